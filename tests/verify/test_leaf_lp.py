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


@pytest.mark.parametrize("seed, offset", [(0, -0.02), (1, 0.02), (2, -0.02), (3, 0.02), (4, -0.02), (5, 0.02),
                                          (2, 0.02)])
def test_relu_splitting_decides_small_networks_to_the_leaves_and_agrees_with_marabou(seed, offset, monkeypatch):
    require("maraboupy")
    # Few branching candidates split worse, so that (2, 0.02) reaches the leaves (with 20 it holds before)
    monkeypatch.setattr("assay.verify.relu_split.FSB_CANDIDATES", 3)
    network = random_network(200 + seed, widths=(3, 6, 6, 2))
    C = np.array([[1.0, -1.0]])
    threshold = sampled_max(network, 3, C, seed=seed) + offset
    d = np.array([-threshold])
    ours = verify(network, box(3), unsafe=unsafe_region(C, d), timeout=60, strategy="relu", attack_restarts=0)
    theirs, _, _ = solve_network(network, -np.ones(3), np.ones(3), C, d, timeout=60)
    assert ours.status in (VerificationStatus.HOLDS, VerificationStatus.VIOLATED), ours.stats
    assert (ours.status is VerificationStatus.VIOLATED) == (theirs == "sat")
    if (seed, offset) == (2, 0.02):  # this one holds only after splitting down to leaves: the LP path is exercised
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


def _region_max(network, C, signs):
    """max of the row C y over the box [-1, 1]^n where every ReLU input has its sign (an LP)."""
    from scipy.optimize import linprog

    from assay.bounds import affine_forms

    forms, (out_coef, out_offset) = affine_forms(network, signs)
    A = np.vstack([(-sign.reshape(-1, 1) * coef).numpy() for (coef, _), sign in zip(forms, signs)])
    b = np.concatenate([(sign.reshape(-1) * offset).numpy() for (_, offset), sign in zip(forms, signs)])
    row = (C @ out_coef).numpy()[0]
    solution = linprog(-row, A_ub=A, b_ub=b, bounds=[(-1, 1)] * len(row), method="highs")
    assert solution.status == 0
    return float(-solution.fun + (C @ out_offset).numpy()[0])


def _full_leaf_lp(network, query, C, d, signs):
    """The leaf's LP with every sign constraint (the formulation before lazy constraints), by
    scipy: its optimum t (≥ 0 iff the leaf's region reaches the conjunction)."""
    from scipy.optimize import linprog

    from assay.bounds import affine_forms

    forms, (out_coef, out_offset) = affine_forms(network, signs)
    rows = [np.hstack([-(C @ out_coef).numpy(), np.ones((C.shape[0], 1))])]
    rhs = [(C @ out_offset + d).numpy()]
    for (coef, offset), sign in zip(forms, signs):
        s = sign.reshape(-1, 1)
        rows.append(np.hstack([(-s * coef).numpy(), np.ones((coef.shape[0], 1))]))
        rhs.append((s.reshape(-1) * offset).numpy())
    n = query.lower.numel()
    objective = np.zeros(n + 1)
    objective[-1] = -1.0
    bounds = list(zip(query.lower.tolist(), query.upper.tolist())) + [(None, None)]
    solution = linprog(objective, A_ub=np.vstack(rows), b_ub=np.concatenate(rhs), bounds=bounds, method="highs")
    assert solution.status == 0
    return -solution.fun


@pytest.mark.parametrize("seed", range(8))
def test_lazy_sign_constraints_give_the_full_lps_verdict_on_every_leaf(seed):
    """Leaves of sampled points of a wide network (most sign constraints redundant over the box,
    some binding), thresholds 1e-4 either side of the full LP's optimum: the verdict is the full
    LP's (REFUTED below, VIOLATED above with a point of the leaf's region), and the certificate
    uses only the constraints the lazy LP added."""
    network = random_network(300 + seed, widths=(3, 24, 24, 2))
    rng = np.random.default_rng(seed)
    C = torch.tensor([[1.0, -1.0]], dtype=torch.float64)
    seen = set()
    for point in torch.as_tensor(rng.uniform(-1, 1, (3, 3))):
        pre = pattern_of(network, point.reshape(1, 3))
        active = [p[0] >= 0 for p in pre]
        signs = [torch.where(a, 1.0, -1.0).to(torch.float64) for a in active]
        lower = [torch.where(a, 0.0, -1e3).to(torch.float64) for a in active]
        upper = [torch.where(a, 1e3, 0.0).to(torch.float64) for a in active]
        region_max = _region_max(network, C, signs)  # the row's maximum over the leaf's region
        for offset in (-1e-2, -1e-4, 1e-4):
            d = torch.tensor([-(region_max + offset)], dtype=torch.float64)
            query = from_unsafe(network, box(3), unsafe_region(C, d))[0]
            full = _full_leaf_lp(network, query, C, d, signs)
            verdict, found = decide_leaf(network, query, C, d, lower, upper)
            seen.add(verdict)
            if full < -1e-6:
                assert verdict == REFUTED, (seed, offset, full)
            elif full > 1e-6:
                assert verdict == VIOLATED, (seed, offset, full)
                x = found[0].reshape(1, 3)
                assert (network.forward(x) @ C.T + d >= 0).all()
                assert all(((p[0] >= 0) == a).all() or (p[0].abs() < 1e-7).any()
                           for p, a in zip(pattern_of(network, x), active))
    assert seen == {REFUTED, VIOLATED}, seen  # both sides of the threshold are exercised


def test_lazy_leaf_lp_adds_few_of_many_redundant_constraints():
    """A wide layer whose neurons are mostly stable over the box: the LP keeps few of them."""
    from assay.verify.leaf_lp import _solve_lazily

    rng = np.random.default_rng(0)
    n, width = 5, 400
    coef = rng.normal(size=(width, n))
    offset = np.abs(coef).sum(1) * np.where(np.arange(width) < 390, 1.5, 0.2)  # 390 hold over the box
    row_coef, row_offset = rng.normal(size=(1, n)), np.array([0.1])
    x, row_duals, sign_duals = _solve_lazily(row_coef, row_offset, coef, offset, -np.ones(n), np.ones(n))
    assert np.count_nonzero(sign_duals) <= 10
    if x is not None:  # every sign constraint holds at the maximiser
        assert (coef @ x + offset >= -1e-9).all()
