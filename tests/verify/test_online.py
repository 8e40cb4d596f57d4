"""Online verification: every HOLDS step is re-checked from scratch and by sampling, every
VIOLATED step carries a re-checked counterexample, for every combination of accelerations;
the Lipschitz distance and the INN containment test are pinned where they would go wrong."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import torch

from assay.bounds import compute_bounds, input_sensitivities, lipschitz_bounds
from assay.errors import OptionError, SpecError
from assay.nn import Linear, Network, ReLU
from assay.sets import Box
from assay.sets.spec import HalfSpaces, OutputSpec
from assay.verify import VerificationStatus, verify
from assay.verify.deadline import Deadline
from assay.verify.input_split import InputSplitting
from assay.verify.online import ACCELERATIONS, OnlineVerifier
from assay.verify.online.geometry import hausdorff_excess, relative_volumes
from assay.verify.problem import from_required
from assay.verify.search import Branches, SearchState, SearchStats, branch_and_bound
from tests.verify.networks import random_relu_network

HOLDS, VIOLATED = VerificationStatus.HOLDS, VerificationStatus.VIOLATED


def random_network(seed: int, widths=(3, 12, 12, 2)) -> Network:
    return random_relu_network(seed, widths)


def box(lower, upper) -> Box:
    return Box(torch.as_tensor(lower, dtype=torch.float64), torch.as_tensor(upper, dtype=torch.float64))


def perturbed(network: Network, rng, scale: float, last_only: bool) -> Network:
    layers = list(network.layers)
    affine = [i for i, layer in enumerate(layers) if isinstance(layer, Linear)]
    for i in affine[-1:] if last_only else affine:
        layer = layers[i]
        layers[i] = Linear(layer.weight + scale * torch.as_tensor(rng.normal(size=tuple(layer.weight.shape))),
                           layer.bias + scale * torch.as_tensor(rng.normal(size=tuple(layer.bias.shape))))
    return Network(tuple(layers), network.input_shape)


def upper_limit_spec(threshold: float) -> OutputSpec:
    """y_0 ≤ threshold (one row: threshold − y_0 ≥ 0)."""
    return OutputSpec((HalfSpaces(torch.tensor([[-1.0, 0.0]], dtype=torch.float64), torch.tensor([threshold]),),))


def near_max_problem(seed: int, margin: float, radius: float = 0.5, widths=(3, 12, 12, 2)):
    """A random network, the box [−radius, radius]³ and "y_0 ≤ its sampled maximum + margin"
    (negative margins make the property false): (network, rng, box, spec)."""
    network = random_network(seed, widths)
    rng = np.random.default_rng(seed)
    start = box(-radius * np.ones(3), radius * np.ones(3))
    y = network.forward(torch.as_tensor(rng.uniform(-radius, radius, (50_000, 3))))
    return network, rng, start, upper_limit_spec(float(y[:, 0].max()) + margin)


def sampled_violation(network, lower, upper, spec, rng, count=20_000) -> bool:
    x = torch.as_tensor(rng.uniform(lower.numpy(), upper.numpy(), size=(count, lower.numel())))
    corners = torch.as_tensor(list(itertools.product(*zip(lower.tolist(), upper.tolist()))), dtype=torch.float64)
    y = network.forward(torch.cat([x, corners]))
    return bool((~spec.contains(y)).any())


def pre_activations(network: Network, x: torch.Tensor) -> list[torch.Tensor]:
    values = []
    for index, layer in enumerate(network.layers):
        if isinstance(layer, ReLU):
            values.append(x)
        x = network.apply_layer(index, x)
    return values


def check_leaves(online: OnlineVerifier, network: Network, rng, per_leaf: int = 64):
    """What the verifier keeps must hold for the current network: every verified leaf's row
    bounds on its verified box, and every leaf's pre-activation bounds (layers that may be
    stale are ±inf), checked on points sampled in each leaf's verified box."""
    leaves = online.leaves
    lower, upper = leaves.checked_lower, leaves.checked_upper
    u = torch.as_tensor(rng.uniform(size=(len(leaves), per_leaf, lower.shape[1])))
    x = (lower.unsqueeze(1) + u * (upper - lower).unsqueeze(1)).reshape(-1, lower.shape[1])
    query = from_required(network, Box(online.lower, online.upper), online._spec)[0]
    rows = (network.forward(x) @ query.C.T + query.d).reshape(len(leaves), per_leaf, -1)
    verified = leaves.verified
    assert bool((rows[verified] <= leaves.row_upper[verified].unsqueeze(1) + 1e-9).all()), "a stored row bound fails"
    if leaves.bounds is not None:
        for k, value in enumerate(pre_activations(network, x)):
            value = value.reshape(len(leaves), per_leaf, -1)
            lo = leaves.bounds.lower[k].reshape(len(leaves), 1, -1)
            hi = leaves.bounds.upper[k].reshape(len(leaves), 1, -1)
            assert bool(((value >= lo - 1e-9) & (value <= hi + 1e-9)).all()), f"stored bounds of ReLU layer {k} fail"


