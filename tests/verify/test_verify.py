"""Verifier verdicts: cross-checked with Marabou, falsified by sampling, counterexamples re-checked."""

from __future__ import annotations

import dataclasses
import time
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from assay.errors import OptionError, SpecError
from assay.nn import Network
from assay.verify import VerificationStatus, VerifyOptions, verify
from assay.verify.marabou import float32_rounded, solve_network
from tests.requirements import require
from tests.verify.networks import random_relu_network


def random_network(seed: int, widths=(3, 10, 10, 2)) -> Network:
    # Marabou reads float32 ONNX weights: verify exactly that network.
    return float32_rounded(random_relu_network(seed, widths))


def unsafe_region(C, d):
    return SimpleNamespace(conjunctions=(SimpleNamespace(C=torch.as_tensor(C, dtype=torch.float64),
                                                         d=torch.as_tensor(d, dtype=torch.float64)),))


def box(n, radius=1.0):
    return SimpleNamespace(lower=-radius * torch.ones(n, dtype=torch.float64), upper=radius * torch.ones(n, dtype=torch.float64))


def sampled_max(network, n, C, samples=200_000, seed=0):
    x = torch.as_tensor(np.random.default_rng(seed).uniform(-1, 1, (samples, n)))
    return (network.forward(x) @ torch.as_tensor(C, dtype=torch.float64).T).amin(1).max().item()


@pytest.mark.parametrize("method", ["alpha", "crown"])
@pytest.mark.parametrize("seed", range(8))
def test_verdicts_agree_with_marabou(seed, method):
    require("maraboupy")
    network = random_network(seed)
    C = np.array([[1.0, -1.0]])
    # Thresholds 10⁻³ above and below the sampled maximum: both verdicts get exercised.
    offset = 1e-3 if seed % 2 else -1e-3
    threshold = sampled_max(network, 3, C) + offset
    d = np.array([-threshold])
    ours = verify(network, box(3), unsafe=unsafe_region(C, d), timeout=60, method=method)
    theirs, _, point = solve_network(network, -np.ones(3), np.ones(3), C, d, timeout=60)
    assert ours.status in (VerificationStatus.HOLDS, VerificationStatus.VIOLATED), ours
    assert theirs in ("sat", "unsat"), theirs
    assert (ours.status is VerificationStatus.VIOLATED) == (theirs == "sat")
    if ours.status is VerificationStatus.VIOLATED:
        x = ours.counterexample.input
        assert ((x >= -1) & (x <= 1)).all()
        y = network.forward(x.reshape(1, 3))
        assert (y @ torch.as_tensor(C).T + torch.as_tensor(d) >= 0).all()


@pytest.mark.parametrize("seed", range(6))
def test_relu_splitting_verdicts_agree_with_marabou(seed):
    """ReLU splitting is for many inputs and small regions (e.g. an ℓ∞ ball around an image)."""
    require("maraboupy")
    n, radius = 20, 0.15
    network = random_network(50 + seed, widths=(n, 16, 16, 2))
    C = np.array([[1.0, -1.0]])
    x = torch.as_tensor(np.random.default_rng(seed).uniform(-radius, radius, (200_000, n)))
    offset = 1e-3 if seed % 2 else -1e-3
    threshold = (network.forward(x) @ torch.as_tensor(C).T).max().item() + offset
    d = np.array([-threshold])
    ours = verify(network, box(n, radius), unsafe=unsafe_region(C, d), timeout=60, strategy="relu")
    theirs, _, _ = solve_network(network, -radius * np.ones(n), radius * np.ones(n), C, d, timeout=60)
    assert ours.stats.strategy == "relu"
    assert ours.status in (VerificationStatus.HOLDS, VerificationStatus.VIOLATED), ours
    assert theirs in ("sat", "unsat"), theirs
    assert (ours.status is VerificationStatus.VIOLATED) == (theirs == "sat")


def test_both_strategies_refute_every_conjunction_of_a_disjunction():
    n, radius = 12, 0.2
    network = random_network(3, widths=(n, 16, 16, 3))
    x = torch.as_tensor(np.random.default_rng(0).uniform(-radius, radius, (200_000, n)))
    y = network.forward(x)
    # Two unreachable regions: y0 - y1 above its sampled max, or y2 below its sampled min.
    top = (y[:, 0] - y[:, 1]).max().item() + 0.3
    bottom = y[:, 2].min().item() - 0.3
    first = SimpleNamespace(C=torch.tensor([[1.0, -1.0, 0.0]], dtype=torch.float64), d=torch.tensor([-top], dtype=torch.float64))
    second = SimpleNamespace(C=torch.tensor([[0.0, 0.0, -1.0]], dtype=torch.float64), d=torch.tensor([bottom], dtype=torch.float64))
    for strategy in ("relu", "input"):
        result = verify(network, box(n, radius), unsafe=SimpleNamespace(conjunctions=(first, second)), timeout=60,
                        strategy=strategy)
        assert result.status is VerificationStatus.HOLDS, (strategy, result)
    # Moving the second region inside the reachable range makes the property violated.
    reachable = SimpleNamespace(C=second.C, d=second.d + 0.6)
    result = verify(network, box(n, radius), unsafe=SimpleNamespace(conjunctions=(first, reachable)), timeout=60,
                    strategy="relu")
    assert result.status is VerificationStatus.VIOLATED
    assert -network.forward(result.counterexample.input.reshape(1, n))[0, 2] + bottom + 0.6 >= 0


