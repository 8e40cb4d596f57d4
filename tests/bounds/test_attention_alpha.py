"""Intermediate α-CROWN on a small self-attention network: the tensors that products and a
softmax read get α-optimised bounds of their own, which stay sound (sampled, tiny and wide boxes)
and never widen CROWN's."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from assay.bounds import AlphaCrownOptions, compute_bounds, plan_for
from assay.nn import Flatten, Linear, Network, ReLU, ops
from assay.nn.layers import Reshape


def attention_network(seed: int = 0) -> Network:
    """(6,) → Linear → 36 → Q, K, V (3 tokens × 4) → softmax(Q·Kᵀ/2)·V → Linear → ReLU → Linear → 3."""
    rng = np.random.default_rng(seed)
    t = lambda *s, scale=1.0: torch.as_tensor(rng.normal(0.0, scale, size=s))  # noqa: E731
    layers, sources = [Linear(t(36, 6, scale=0.8), t(36, scale=0.3))], [(0,)]

    def add(layer, *reads):
        layers.append(layer)
        sources.append(reads)
        return len(layers)

    q = add(Reshape((3, 4)), add(ops.Slice((0,), (0,), (12,), (1,)), 1))
    k = add(Reshape((3, 4)), add(ops.Slice((0,), (12,), (24,), (1,)), 1))
    v = add(Reshape((3, 4)), add(ops.Slice((0,), (24,), (36,), (1,)), 1))
    scores = add(ops.Affine(torch.tensor(0.5), torch.tensor(0.0)), add(ops.MatMul(), q, add(ops.Transpose((1, 0)), k)))
    mixed = add(ops.MatMul(), add(ops.Softmax(1), scores), v)
    hidden = add(ReLU(), add(Linear(t(8, 12, scale=0.5), t(8, scale=0.2)), add(Flatten(), mixed)))
    add(Linear(t(3, 8, scale=0.5), t(3, scale=0.2)), hidden)
    return Network(tuple(layers), (6,), sources=tuple(sources))


def sampled(network, lower, upper, count=4000, seed=0):
    """Every tensor at random points and corners of the box: (N, *shape) per tensor."""
    generator = torch.Generator().manual_seed(seed)
    fractions = torch.rand(count, lower.numel(), dtype=torch.float64, generator=generator)
    fractions[: count // 2] = fractions[: count // 2].round()  # corners
    with torch.no_grad():
        return network.tensors(lower + (upper - lower) * fractions)


@pytest.mark.parametrize("radius", [1e-3, 0.3])
def test_alpha_bounds_of_operator_inputs_hold_and_never_widen_crown(radius):
    network = attention_network()
    centre = torch.as_tensor(np.random.default_rng(1).normal(size=6))
    lower, upper = centre - radius, centre + radius
    crown = compute_bounds(network, (lower, upper), method="crown")
    alpha = compute_bounds(network, (lower, upper), method="alpha", intermediate_method="alpha",
                           options=AlphaCrownOptions(iterations=8, lr=0.3))
    plan = plan_for(network, torch.float64)
    values = sampled(network, lower, upper)
    narrower = 0
    bounds = list(zip(alpha.intermediate.operator_lower, alpha.intermediate.operator_upper,
                      crown.intermediate.operator_lower, crown.intermediate.operator_upper))
    for tensor, (lo, hi, crown_lo, crown_hi) in zip(plan.operator_tensors, bounds):
        assert (lo >= crown_lo).all() and (hi <= crown_hi).all()
        assert (values[tensor] >= lo).all() and (values[tensor] <= hi).all(), tensor
        narrower += int(((lo > crown_lo) | (hi < crown_hi)).sum())
    for lo, hi, position in zip(alpha.intermediate.lower, alpha.intermediate.upper, plan.relu_positions):
        assert (values[position] >= lo).all() and (values[position] <= hi).all()
    out = values[-1]
    assert (out >= alpha.lower).all() and (out <= alpha.upper).all()
    assert narrower > 0  # the product's and softmax's parameters moved some bound


def test_alpha_bounds_are_tight_on_a_tiny_box():
    """On a box 2e-6 wide the α bounds of every operator input lie within 1e-5 of the sampled
    range (a bound moved inward by 1e-4 would be caught by the test above)."""
    network = attention_network(2)
    centre = torch.as_tensor(np.random.default_rng(3).normal(size=6))
    lower, upper = centre - 1e-6, centre + 1e-6
    alpha = compute_bounds(network, (lower, upper), method="alpha", intermediate_method="alpha",
                           options=AlphaCrownOptions(iterations=3))
    values = sampled(network, lower, upper, count=512)
    plan = plan_for(network, torch.float64)
    for tensor, lo, hi in zip(plan.operator_tensors, alpha.intermediate.operator_lower, alpha.intermediate.operator_upper):
        low, high = values[tensor].amin(0), values[tensor].amax(0)
        assert (lo <= low).all() and (hi >= high).all()
        assert (low - lo < 1e-5).all() and (hi - high < 1e-5).all()