def check_step(step, network, input_box, spec, rng):
    """The standard every step of every stream must meet."""
    if step.status is HOLDS:
        assert step.coverage == 1.0
        # The reference's HOLDS rests on its sound bounds alone, attack or not (an attack only
        # turns a search that would not answer HOLDS into VIOLATED sooner): none is run.
        reference = verify(network, input_box, spec=spec, timeout=60, attack_restarts=0)
        assert reference.status is HOLDS, f"online HOLDS, from scratch {reference.status.value}"
        assert not sampled_violation(network, input_box.lower.reshape(-1), input_box.upper.reshape(-1), spec, rng)
    elif step.status is VIOLATED:
        x = step.counterexample.input.reshape(1, -1)
        assert bool(((input_box.lower.reshape(-1) <= x) & (x <= input_box.upper.reshape(-1))).all())
        assert not bool(spec.contains(network.forward(x))[0])
    else:
        assert 0.0 <= step.coverage < 1.0 or step.status is VerificationStatus.TIMEOUT


# Every acceleration, alone where it acts alone and with the one it needs otherwise.
COMBINATIONS = ["none", "all", "bmi", "bmw", "bmi,lb", "bmi,rsr", "bmi,lb,rsr", "bmw,inn", "bmw,ic", "bmw,inn,ic",
                "bmi,lb,rsr,bmw,inn"]


def random_stream(seed: int, steps: int):
    """Domain moves (grow, shrink, shift) and weight updates (all layers or the last), mixed."""
    rng = np.random.default_rng(seed)
    lower, upper = -0.5 * np.ones(3), 0.5 * np.ones(3)
    for _ in range(steps):
        kind = rng.choice(["grow", "shrink", "move", "weights", "last", "both"])
        if kind in ("grow", "both"):
            dim = rng.integers(3)
            lower[dim] -= rng.uniform(0, 0.03)
            upper[dim] += rng.uniform(0, 0.03)
        elif kind == "shrink":
            lower, upper = lower + rng.uniform(0, 0.02, 3), upper - rng.uniform(0, 0.02, 3)
        elif kind == "move":
            shift = rng.uniform(-0.03, 0.03, 3)
            lower, upper = lower + shift, upper + shift
        yield kind, lower.copy(), upper.copy()


def run_stream(online: OnlineVerifier, seed: int, steps: int, spec, rng, check_kept: bool) -> set:
    """Step ``online`` through a random stream, checking every step (and, for input-splitting
    leaves, every kept bound); returns the statuses seen."""
    check_step(online.steps[0], online.network, Box(online.lower, online.upper), spec, rng)
    seen = set()
    for kind, lower, upper in random_stream(seed, steps):
        current = online.network
        if kind in ("weights", "last", "both"):
            current = perturbed(current, rng, 3e-3, last_only=kind == "last")
        step = online.update(box(lower, upper), network=current)
        check_step(step, current, box(lower, upper), spec, rng)
        assert 0.0 <= step.coverage <= 1.0
        if check_kept:
            check_leaves(online, current, rng)
        seen.add(step.status)
    return seen


