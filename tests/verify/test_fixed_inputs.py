"""Properties that fix most inputs (a 1-D CNN over 800 readings with 4 perturbed): `auto` counts the
inputs that vary, input splitting never splits the fixed ones, and its progress still reaches 1.

Verdicts are cross-checked with Marabou on the same float32 network, thresholds just above and
below the sampled maximum (both verdicts exercised).
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from assay.verify import VerificationStatus, verify
from assay.verify.marabou import float32_rounded, solve_network
from tests.requirements import require
from tests.verify.networks import random_relu_network

N, VARYING, FIXED_VALUE = 40, (3, 17, 29), 0.3


def fixed_box():
    lower = torch.full((N,), FIXED_VALUE, dtype=torch.float64)
    upper = lower.clone()
    lower[list(VARYING)], upper[list(VARYING)] = -1.0, 1.0
    return SimpleNamespace(lower=lower, upper=upper)


def unsafe_at_least(threshold):
    return SimpleNamespace(conjunctions=(SimpleNamespace(C=torch.tensor([[1.0, -1.0]], dtype=torch.float64),
                                                         d=torch.tensor([-threshold], dtype=torch.float64)),))


@pytest.mark.parametrize("seed", range(2))
def test_auto_splits_the_varying_inputs_and_agrees_with_marabou(seed):
    require("maraboupy")
    network = float32_rounded(random_relu_network(300 + seed, widths=(N, 12, 12, 2)))
    box = fixed_box()
    x = box.lower + (box.upper - box.lower) * torch.as_tensor(np.random.default_rng(seed).uniform(0, 1, (100_000, N)))
    y = network.forward(x)
    # 10⁻³ above the sampled maximum is still reachable on these networks; 10⁻² above is not.
    threshold = (y[:, 0] - y[:, 1]).max().item() + (1e-2 if seed % 2 else -1e-3)
    fractions = []
    ours = verify(network, box, unsafe=unsafe_at_least(threshold), timeout=60,
                  progress=lambda fraction, pending: fractions.append(fraction))
    assert ours.stats.strategy == "input"  # 3 inputs vary, though the network takes 40
    theirs, _, _ = solve_network(network, box.lower.numpy(), box.upper.numpy(), np.array([[1.0, -1.0]]),
                                 np.array([-threshold]), timeout=60)
    assert theirs in ("sat", "unsat") and ours.status in (VerificationStatus.HOLDS, VerificationStatus.VIOLATED)
    assert (ours.status is VerificationStatus.VIOLATED) == (theirs == "sat")
    assert (ours.status is VerificationStatus.HOLDS) == (seed % 2 == 1)
    if ours.status is VerificationStatus.HOLDS:
        assert len(fractions) > 1 and fractions[-1] == pytest.approx(1.0)  # fixed inputs count as full width
    else:
        point = ours.counterexample.input.reshape(-1)
        fixed = torch.ones(N, dtype=torch.bool)
        fixed[list(VARYING)] = False
        assert (point[fixed] == FIXED_VALUE).all() and (point.abs() <= 1).all()
        out = network.forward(point.reshape(1, N))[0]
        assert out[0] - out[1] >= threshold


def test_relu_splitting_when_many_inputs_vary():
    network = random_relu_network(7, widths=(N, 8, 2))
    box = SimpleNamespace(lower=-0.01 * torch.ones(N, dtype=torch.float64), upper=0.01 * torch.ones(N, dtype=torch.float64))
    assert verify(network, box, unsafe=unsafe_at_least(100.0), timeout=30).stats.strategy == "relu"
