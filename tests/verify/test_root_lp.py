"""The hull LP of one-ReLU-layer networks (assay.verify.root_lp) and its weak-duality certificate.

Falsified against the exact maximum (a MILP per row, itself checked against every activation
pattern's LP on small networks), rows placed 1e-4 from zero, multipliers that are not optimal,
and α-CROWN (which the LP must never lose to).
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import scipy.sparse as sp
import torch
from scipy.optimize import Bounds, LinearConstraint, linprog, milp

from assay._lp_certificate import dual_upper_bound
from assay.bounds import AlphaCrownOptions, compute_bounds
from assay.nn import Conv2d, Flatten, Linear, Network, ReLU
from assay.nn.layers import AvgPool2d
from assay.sets import Box
from assay.verify import VerificationStatus, verify
from assay.verify.root_lp import conv_matrix, one_layer_form, root_lp_upper_bounds


def dense_net(rng, inputs=3, hidden=6, outputs=2):
    return Network((Linear(rng.normal(size=(hidden, inputs)), rng.normal(size=hidden) * 0.5), ReLU(),
                    Linear(rng.normal(size=(outputs, hidden)), rng.normal(size=outputs))), (inputs,))


def conv_net(rng):
    """1x3x3 image → 2x2 convolution (2 channels, 4 inputs per neuron: 8 neurons) → ReLU → 2x2 average
    pool → Linear."""
    return Network((Conv2d(rng.normal(size=(2, 1, 2, 2)), rng.normal(size=2) * 0.3), ReLU(), AvgPool2d(2, 2),
                    Flatten(), Linear(rng.normal(size=(2, 2)), rng.normal(size=2))), (1, 3, 3))


def exact_maxima(network, form, lower, upper, rows, offset=0.0):
    """max over the box of row·f(x) + offset for each row: a mixed-integer program per row (HiGHS),
    ReLU h = max(0, z) exact through one binary per neuron with big-M constants from the
    pre-activations' exact interval (numpy, independent of assay's bounds)."""
    W, b = form.W.toarray(), form.b
    m, n = W.shape
    z_low = np.clip(W, 0, None) @ lower + np.clip(W, None, 0) @ upper + b
    z_high = np.clip(W, 0, None) @ upper + np.clip(W, None, 0) @ lower + b
    rows = np.atleast_2d(rows)
    c, constant = rows @ form.M, rows @ form.m + offset
    # variables [x (n), h (m), a (m)]: h ≥ Wx + b; h ≤ Wx + b − z_low·(1 − a); h ≤ z_high·a; h ≥ 0
    eye, zero_nm, zero_mm = np.eye(m), np.zeros((m, n)), np.zeros((m, m))
    constraints = [
        LinearConstraint(np.hstack([-W, eye, zero_mm]), b, np.inf),
        LinearConstraint(np.hstack([-W, eye, -np.diag(z_low)]), -np.inf, b - z_low),
        LinearConstraint(np.hstack([zero_nm, eye, -np.diag(np.maximum(z_high, 0))]), -np.inf, 0.0),
    ]
    bounds = Bounds(np.concatenate([lower, np.zeros(m), np.zeros(m)]),
                    np.concatenate([upper, np.full(m, np.inf), np.ones(m)]))
    integrality = np.concatenate([np.zeros(n + m), np.ones(m)])
    best = np.empty(len(rows))
    for k in range(len(rows)):
        objective = np.concatenate([np.zeros(n), -c[k], np.zeros(m)])
        result = milp(objective, constraints=constraints, bounds=bounds, integrality=integrality,
                      options={"mip_rel_gap": 0.0})  # HiGHS' absolute gap, 1e-6, is far below the 1e-4 offsets
        assert result.status == 0, result.message
        best[k] = -result.fun + constant[k]
    return best


def exact_maximum(network, form, lower, upper, row, offset):
    """max over the box of row·f(x) + offset (see :func:`exact_maxima`)."""
    return float(exact_maxima(network, form, lower, upper, row, offset)[0])


def enumerated_maximum(form, lower, upper, row):
    """max over the box of row·f(x), by one LP per activation pattern of the hidden layer (the
    MILP's check on small networks)."""
    W, b = form.W.toarray(), form.b
    c, constant = row @ form.M, row @ form.m
    best = -np.inf
    for pattern in itertools.product((0.0, 1.0), repeat=len(b)):
        s = np.array(pattern)
        sign = np.where(s > 0, -1.0, 1.0)  # active: −(Wx + b) ≤ 0; inactive: Wx + b ≤ 0
        result = linprog(-(c * s) @ W, A_ub=sign[:, None] * W, b_ub=-sign * b, bounds=list(zip(lower, upper)),
                         method="highs")
        if result.status == 0:
            best = max(best, -result.fun + (c * s) @ b + constant)
    return best


@pytest.mark.parametrize("seed", range(3))
def test_the_exact_maximum_by_milp_equals_the_enumeration_of_activation_patterns(seed):
    rng = np.random.default_rng(seed)
    network = dense_net(rng)
    form = one_layer_form(network)
    lower = rng.uniform(-0.5, 0.5, 3) - 0.6
    upper = lower + 1.2
    rows = np.vstack([np.eye(2), -np.eye(2), [[1.0, -1.0]]])
    enumerated = [enumerated_maximum(form, lower, upper, row) for row in rows]
    assert np.allclose(exact_maxima(network, form, lower, upper, rows), enumerated, atol=1e-6)


def z_bounds(network, lower, upper):
    shape = network.input_shape
    box = (torch.as_tensor(lower).reshape(1, *shape), torch.as_tensor(upper).reshape(1, *shape))
    result = compute_bounds(network, box, method="ibp")
    return (result.intermediate.lower[0][0].reshape(-1).numpy(), result.intermediate.upper[0][0].reshape(-1).numpy())


@pytest.mark.parametrize("kind", ["dense", "conv", "dense_wide"])
@pytest.mark.parametrize("seed", range(4))
def test_the_lp_bound_is_at_least_the_exact_maximum_and_at_most_alpha_crowns(kind, seed):
    rng = np.random.default_rng(seed)
    network = {"dense": lambda: dense_net(rng), "conv": lambda: conv_net(rng),
               "dense_wide": lambda: dense_net(rng, inputs=10, hidden=6)}[kind]()  # 10 inputs: big-M rows only
    form = one_layer_form(network)
    assert form is not None
    n = network.input_size
    center = rng.uniform(-0.5, 0.5, n)
    lower, upper = center - 0.6, center + 0.6
    z_lower, z_upper = z_bounds(network, lower, upper)
    rows = np.vstack([np.eye(network.output_size), -np.eye(network.output_size)])
    exact = exact_maxima(network, form, lower, upper, rows)
    # Offsets put every row's exact maximum at +1e-4 or −1e-4: the bound must stay above it.
    for shift in (1e-4, -1e-4):
        offsets = shift - exact
        bound = root_lp_upper_bounds(form, lower, upper, rows, offsets, z_lower, z_upper)
        assert (bound >= shift - 1e-12).all(), (bound, shift)
    box = (torch.as_tensor(lower).reshape(1, *network.input_shape), torch.as_tensor(upper).reshape(1, *network.input_shape))
    alpha = compute_bounds(network, box, spec=torch.as_tensor(rows), method="alpha", sides="upper",
                           options=AlphaCrownOptions(iterations=30)).upper[0].numpy()
    bound = root_lp_upper_bounds(form, lower, upper, rows, np.zeros(len(rows)), z_lower, z_upper)
    finite = np.isfinite(bound)
    assert finite.all() or kind == "dense_wide"  # wide neurons get no hull rows: no LP for their rows
    assert (bound[finite] <= alpha[finite] + 1e-6).all()
    samples = rng.uniform(lower, upper, size=(2000, n))
    values = network.forward(torch.as_tensor(samples).reshape(-1, *network.input_shape)).reshape(2000, -1).numpy() @ rows.T
    assert (values.max(0) <= exact + 1e-9).all()  # the enumeration itself is right


def test_the_one_layer_form_is_the_network():
    rng = np.random.default_rng(0)
    for network in (dense_net(rng), conv_net(rng)):
        form = one_layer_form(network)
        x = rng.normal(size=(50, network.input_size))
        mine = np.maximum(x @ form.W.T.toarray() + form.b, 0) @ form.M.T + form.m
        theirs = network.forward(torch.as_tensor(x).reshape(-1, *network.input_shape)).reshape(50, -1).numpy()
        assert np.allclose(mine, theirs, atol=1e-12)
    deeper = Network((Linear(rng.normal(size=(4, 3)), np.zeros(4)), ReLU(), Linear(rng.normal(size=(4, 4)), np.zeros(4)),
                      ReLU(), Linear(rng.normal(size=(2, 4)), np.zeros(2))), (3,))
    assert one_layer_form(deeper) is None


@pytest.mark.parametrize(("channels", "out_channels", "kernel", "stride", "padding", "dilation", "groups"),
                         [(1, 2, (2, 2), (1, 1), (0, 0), (1, 1), 1), (2, 4, (3, 2), (2, 1), (1, 0), (1, 1), 1),
                          (4, 4, (3, 3), (2, 2), (1, 2), (2, 1), 2), (3, 3, (2, 2), (2, 2), (0, 0), (1, 1), 3)])
def test_the_conv_matrix_is_the_convolutions_response_to_unit_inputs(channels, out_channels, kernel, stride, padding,
                                                                      dilation, groups):
    """Entry by entry, to the bit: the weights' index arithmetic against the convolution applied to
    every unit input (zero weights left out, as the hull's fan-in counts only real inputs)."""
    rng = np.random.default_rng(sum(kernel) + channels)
    weight = rng.normal(size=(out_channels, channels // groups, *kernel))
    weight[0, 0, 0, 0] = 0.0
    conv = Conv2d(weight, rng.normal(size=out_channels), stride, padding, dilation, groups)
    shape = (channels, 7, 6)
    size = int(np.prod(shape))
    with torch.no_grad():
        responses = conv.apply(torch.eye(size, dtype=torch.float64).reshape(size, *shape), conv.weight, None)
    expected = sp.csr_matrix(responses.reshape(size, -1).numpy().T)
    mine = conv_matrix(conv, shape)
    assert mine.shape == expected.shape and mine.nnz == expected.nnz
    assert np.array_equal(mine.indptr, expected.indptr) and np.array_equal(mine.indices, expected.indices)
    assert np.array_equal(mine.data, expected.data)


def test_any_multipliers_give_a_valid_bound_and_optimal_ones_a_tight_one():
    rng = np.random.default_rng(3)
    for _ in range(20):
        n, m = 6, 9
        A = sp.csr_matrix(rng.normal(size=(m, n)))
        b = rng.uniform(0.5, 2.0, m)
        A_eq = sp.csr_matrix(rng.normal(size=(1, n)))
        b_eq = np.array([0.1])
        w = rng.normal(size=n)
        lower, upper = -np.ones(n), np.ones(n)
        solution = linprog(-w, A_ub=A, b_ub=b, A_eq=A_eq, b_eq=b_eq, bounds=list(zip(lower, upper)), method="highs")
        assert solution.status == 0
        optimum = -solution.fun
        lam, mu = -solution.ineqlin.marginals, -solution.eqlin.marginals
        tight = dual_upper_bound(w, A, b, A_eq, b_eq, lower, upper, lam, mu)
        assert optimum - 1e-9 <= tight <= optimum + 1e-6
        for _ in range(5):  # any λ ≥ 0 (negative entries are clipped) and any μ
            loose = dual_upper_bound(w, A, b, A_eq, b_eq, lower, upper, rng.normal(size=m), rng.normal(size=1))
            assert loose >= optimum - 1e-9
    # an unbounded variable left with a positive reduced coefficient: no finite bound
    assert dual_upper_bound(np.array([1.0]), None, None, None, None, np.array([0.0]), np.array([np.inf]), None, None) == np.inf


def _open_row_case():
    """A conv network and box where α-CROWN leaves y0 − y1 open above some threshold that the LP refutes."""
    rng = np.random.default_rng(11)
    network = conv_net(rng)
    lower, upper = np.full(9, -1.0), np.full(9, 1.0)
    form = one_layer_form(network)
    row = np.array([1.0, -1.0])
    exact = exact_maximum(network, form, lower, upper, row, 0.0)
    box = (torch.as_tensor(lower).reshape(1, 1, 3, 3), torch.as_tensor(upper).reshape(1, 1, 3, 3))
    alpha = compute_bounds(network, box, spec=torch.as_tensor(row).reshape(1, 2), method="alpha", sides="upper",
                           options=AlphaCrownOptions(iterations=20)).upper[0, 0].item()
    return network, Box(box[0][0], box[1][0]), exact, alpha


def test_verify_refutes_through_the_lp_where_alpha_leaves_the_row_open_and_finds_violations_next_to_it():
    network, box, exact, alpha = _open_row_case()
    assert alpha > exact + 0.05  # α-CROWN alone leaves a gap here
    form = one_layer_form(network)
    z_lower, z_upper = z_bounds(network, box.lower.reshape(-1).numpy(), box.upper.reshape(-1).numpy())
    hull = root_lp_upper_bounds(form, box.lower.reshape(-1).numpy(), box.upper.reshape(-1).numpy(),
                                np.array([[1.0, -1.0]]), np.zeros(1), z_lower, z_upper)[0]
    threshold = (hull + alpha) / 2  # between the LP's bound and α-CROWN's
    unsafe = _unsafe_difference(threshold)
    result = verify(network, box, unsafe=unsafe, timeout=60, strategy="relu", attack_restarts=0)
    assert result.status is VerificationStatus.HOLDS and result.stats.domains == 0
    result = verify(network, box, unsafe=_unsafe_difference(exact - 1e-4), timeout=60, strategy="relu")
    assert result.status is VerificationStatus.VIOLATED


def _unsafe_difference(threshold):
    from types import SimpleNamespace

    return SimpleNamespace(conjunctions=(SimpleNamespace(C=torch.tensor([[1.0, -1.0]], dtype=torch.float64),
                                                         d=torch.tensor([-threshold], dtype=torch.float64)),))


@pytest.mark.data
@pytest.mark.parametrize("prop", ["prop_7_0.04", "prop_14_0.04"])
def test_verivital_avgpool_rows_hold_at_the_root(data_dir, prop):
    """VNN-COMP 2021 verivital rows 27 and 34: α-CROWN leaves rows open at +0.45/+0.49 and +0.05 (the
    searches timed out at 300 s); the hull LP bounds them at −0.49/−0.71 and −0.79."""
    import assay.nn as nn
    from assay.sets import read_vnnlib
    from assay.verify import verify_vnnlib

    folder = data_dir / "vnncomp" / "verivital"
    network = nn.load(folder / "Convnet_avgpool.onnx")
    property_ = read_vnnlib(folder / "specs" / "avgpool_specs" / f"{prop}.vnnlib", network.input_size,
                            network.output_size)
    # A generous deadline: it costs nothing when the root decides (seconds), and a loaded machine
    # must not turn the verdict into a timeout.
    result = verify_vnnlib(network, property_, timeout=600)
    assert result.status is VerificationStatus.HOLDS
    assert result.stats.domains == 0


def test_a_passed_deadline_or_wide_neurons_give_no_bound():
    """No LP runs after the deadline, nor where no neuron has few enough inputs for the hull
    (the triangle LP alone would only repeat α-CROWN): +inf, which refutes nothing."""
    import time

    rng = np.random.default_rng(2)
    network = conv_net(rng)
    form = one_layer_form(network)
    lower, upper = -np.ones(9), np.ones(9)
    z_lower, z_upper = z_bounds(network, lower, upper)
    rows = np.eye(2)
    passed = root_lp_upper_bounds(form, lower, upper, rows, np.zeros(2), z_lower, z_upper, deadline=time.monotonic())
    assert np.isinf(passed).all()
    wide = dense_net(rng, inputs=10, hidden=6)  # 10 inputs per neuron: above MAX_HULL_INPUTS
    form = one_layer_form(wide)
    lower, upper = -np.ones(10), np.ones(10)
    z_lower, z_upper = z_bounds(wide, lower, upper)
    assert np.isinf(root_lp_upper_bounds(form, lower, upper, rows, np.zeros(2), z_lower, z_upper)).all()