@pytest.mark.parametrize(("accelerations", "seed"), [(name, number % 3) for number, name in enumerate(COMBINATIONS)])
def test_every_step_of_a_random_stream_is_confirmed(accelerations, seed):
    rng = np.random.default_rng(100 + seed)
    network = random_network(seed)
    start = box(-0.5 * np.ones(3), 0.5 * np.ones(3))
    # A threshold just above the sampled maximum: some steps hold, some are violated.
    y = network.forward(torch.as_tensor(rng.uniform(-0.55, 0.55, (50_000, 3))))
    spec = upper_limit_spec(float(y[:, 0].max()) - 0.01 * seed)
    online = OnlineVerifier(network, start, spec=spec, accelerations=accelerations, max_leaves=64, timeout=30)
    seen = run_stream(online, seed, 10, spec, rng, check_kept=True)
    assert seen & {HOLDS, VIOLATED}, "the stream should decide some steps"


# Each acceleration that acts on ReLU-splitting leaves, alone or with the one it needs; "all" runs rsr
# beside the others. (RSR's box bookkeeping has a direct test: a leaf proved on a box smaller than X(t)
# counts for nothing, tests/verify/test_online_streams.py.)
@pytest.mark.parametrize(("accelerations", "seed"), [("none", 0), ("bmi", 1), ("bmw,ic", 1), ("all", 2)])
def test_every_step_over_relu_splitting_leaves_is_confirmed(accelerations, seed):
    """The same streams with ReLU-splitting leaves (the strategy for networks with many inputs)."""
    rng = np.random.default_rng(200 + seed)
    network = random_network(20 + seed, widths=(3, 10, 10, 2))
    start = box(-0.5 * np.ones(3), 0.5 * np.ones(3))
    y = network.forward(torch.as_tensor(rng.uniform(-0.55, 0.55, (50_000, 3))))
    spec = upper_limit_spec(float(y[:, 0].max()) - 0.01 * seed)
    online = OnlineVerifier(network, start, spec=spec, accelerations=accelerations, strategy="relu", max_leaves=64,
                            timeout=30)
    run_stream(online, seed, 8, spec, rng, check_kept=False)


def test_bounds_kept_for_leaves_off_the_domain_are_renewed_after_an_update():
    """Leaves outside the domain are not bounded at a network update; what they keep from the
    old network (pre-activation bounds after the changed layer) must not be used later."""
    network, rng, start, spec = near_max_problem(10, 0.02, radius=1.0)
    online = OnlineVerifier(network, start, spec=spec, accelerations="bmi,bmw,ic", max_leaves=64)
    assert len(online.leaves) > 4
    online.update(box(0.8 * np.ones(3), np.ones(3)))  # most leaves leave the domain
    layers = list(network.layers)
    layers[2] = Linear(layers[2].weight, layers[2].bias + 1.0)  # the second hidden layer moves
    updated = Network(tuple(layers), network.input_shape)
    online.update(network=updated)
    check_leaves(online, updated, rng)
    step = online.update(start)  # back to the whole domain, same network
    check_step(step, updated, start, spec, rng)
    check_leaves(online, updated, rng)


def test_incremental_computation_keeps_the_bounds_of_unchanged_layers():
    """Fine-tuning the last layer: every leaf starts from its own bounds of the hidden layers
    (finite, not reset), so the tree is bounded again without any new split."""
    network, rng, start, spec = near_max_problem(11, 0.02)
    online = OnlineVerifier(network, start, spec=spec, accelerations="bmw,ic", max_leaves=64)
    before = len(online.leaves)
    tuned = perturbed(network, rng, 1e-4, last_only=True)
    step = online.update(network=tuned)
    assert step.status is HOLDS and step.resplit == 0 and len(online.leaves) == before
    assert all(bool(torch.isfinite(t).all()) for t in online.leaves.bounds.lower)
    check_leaves(online, tuned, rng)


