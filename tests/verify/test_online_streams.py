"""Online verification over streams of box moves, network swaps and weight updates, with
disjunctive and conjunctive unsafe regions: every step's verdict is compared with verifying that
step from scratch, every HOLDS is attacked by sampling (and, on small networks, checked by
Marabou), every VIOLATED carries a re-checked counterexample. The streams run over ReLU-splitting
leaves (networks with more than 16 inputs, and ``strategy="relu"`` on small ones) and over
input-splitting leaves.

``ASSAY_STREAM_EXAMPLES`` sets how many streams hypothesis draws per family of small networks
(default 15) and ``ASSAY_STREAM_EXAMPLES_LARGE`` per family of 18- and 20-input ones (default 3,
their from-scratch checks cost more); ``benchmarks/online_streams.py`` runs the same streams long
and seeded (over 1,000 steps)."""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, seed, settings
from hypothesis import strategies as st

from assay.nn import Linear, Network, ReLU
from assay.sets import Box
from assay.sets.spec import HalfSpaces, OutputSpec
from assay.verify import VerificationStatus, verify
from assay.verify.online import OnlineVerifier
from assay.verify.online.leaves import check_current
from tests.requirements import require

HOLDS, VIOLATED = VerificationStatus.HOLDS, VerificationStatus.VIOLATED
EXAMPLES = int(os.environ.get("ASSAY_STREAM_EXAMPLES", "15"))
EXAMPLES_LARGE = int(os.environ.get("ASSAY_STREAM_EXAMPLES_LARGE", "3"))


# ---------------------------------------------------------------------------- networks
def two_sided(inputs: int, a: float, b: float = 0.1, shift: float = 0.5) -> Network:
    """``Y0 = a·relu(x0 − shift) + b·relu(x1)``, ``Y1 = a·relu(−x0 − shift) + b·relu(−x1)``: Y0 lives on
    the right of x0, Y1 on the left, so a box move can settle one output while the other stays."""
    W1 = torch.zeros(4, inputs, dtype=torch.float64)
    W1[0, 0], W1[1, 0], W1[2, 1], W1[3, 1] = 1, -1, 1, -1
    b1 = torch.tensor([-shift, -shift, 0.0, 0.0], dtype=torch.float64)
    W2 = torch.tensor([[a, 0, b, 0], [0, a, 0, b]], dtype=torch.float64)
    return Network((Linear(W1, b1), ReLU(), Linear(W2, torch.zeros(2, dtype=torch.float64))), (inputs,))


def random_mlp(seed_: int, inputs: int, hidden: int = 8) -> Network:
    """A two-hidden-layer ReLU network whose first two inputs matter most (the rest are small)."""
    rng = np.random.default_rng(seed_)
    W1 = rng.normal(0, 1 / np.sqrt(2), (hidden, inputs))
    W1[:, 2:] *= 0.05
    layers = (Linear(torch.as_tensor(W1), torch.as_tensor(rng.normal(0, 0.1, hidden))), ReLU(),
              Linear(torch.as_tensor(rng.normal(0, 1 / np.sqrt(hidden), (hidden, hidden))),
                     torch.as_tensor(rng.normal(0, 0.1, hidden))), ReLU(),
              Linear(torch.as_tensor(rng.normal(0, 1 / np.sqrt(hidden), (2, hidden))), torch.as_tensor(rng.normal(0, 0.1, 2))))
    return Network(layers, (inputs,))


def scaled_last_layer(network: Network, factor: float, noise: float, rng: np.random.Generator) -> Network:
    layers = list(network.layers)
    last = layers[-1]
    layers[-1] = Linear(last.weight * factor + noise * torch.as_tensor(rng.normal(size=tuple(last.weight.shape))),
                        last.bias + noise * torch.as_tensor(rng.normal(size=tuple(last.bias.shape))))
    return Network(tuple(layers), network.input_shape)


