"""First-layer bounds under a domain's first-layer splits: sound on every sampled point of the
domain, close to the exact LP, empty only where no point is; and ReLU-splitting verdicts that use
them agree with an exact MILP on one-hidden-layer networks."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch
from scipy.optimize import Bounds, LinearConstraint, linprog, milp

from assay.bounds import IntermediateBounds
from assay.bounds.ibp import cast_outward
from assay.nn import Linear, Network, ReLU
from assay.verify import VerificationStatus, verify
from assay.verify import first_layer as first_layer_module
from assay.verify.first_layer import first_layer, tighten_first_layer
from tests.verify.networks import random_relu_network


def _box_bounds(W, b, lower, upper):
    """(B, N) interval bounds of W x + b over each box (what a domain inherits before tightening)."""
    center, radius = (lower + upper) / 2, (upper - lower) / 2
    mid = center @ W.T + b
    spread = radius @ W.abs().T
    return mid - spread, mid + spread


def _domains(seed: int, count: int = 6, inputs: int = 3, neurons: int = 10):
    """A random first layer, ``count`` boxes and split histories: each split is the sign of its
    neuron at a random point of the box (so that point lies in the domain), on 2 to 5 neurons."""
    rng = np.random.default_rng(seed)
    network = random_relu_network(seed, (inputs, neurons, 2))
    W, b = network.layers[0].weight, network.layers[0].bias
    center = torch.as_tensor(rng.uniform(-0.5, 0.5, (count, inputs)))
    radius = torch.as_tensor(rng.uniform(0.3, 1.0, (count, inputs)))
    lower, upper = center - radius, center + radius
    point = lower + (upper - lower) * torch.as_tensor(rng.uniform(0, 1, (count, inputs)))
    z = point @ W.T + b
    splits = torch.zeros(count, neurons, dtype=torch.int8)
    for i in range(count):
        chosen = rng.choice(neurons, size=int(rng.integers(2, 6)), replace=False)
        splits[i, chosen] = torch.where(z[i, chosen] >= 0, 1, -1).to(torch.int8)
    box_lower, box_upper = _box_bounds(W, b, lower, upper)
    # The inherited bounds are clamped by the splits, as ReLU splitting does.
    box_lower = torch.where(splits > 0, box_lower.clamp(min=0), box_lower)
    box_upper = torch.where(splits < 0, box_upper.clamp(max=0), box_upper)
    return network, lower, upper, splits, IntermediateBounds((box_lower,), (box_upper,))


def _in_domain(W, b, x, splits):
    z = x @ W.T + b
    return ~(((splits > 0) & (z < 0)) | ((splits < 0) & (z > 0))).any(-1), z


def _lp_extreme(W, b, lower, upper, splits, j, sign):
    """max of sign · z_j over the box cut by the splits (exact LP; None when empty)."""
    s = splits.numpy().astype(float)
    rows = s != 0
    A_ub = -(s[rows, None] * W.numpy()[rows])
    b_ub = s[rows] * b.numpy()[rows]
    result = linprog(-sign * W[j].numpy(), A_ub=A_ub, b_ub=b_ub, bounds=list(zip(lower.numpy(), upper.numpy())),
                     method="highs")
    return None if result.status == 2 else -result.fun + sign * float(b[j])


@pytest.mark.parametrize("seed", range(6))
def test_tightened_bounds_hold_on_every_sampled_point_of_the_domain_and_approach_the_lp(seed):
    network, lower, upper, splits, bounds = _domains(seed)
    form = first_layer(network)
    W, b = form.W, form.b
    tightened, empty = tighten_first_layer(form, lower, upper, splits, bounds)
    new_lower, new_upper = tightened.lower[0], tightened.upper[0]
    assert not empty.any()  # each domain holds the point its splits were read from
    assert (new_lower >= bounds.lower[0]).all() and (new_upper <= bounds.upper[0]).all()
    rng = np.random.default_rng(seed)
    reached = []
    for i in range(len(lower)):
        x = lower[i] + (upper[i] - lower[i]) * torch.as_tensor(rng.uniform(0, 1, (20_000, W.shape[1])))
        inside, z = _in_domain(W, b, x, splits[i])
        assert inside.any()
        z = z[inside]
        assert (z <= new_upper[i] + 1e-12).all() and (z >= new_lower[i] - 1e-12).all()
        for j in range(W.shape[0]):
            if splits[i, j] != 0 or not bounds.lower[0][i, j] < 0 < bounds.upper[0][i, j]:
                continue
            exact_upper = _lp_extreme(W, b, lower[i], upper[i], splits[i], j, 1)
            exact_lower = -_lp_extreme(W, b, lower[i], upper[i], splits[i], j, -1)
            assert new_upper[i, j] >= exact_upper - 1e-9 and new_lower[i, j] <= exact_lower + 1e-9
            # the share of the possible tightening (box bound to LP optimum) reached, per side
            for box_side, new, exact in ((bounds.upper[0][i, j], new_upper[i, j], exact_upper),
                                         (-bounds.lower[0][i, j], -new_lower[i, j], -exact_lower)):
                if float(box_side) - exact > 1e-6:
                    reached.append((float(box_side) - float(new)) / (float(box_side) - exact))
    # The multipliers are searched, not solved for: most rows get most of the way to the LP's optimum.
    assert reached and float(np.median(reached)) > 0.9, reached


def test_a_domain_whose_splits_contradict_each_other_is_empty_and_the_others_are_not():
    # z_1 = −z_0 − 1: the splits z_0 ≥ 0 and z_1 ≥ 0 leave no point; z_0 ≥ 0 and z_1 ≤ 0 do.
    W = torch.tensor([[1.0, 0.5], [-1.0, -0.5], [0.3, -1.0]], dtype=torch.float64)
    b = torch.tensor([0.0, -1.0, 0.1], dtype=torch.float64)
    network = Network((Linear(W, b), ReLU(), Linear(torch.ones(1, 3, dtype=torch.float64),
                                                   torch.zeros(1, dtype=torch.float64))), (2,))
    lower, upper = -torch.ones(2, 2, dtype=torch.float64), torch.ones(2, 2, dtype=torch.float64)
    splits = torch.tensor([[1, 1, 0], [1, -1, 0]], dtype=torch.int8)
    box_lower, box_upper = _box_bounds(W, b, lower, upper)
    box_lower = torch.where(splits > 0, box_lower.clamp(min=0), box_lower)
    box_upper = torch.where(splits < 0, box_upper.clamp(max=0), box_upper)
    _, empty = tighten_first_layer(first_layer(network), lower, upper, splits,
                                   IntermediateBounds((box_lower,), (box_upper,)))
    assert empty.tolist() == [True, False]


def test_only_a_dense_first_layer_of_a_chain_is_tightened():
    assert first_layer(random_relu_network(0, (3, 5, 5, 2))) is not None
    no_relu = Network((Linear(torch.ones(2, 3, dtype=torch.float64), torch.zeros(2, dtype=torch.float64)),), (3,))
    assert first_layer(no_relu) is None


def _exact_max(network: Network, lower: np.ndarray, upper: np.ndarray, C: np.ndarray, d: np.ndarray) -> float:
    """max over the box of min_i (C f(x) + d)_i for f = W2 relu(W1 x + b1) + b2 (big-M MILP, HiGHS)."""
    W1, b1 = network.layers[0].weight.numpy(), network.layers[0].bias.numpy()
    W2, b2 = network.layers[2].weight.numpy(), network.layers[2].bias.numpy()
    n, N = W1.shape[1], W1.shape[0]
    z_lower = np.minimum(W1, 0) @ upper + np.maximum(W1, 0) @ lower + b1
    z_upper = np.maximum(W1, 0) @ upper + np.minimum(W1, 0) @ lower + b1
    count = n + 2 * N + 1  # x, r = relu(z), a (binary phase), t
    rows, row_lower, row_upper = [], [], []
    for j in range(N):
        r, a = n + j, n + N + j
        row = np.zeros(count); row[:n] = -W1[j]; row[r] = 1
        rows.append(row); row_lower.append(b1[j]); row_upper.append(np.inf)  # r ≥ z
        row = row.copy(); row[a] = -z_lower[j]
        rows.append(row); row_lower.append(-np.inf); row_upper.append(b1[j] - z_lower[j])  # r ≤ z − l(1 − a)
        row = np.zeros(count); row[r] = 1; row[a] = -max(z_upper[j], 0)
        rows.append(row); row_lower.append(-np.inf); row_upper.append(0.0)  # r ≤ u a
    M, m = C @ W2, C @ b2 + d
    for i in range(C.shape[0]):
        row = np.zeros(count); row[n:n + N] = -M[i]; row[-1] = 1
        rows.append(row); row_lower.append(-np.inf); row_upper.append(m[i])  # t ≤ row i
    objective = np.zeros(count); objective[-1] = -1
    bounds = Bounds(np.concatenate([lower, np.zeros(2 * N), [-1e6]]),
                    np.concatenate([upper, np.maximum(z_upper, 0), np.ones(N), [1e6]]))
    integrality = np.concatenate([np.zeros(n + N), np.ones(N), [0]])
    result = milp(objective, constraints=LinearConstraint(np.array(rows), row_lower, row_upper),
                  integrality=integrality, bounds=bounds)
    assert result.status == 0
    return -result.fun


@pytest.mark.parametrize("seed", range(4))
def test_relu_splitting_on_one_hidden_layer_agrees_with_an_exact_milp(seed, monkeypatch):
    """Wide boxes, most neurons unstable (as on VNN-COMP safenlp): the search leans on the tightening."""
    calls = []
    original = first_layer_module.tighten_first_layer_from

    def counted(*args, **kwargs):
        start = args[5]
        # whether some domain starts from its parent's multipliers (they travel in its tags)
        calls.append(start is not None and bool((start.columns >= 0).any()))
        return original(*args, **kwargs)

    monkeypatch.setattr("assay.verify.relu_split.tighten_first_layer_from", counted)
    n = 5
    network = random_relu_network(100 + seed, (n, 16, 2))
    lower, upper = -np.ones(n), np.ones(n)
    C = np.array([[1.0, -1.0]])
    offset = 1e-2 if seed % 2 else -1e-2
    d = np.array([-(_exact_max(network, lower, upper, C, np.zeros(1)) + offset)])
    unsafe = SimpleNamespace(conjunctions=(SimpleNamespace(C=torch.as_tensor(C), d=torch.as_tensor(d)),))
    box = SimpleNamespace(lower=torch.as_tensor(lower), upper=torch.as_tensor(upper))
    result = verify(network, box, unsafe=unsafe, timeout=60, strategy="relu")
    expected = VerificationStatus.HOLDS if offset > 0 else VerificationStatus.VIOLATED
    assert result.status is expected, result
    if expected is VerificationStatus.HOLDS:
        assert calls  # the search branched on the first layer and tightened it
        assert any(calls)  # children started from their parents' multipliers


def test_bounds_kept_in_float32_are_rounded_outwards():
    """The search may hold a domain's bounds in float32: the float64 bounds go into it outwards."""
    network, lower, upper, splits, bounds = _domains(7)
    form = first_layer(network)
    wide, _ = tighten_first_layer(form, lower, upper, splits, bounds)
    narrow_start = IntermediateBounds(*((side,) for side in cast_outward(bounds.lower[0], bounds.upper[0], torch.float32)))
    narrow, _ = tighten_first_layer(form, lower, upper, splits, narrow_start)
    assert narrow.upper[0].dtype == torch.float32
    tightened = wide.upper[0] < bounds.upper[0]
    assert tightened.any()
    assert (narrow.upper[0].double() >= wide.upper[0]).all()
    assert (narrow.lower[0].double() <= wide.lower[0]).all()