def test_incremental_computation_splits_exactly_as_much_as_bounding_again():
    """The layers IC keeps are exact for the leaves it starts from (the same bounds CROWN would
    compute again), not for their children: children must tighten every layer. Then the search
    after a last-layer update is the same with and without IC, split for split."""
    network, rng, start, spec = near_max_problem(16, 0.03, radius=1.0, widths=(3, 16, 16, 2))
    layers = list(network.layers)
    layers[-1] = Linear(layers[-1].weight, layers[-1].bias + torch.tensor([0.02, 0.0], dtype=torch.float64))
    tuned = Network(tuple(layers), network.input_shape)
    steps = {}
    for accelerations in ("bmw", "bmw,ic"):
        online = OnlineVerifier(network, start, spec=spec, accelerations=accelerations, max_leaves=2000,
                                rebuild_drop=None)
        steps[accelerations] = online.update(network=tuned)
        check_step(steps[accelerations], tuned, start, spec, rng)
    assert steps["bmw"].resplit > 0, "the update should make some leaves split"
    assert (steps["bmw,ic"].leaves, steps["bmw,ic"].domains) == (steps["bmw"].leaves, steps["bmw"].domains)


def test_adaptive_rsr_covers_a_steady_drift_with_fewer_bound_passes():
    network = random_network(13)
    spec = upper_limit_spec(10.0)
    passes = {}
    for adaptive in (False, True):
        online = OnlineVerifier(network, box(-np.ones(3), np.ones(3)), spec=spec, accelerations="bmi,rsr",
                                rsr_offset=1e-3, rsr_adaptive=adaptive)
        steps = [online.update(box(-np.ones(3), (1 + 1e-3 * t) * np.ones(3))) for t in range(1, 17)]
        assert all(step.status is HOLDS for step in steps)
        passes[adaptive] = sum(step.domains > 0 for step in steps)
    assert passes[False] >= 7 and passes[True] <= 5


def test_leaves_partition_the_domain_after_every_step():
    network = random_network(3)
    spec = upper_limit_spec(10.0)
    online = OnlineVerifier(network, box(-np.ones(3), np.ones(3)), spec=spec, accelerations="all", max_leaves=40)
    for lower, upper in [(-1.1 * np.ones(3), np.ones(3)), (np.array([-1.0, -0.5, -2.0]), np.array([0.3, 1.5, 1.0]))]:
        step = online.update(box(lower, upper))
        leaves = online.leaves
        lo = torch.maximum(leaves.cell_lower, torch.as_tensor(lower))
        hi = torch.minimum(leaves.cell_upper, torch.as_tensor(upper))
        active = (lo <= hi).all(1)
        total = relative_volumes(lo[active], hi[active], torch.as_tensor(lower), torch.as_tensor(upper)).sum()
        assert float(total) == pytest.approx(1.0, abs=1e-12)
        assert step.status is HOLDS and step.coverage == 1.0


def test_a_reused_step_does_no_bound_work_and_is_reported():
    network = random_network(4)
    spec = upper_limit_spec(10.0)
    online = OnlineVerifier(network, box(-np.ones(3), np.ones(3)), spec=spec, accelerations="bmi")
    step = online.update(box(-0.9 * np.ones(3), 0.9 * np.ones(3)))  # shrinks: every leaf is inside its verified box
    assert step.status is HOLDS and step.domains == 0 and step.recomputed == 0 and step.reused == step.active


# ---------------------------------------------------------------------------- the Lipschitz test
def test_directed_hausdorff_distance_counts_corners():
    old_lower, old_upper = torch.zeros(1, 2, dtype=torch.float64), torch.ones(1, 2, dtype=torch.float64)
    new_lower, new_upper = torch.zeros(1, 2, dtype=torch.float64), torch.full((1, 2), 1.1, dtype=torch.float64)
    assert float(hausdorff_excess(new_lower, new_upper, old_lower, old_upper, "inf")) == pytest.approx(0.1)
    # The corner (1.1, 1.1) is 0.1·√2 from the old box, not 0.1.
    assert float(hausdorff_excess(new_lower, new_upper, old_lower, old_upper, "2")) >= 0.1 * math.sqrt(2)
    # Shrinking and moving inside: no distance; a move out on one side only: that side.
    assert float(hausdorff_excess(old_lower + 0.2, old_upper - 0.2, old_lower, old_upper, "2")) == 0.0
    shift = torch.tensor([[0.3, 0.0]], dtype=torch.float64)
    moved = hausdorff_excess(old_lower + shift, old_upper + shift,
                             old_lower, old_upper, "2")
    assert float(moved) == pytest.approx(0.3, rel=1e-12)