def perturbed_all(network: Network, scale: float, rng: np.random.Generator) -> Network:
    layers = [Linear(layer.weight + scale * torch.as_tensor(rng.normal(size=tuple(layer.weight.shape))),
                     layer.bias + scale * torch.as_tensor(rng.normal(size=tuple(layer.bias.shape))))
              if isinstance(layer, Linear) else layer for layer in network.layers]
    return Network(tuple(layers), network.input_shape)


# ---------------------------------------------------------------------------- properties
def output_at_least(rows: list[tuple[int, float]]) -> HalfSpaces:
    """The conjunction of ``y_j ≥ t`` for each (j, t)."""
    C = torch.zeros(len(rows), 2, dtype=torch.float64)
    d = torch.zeros(len(rows), dtype=torch.float64)
    for k, (j, t) in enumerate(rows):
        C[k, j], d[k] = 1.0, -t
    return HalfSpaces(C, d)


def unsafe_region(kind: str, t0: float, t1: float) -> OutputSpec:
    """``or``: Y0 ≥ t0 or Y1 ≥ t1; ``and``: Y0 ≥ t0 and Y1 ≥ t1; ``one``: Y0 ≥ t0."""
    if kind == "or":
        return OutputSpec((output_at_least([(0, t0)]), output_at_least([(1, t1)])))
    if kind == "and":
        return OutputSpec((output_at_least([(0, t0), (1, t1)]),))
    return OutputSpec((output_at_least([(0, t0)]),))


# ---------------------------------------------------------------------------- checks
def falsified_by_sampling(network: Network, lower, upper, unsafe: OutputSpec, rng, count=4096) -> bool:
    x = torch.as_tensor(rng.uniform(lower.numpy(), upper.numpy(), size=(count, lower.numel())))
    # Points on the faces of x0 and x1, where these networks peak.
    edges = x[:64].clone()
    edges[:, 0] = torch.where(torch.arange(64) % 2 == 0, lower[0], upper[0])
    edges[:, 1] = torch.where(torch.arange(64) % 4 < 2, lower[1], upper[1])
    return bool(unsafe.contains(network.forward(torch.cat([x, edges]))).any())


def marabou_finds_a_violation(network: Network, lower, upper, unsafe: OutputSpec) -> bool:
    from assay.verify.marabou import solve_network

    for conjunction in unsafe.conjunctions:
        answer, _, _ = solve_network(network, lower, upper, conjunction.C.numpy(), conjunction.d.numpy(), timeout=30)
        if answer == "sat":
            return True
    return False


@dataclass
class Tally:
    steps: int = 0
    holds: int = 0
    violated: int = 0


def check_step(step, network, lower, upper, unsafe, rng, tally: Tally, marabou: bool):
    tally.steps += 1
    box = Box(lower, upper)
    if step.status is HOLDS:
        tally.holds += 1
        scratch = verify(network, box, unsafe=unsafe, timeout=60)
        assert scratch.status is not VIOLATED, f"online HOLDS at step {step.step}, from scratch VIOLATED"
        assert not falsified_by_sampling(network, lower, upper, unsafe, rng), f"online HOLDS at step {step.step}, sampling violates"
        if marabou:
            assert not marabou_finds_a_violation(network, lower, upper, unsafe), f"online HOLDS at step {step.step}, Marabou sat"
    elif step.status is VIOLATED:
        tally.violated += 1
        x = step.counterexample.input.reshape(1, -1).to(torch.float64)
        assert bool(((lower <= x) & (x <= upper)).all()), "the counterexample leaves the box"
        assert bool(unsafe.contains(network.forward(x))[0]), "the counterexample does not violate"
    else:
        assert step.coverage < 1.0 or step.status is VerificationStatus.TIMEOUT


# ---------------------------------------------------------------------------- streams
ACCELERATIONS = ["all", "bmi,bmw", "bmi,rsr,bmw,ic", "bmi,lb,bmw,inn", "bmw,ic"]