@pytest.mark.parametrize("method", ["alpha", "crown"])
@pytest.mark.parametrize("seed", range(5))
def test_holds_is_never_contradicted_by_sampling_or_attack(seed, method):
    network = random_network(100 + seed, widths=(2, 12, 12, 3))
    C = np.array([[1.0, -1.0, 0.0], [1.0, 0.0, -1.0]])
    threshold = sampled_max(network, 2, C, seed=seed) + 1e-3
    result = verify(network, box(2), unsafe=unsafe_region(C, [-threshold, -threshold]), timeout=60, method=method)
    # Fresh points, never those that set the threshold: uniform, and dense around the best of them.
    fresh = np.random.default_rng(5000 + seed)
    x = torch.as_tensor(fresh.uniform(-1, 1, (400_000, 2)))
    best = x[(network.forward(x) @ torch.as_tensor(C).T).amin(1).argmax()]
    x = torch.cat([x, (best + torch.as_tensor(fresh.normal(0, 1e-3, (100_000, 2)))).clamp(-1, 1)])
    values = (network.forward(x) @ torch.as_tensor(C).T).amin(1) - threshold
    if result.status is VerificationStatus.HOLDS:
        assert (values < 0).all()
    else:
        assert result.status is VerificationStatus.VIOLATED
        assert (network.forward(result.counterexample.input.reshape(1, 2)) @ torch.as_tensor(C).T - threshold >= 0).all()


def test_required_spec_polarity():
    """spec= is what must hold; unsafe= is what must not happen. The two are not confused."""
    network = random_network(7, widths=(2, 8, 2))
    x = torch.as_tensor(np.random.default_rng(1).uniform(-1, 1, (100_000, 2)))
    y = network.forward(x)
    always_bigger = (y[:, 0] - y[:, 1]).min().item() - 1.0  # y0 - y1 ≥ this holds with margin 1
    spec = SimpleNamespace(conjunctions=(SimpleNamespace(C=torch.tensor([[1.0, -1.0]], dtype=torch.float64),
                                                         d=torch.tensor([-always_bigger], dtype=torch.float64)),))
    assert verify(network, box(2), spec=spec, timeout=30).status is VerificationStatus.HOLDS
    assert verify(network, box(2), unsafe=spec, timeout=30).status is VerificationStatus.VIOLATED


# Instances that no search decides within minutes (measured: still open after 10-15 s with
# thousands of domains bounded). A deadline that some phase ignores makes these tests run on:
# pytest-timeout then fails them instead of letting the suite hang.
def hard_input_split_instance():
    network = random_network(3, widths=(6, 100, 100, 100, 2))
    C = np.array([[1.0, -1.0]])
    x = torch.as_tensor(np.random.default_rng(0).uniform(-1, 1, (100_000, 6)))
    threshold = (network.forward(x) @ torch.as_tensor(C).T).max().item() + 0.2
    return network, box(6), unsafe_region(C, [-threshold])


def hard_relu_split_instance():
    network = random_network(4, widths=(40, 128, 128, 128, 2))
    C = np.array([[1.0, -1.0]])
    x = torch.as_tensor(np.random.default_rng(0).uniform(-0.5, 0.5, (100_000, 40)))
    threshold = (network.forward(x) @ torch.as_tensor(C).T).max().item() + 2.0
    return network, box(40, 0.5), unsafe_region(C, [-threshold])


@pytest.mark.timeout(150)
@pytest.mark.parametrize("strategy, instance", [("input", hard_input_split_instance), ("relu", hard_relu_split_instance)])
@pytest.mark.parametrize("timeout, attack", [(2.0, 32), (2.0, 0), (0.2, 32)])
def test_a_search_past_its_deadline_returns_timeout_on_time(strategy, instance, timeout, attack):
    """TIMEOUT within a second of the deadline, whichever phase it falls in (0.2 s: the attack)."""
    network, input_box, unsafe = instance()
    started = time.monotonic()
    result = verify(network, input_box, unsafe=unsafe, timeout=timeout, strategy=strategy, attack_restarts=attack)
    wall = time.monotonic() - started
    assert result.status is VerificationStatus.TIMEOUT, result.stats
    assert wall <= timeout + 1.0, (wall, result.stats)
    assert result.stats.seconds <= wall