def two_relu_sum() -> Network:
    """y = relu(x_1) + relu(x_2) (and a second output 0): ℓ2 Lipschitz constant exactly √2."""
    return Network((Linear(torch.eye(2, dtype=torch.float64), torch.zeros(2, dtype=torch.float64)), ReLU(),
                    Linear(torch.tensor([[1.0, 1.0], [0.0, 0.0]], dtype=torch.float64), torch.zeros(2, dtype=torch.float64))),
                   (2,))


@pytest.mark.parametrize("norm", ["2", "inf"])
def test_lipschitz_skip_is_not_fooled_by_a_corner(norm):
    """[0,1]² grows to [0,1.1]²: max y goes from 2 to 2.2. With y ≤ 2.17 required, a skip
    that reads the distance as 0.1 (not 0.1·√2 at the corner) would claim 2 + √2·0.1 < 2.17."""
    network = two_relu_sum()
    spec = upper_limit_spec(2.17)
    online = OnlineVerifier(network, box([0.0, 0.0], [1.0, 1.0]), spec=spec, accelerations="bmi,lb",
                            lipschitz_norm=norm, max_leaves=8)
    assert online.steps[0].status is HOLDS
    step = online.update(box([0.0, 0.0], [1.1, 1.1]))
    assert step.status is VIOLATED and step.skipped["lb"] == 0
    check_step(step, network, box([0.0, 0.0], [1.1, 1.1]), spec, np.random.default_rng(0))
    # A small enough move is skipped by the test, soundly.
    online = OnlineVerifier(network, box([0.0, 0.0], [1.0, 1.0]), spec=spec, accelerations="bmi,lb",
                            lipschitz_norm=norm, max_leaves=8)
    step = online.update(box([0.0, 0.0], [1.05, 1.05]))
    assert step.status is HOLDS and step.skipped["lb"] >= 1 and step.domains == 0


@pytest.mark.parametrize("norm", ["inf", "2"])
def test_lipschitz_bounds_hold_on_random_pairs(norm):
    network = random_network(5, widths=(4, 16, 16, 3))
    rows = torch.tensor([[1.0, -2.0, 0.5], [0.0, 1.0, 0.0]], dtype=torch.float64)
    constants = lipschitz_bounds(network, rows, norm)
    rng = np.random.default_rng(0)
    x = torch.as_tensor(rng.normal(size=(5000, 4)))
    x2 = x + torch.as_tensor(rng.normal(scale=0.3, size=(5000, 4)))
    change = ((network.forward(x) - network.forward(x2)) @ rows.T).abs()
    distance = (x - x2).abs().amax(1) if norm == "inf" else (x - x2).norm(dim=1)
    ratio = change / distance.unsqueeze(1)
    assert bool((ratio <= constants).all())
    assert bool((ratio.amax(0) >= 0.05 * constants).all())  # and not absurdly loose


def test_input_sensitivities_bound_every_pre_activation_change():
    network = random_network(12, widths=(4, 16, 16, 3))
    sensitivities = input_sensitivities(network)
    rng = np.random.default_rng(1)
    x = torch.as_tensor(rng.normal(size=(4000, 4)))
    x2 = x + torch.as_tensor(rng.normal(scale=0.2, size=(4000, 4)))
    for value, value2, sensitivity in zip(pre_activations(network, x), pre_activations(network, x2), sensitivities):
        bound = (x - x2).abs() @ sensitivity.T
        assert bool(((value - value2).abs() <= bound + 1e-12).all())


# ---------------------------------------------------------------------------- INN
@pytest.mark.parametrize("where", ["last bias", "first weight"])
def test_inn_skips_only_networks_inside_its_intervals(where):
    """After a tiny update sets the intervals, an update that leaves them by one parameter
    and breaks the property must be verified again (and found violated), not skipped."""
    network, rng, start, spec = near_max_problem(6, 0.05)
    online = OnlineVerifier(network, start, spec=spec, accelerations="bmw,inn", max_leaves=64)
    assert online.steps[0].status is HOLDS
    small = perturbed(network, rng, 1e-5, last_only=False)
    step = online.update(network=small)
    assert step.status is HOLDS
    step = online.update(network=perturbed(small, rng, 1e-6, last_only=False))  # inside the intervals
    assert step.status is HOLDS and step.skipped["inn"] > 0 and step.recomputed == step.active - step.skipped["inn"]
    layers = list(online.network.layers)
    if where == "last bias":
        last = layers[-1]
        layers[-1] = Linear(last.weight, last.bias + torch.tensor([0.5, 0.0], dtype=torch.float64))
    else:  # the first layer's weights, far outside their intervals (the last layer untouched)
        first = layers[0]
        layers[0] = Linear(4.0 * first.weight, first.bias)
    broken = Network(tuple(layers), network.input_shape)
    truth = verify(broken, start, spec=spec, timeout=60)
    assert truth.status is VIOLATED
    step = online.update(network=broken)
    assert step.skipped["inn"] == 0 and step.status is VIOLATED
    check_step(step, broken, start, spec, rng)