# Box moves: shift x0 and x1, clip one side of one of them, restore the first box.
box_moves = st.one_of(
    st.tuples(st.just("shift"), st.floats(-0.3, 0.3), st.floats(-0.3, 0.3)),
    st.tuples(st.just("clip"), st.sampled_from(["left", "right", "bottom", "top"]), st.floats(0.2, 0.8)),
    st.tuples(st.just("restore"), st.just(0.0), st.just(0.0)),
)
# Network changes: scale the last layer (plus noise), perturb every layer, swap to another network.
network_changes = st.one_of(
    st.tuples(st.just("scale"), st.floats(0.5, 5.0), st.floats(0.0, 0.05)),
    st.tuples(st.just("perturb"), st.floats(1e-3, 5e-2), st.just(0.0)),
    st.tuples(st.just("swap"), st.integers(0, 3), st.just(0.0)),
)
# The two-sided networks: moves of x0 (which side of x0 is in the box decides which output can
# be large) and changes of the output scale.
two_sided_moves = st.one_of(
    st.tuples(st.just("clip"), st.sampled_from(["left", "right"]), st.floats(0.1, 0.8)),
    st.tuples(st.just("clip"), st.sampled_from(["left", "right"]), st.floats(0.25, 0.8)),
    st.tuples(st.just("shift"), st.floats(-0.4, 0.4), st.just(0.0)),
    st.tuples(st.just("restore"), st.just(0.0), st.just(0.0)),
)
two_sided_changes = st.one_of(
    st.tuples(st.just("swap"), st.integers(0, 3), st.just(0.0)),
    st.tuples(st.just("scale"), st.floats(0.5, 5.0), st.just(0.0)),
)


def stream_events(moves, changes):
    """Changes alternate between the network and the box more often than not: a network change
    that leaves one disjunct violated, then a box move that settles it, is where stale leaves hide."""
    groups = st.tuples(changes, moves).map(list) | st.lists(moves | changes, min_size=1, max_size=2)
    return st.lists(groups, min_size=1, max_size=4).map(lambda parts: [event for part in parts for event in part])


# The two-sided streams are pairs (a network change, then a box move) with an optional last
# move: the order in which a stale leaf of another disjunct shows.
two_sided_events = st.tuples(st.lists(st.tuples(two_sided_changes, two_sided_moves), min_size=1, max_size=3),
                             st.lists(two_sided_moves, max_size=1)).map(
    lambda parts: [event for pair in parts[0] for event in pair] + parts[1])
EVENTS = {"two_sided": two_sided_events, "random": stream_events(box_moves, network_changes)}
# Disjunctions (several searches, one of which may stop early) are drawn most often.
KINDS = {"two_sided": st.sampled_from(["or", "or", "or", "and", "one"]), "random": st.sampled_from(["or", "or", "and", "one"])}
# Thresholds: the two-sided networks start with outputs ≤ 0.6, so step 0 holds above it.
THRESHOLDS = {"two_sided": st.floats(0.65, 1.5), "random": st.floats(0.2, 1.5)}


def run_stream(*, family: str, inputs: int, strategy: str, kind: str, accelerations: str, events, net_seed: int,
               t0: float, t1: float, tally: Tally):
    rng = np.random.default_rng(net_seed)
    networks = ([two_sided(inputs, a) for a in (1.0, 4.0, 2.0, 0.5)] if family == "two_sided"
                else [random_mlp(net_seed + k, inputs) for k in range(4)])
    base_lower, base_upper = -torch.ones(inputs, dtype=torch.float64), torch.ones(inputs, dtype=torch.float64)
    lower, upper = base_lower.clone(), base_upper.clone()
    network = networks[0]
    unsafe = unsafe_region(kind, t0, t1)
    marabou = inputs <= 3 and os.environ.get("ASSAY_STREAM_MARABOU", "1") == "1"
    online = OnlineVerifier(network, Box(lower, upper), unsafe=unsafe, accelerations=accelerations, strategy=strategy,
                            max_leaves=48, timeout=30)
    check_step(online.steps[0], network, lower, upper, unsafe, rng, tally, marabou)
    for event, p, q in events:
        new_network = None
        if event == "shift":
            lower, upper = lower.clone(), upper.clone()
            lower[0], upper[0] = base_lower[0] + p, base_upper[0] + p
            lower[1], upper[1] = base_lower[1] + q, base_upper[1] + q
        elif event == "clip":
            lower, upper = lower.clone(), upper.clone()
            if p == "left":
                lower[0] = torch.minimum(upper[0], lower[0] + 2 * q)
            elif p == "right":
                upper[0] = torch.maximum(lower[0], upper[0] - 2 * q)
            elif p == "bottom":
                lower[1] = torch.minimum(upper[1], lower[1] + 2 * q)
            else:
                upper[1] = torch.maximum(lower[1], upper[1] - 2 * q)
        elif event == "restore":
            lower, upper = base_lower.clone(), base_upper.clone()
        elif event == "scale":
            new_network = scaled_last_layer(network, p, q, rng)
        elif event == "perturb":
            new_network = perturbed_all(network, p, rng)
        else:
            new_network = networks[p]
        if new_network is not None:
            network = new_network
            step = online.update(Box(lower, upper), network=network)
        else:
            step = online.update(Box(lower, upper))
        check_step(step, network, lower, upper, unsafe, rng, tally, marabou)


