"""The general split (branching on the inputs of non-linear operators) against sampled points.

A branch of the general split stands for the inputs of the box whose intermediate values lie in
its narrowed intervals. The children of every split are checked point by point: each sampled
input is sorted into the leaves its own intermediate values (a plain forward pass) fit, it must
fit at least one (the children cover their parent), and every leaf's bounds must contain the
output of every point it holds. Verdicts are checked against an independent gradient-ascent
estimate of the maximum.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from assay.bounds import plan_for
from assay.nn import Linear, Network, ReLU, ops
from assay.sets import Box
from assay.verify import VerificationStatus, verify
from assay.verify.deadline import Deadline
from assay.verify.input_split import bound_root
from assay.verify.operator_split import OperatorSplitting, root_branch, tighten_root
from assay.verify.problem import from_unsafe
from assay.verify.search import SearchStats

from .test_general_networks import at_least

HOLDS, VIOLATED = VerificationStatus.HOLDS, VerificationStatus.VIOLATED


def mixed_network(seed: int) -> Network:
    """6 → 8 → relu → 8 → sigmoid → (Mul of halves: 4) → 1: a ReLU split, an S-curve's and a product's."""
    rng = np.random.default_rng(seed)
    t = lambda *s: torch.as_tensor(rng.normal(0, 1.0, size=s))  # noqa: E731
    layers = (Linear(t(8, 6), t(8)), ReLU(), Linear(t(8, 8), t(8)), ops.Sigmoid(),
              ops.Slice((0,), (0,), (4,), (1,)), ops.Slice((0,), (4,), (8,), (1,)), ops.Binary("Mul"),
              Linear(t(1, 4), t(1)))
    sources = ((0,), (1,), (2,), (3,), (4,), (4,), (5, 6), (7,))
    return Network(layers, (6,), sources=sources)


def box(radius: float = 0.5):
    return torch.full((6,), -radius, dtype=torch.float64), torch.full((6,), radius, dtype=torch.float64)


def ascent_max(network: Network, lower, upper, starts: int = 64, steps: int = 100) -> float:
    """An independent estimate of max f over the box: projected gradient ascent from random starts."""
    generator = torch.Generator().manual_seed(0)
    x = (lower + (upper - lower) * torch.rand(starts, lower.numel(), dtype=torch.float64, generator=generator))
    x.requires_grad_(True)
    model = network.to_torch().to(torch.float64)
    optimiser = torch.optim.Adam([x], lr=0.02)
    best = -np.inf
    for _ in range(steps):
        value = model(x).reshape(-1)
        best = max(best, float(value.detach().max()))
        optimiser.zero_grad()
        (-value.sum()).backward()
        optimiser.step()
        with torch.no_grad():
            x.copy_(torch.minimum(torch.maximum(x, lower), upper))
    return best


def leaves_of(network, lower, upper, threshold, depth):
    """The leaves of a general split ``depth`` levels deep (every branch split, none closed)."""
    query = from_unsafe(network, Box(lower, upper), at_least(threshold))[0]
    strategy = OperatorSplitting(network, query, method="crown")
    deadline, stats = Deadline(float("inf")), SearchStats()
    branches = root_branch(query).pending[0]
    for _ in range(depth):
        bounded = strategy.bound(branches, deadline, stats)
        every = torch.ones(len(branches), dtype=torch.bool)
        strategy.decide(bounded, every, deadline, stats)
        left, right = strategy.split(bounded, every)
        branches = type(left).concat([left, right])
    bounded = strategy.bound(branches, deadline, stats)
    return bounded.branches, bounded.branches.row_upper[:, 0]


def inside(network, x, parents) -> torch.Tensor:
    """(N, B): whether point n's intermediate values lie within branch b's bounds."""
    plan = plan_for(network, torch.float64)
    tensors = network.tensors(x)
    fits = torch.ones(x.shape[0], parents.batch_size, dtype=torch.bool)
    pairs = list(zip(plan.relu_positions, parents.lower, parents.upper))
    pairs += list(zip(plan.operator_tensors, parents.operator_lower, parents.operator_upper))
    for tensor, low, high in pairs:
        value = tensors[tensor].reshape(x.shape[0], 1, -1)
        fits &= ((value >= low.reshape(1, low.shape[0], -1)) & (value <= high.reshape(1, high.shape[0], -1))).all(2)
    return fits


@pytest.mark.parametrize("seed", [1, 2])
def test_the_leaves_of_a_general_split_cover_the_box_and_bound_every_point_they_hold(seed):
    network = mixed_network(seed)
    lower, upper = box()
    leaves, leaf_upper = leaves_of(network, lower, upper, threshold=0.0, depth=4)
    assert len(leaves) == 16
    generator = torch.Generator().manual_seed(seed)
    x = lower + (upper - lower) * torch.rand(4000, 6, dtype=torch.float64, generator=generator)
    corners = torch.where(torch.rand(64, 6, generator=generator) < 0.5, lower, upper)
    x = torch.cat([x, corners])
    y = network.forward(x).reshape(-1)
    fits = inside(network, x, leaves.parents)
    assert bool(fits.any(1).all()), "some input lies in no leaf: the children do not cover their parent"
    empty = torch.isneginf(leaf_upper)
    assert not bool(fits[:, empty].any()), "a leaf bounded as empty holds a point"
    # every leaf's upper bound of the row y − 0 holds at every point it contains
    worst = torch.where(fits, y.unsqueeze(1) - leaf_upper.unsqueeze(0), torch.full_like(fits, -np.inf, dtype=y.dtype))
    assert float(worst.max()) <= 0.0
    # the split tightens: some leaf is bounded below the root's bound
    root_upper = leaves_of(network, lower, upper, 0.0, depth=0)[1]
    assert float(leaf_upper[~empty].min()) < float(root_upper[0])


def test_general_split_verdicts_agree_with_gradient_ascent():
    network = mixed_network(1)
    lower, upper = box()
    peak = ascent_max(network, lower, upper)
    root = float(leaves_of(network, lower, upper, 0.0, depth=0)[1][0])  # the root's bound of y
    assert root > peak + 0.1, "the root's bound alone would decide: the split would go untested"
    # between the root's bound and the maximum: only branching can prove it (no attack first, so
    # the verdicts are the search's own; its probes look for violations)
    for threshold, may_hold in ((root - 0.3 * (root - peak), True), (peak - 1e-4, False)):
        result = verify(network, Box(lower, upper), unsafe=at_least(threshold), timeout=15, strategy="operator",
                        attack_restarts=0)
        if result.status is VIOLATED:
            point = result.counterexample.input.reshape(1, 6).to(torch.float64)
            assert float(network.forward(point)) >= threshold
        if may_hold:
            assert result.status is HOLDS and result.stats.domains > 1, result.status
            assert threshold > peak
        else:
            assert result.status is not HOLDS, f"HOLDS for y ≥ {threshold}, but gradient ascent reaches {peak}"


def test_given_operator_bounds_after_fixed_layers_are_not_trusted():
    """``fixed_layers`` says the layers after the first k ReLU layers may have changed: bounds given
    for the tensors operators read there (from the network before the change) must not be used."""
    from assay.bounds import IntermediateBounds, compute_bounds

    network = mixed_network(1)
    lower, upper = box()
    first = compute_bounds(network, Box(lower, upper), method="crown")
    stale = first.intermediate
    # tensors after the ReLU (the sigmoid's input and the product's factors) pinned to a point
    wrong = IntermediateBounds(stale.lower, stale.upper, tuple(t * 0 for t in stale.operator_lower),
                               tuple(t * 0 for t in stale.operator_upper))
    result = compute_bounds(network, Box(lower, upper), method="crown", intermediate=wrong, fixed_layers=1)
    generator = torch.Generator().manual_seed(0)
    x = lower + (upper - lower) * torch.rand(2000, 6, dtype=torch.float64, generator=generator)
    y = network.forward(x).reshape(-1)
    assert float(result.lower[0, 0]) <= float(y.min()) and float(result.upper[0, 0]) >= float(y.max())


def test_verify_refuses_a_bound_method_without_linear_bounds_in_one_line():
    """The searches shrink boxes and score splits by linear bounds: IBP has none, and was once
    accepted only to fail deep inside the first bound call."""
    from assay.errors import OptionError

    network = mixed_network(1)
    lower, upper = box()
    with pytest.raises(OptionError, match="`method` option of verify must be one of 'crown', 'alpha'"):
        verify(network, Box(lower, upper), unsafe=at_least(10.0), method="ibp")


@pytest.mark.parametrize("seed", [1, 4])
def test_tightened_root_never_loosens_and_stays_above_gradient_ascent(seed):
    """tighten_root (intermediate α-CROWN on the root): its bound of y is at most the root's and
    at least the largest value gradient ascent finds; its intermediate bounds lie within the root's."""
    network = mixed_network(seed)
    lower, upper = box()
    query = from_unsafe(network, Box(lower, upper), at_least(0.0))[0]
    stats = SearchStats()
    root = bound_root(network, query, method="crown", dtype="float64", stats=stats)
    tightened = tighten_root(network, query, root, dtype="float64", stats=stats, deadline=Deadline(float("inf")))
    peak = ascent_max(network, lower, upper)
    assert float(tightened.group_upper[0, 0]) <= float(root.group_upper[0, 0])
    assert float(tightened.group_upper[0, 0]) >= peak
    given, tighter = root.result.intermediate, tightened.result.intermediate
    for lo, hi, root_lo, root_hi in zip(tighter.lower + tighter.operator_lower, tighter.upper + tighter.operator_upper,
                                        given.lower + given.operator_lower, given.upper + given.operator_upper):
        assert (lo >= root_lo).all() and (hi <= root_hi).all()