# ---------------------------------------------------------------------------- engine and search pieces
def test_fixed_layers_reuse_bounds_of_unchanged_layers_soundly():
    network = random_network(7, widths=(3, 16, 16, 2))
    lower, upper = -torch.ones(1, 3, dtype=torch.float64), torch.ones(1, 3, dtype=torch.float64)
    first = compute_bounds(network, (lower, upper), method="crown")
    layers = list(network.layers)
    layers[-1] = Linear(layers[-1].weight * 1.1, layers[-1].bias + 0.05)
    tuned = Network(tuple(layers), network.input_shape)
    again = compute_bounds(tuned, (lower, upper), method="crown", intermediate=first.intermediate, fixed_layers=2)
    fresh = compute_bounds(tuned, (lower, upper), method="crown")
    assert torch.allclose(again.lower, fresh.lower, atol=1e-9) and torch.allclose(again.upper, fresh.upper, atol=1e-9)
    y = tuned.forward(torch.as_tensor(np.random.default_rng(0).uniform(-1, 1, (20_000, 3))))
    assert bool((y >= again.lower).all() and (y <= again.upper).all())
    with pytest.raises(OptionError, match="fixed_layers"):
        compute_bounds(tuned, (lower, upper), method="crown", fixed_layers=1)


def test_a_leaf_budget_keeps_a_partition_and_answers_unknown():
    network = random_network(8)
    query = from_required(network, box(-np.ones(3), np.ones(3)), upper_limit_spec(-5.0))  # hopeless: never closed
    query = query[0]
    strategy = InputSplitting(network, query, method="crown", clip=False)
    root = Branches(query.lower.unsqueeze(0), query.upper.unsqueeze(0), None, None, torch.ones(1, dtype=torch.float64))
    stats = SearchStats()
    outcome = branch_and_bound(strategy, SearchState.start(root), Deadline(), batch_size=64, stats=stats,
                               keep_closed=True, max_leaves=20)
    state = outcome.state
    assert outcome.status in (VerificationStatus.UNKNOWN, VIOLATED)
    if outcome.status is VerificationStatus.UNKNOWN:
        leaves = Branches.concat([*state.closed, *state.unresolved])
        assert len(leaves) <= 20 and state.pending_count == 0
        assert float(leaves.weight.sum()) == pytest.approx(1.0, abs=1e-12)
    with pytest.raises(ValueError, match="keep_closed"):
        branch_and_bound(strategy, SearchState.start(root), Deadline(), batch_size=64, stats=stats, max_leaves=20)


def test_bad_input_is_a_clear_error():
    network = random_network(9)
    spec = upper_limit_spec(10.0)
    with pytest.raises(OptionError, match="unknown acceleration"):
        OnlineVerifier(network, box(-np.ones(3), np.ones(3)), spec=spec, accelerations="bmi,warp")
    # An acceleration without the one whose leaves it acts on would silently do nothing.
    for alone, needed in [("lb", "bmi"), ("rsr", "bmi"), ("inn", "bmw"), ("ic", "bmw")]:
        assert alone in ACCELERATIONS
        with pytest.raises(OptionError, match=f"'{alone}' needs '{needed}'"):
            OnlineVerifier(network, box(-np.ones(3), np.ones(3)), spec=spec, accelerations=alone)
    online = OnlineVerifier(network, box(-np.ones(3), np.ones(3)), spec=spec)
    with pytest.raises(SpecError, match="3 inputs"):
        online.update(box(-np.ones(4), np.ones(4)))
    with pytest.raises(OptionError, match="Linear/Conv2d layers"):
        online.update(weights=[(torch.zeros(12, 3), torch.zeros(12))])
    with pytest.raises(SpecError, match="same layers"):
        online.update(network=random_network(9, widths=(3, 8, 2)))


