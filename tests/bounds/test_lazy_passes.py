"""The bound engine's shortcuts that must not change a bound: interval passes that stop at the
next tensor CROWN refines (``interval_pass(until=...)``), and element-wise relaxations kept
between the backward walks of one bound computation (``OperatorStage.cross``)."""

from __future__ import annotations

import numpy as np
import torch

from assay.bounds import compute_bounds, interval_pass, plan_for
from assay.bounds.plan import OperatorStage
from assay.nn import ReLU, ops

from .test_general_graphs import branches_graph


def _network():
    return branches_graph(np.random.default_rng(5), [ops.Sin(), ops.Affine(torch.tensor(1.5), torch.tensor(0.1)), ReLU()])


def _box(network, batch=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    center = torch.randn(batch, *network.input_shape, generator=g, dtype=torch.float64)
    radius = 0.3 * torch.rand(batch, *network.input_shape, generator=g, dtype=torch.float64)
    return center - radius, center + radius


def test_an_interval_pass_stopped_early_is_the_prefix_of_the_full_pass():
    """Every tensor up to ``until`` is what the full pass gives it, the clamping of the last one
    included (known bounds tighter than IBP, as a parent's bounds in branch and bound)."""
    network = _network()
    plan = plan_for(network, torch.float64)
    lower, upper = _box(network)
    plain = interval_pass(plan, lower, upper)
    known = {t: (l + 0.1 * (u - l), u - 0.1 * (u - l)) for t, (l, u) in enumerate(plain)}

    def clamp(position, l, u):
        return torch.maximum(l, known[position][0]), torch.minimum(u, known[position][1])

    full = interval_pass(plan, lower, upper, clamp=clamp)
    assert len(full) == len(plan.stages) + 1
    for until in range(1, len(plan.stages) + 1):
        part = interval_pass(plan, lower, upper, clamp=clamp, until=until)
        assert len(part) == until + 1
        for t, ((a, b), (c, d)) in enumerate(zip(part, full)):
            assert torch.equal(a, c) and torch.equal(b, d), (until, t)


def test_refined_bounds_are_sound_on_samples():
    """CROWN with refined intermediate tensors (lazy interval passes between them) on boxes and
    on children boxes given their parents' bounds: every sampled output lies within."""
    network = _network()
    lower, upper = _box(network, batch=6, seed=1)
    g = torch.Generator().manual_seed(2)
    for method in ("crown", "alpha"):
        parent = compute_bounds(network, (lower, upper), method=method)
        middle = (lower + upper) / 2
        child = compute_bounds(network, (lower, middle), method=method, intermediate=parent.intermediate)
        for (lo, hi), result in (((lower, upper), parent), ((lower, middle), child)):
            x = lo + (hi - lo) * torch.rand(512, *lo.shape, generator=g, dtype=torch.float64)
            y = network.forward(x.reshape(-1, *lo.shape[1:])).reshape(512, *result.lower.shape)
            assert (y >= result.lower).all() and (y <= result.upper).all()


def test_a_kept_relaxation_is_used_only_for_the_same_unmodified_bounds():
    network = _network()
    plan = plan_for(network, torch.float64)
    position, stage = next((p, s) for p, s in enumerate(plan.stages)
                           if isinstance(s, OperatorStage) and isinstance(s.layer, ops.Sin))
    bounds = interval_pass(plan, *_box(network))
    (source,) = stage.sources
    A = torch.randn(4, 3, *stage.out_shape, generator=torch.Generator().manual_seed(3), dtype=torch.float64)

    def fresh():
        return stage.rule.backward(stage.layer, A, [bounds[source]])

    def same(a, b):
        return torch.equal(a.offset, b.offset) and all(torch.equal(x, y) for x, y in zip(a.coefficients, b.coefficients))

    assert same(stage.cross(A, bounds), fresh())
    assert same(stage.cross(A, bounds), fresh())  # kept
    lower, upper = bounds[source]
    lower.sub_(0.7)  # the same tensor, changed in place
    assert same(stage.cross(A, bounds), fresh())
    bounds[source] = (lower.clone() + 0.5, upper.clone())  # new tensors
    assert same(stage.cross(A, bounds), fresh())