@pytest.mark.parametrize("seed", [1, 4])
def test_tightened_root_stays_above_the_maximum_on_a_box_where_it_is_nearly_exact(seed):
    """On a box 2e-7 wide the root's bound is within 1e-9 of the true maximum, so a combination
    moved inward by anything above that (the rows' minimum, the groups' minimum) drops below a
    point of the box. The maximum: the forward pass at the corner the gradient points to (the
    network is linear to ~1e-14 there) and at dense samples."""
    network = mixed_network(seed)
    centre = torch.as_tensor(np.random.default_rng(seed).uniform(-0.5, 0.5, 6))
    lower, upper = centre - 1e-7, centre + 1e-7
    model = network.to_torch().to(torch.float64)
    x = centre.clone().requires_grad_(True)
    model(x.unsqueeze(0)).sum().backward()
    corner = torch.where(x.grad >= 0, upper, lower)
    generator = torch.Generator().manual_seed(seed)
    samples = lower + (upper - lower) * torch.rand(4000, 6, dtype=torch.float64, generator=generator)
    points = torch.cat([corner.unsqueeze(0), samples])
    peak = float(network.forward(points).max())
    query = from_unsafe(network, Box(lower, upper), at_least(peak))[0]  # rows: y − peak, at least 0 at a point
    stats = SearchStats()
    root = bound_root(network, query, method="crown", dtype="float64", stats=stats)
    tightened = tighten_root(network, query, root, dtype="float64", stats=stats, deadline=Deadline(float("inf")))
    bound = float(tightened.group_upper[0, 0])
    assert bound >= 0.0 and float(tightened.result.upper.max()) >= 0.0
    assert bound < 1e-9  # near-exact: the test sits where an inward shift shows