def test_a_relu_leaves_step_bounds_no_root_and_searches_each_conjunction_with_its_rows(monkeypatch):
    """A step over kept ReLU-splitting leaves searches from those leaves only: it must not pay for
    the root's α-CROWN bounds (the costly part of building a search), and each conjunction's
    strategy carries that conjunction's rows (as the searches built with root bounds do)."""
    from assay.verify import relu_split
    from assay.verify.problem import from_unsafe
    from assay.verify.relu_split import conjunction_searches, conjunction_strategies

    # two conjunctions: y_0 ≥ t or y_1 ≥ t' is unsafe
    network = random_network(21, widths=(3, 10, 10, 2))
    start = box(-0.5 * np.ones(3), 0.5 * np.ones(3))
    y = network.forward(torch.as_tensor(np.random.default_rng(0).uniform(-0.5, 0.5, (20_000, 3))))
    top = y.max(0).values
    unsafe = OutputSpec((HalfSpaces(torch.tensor([[-1.0, 0.0]], dtype=torch.float64), torch.tensor([-(float(top[0]) + 0.3)])),
                         HalfSpaces(torch.tensor([[0.0, -1.0]], dtype=torch.float64), torch.tensor([-(float(top[1]) + 0.3)]))))
    query = from_unsafe(network, start, unsafe)[0]
    assert query.num_groups == 2
    built = conjunction_searches(network, query)
    plain = conjunction_strategies(network, query)
    assert len(plain) == len(built) == 2
    for strategy, (reference, _) in zip(plain, built):
        assert torch.equal(strategy.C, reference.C) and torch.equal(strategy.d, reference.d)
        assert strategy.root_bounds is None and reference.root_bounds is not None
    online = OnlineVerifier(network, start, unsafe=unsafe, accelerations="bmi,bmw", strategy="relu", max_leaves=64)
    assert online.steps[0].status is HOLDS

    def no_root(*args, **kwargs):
        raise AssertionError("a step over kept leaves bounded the root")

    monkeypatch.setattr(relu_split, "_root_bounds", no_root)
    moved = box(-0.45 * np.ones(3), 0.55 * np.ones(3))
    step = online.update(moved)
    assert step.status is HOLDS
    monkeypatch.undo()
    reference = verify(network, moved, unsafe=unsafe, timeout=60, attack_restarts=0, strategy="relu")
    assert reference.status is HOLDS


@pytest.mark.parametrize("strategy", ["input", "relu"])
def test_a_verdict_proved_on_a_box_smaller_than_the_step_never_makes_it_hold(strategy, monkeypatch):
    """RSR bounds leaves on X(t) grown by an offset. Were that bookkeeping wrong (simulated here:
    the "grown" box shrunk by 0.1), leaves would be proved on a box that misses part of X(t);
    the step must then not hold. y = x on [0, 0.5] holds below 0.55; the next step's box [0, 0.6]
    is violated at x > 0.55, outside the shrunk box [0.1, 0.5] where the leaves are proved."""
    from assay.verify.online import relu_tree, verifier

    def shrunk(lower, upper, offset):
        return lower + 0.1, upper - 0.1

    monkeypatch.setattr(verifier, "enlarge", shrunk)
    monkeypatch.setattr(relu_tree, "enlarge", shrunk)
    eye = torch.eye(2, dtype=torch.float64)
    network = Network((Linear(torch.tensor([[1.0], [0.0]], dtype=torch.float64), torch.zeros(2, dtype=torch.float64)),
                       ReLU(), Linear(eye, torch.zeros(2, dtype=torch.float64))), (1,))
    online = OnlineVerifier(network, box([0.0], [0.5]), spec=upper_limit_spec(0.55), accelerations="bmi,rsr",
                            strategy=strategy, timeout=30)
    assert online.steps[0].status is HOLDS
    step = online.update(box([0.0], [0.6]))
    assert step.status is not HOLDS and step.coverage < 1.0
