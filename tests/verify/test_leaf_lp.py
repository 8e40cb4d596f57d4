"""Leaves of ReLU splitting decided by an LP: falsified by sampling, and end to end against Marabou."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from assay.verify import VerificationStatus, verify
from assay.verify.leaf_lp import HOLDS as REFUTED
from assay.verify.leaf_lp import VIOLATED, decide_leaf
from assay.verify.marabou import solve_network
from assay.verify.problem import from_unsafe
from tests.requirements import require
from tests.verify.test_verify import box, random_network, sampled_max, unsafe_region


def pattern_of(network, x):
    """Pre-activation values of every ReLU layer at points x (N, n)."""
    values, h = [], x
    for index, layer in enumerate(network.layers):
        if type(layer).__name__ == "ReLU":
            values.append(h)
        h = network.apply_layer(index, h)
    return values


@pytest.mark.parametrize("seed", range(6))
def test_leaf_verdicts_match_the_linear_region_sampled_densely(seed):
    """For the linear region of a random point: REFUTED only if no sampled point of the region
    violates, VIOLATED with a re-checked point, and both verdicts occur across thresholds."""
    network = random_network(seed, widths=(2, 6, 6, 2))
    rng = np.random.default_rng(seed)
    x = torch.as_tensor(rng.uniform(-1, 1, (200_000, 2)))
    pre = pattern_of(network, x)
    anchor = 0
    signs = [p[anchor] >= 0 for p in pre]
    in_region = torch.stack([((p >= 0) == s).all(1) for p, s in zip(pre, signs)]).all(0)
    big = 1e3
    lower = [torch.where(s, 0.0, -big).to(torch.float64) for s in signs]
    upper = [torch.where(s, big, 0.0).to(torch.float64) for s in signs]
    C = torch.tensor([[1.0, -1.0]], dtype=torch.float64)
    values = (network.forward(x[in_region]) @ C.T).reshape(-1)
    seen = set()
    for offset in (-0.05, -0.01, 0.01, 0.05):
        threshold = float(values.max()) + offset
        d = torch.tensor([-threshold], dtype=torch.float64)
        query = from_unsafe(network, box(2), unsafe_region(C, d))[0]
        verdict, found = decide_leaf(network, query, C, d, lower, upper)
        seen.add(verdict)
        if verdict == REFUTED:
            assert (values - threshold < 0).all()
        elif verdict == VIOLATED:
            point, output = found
            assert ((point >= -1) & (point <= 1)).all()
            assert (network.forward(point.reshape(1, 2)) @ C.T + d >= 0).all()
            assert torch.allclose(network.forward(point.reshape(1, 2)).reshape(-1), output.reshape(-1))
    # The region's true maximum lies between the thresholds: exact answers on both sides.
    assert seen == {REFUTED, VIOLATED}, seen


def test_every_sign_pattern_of_a_small_layer_gets_a_verdict_sampling_cannot_contradict():
    """All 16 sign patterns of a 4-neuron layer, realised by some input or by none: REFUTED only
    where no sampled point of the pattern's region violates (patterns no input realises are
    refuted, never violated), VIOLATED only with a re-checked point of the region."""
    import itertools

    network = random_network(11, widths=(2, 4, 2))
    C = torch.tensor([[1.0, 0.0]], dtype=torch.float64)
    d = torch.tensor([0.0], dtype=torch.float64)
    query = from_unsafe(network, box(2), unsafe_region(C, d))[0]
    x = torch.as_tensor(np.random.default_rng(0).uniform(-1, 1, (100_000, 2)))
    pre = pattern_of(network, x)[0]
    outputs = network.forward(x)[:, 0]
    seen = {"realised": set(), "unrealised": set()}
    for pattern in itertools.product([False, True], repeat=4):
        active = torch.tensor(pattern)
        lower = [torch.where(active, 0.0, -1e3).to(torch.float64)]
        upper = [torch.where(active, 1e3, 0.0).to(torch.float64)]
        verdict, found = decide_leaf(network, query, C, d, lower, upper)
        in_region = ((pre >= 0) == active).all(1)
        seen["realised" if in_region.any() else "unrealised"].add(verdict)
        if verdict == REFUTED:
            assert (outputs[in_region] < 0).all(), pattern
        elif verdict == VIOLATED:
            point, output = found
            assert ((point >= -1) & (point <= 1)).all()
            assert float(network.forward(point.reshape(1, 2))[0, 0]) >= 0
            point_pre = pattern_of(network, point.reshape(1, 2))[0][0]
            assert ((point_pre >= 0) == active).all() or (point_pre.abs() < 1e-9).any(), pattern
    assert seen["realised"] == {REFUTED, VIOLATED}, seen  # both exact answers occur
    assert seen["unrealised"] == {REFUTED}, seen


@pytest.mark.parametrize("seed", range(6))
def test_relu_splitting_decides_small_networks_to_the_leaves_and_agrees_with_marabou(seed):
    require("maraboupy")
    network = random_network(200 + seed, widths=(3, 6, 6, 2))
    C = np.array([[1.0, -1.0]])
    offset = 0.02 if seed % 2 else -0.02
    threshold = sampled_max(network, 3, C, seed=seed) + offset
    d = np.array([-threshold])
    ours = verify(network, box(3), unsafe=unsafe_region(C, d), timeout=60, strategy="relu", attack_restarts=0)
    theirs, _, _ = solve_network(network, -np.ones(3), np.ones(3), C, d, timeout=60)
    assert ours.status in (VerificationStatus.HOLDS, VerificationStatus.VIOLATED), ours.stats
    assert (ours.status is VerificationStatus.VIOLATED) == (theirs == "sat")
    if seed == 1:  # this instance holds only after splitting down to leaves: the LP path is exercised
        assert ours.stats.leaf_lps > 0, ours.stats
    if ours.status is VerificationStatus.VIOLATED:
        x = ours.counterexample.input.reshape(1, 3)
        assert ((x >= -1) & (x <= 1)).all()
        assert (network.forward(x) @ torch.as_tensor(C).T + torch.as_tensor(d) >= 0).all()


def test_affine_forms_reproduce_the_network_on_its_linear_region_for_conv_and_pool_layers():
    """The forms the LP is built from equal the network (and every ReLU input) at the point whose
    activation pattern they use: Conv2d, AvgPool2d, Flatten and Linear."""
    from assay.bounds import affine_forms
    from assay.nn import AvgPool2d, Conv2d, Flatten, Linear, Network, ReLU

    rng = np.random.default_rng(0)

    def tensor(*shape, scale=1.0):
        return torch.as_tensor(rng.normal(0, scale, shape))

    network = Network((Conv2d(tensor(2, 1, 3, 3, scale=0.6), tensor(2, scale=0.3), 1, 1), ReLU(), AvgPool2d(2, 2),
                       Flatten(), Linear(tensor(5, 8, scale=0.8), tensor(5, scale=0.3)), ReLU(),
                       Linear(tensor(3, 5), tensor(3, scale=0.3))), (1, 4, 4))
    for _ in range(5):
        x = torch.as_tensor(rng.uniform(-1, 1, (1, 1, 4, 4)))
        pre = pattern_of(network, x)
        signs = [torch.where(p[0] >= 0, 1.0, -1.0).to(torch.float64) for p in pre]
        forms, (coef, offset) = affine_forms(network, signs)
        flat = x.reshape(-1)
        assert torch.allclose(coef @ flat + offset, network.forward(x).reshape(-1), atol=1e-12)
        for (layer_coef, layer_offset), values in zip(forms, pre):
            assert torch.allclose(layer_coef @ flat + layer_offset, values.reshape(-1), atol=1e-12)
