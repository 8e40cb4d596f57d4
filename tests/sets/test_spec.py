"""Output specifications: half-spaces, OR of ANDs, builders."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from assay.errors import DataError, SpecError
from assay.sets import (
    HalfSpaces,
    OutputSpec,
    all_of,
    any_of,
    argmax_is,
    negation_closure,
    output_at_least,
    targeted_robustness,
    untargeted_robustness,
)


@pytest.fixture
def outputs() -> torch.Tensor:
    return torch.as_tensor(np.random.default_rng(7).normal(size=(2000, 4)))


def test_half_spaces_are_a_conjunction_of_closed_rows():
    rows = HalfSpaces([[1.0, -1.0], [0.0, 1.0]], [0.0, 2.0])  # y0 ≥ y1 and y1 ≥ −2
    assert rows.num_outputs == 2 and rows.num_rows == 2 and rows.C.dtype == torch.float64
    assert rows.contains([1.0, 1.0]) is True and rows.contains([1.0, -3.0]) is False
    assert rows.contains(torch.tensor([[3.0, 0.0], [0.0, 3.0]])).tolist() == [True, False]
    assert HalfSpaces([1.0, 0.0], [0.0]).C.shape == (1, 2)  # a 1-D C is one row
    with pytest.raises(SpecError, match=r"got \(2, 2\) and \(3,\)"):
        HalfSpaces(torch.zeros(2, 2), torch.zeros(3))
    with pytest.raises(DataError, match="finite"):
        HalfSpaces([[float("inf")]], [0.0])
    with pytest.raises(DataError, match=r"over 2 outputs"):
        rows.contains([1.0, 2.0, 3.0])


def test_output_spec_is_the_or_of_its_conjunctions():
    first = HalfSpaces([[1.0, 0.0]], [-1.0])  # y0 ≥ 1
    second = HalfSpaces([[0.0, 1.0], [1.0, 0.0]], [-1.0, 0.0])  # y1 ≥ 1 and y0 ≥ 0
    spec = OutputSpec((first, second))
    assert spec.num_outputs == 2 and spec.num_rows == 3
    assert spec.contains(torch.tensor([[2.0, 0.0], [0.5, 2.0], [-0.5, 2.0]])).tolist() == [True, True, False]
    C, d, index = spec.rows()
    assert C.shape == (3, 2) and d.tolist() == [-1.0, -1.0, 0.0] and index.tolist() == [0, 1, 1]
    assert index.dtype == torch.long
    with pytest.raises(SpecError, match="at least one conjunction"):
        OutputSpec(())
    with pytest.raises(SpecError, match=r"different numbers of outputs \(\[2, 3\]\)"):
        OutputSpec((first, HalfSpaces(torch.ones(1, 3), torch.zeros(1))))
    with pytest.raises(SpecError, match="wrap a single one"):
        OutputSpec(first)


def test_argmax_is_matches_torch_argmax_and_counts_ties(outputs):
    for k in range(4):
        assert torch.equal(argmax_is(k, 4).contains(outputs), outputs.argmax(1) == k)
    assert argmax_is(0, 3).contains([1.0, 1.0, 0.0]) is True  # closed: a tie is still "argmax 0"
    assert argmax_is(np.int64(1), 2).conjunctions[0].C.tolist() == [[-1.0, 1.0]]
    assert argmax_is(0, 1).contains([5.0]) is True
    assert torch.equal(untargeted_robustness(2, 4).rows()[0], argmax_is(2, 4).rows()[0])


def test_pairwise_builders(outputs):
    assert torch.equal(output_at_least(1, 3, 4).contains(outputs), outputs[:, 1] >= outputs[:, 3])
    targeted = targeted_robustness(0, 2, 4)
    assert targeted.rows()[0].tolist() == [[1.0, 0.0, -1.0, 0.0]] and targeted.rows()[1].tolist() == [0.0]


@pytest.mark.parametrize("call, message", [
    (lambda: argmax_is(3, 3), r"output index in 0 … 2 \(the network has 3 outputs\); got 3"),
    (lambda: argmax_is(-1, 3), "got -1"),
    (lambda: argmax_is(0, 0), "num_outputs must be ≥ 1"),
    (lambda: argmax_is(1.0, 3), "must be an integer"),
    (lambda: output_at_least(0, 5, 3), "j must be an output index"),
    (lambda: targeted_robustness(1, 1, 3), "different from the label"),
    (lambda: any_of(argmax_is(0, 3), argmax_is(0, 4)), r"different numbers of outputs \[3, 4\]"),
    (lambda: all_of(argmax_is(0, 3), argmax_is(0, 4)), "different numbers of outputs"),
    (lambda: any_of(), "at least one"),
    (lambda: all_of("y0 > y1"), "pass OutputSpec or HalfSpaces"),
    (lambda: negation_closure(any_of(argmax_is(0, 3), argmax_is(1, 3))), "single conjunction, got 2"),
])
def test_builder_errors_say_what_to_fix(call, message):
    with pytest.raises(SpecError, match=message):
        call()


def test_any_of_and_all_of_are_or_and_and(outputs):
    a = any_of(argmax_is(0, 4), argmax_is(1, 4))
    b = any_of(output_at_least(2, 3, 4), HalfSpaces([[0.0, 0.0, 0.0, 1.0]], [0.0]))
    assert len(a.conjunctions) == 2
    assert torch.equal(a.contains(outputs), (outputs.argmax(1) == 0) | (outputs.argmax(1) == 1))
    both = all_of(a, b)
    assert len(both.conjunctions) == 4
    assert torch.equal(both.contains(outputs), a.contains(outputs) & b.contains(outputs))
    assert torch.equal(any_of(a, b).contains(outputs), a.contains(outputs) | b.contains(outputs))


def test_negation_closure_is_the_closed_complement(outputs):
    region = argmax_is(0, 4)
    complement = negation_closure(region)
    assert len(complement.conjunctions) == 3
    assert torch.equal(complement.contains(outputs), ~region.contains(outputs))  # no ties in random data
    tie = torch.tensor([1.0, 1.0, 0.0, 0.0])
    assert region.contains(tie) and complement.contains(tie)  # the shared boundary
    assert torch.equal(negation_closure(region.conjunctions[0]).rows()[0], complement.rows()[0])
