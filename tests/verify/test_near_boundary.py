"""Verdicts 10⁻⁴ from the exact maximum: where a refutation with a little slack would go wrong.

The networks of :mod:`tests.verify.exact_maxima` have maxima known exactly. A threshold
10⁻⁴ below the maximum must give VIOLATED with a counterexample that a plain forward pass
confirms; 10⁻⁴ above, HOLDS, which fresh samples concentrated around the maximiser (never the
points that set a threshold) and, at 10⁻³, Marabou try to contradict. Both search strategies,
with and without the counterexample search before branching, conjunctions and disjunctions.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from assay.verify import VerificationStatus, verify
from tests.requirements import require
from tests.verify.exact_maxima import (
    OFFSET,
    at_least,
    at_most,
    linear_region_problem,
    peak_network,
    samples_near,
    unit_box,
)

HOLDS, VIOLATED = VerificationStatus.HOLDS, VerificationStatus.VIOLATED
STRATEGIES = ["input", "relu"]
ATTACK = [pytest.param(0, id="no-attack"), pytest.param(32, id="attack")]


def assert_counterexample(network, box, unsafe, result):
    """The counterexample lies in the box and its float64 forward pass is in the unsafe region."""
    assert result.status is VIOLATED, result.stats
    x = result.counterexample.input.reshape(1, -1).to(torch.float64)
    assert ((x >= box.lower) & (x <= box.upper)).all()
    y = network.forward(x).reshape(-1)  # one row alone: rounding may differ from the batched check by ~1e-16
    assert torch.allclose(y, result.counterexample.output.reshape(-1), rtol=0, atol=1e-12)
    assert any(bool((part.C @ y + part.d >= 0).all()) for part in unsafe.conjunctions)


def assert_never_reached(network, box, peak, output, threshold, seed):
    """Fresh samples (uniform and within 10⁻⁵…10⁻² of the maximiser) all stay below the threshold."""
    points = samples_near(peak, box, np.random.default_rng(7000 + seed))
    values = network.forward(points)[:, output]
    assert values.max().item() < threshold


@pytest.mark.parametrize("attack", ATTACK)
@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize("seed", range(3))
def test_just_below_a_peak_is_violated(seed, strategy, attack):
    network, _ = peak_network(3, seed)
    box = unit_box(3)
    unsafe = at_least(1, [(0, 2.0 - OFFSET)])
    result = verify(network, box, unsafe=unsafe, strategy=strategy, attack_restarts=attack, timeout=120)
    assert_counterexample(network, box, unsafe, result)


@pytest.mark.parametrize("attack", ATTACK)
@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize("seed", range(3))
def test_just_above_a_peak_holds(seed, strategy, attack):
    network, peak = peak_network(3, seed)
    box = unit_box(3)
    result = verify(network, box, unsafe=at_least(1, [(0, 2.0 + OFFSET)]), strategy=strategy,
                    attack_restarts=attack, timeout=120)
    assert result.status is HOLDS, result.stats
    assert_never_reached(network, box, peak, 0, 2.0 + OFFSET, seed)


@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize("below, above", [(0.0, 1.0), (1.0, 0.0)])
def test_required_region_at_a_peak(strategy, below, above):
    """spec=: y0 ≤ 2 + 10⁻⁴ holds, y0 ≤ 2 − 10⁻⁴ is violated (the counterexample lies strictly outside)."""
    network, _ = peak_network(2, 11)
    box = unit_box(2)
    threshold = 2.0 + OFFSET * (above - below)
    result = verify(network, box, spec=at_most(1, [(0, threshold)]), strategy=strategy, attack_restarts=0, timeout=120)
    if above:
        assert result.status is HOLDS, result.stats
    else:
        assert result.status is VIOLATED, result.stats
        assert network.forward(result.counterexample.input.reshape(1, -1))[0, 0].item() > threshold


# Two heads peaking at the same point: y0 ≤ 2 and y1 ≤ 3, both reached only at x*.
TWO_HEAD_CASES = [
    pytest.param([[(0, 2 - OFFSET), (1, 3 - OFFSET)]], VIOLATED, id="conjunction-both-below"),
    pytest.param([[(0, 2 - OFFSET), (1, 3 + OFFSET)]], HOLDS, id="conjunction-one-above"),
    pytest.param([[(0, 2 + OFFSET)], [(1, 3 - OFFSET)]], VIOLATED, id="disjunction-second-below"),
    pytest.param([[(0, 2 - OFFSET)], [(1, 3 + OFFSET)]], VIOLATED, id="disjunction-first-below"),
    pytest.param([[(0, 2 + OFFSET)], [(1, 3 + OFFSET)]], HOLDS, id="disjunction-both-above"),
    pytest.param([[(0, 2 + OFFSET), (1, 3 - OFFSET)], [(0, 2 - OFFSET), (1, 3 + OFFSET)]], HOLDS,
                 id="disjunction-of-conjunctions-above"),
]


@pytest.mark.parametrize("attack", ATTACK)
@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize("conjunctions, expected", TWO_HEAD_CASES)
def test_conjunctions_and_disjunctions_near_two_peaks(conjunctions, expected, strategy, attack):
    network, peak = peak_network(2, 5, heights=(2.0, 3.0))
    box = unit_box(2)
    unsafe = at_least(2, *conjunctions)
    result = verify(network, box, unsafe=unsafe, strategy=strategy, attack_restarts=attack, timeout=120)
    if expected is VIOLATED:
        assert_counterexample(network, box, unsafe, result)
    else:
        assert result.status is HOLDS, result.stats
        points = samples_near(peak, box, np.random.default_rng(3))
        y = network.forward(points)
        for part in unsafe.conjunctions:
            assert not (y @ part.C.T + part.d >= 0).all(1).any()


@pytest.mark.parametrize("attack", ATTACK)
@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize("seed", range(3))
def test_single_linear_region_maximum(seed, strategy, attack):
    """A random network on a box where no ReLU switches: the exact maximum is at a corner."""
    from tests.verify.test_verify import random_network

    network = random_network(300 + seed, widths=(4, 16, 16, 3))
    box, maxima, maximisers = linear_region_problem(network, seed)
    output = seed % 3
    below = at_least(3, [(output, maxima[output] - OFFSET)])
    result = verify(network, box, unsafe=below, strategy=strategy, attack_restarts=attack, timeout=120)
    assert_counterexample(network, box, below, result)
    above = verify(network, box, unsafe=at_least(3, [(output, maxima[output] + OFFSET)]), strategy=strategy,
                   attack_restarts=attack, timeout=120)
    assert above.status is HOLDS, above.stats
    assert_never_reached(network, box, maximisers[output].numpy(), output, maxima[output] + OFFSET, seed)


@pytest.mark.parametrize("seed", range(3))
def test_marabou_agrees_at_a_peak(seed):
    """An independent solver on the same float32 network: 10⁻³ below the maximum is sat, above unsat."""
    require("maraboupy")
    from assay.verify.marabou import float32_rounded, solve_network

    # Rounding the weights to float32 moves x* but keeps each maximum exactly at its height.
    network = float32_rounded(peak_network(3, 40 + seed)[0])
    box = unit_box(3)
    C = np.array([[1.0]])
    for offset, expected, answer in [(-1e-3, VIOLATED, "sat"), (1e-3, HOLDS, "unsat")]:
        threshold = 2.0 + offset
        ours = verify(network, box, unsafe=at_least(1, [(0, threshold)]), timeout=60)
        theirs, _, point = solve_network(network, -np.ones(3), np.ones(3), C, np.array([-threshold]), timeout=60)
        assert (ours.status, theirs) == (expected, answer)
        if answer == "sat":
            assert network.forward(torch.as_tensor(point).reshape(1, 3))[0, 0].item() >= threshold - 1e-6
