"""Forward linear bounds with error symbols (``forward_bounds(symbols=True)``, the forward pass of
``intermediate_method="hybrid"``): every ReLU adds one symbol per unstable neuron, shared by every
later tensor. Here: hybrid bounds of batches clamped by a parent's bounds hold on every sample, a
cut gives back its own bounds, and on a generator feeding a discriminator the symbols tighten the
output bounds (the reason they exist: cgan's 64×64 rows). That every sampled tensor lies within
the symbols' bounds, and that CROWN walks stopped at a cut hold through its symbols, is tested
beside the per-side forward bounds in test_forward_general.
"""

from __future__ import annotations

import numpy as np
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from assay.bounds import compute_bounds, plan_for
from assay.bounds.forward import forward_bounds
from assay.nn import Linear, Network, ReLU

from .strategies import forward_batched, sample_box
from .test_forward_general import generator_graph

SAMPLES = 2_000
FAST = settings(max_examples=4, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _no_clamp(position, low, high, members=None):
    return low, high


@given(seed=st.integers(0, 2**32 - 1))
@FAST
def test_hybrid_bounds_with_symbols_hold_per_box_with_parent_bounds(seed):
    """compute_bounds(intermediate_method="hybrid") on several boxes at once, with a parent's
    bounds given (each domain clamps with its own): every sample of each box within its bounds."""
    rng = np.random.default_rng(seed)
    network = generator_graph(rng, channels=4)
    lower = torch.as_tensor(rng.uniform(-1, 1, size=(1, 4)))
    upper = lower + 0.6
    parent = compute_bounds(network, (lower, upper), intermediate_method="hybrid")
    middle = (lower + upper) / 2
    boxes = (torch.cat([lower, lower]), torch.cat([middle, upper]))  # a child and the whole box
    intermediate = type(parent.intermediate)(*(tuple(t.expand(2, *t.shape[1:]) for t in part)
                                               for part in (parent.intermediate.lower, parent.intermediate.upper,
                                                            parent.intermediate.operator_lower,
                                                            parent.intermediate.operator_upper)))
    child = compute_bounds(network, boxes, intermediate_method="hybrid", intermediate=intermediate)
    x = sample_box(boxes[0], boxes[1], rng, SAMPLES)
    y = forward_batched(network, x)
    assert (y >= child.lower.unsqueeze(0)).all() and (y <= child.upper.unsqueeze(0)).all()


def _deep_chain(rng, width: int = 24, depth: int = 6) -> Network:
    layers, inputs = [], 4
    for _ in range(depth):
        layers += [Linear(torch.as_tensor(rng.normal(0, 1.2 / np.sqrt(inputs), size=(width, inputs))),
                          torch.as_tensor(rng.normal(0, 0.1, size=width))), ReLU()]
        inputs = width
    layers.append(Linear(torch.as_tensor(rng.normal(0, 1.0, size=(1, width))), torch.zeros(1, dtype=torch.float64)))
    return Network(tuple(layers), (4,))


def test_symbols_tighten_deep_chains():
    """The correlation the symbols keep: on deep chains of many unstable neurons (a generator
    feeding a discriminator is one), the last ReLU layer's bounds are narrower with symbols than
    by the per-side relaxation, summed over seeded networks (the bounds are deterministic)."""
    narrow = wide = 0.0
    for seed in range(5):
        network = _deep_chain(np.random.default_rng(seed))
        lower, upper = -0.5 * torch.ones(1, 4, dtype=torch.float64), 0.5 * torch.ones(1, 4, dtype=torch.float64)
        plan = plan_for(network, torch.float64)
        last = plan.relu_positions[-1]
        low, high = forward_bounds(plan, lower, upper, _no_clamp, symbols=True)[last]
        narrow += float((high - low).sum())
        low, high = forward_bounds(plan, lower, upper, _no_clamp)[last]
        wide += float((high - low).sum())
    assert narrow < 0.8 * wide, (narrow, wide)


@given(seed=st.integers(0, 2**32 - 1), width=st.sampled_from([0.3, 2.0]))
@FAST
def test_a_cut_gives_back_its_own_forward_bounds(seed, width):
    """Substituting a cut's functions into unit rows on the cut tensor itself (a walk of no stage)
    concretises exactly what forward_bounds returned for that tensor: the symbols' coefficients
    are charged in full there, no more (tighter would be unsound) and no less."""
    from assay.bounds.crown import backsubstitute, concretize
    from assay.bounds.ibp import center_radius, interval_pass

    rng = np.random.default_rng(seed)
    network = generator_graph(rng)
    plan = plan_for(network, torch.float64)
    lower = torch.as_tensor(rng.uniform(-1, 1, size=(2, 4)))
    upper = lower + width
    cuts = {}
    bounds_of = forward_bounds(plan, lower, upper, _no_clamp, keep=set(plan.relu_positions), cuts=cuts, symbols=True)
    bounds = interval_pass(plan, lower, upper)
    center, radius = center_radius(lower, upper)
    for t in plan.relu_positions:
        n = bounds_of[t][0][0].numel()
        unit = torch.eye(n, dtype=torch.float64).reshape(1, n, *bounds_of[t][0].shape[1:]).expand(2, -1, *([-1] * (
            bounds_of[t][0].dim() - 1)))
        C = torch.cat([unit, -unit], 1)
        back = backsubstitute(plan, t, C, torch.zeros(2, 2 * n, dtype=torch.float64), bounds, cut=cuts[t])
        value = concretize(plan, back, center, radius)[0]
        torch.testing.assert_close(value[:, :n], bounds_of[t][0].reshape(2, -1), rtol=0, atol=1e-9)
        torch.testing.assert_close(-value[:, n:], bounds_of[t][1].reshape(2, -1), rtol=0, atol=1e-9)
        # folded, the symbols' magnitudes are charged to each element alone: the same bounds here
        back = backsubstitute(plan, t, C, torch.zeros(2, 2 * n, dtype=torch.float64), bounds, cut=cuts[t].folded())
        folded = concretize(plan, back, center, radius)[0]
        torch.testing.assert_close(folded, value, rtol=0, atol=1e-9)
