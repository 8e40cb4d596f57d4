"""Preimage approximations of a residual network (a graph, not a chain) survive a 10⁵-sample attack."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from assay.nn import Add, Linear, Network, ReLU
from assay.preimage import approximate_preimage
from assay.sets import Box, argmax_is


def residual_network() -> Network:
    rng = np.random.default_rng(0)

    def t(*shape):
        return torch.as_tensor(rng.normal(0, 0.8, size=shape))

    layers = (Linear(t(6, 2), t(6)), ReLU(), Linear(t(6, 6), t(6)), Add(), ReLU(), Linear(t(3, 6), t(3)))
    return Network(layers, (2,), sources=((0,), (1,), (2,), (3, 2), (4,), (5,)))


@pytest.mark.parametrize("kind", ["under", "over"])
def test_residual_network_preimage_is_sound(kind):
    network = residual_network()
    result = approximate_preimage(network, Box(-torch.ones(2), torch.ones(2)), argmax_is(0, 3), kind=kind,
                                  threshold=0.9 if kind == "under" else 1.1, time_limit=30,
                                  rng=np.random.default_rng(0))
    x = torch.as_tensor(np.random.default_rng(1).uniform(-1, 1, size=(100_000, 2)))
    inside = torch.as_tensor(np.asarray(result.contains(x)))
    in_preimage = network.forward(x).argmax(1) == 0
    if kind == "under":
        assert not (inside & ~in_preimage).any(), "a point of the under-approximation leaves the preimage"
    else:
        assert not (in_preimage & ~inside).any(), "a preimage point lies outside the over-approximation"
    assert 0.05 < float(in_preimage.double().mean()) < 0.95  # the property splits the box: the test can fail