def test_check_current_names_the_stale_leaf():
    versions = torch.tensor([3, 3, 2, 3])
    check_current(versions, torch.tensor([True, True, False, True]), 3, "ReLU-splitting")
    with pytest.raises(AssertionError, match="ReLU-splitting leaf 2, proved for network version 2"):
        check_current(versions, torch.tensor([False, False, True, False]), 3, "ReLU-splitting")


@pytest.mark.parametrize(("inputs", "strategy"), [(20, "auto"), (2, "relu"), (2, "input")])
def test_a_counterexample_in_one_disjunct_does_not_leave_the_others_proved_for_the_old_network(inputs, strategy):
    """Issue 31's case: f1 violates Y0 ≥ 1 at step 1 (the search stops there); the box of step 2
    settles Y0, and Y1 ≥ 1 is violated by f1 at x0 = −1, which f0's leaves never saw."""
    unsafe = unsafe_region("or", 1.0, 1.0)
    box = Box(-torch.ones(inputs, dtype=torch.float64), torch.ones(inputs, dtype=torch.float64))
    online = OnlineVerifier(two_sided(inputs, 1.0), box, unsafe=unsafe, strategy=strategy)
    assert online.steps[0].status is HOLDS
    assert online.update(network=two_sided(inputs, 4.0)).status is VIOLATED
    upper = torch.ones(inputs, dtype=torch.float64)
    upper[0] = 0.5
    step = online.update(Box(-torch.ones(inputs, dtype=torch.float64), upper))
    assert step.status is VIOLATED
    x = step.counterexample.input.reshape(1, -1)
    assert bool(unsafe.contains(two_sided(inputs, 4.0).forward(x))[0])


@pytest.mark.parametrize("strategy", ["relu", "input"])
def test_a_step_cut_short_by_an_exception_leaves_nothing_proved_for_the_new_network(strategy, monkeypatch):
    """The network changes, the step raises before its leaves are bounded again; the next step
    (box unchanged, network unchanged since the failed step) must not reuse f0's verdicts."""
    import assay.verify.online.relu_tree as relu_tree
    import assay.verify.online.verifier as verifier

    unsafe = unsafe_region("or", 1.0, 1.0)
    box = Box(-torch.ones(2, dtype=torch.float64), torch.ones(2, dtype=torch.float64))
    online = OnlineVerifier(two_sided(2, 1.0), box, unsafe=unsafe, strategy=strategy)
    assert online.steps[0].status is HOLDS

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    with monkeypatch.context() as patch:
        patch.setattr(relu_tree, "compute_bounds", interrupted)
        patch.setattr(verifier, "branch_and_bound", interrupted)
        patch.setattr(verifier.InputSplitting, "bound", interrupted)
        with pytest.raises(KeyboardInterrupt):
            online.update(network=two_sided(2, 4.0))
    upper = torch.ones(2, dtype=torch.float64)
    upper[0] = 0.5
    step = online.update(Box(-torch.ones(2, dtype=torch.float64), upper))
    assert step.status is VIOLATED


