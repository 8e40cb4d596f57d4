"""Intermediate α-CROWN where the rows of a layer's neurons reach no optimisable relaxation: a
graph of two branches, the second's first ReLU layer after the first's in the plan (a relaxed
stage before it, but not on its rows' walk, as in pensieve's parallel branches). The
optimisation must end with CROWN's bound instead of failing, and the bounds must hold."""

from __future__ import annotations

import numpy as np
import torch

from assay.bounds import compute_bounds
from assay.nn import Linear, Network, ReLU, ops

from .strategies import sample_box


def two_branches(seed: int) -> Network:
    rng = np.random.default_rng(seed)
    t = lambda *shape: torch.as_tensor(rng.normal(0.0, 1.0, size=shape))  # noqa: E731
    layers, sources = [], []

    def add(layer, *reads):
        layers.append(layer)
        sources.append(reads)
        return len(layers)

    a = add(ops.Slice((0,), (0,), (2,), (1,)), 0)
    a = add(Linear(t(6, 2), t(6)), a)
    a = add(ReLU(), a)
    a = add(Linear(t(4, 6), t(4)), a)
    a = add(ReLU(), a)
    b = add(ops.Slice((0,), (2,), (4,), (1,)), 0)
    b = add(Linear(t(6, 2), t(6)), b)
    b = add(ReLU(), b)  # the second branch's first ReLU layer: its rows cross no relaxation
    b = add(Linear(t(4, 6), t(4)), b)
    b = add(ReLU(), b)
    joined = add(ops.Concat(0), a, b)
    add(Linear(t(2, 8), t(2)), joined)
    return Network(tuple(layers), (4,), sources=tuple(sources))


def test_intermediate_alpha_with_no_parameter_on_a_layers_walk_holds():
    for seed in range(3):
        network = two_branches(seed)
        rng = np.random.default_rng(seed)
        lower = torch.as_tensor(rng.uniform(-1, 0, (2, 4)))
        upper = lower + 1.0
        result = compute_bounds(network, (lower, upper), method="alpha", intermediate_method="alpha")
        crown = compute_bounds(network, (lower, upper), method="crown")
        assert bool((result.lower >= crown.lower - 1e-9).all() and (result.upper <= crown.upper + 1e-9).all())
        x = sample_box(lower, upper, rng, 2000)
        with torch.no_grad():
            y = network(x.reshape(-1, 4)).reshape(x.shape[0], 2, -1)
        assert bool((y >= result.lower).all() and (y <= result.upper).all())