def test_bad_requests_raise_clear_errors():
    network = random_network(0)
    with pytest.raises(OptionError, match="exactly one"):
        verify(network, box(3))
    with pytest.raises(SpecError, match="3 inputs"):
        verify(network, box(4), unsafe=unsafe_region([[1.0, -1.0]], [0.0]))
    with pytest.raises(SpecError, match="2"):
        verify(network, box(3), unsafe=unsafe_region([[1.0, -1.0, 0.0]], [0.0]))
    with pytest.raises(OptionError, match="timeout"):
        verify(network, box(3), unsafe=unsafe_region([[1.0, -1.0]], [0.0]), timeout=0)
    with pytest.raises(OptionError, match=r"unknown verify option\(s\) \['timeuot'\]; known: .*'timeout'"):
        verify(network, box(3), unsafe=unsafe_region([[1.0, -1.0]], [0.0]), timeuot=5)
    with pytest.raises(OptionError, match="strategy"):
        VerifyOptions(strategy="depth")


def test_a_search_past_its_memory_limit_stops_unknown_not_out_of_memory():
    """ReLU splitting keeps every pending domain's bounds; past memory_limit it answers UNKNOWN at once."""
    n, radius = 20, 0.15
    network = random_network(51, widths=(n, 16, 16, 2))
    vertices = radius * torch.as_tensor(np.sign(np.random.default_rng(1).uniform(-1, 1, (200_000, n))))
    threshold = (network.forward(vertices) @ torch.tensor([1.0, -1.0], dtype=torch.float64)).max().item() + 0.05
    unsafe = unsafe_region(np.array([[1.0, -1.0]]), np.array([-threshold]))  # holds, after much branching
    tight = verify(network, box(n, radius), unsafe=unsafe, timeout=60, strategy="relu", attack_restarts=0,
                   memory_limit=1e-6)  # about a kilobyte: the root's two children already exceed it
    assert tight.status is VerificationStatus.UNKNOWN and tight.stats.domains <= 3, tight
    for seconds in (3, 15):  # the longer run only where a loaded machine spent the 3 s on the root
        roomy = verify(network, box(n, radius), unsafe=unsafe, timeout=seconds, strategy="relu", attack_restarts=0)
        if roomy.stats.domains > 3:
            break
    assert roomy.status in (VerificationStatus.HOLDS, VerificationStatus.TIMEOUT) and roomy.stats.domains > 3, roomy
    with pytest.raises(OptionError, match="memory_limit"):
        VerifyOptions(memory_limit=0)


def test_options_are_one_frozen_value_with_overrides():
    options = VerifyOptions(timeout=30, attack_restarts=0)
    with pytest.raises(dataclasses.FrozenInstanceError):
        options.timeout = 5
    assert VerifyOptions.build(options, timeout=5) == VerifyOptions(timeout=5, attack_restarts=0)
    assert VerifyOptions().strategy_for(5) == "input" and VerifyOptions().strategy_for(784) == "relu"
    network = random_network(7, widths=(2, 8, 2))
    result = verify(network, box(2), unsafe=unsafe_region([[1.0, -1.0]], [100.0]), options=options, strategy="relu")
    assert result.status is VerificationStatus.VIOLATED and result.stats.strategy == "relu"


@pytest.mark.data
@pytest.mark.parametrize("network_name, prop, expected", [
    ("1_1", 1, VerificationStatus.HOLDS),
    ("1_2", 3, VerificationStatus.HOLDS),
    ("2_1", 2, VerificationStatus.VIOLATED),
    ("1_4", 2, VerificationStatus.VIOLATED),
    ("3_2", 2, VerificationStatus.VIOLATED),
    # The violating region is tiny and sits at the box's faces: found by the boundary-heavy sampling.
    ("1_9", 7, VerificationStatus.VIOLATED),
])
def test_acas_xu_instances_end_to_end(data_dir, network_name, prop, expected):
    """Fast ACAS Xu instances (verdicts agree with Marabou in benchmarks/acasxu.py)."""
    from assay.nn import load
    from assay.sets import read_vnnlib
    from assay.verify import verify_vnnlib

    network = load(data_dir / "acasxu" / f"ACASXU_run2a_{network_name}_batch_2000.onnx")
    vnnlib = read_vnnlib(data_dir / "acasxu" / f"prop_{prop}.vnnlib", network.input_size, network.output_size)
    result = verify_vnnlib(network, vnnlib, timeout=100)
    assert result.status is expected, result.stats
    if expected is VerificationStatus.VIOLATED:
        counterexample = result.counterexample
        query = vnnlib.queries[counterexample.query]
        assert query.input_set.contains(counterexample.input.reshape(-1))
        y = network.forward(counterexample.input.reshape(1, *network.input_shape)).reshape(-1)
        assert query.unsafe_outputs.contains(y)
