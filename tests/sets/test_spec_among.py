"""argmax_is(k, n, among=...): one head of a multi-head network."""

from __future__ import annotations

import pytest
import torch

from assay.errors import SpecError
from assay.sets import all_of, argmax_is


def test_among_restricts_the_competition():
    spec = all_of(argmax_is(0, 8, range(4)), argmax_is(5, 8, range(4, 8)))
    (conjunction,) = spec.conjunctions
    assert conjunction.C.shape == (6, 8)
    y = torch.tensor([[3.0, 1, 2, 0, -9, 9, 1, 0], [3.0, 1, 2, 0, 9, 8, 1, 0], [1.0, 3, 0, 0, 0, 5, 0, 0]])
    assert spec.contains(y).tolist() == [True, False, False]
    assert argmax_is(2, 3, [2]).contains(torch.tensor([[5.0, 9.0, 0.0]])).tolist() == [True]
    with pytest.raises(SpecError, match="must be one of the outputs"):
        argmax_is(0, 8, range(4, 8))
    with pytest.raises(SpecError, match="0 … 7"):
        argmax_is(0, 8, [0, 9])
