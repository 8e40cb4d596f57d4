"""Constants in forward linear bounds: tensors that no box lets vary (every input they read is
fixed), as in nn4sys' mscn, whose boxes let 1–3 inputs of one of its 6 set blocks vary.

The forward pass crosses the stages that read only constants by their interval rules, the
interval pass after it takes those bounds as computed, and CROWN's walk of the rows stops at
them (``A·z ≥ A⁺·l + A⁻·u``). Every tensor's bounds must hold at sampled points, and the
rows' bounds must equal those computed without the shortcut to rounding (a constant's interval
is as tight as its linear functions): a bound moved inward fails one of the two.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import assay.bounds.api as api
import assay.bounds.forward as forward
from assay.bounds import compute_bounds, plan_for
from assay.bounds.crown import backsubstitute, concretize
from assay.bounds.ibp import center_radius, interval_pass
from assay.bounds.stages.operator import OperatorStage
from assay.bounds.stages.relu import ReluStage
from assay.nn import Linear, Network, ReLU, ops

from .strategies import sample_box
from .test_forward_products import add_set_block

ROWS, FEATURES, HIDDEN = 3, 3, 6


def _t(rng, *shape, scale=1.0):
    return torch.as_tensor(rng.normal(0.0, scale, size=shape))


def two_set_network(seed: int) -> Network:
    """Two sets of ROWS elements (FEATURES values and a mask each; the input's rows 0..ROWS−1 and
    ROWS..2·ROWS−1), each through its own two ReLU layers, times its mask, summed over the set
    and divided by the mask count; the two pooled vectors joined → Linear → ReLU → Linear →
    Sigmoid (mscn's shape, with two blocks instead of six)."""
    rng = np.random.default_rng(seed)
    layers, sources = [], []

    def add(layer, *reads):
        layers.append(layer)
        sources.append(reads)
        return len(layers)

    pooled = []
    for block in range(2):
        rows = add(ops.Slice((0,), (block * ROWS,), ((block + 1) * ROWS,), (1,)), 0)
        pooled.append(add_set_block(add, rng, rows, FEATURES, HIDDEN))
    t = add(ops.Concat(0), *pooled)
    t = add(Linear(_t(rng, 5, 2 * HIDDEN, scale=0.6), _t(rng, 5, scale=0.2)), t)
    t = add(ReLU(), t)
    t = add(Linear(_t(rng, 2, 5, scale=0.6), _t(rng, 2, scale=0.2)), t)
    add(ops.Sigmoid(), t)
    return Network(tuple(layers), (2 * ROWS, FEATURES + 1), sources=tuple(sources))


def boxes(seed: int, count: int = 6, width: float = 0.6):
    """Boxes that let features of the first block vary (box i: feature 0 of element i mod ROWS,
    and every other box feature 1 of the next element too, so boxes vary 1 or 2 inputs); the
    second block and every mask (1, 1, 0: padding) are fixed."""
    rng = np.random.default_rng(seed + 100)
    lower = torch.as_tensor(rng.uniform(-1, 1, (count, 2 * ROWS, FEATURES + 1)))
    lower[:, :, FEATURES] = torch.tensor([1.0, 1.0, 0.0] * 2, dtype=torch.float64)
    upper = lower.clone()
    index = torch.arange(count)
    upper[index, index % ROWS, 0] += width
    upper[index[::2], (index[::2] + 1) % ROWS, 1] += width / 2
    return lower, upper


def _no_constants(monkeypatch):
    """Forward bounds without the constants (every stage by its forward step, every walk whole)."""
    original = api.forward_bounds

    def without(*args, **kwargs):
        kwargs["constants"] = None
        return original(*args, **kwargs)

    monkeypatch.setattr(api, "forward_bounds", without)


def _tensor_of(network, lower, upper, seed, count=2000):
    x = sample_box(lower, upper, np.random.default_rng(seed), count)  # (n, B, *shape)
    with torch.no_grad():
        values = network.tensors(x.reshape(-1, *network.input_shape))
    return [v.reshape(x.shape[0], x.shape[1], *v.shape[1:]) for v in values]


@pytest.mark.parametrize("seed", range(3))
def test_the_fixed_blocks_tensors_are_constants_and_hold_at_sampled_points(seed):
    network = two_set_network(seed)
    lower, upper = boxes(seed)
    plan = plan_for(network, torch.float64)
    eager = forward.Constants()
    found = forward.forward_bounds(plan, lower, upper, lambda t, lo, hi: (lo, hi), constants=eager)
    assert set(eager.bounds) == eager.tensors
    constants = eager.bounds
    # tensors 1–12 are the first block's (its rows, features, mask, …, pooled), 13–24 the
    # second's: the second block and the first block's mask and mask count are constants; the
    # first block's rows, features and pooled output are not
    assert set(range(13, 25)) | {3, 11} <= set(constants), sorted(constants)
    assert not {1, 2, 4, 12, 25} & set(constants), sorted(constants)
    values = _tensor_of(network, lower, upper, seed)
    for tensor, (low, high) in {**constants, **found}.items():
        seen = values[tensor]
        assert bool((seen >= low - 0.0).all() and (seen <= high + 0.0).all()), f"tensor {tensor} escapes its bounds"
    for tensor in constants:  # a constant's interval is a point, up to rounding
        low, high = constants[tensor]
        assert float((high - low).max()) < 1e-12


@pytest.mark.parametrize("seed", range(3))
def test_rows_bounds_equal_those_without_constants_and_hold_at_sampled_points(seed, monkeypatch):
    network = two_set_network(seed)
    lower, upper = boxes(seed)
    result = compute_bounds(network, (lower, upper), method="crown", intermediate_method="forward",
                            return_linear=True)
    y = _tensor_of(network, lower, upper, seed)[-1]
    assert bool((y >= result.lower).all() and (y <= result.upper).all())
    _no_constants(monkeypatch)
    whole = compute_bounds(network, (lower, upper), method="crown", intermediate_method="forward",
                           return_linear=True)
    assert torch.allclose(result.lower, whole.lower, rtol=0, atol=1e-10)
    assert torch.allclose(result.upper, whole.upper, rtol=0, atol=1e-10)
    # the coefficients on the inputs the boxes let vary (the whole walk also reaches fixed ones)
    varies = (upper > lower).unsqueeze(1)
    assert torch.allclose(result.linear.upper_A * varies, whole.linear.upper_A * varies, rtol=0, atol=1e-10)
    for mine, theirs in zip(result.intermediate.lower + result.intermediate.upper,
                            whole.intermediate.lower + whole.intermediate.upper):
        assert torch.allclose(mine, theirs, rtol=0, atol=1e-10)


@pytest.mark.parametrize("seed", range(2))
def test_children_given_their_parents_bounds_match_and_hold(seed, monkeypatch):
    """Input splitting's children (the parent's bounds given, no interval pass first)."""
    network = two_set_network(seed)
    lower, upper = boxes(seed)
    parent = compute_bounds(network, (lower, upper), method="crown", intermediate_method="forward")
    middle = (lower + upper) / 2
    child_lower, child_upper = torch.cat([lower, middle]), torch.cat([middle, upper])
    parents = parent.intermediate.select(torch.cat([torch.arange(len(lower))] * 2))
    result = compute_bounds(network, (child_lower, child_upper), method="crown", intermediate_method="forward",
                            intermediate=parents)
    y = _tensor_of(network, child_lower, child_upper, seed)[-1]
    assert bool((y >= result.lower).all() and (y <= result.upper).all())
    _no_constants(monkeypatch)
    whole = compute_bounds(network, (child_lower, child_upper), method="crown", intermediate_method="forward",
                           intermediate=parents)
    assert torch.allclose(result.upper, whole.upper, rtol=0, atol=1e-10)
    assert torch.allclose(result.lower, whole.lower, rtol=0, atol=1e-10)


def test_a_point_box_is_constant_throughout_and_its_bounds_hold():
    """Nothing varies: every tensor is a constant, the rows' walk reaches no input (zero
    coefficients there) and the bounds still contain the network's value."""
    network = two_set_network(0)
    lower, _ = boxes(0)
    result = compute_bounds(network, (lower, lower), method="crown", intermediate_method="forward",
                            return_linear=True)
    with torch.no_grad():
        y = network.forward(lower)
    assert bool((y >= result.lower).all() and (y <= result.upper).all())
    assert float((result.upper - result.lower).max()) < 1e-12
    assert not bool(result.linear.upper_A.any())


def test_a_walk_that_stops_at_constants_equals_the_whole_walk():
    """backsubstitute's ``stops``: the same bound (to rounding) as walking every stage, with the
    rounding owed at least that of the whole walk's crossing of the constant tensors' stages."""
    network = two_set_network(1)
    lower, upper = boxes(1)
    plan = plan_for(network, torch.float64)
    eager = forward.Constants()
    known = forward.forward_bounds(plan, lower, upper, lambda t, lo, hi: (lo, hi), constants=eager)
    constants = eager.bounds
    bounds = interval_pass(plan, lower, upper, None, lambda t, lo, hi: (torch.maximum(lo, known[t][0]),
                                                                         torch.minimum(hi, known[t][1]))
                           if t in known else (lo, hi), given=constants, complete=constants)
    C = torch.eye(2, dtype=torch.float64).expand(len(lower), 2, 2)
    d = torch.zeros(len(lower), 2, dtype=torch.float64)
    center, radius = center_radius(lower, upper)
    whole = backsubstitute(plan, len(plan.stages), C, d, bounds)
    stopped = backsubstitute(plan, len(plan.stages), C, d, bounds, stops=list(constants))
    # the same coefficients on the inputs that vary; none on the second block, which the stopped
    # walk concretised where the whole one reached its (fixed) inputs
    varies = (upper > lower).unsqueeze(1)
    assert torch.allclose(stopped.A * varies, whole.A * varies, rtol=0, atol=1e-12)
    assert not bool(stopped.A[:, :, ROWS:].any()) and bool(whole.A[:, :, ROWS:].any())
    bound, margin = concretize(plan, stopped, center, radius)
    reference, _ = concretize(plan, whole, center, radius)
    assert torch.allclose(bound, reference, rtol=0, atol=1e-10)
    assert bool((margin > 0).all())


def test_stops_refuse_forks_grouped_rows_and_cuts():
    network = two_set_network(0)
    lower, upper = boxes(0)
    plan = plan_for(network, torch.float64)
    bounds = interval_pass(plan, lower, upper)
    C = torch.eye(2, dtype=torch.float64).expand(len(lower), 2, 2)
    d = torch.zeros(len(lower), 2, dtype=torch.float64)
    with pytest.raises(ValueError, match="stops"):
        backsubstitute(plan, len(plan.stages), C, d, bounds, stops=[13], reduce=lambda t, p: p.sum(-1))


def test_a_stop_of_infinite_bounds_is_walked_through():
    """A constant whose interval is not finite (an unbounded operator upstream) is no stop: the walk
    crosses it as usual, and the bound is the whole walk's (not −inf, not NaN)."""
    network = two_set_network(2)
    lower, upper = boxes(2)
    plan = plan_for(network, torch.float64)
    bounds = list(interval_pass(plan, lower, upper))
    bounds[13] = (torch.full_like(bounds[13][0], -torch.inf), torch.full_like(bounds[13][1], torch.inf))
    C = torch.eye(2, dtype=torch.float64).expand(len(lower), 2, 2)
    d = torch.zeros(len(lower), 2, dtype=torch.float64)
    center, radius = center_radius(lower, upper)
    whole, _ = concretize(plan, backsubstitute(plan, len(plan.stages), C, d, bounds), center, radius)
    stopped, _ = concretize(plan, backsubstitute(plan, len(plan.stages), C, d, bounds, stops=[13]), center, radius)
    assert bool(torch.isfinite(stopped).all())
    assert torch.equal(stopped, whole)


@pytest.mark.parametrize("seed", range(2))
def test_lazy_constants_bound_only_what_is_read_and_children_take_their_parents(seed, monkeypatch):
    """compute_bounds (CROWN rows) bounds constants lazily: a fixed block's inner tensors are
    never computed, a child takes its parent's bounds of the constant ReLU inputs (no interval
    rule runs inside the fixed block), and the rows' bounds are those of the eager computation."""
    network = two_set_network(seed)
    lower, upper = boxes(seed)
    made = []
    original = forward.Constants.given

    def spy(self, *args):
        made.append(self)
        return original(self, *args)

    monkeypatch.setattr(forward.Constants, "given", spy)
    parent = compute_bounds(network, (lower, upper), method="crown", intermediate_method="forward")
    assert made[-1].lazy and 16 in made[-1].tensors and 16 not in made[-1].bounds  # block 2's first product
    middle = (lower + upper) / 2
    child_lower, child_upper = torch.cat([lower, middle]), torch.cat([middle, upper])
    parents = parent.intermediate.select(torch.cat([torch.arange(len(lower))] * 2))
    crossed = []
    for kind in (OperatorStage, ReluStage):
        def counted(self, *args, _original=kind.interval, **kwargs):
            crossed.append(self.index)
            return _original(self, *args, **kwargs)

        monkeypatch.setattr(kind, "interval", counted)
    result = compute_bounds(network, (child_lower, child_upper), method="crown", intermediate_method="forward",
                            intermediate=parents)
    # block 2's stages from its first product to its mask product (tensors 16–21)
    assert not set(crossed) & set(range(15, 21)), f"the fixed block's stages were bounded again: {crossed}"
    y = _tensor_of(network, child_lower, child_upper, seed)[-1]
    assert bool((y >= result.lower).all() and (y <= result.upper).all())
    monkeypatch.undo()
    _no_constants(monkeypatch)
    whole = compute_bounds(network, (child_lower, child_upper), method="crown", intermediate_method="forward",
                           intermediate=parents)
    assert torch.allclose(result.upper, whole.upper, rtol=0, atol=1e-10)
    assert torch.allclose(result.lower, whole.lower, rtol=0, atol=1e-10)
    for mine, theirs in zip(result.intermediate.lower + result.intermediate.upper,
                            whole.intermediate.lower + whole.intermediate.upper):
        assert torch.allclose(mine, theirs, rtol=0, atol=1e-10)


def test_optimised_rows_get_every_constant_bounded():
    """α-CROWN's rows walk every stage: no constant is left unbounded for them."""
    network = two_set_network(0)
    lower, upper = boxes(0)
    result = compute_bounds(network, (lower, upper), method="alpha", intermediate_method="forward")
    y = _tensor_of(network, lower, upper, 0)[-1]
    assert bool(torch.isfinite(result.lower).all() and torch.isfinite(result.upper).all())
    assert bool((y >= result.lower).all() and (y <= result.upper).all())