def draw_and_run(family, inputs, strategy, accelerations, net_seed, data):
    if inputs <= 3 and os.environ.get("ASSAY_STREAM_MARABOU", "1") == "1":
        require("maraboupy")
    kind = data.draw(KINDS[family], label="kind")
    events = data.draw(EVENTS[family], label="events")
    t0, t1 = data.draw(THRESHOLDS[family], label="t0"), data.draw(THRESHOLDS[family], label="t1")
    run_stream(family=family, inputs=inputs, strategy=strategy, kind=kind, accelerations=accelerations, events=events,
               net_seed=net_seed, t0=t0, t1=t1, tally=Tally())


def stream_settings(examples: int):
    return settings(max_examples=examples, deadline=None, database=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


STREAM_DRAWS = {"accelerations": st.sampled_from(ACCELERATIONS), "net_seed": st.integers(0, 50), "data": st.data()}


@pytest.mark.parametrize(("family", "inputs", "strategy"), [("two_sided", 2, "relu"), ("random", 3, "relu"),
                                                            ("two_sided", 2, "input")])
@seed(31)
@stream_settings(EXAMPLES)
@given(**STREAM_DRAWS)
def test_every_step_of_a_random_stream_agrees_with_verifying_from_scratch(family, inputs, strategy, accelerations,
                                                                         net_seed, data):
    """Small networks: ReLU-splitting leaves (``strategy="relu"``) and input boxes, with Marabou."""
    draw_and_run(family, inputs, strategy, accelerations, net_seed, data)


@pytest.mark.parametrize(("family", "inputs"), [("two_sided", 20), ("random", 18)])
@seed(31)
@stream_settings(EXAMPLES_LARGE)
@given(**STREAM_DRAWS)
def test_every_step_of_a_random_stream_on_many_inputs_agrees_with_verifying_from_scratch(family, inputs, accelerations,
                                                                                        net_seed, data):
    """Networks with more than 16 inputs: the default strategy splits ReLUs."""
    draw_and_run(family, inputs, "auto", accelerations, net_seed, data)


def test_leaves_proved_for_another_network_count_for_no_coverage():
    """A step cut short (timeout) keeps later disjuncts' leaves proved for the last network: they
    must not count as verified in the step's coverage or in ``all_verified``."""
    unsafe = unsafe_region("or", 1.0, 1.0)
    box = Box(-torch.ones(20, dtype=torch.float64), torch.ones(20, dtype=torch.float64))
    online = OnlineVerifier(two_sided(20, 1.0), box, unsafe=unsafe)
    tree = online._relu
    query = online._query(online.network, online.lower, online.upper)
    assert tree.all_verified(query) and tree.coverage(online.network, query) == 1.0
    tree.version += 1  # the tree now answers for a network none of its leaves was proved for
    assert not tree.all_verified(query)
    assert tree.coverage(online.network, query) == 0.0


@pytest.mark.parametrize("grown", [1e-9, 0.1])
def test_leaves_proved_on_a_smaller_box_count_for_no_coverage(grown):
    """A leaf's verdict holds on the box it was bounded on: asked about a box that reaches past it
    (by 1e-9 or by 0.1 in one input), the tree has no verified leaf (an RSR step that proved its
    leaves on a box smaller than X(t) must not make the step hold)."""
    unsafe = unsafe_region("or", 1.0, 1.0)
    box = Box(-torch.ones(20, dtype=torch.float64), torch.ones(20, dtype=torch.float64))
    online = OnlineVerifier(two_sided(20, 1.0), box, unsafe=unsafe)
    tree = online._relu
    assert tree.all_verified(online._query(online.network, online.lower, online.upper))
    upper = online.upper.clone()
    upper[3] += grown
    query = online._query(online.network, online.lower, upper)
    assert not tree.all_verified(query)
    assert tree.coverage(online.network, query) == 0.0
