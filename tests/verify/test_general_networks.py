"""verify and verify-online on networks with general operators (sigmoid, tanh, products, shapes).

Each verdict is checked independently: HOLDS by sampling the box (no sample may reach the unsafe
region), VIOLATED by the counterexample's own forward pass. Thresholds are placed within 1e-4 of
the true extreme found by sampling, where a loose or unsound bound shows first.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from assay.nn import Linear, Network, ops
from assay.sets import Box
from assay.sets.spec import HalfSpaces, OutputSpec
from assay.verify import VerificationStatus, verify
from assay.verify.online import OnlineVerifier

HOLDS, VIOLATED = VerificationStatus.HOLDS, VerificationStatus.VIOLATED


def sigmoid_tanh(scale: float = 1.0) -> Network:
    """2 → 4 → sigmoid → ×scale (an Affine) → tanh → Mul of two halves → 1."""
    rng = np.random.default_rng(3)
    t = lambda *s: torch.as_tensor(rng.normal(0, 1.0, size=s))  # noqa: E731
    layers = (Linear(t(4, 2), t(4)), ops.Sigmoid(), ops.Affine(torch.tensor(scale), torch.tensor(0.0)), ops.Tanh(),
              ops.Slice((0,), (0,), (2,), (1,)), ops.Slice((0,), (2,), (4,), (1,)), ops.Binary("Mul"),
              Linear(t(1, 2), t(1)))
    sources = ((0,), (1,), (2,), (3,), (4,), (4,), (5, 6), (7,))
    return Network(layers, (2,), sources=sources)


def at_least(threshold: float) -> OutputSpec:
    """The unsafe region y ≥ threshold."""
    return OutputSpec((HalfSpaces(torch.tensor([[1.0]], dtype=torch.float64),
                                  torch.tensor([-threshold], dtype=torch.float64)),))


def sampled_max(network: Network, lower, upper, count: int = 20_000) -> float:
    rng = np.random.default_rng(0)
    x = lower + (upper - lower) * torch.as_tensor(rng.uniform(size=(count, *lower.shape)))
    return float(network.forward(x).max())


@pytest.mark.parametrize("margin", [0.05, 1e-3])
def test_verify_decides_a_general_network_on_both_sides_of_its_maximum(margin):
    network = sigmoid_tanh()
    lower, upper = torch.full((2,), -0.3, dtype=torch.float64), torch.full((2,), 0.3, dtype=torch.float64)
    peak = sampled_max(network, lower, upper)
    below = verify(network, Box(lower, upper), unsafe=at_least(peak - margin), timeout=60)
    assert below.status is VIOLATED
    x = below.counterexample.input.reshape(1, 2)
    assert float(network.forward(x.to(torch.float64))) >= peak - margin
    above = verify(network, Box(lower, upper), unsafe=at_least(peak + margin), timeout=60)
    assert above.status is HOLDS, above.status
    assert sampled_max(network, lower, upper) < peak + margin


def test_relu_splitting_is_refused_in_one_line_on_a_sigmoid_network():
    from assay.errors import OptionError

    network = sigmoid_tanh()
    box = Box(torch.full((2,), -0.3, dtype=torch.float64), torch.full((2,), 0.3, dtype=torch.float64))
    with pytest.raises(OptionError, match="ReLUs only"):
        verify(network, box, unsafe=at_least(10.0), strategy="relu")


def test_online_verification_rebuilds_when_an_operators_constant_changes():
    """A changed Affine scale is no Linear/Conv2d weight: weight-perturbation bounds do not cover
    it, and reusing the old network's leaves would keep a HOLDS that is now false."""
    lower, upper = torch.full((2,), -0.3, dtype=torch.float64), torch.full((2,), 0.3, dtype=torch.float64)
    before, after = sigmoid_tanh(1.0), sigmoid_tanh(0.3)
    threshold = sampled_max(before, lower, upper) + 0.02
    assert sampled_max(after, lower, upper) > threshold + 0.05, "the update must break the property"
    online = OnlineVerifier(before, Box(lower, upper), unsafe=at_least(threshold))
    assert online.steps[0].status is HOLDS
    assert online.update(network=after).status is VIOLATED
    assert online.update(network=before).status is HOLDS


def test_input_splitting_with_hybrid_bounds_decides_a_generator_on_both_sides(monkeypatch, margin=0.01):
    """A small cgan-like generator and discriminator, its boxes bounded as a large generator's are
    (intermediate_method="hybrid": forward bounds, CROWN walks stopped at cuts): the verdicts on
    both sides of the sampled maximum must hold up."""
    import assay.verify.input_split as input_split
    from tests.bounds.test_forward_general import generator_graph

    chosen = []

    def hybrid(plan, inputs=None):
        chosen.append("hybrid")
        return "hybrid"

    monkeypatch.setattr(input_split, "intermediate_method_for", hybrid)
    network = generator_graph(np.random.default_rng(5))
    first_output = Network(network.layers + (Linear(torch.tensor([[1.0, 0.0]], dtype=torch.float64),
                                                    torch.zeros(1, dtype=torch.float64)),), (4,))
    lower, upper = torch.full((4,), -0.2, dtype=torch.float64), torch.full((4,), 0.2, dtype=torch.float64)
    vertices = torch.cartesian_prod(*[torch.tensor([-0.2, 0.2], dtype=torch.float64)] * 4)
    peak = max(sampled_max(first_output, lower, upper), float(first_output.forward(vertices).max()))
    below = verify(first_output, Box(lower, upper), unsafe=at_least(peak - margin), timeout=60)
    assert below.status is VIOLATED
    found = float(first_output.forward(below.counterexample.input.reshape(1, 4)))
    assert found >= peak - margin
    peak = max(peak, found)  # the search may find a higher point than the samples: the threshold sits above it
    above = verify(first_output, Box(lower, upper), unsafe=at_least(peak + margin), timeout=60)
    assert above.status is HOLDS, above.status
    assert chosen  # the boxes were bounded the hybrid way


def test_the_attack_before_input_splitting_gets_a_share_of_the_time_left(monkeypatch):
    """Input splitting probes its open boxes with PGD itself: the counterexample search before it
    is given a deadline of at most INPUT_SPLIT_ATTACK_SHARE of the time left (a 64×64 generator's
    32-start search once took 200 of a holding query's 300 s), and the verdict stands."""
    import time

    import assay.verify.api as api

    calls = []
    original = api.search

    def recording_search(*args, deadline=None, **kwargs):
        calls.append((time.monotonic(), deadline.at))
        return original(*args, deadline=deadline, **kwargs)

    monkeypatch.setattr(api, "search", recording_search)
    network = sigmoid_tanh()
    lower, upper = torch.full((2,), -0.3, dtype=torch.float64), torch.full((2,), 0.3, dtype=torch.float64)
    timeout = 1000.0
    started = time.monotonic()
    # a threshold just above the maximum: the root's bounds leave it open, the search settles it
    result = verify(network, Box(lower, upper), unsafe=at_least(sampled_max(network, lower, upper) + 2e-3),
                    timeout=timeout, strategy="input")
    assert result.status is HOLDS
    assert calls, "the root's bounds were meant to leave the query open"
    for called, until in calls:
        assert until <= called + api.INPUT_SPLIT_ATTACK_SHARE * (started + 5 + timeout - called)  # 5 s: set-up
