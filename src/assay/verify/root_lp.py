"""Bound the root of a one-hidden-layer network by an LP with the ideal single-neuron relaxation.

For ``f(x) = M·relu(W x + b) + m`` (one ReLU layer between affine maps, e.g. a convolution, a
ReLU, pooling and a dense layer), the triangle relaxation of each ReLU over its pre-activation
interval (what α-CROWN optimises, and equals at its optimum on one layer) ignores that a
neuron's few inputs are themselves boxed. The convex hull of ``{(x, relu(w·x + b)) : x in a box}``
is described exactly by Anderson et al.'s inequalities ("Strong mixed-integer programming
formulations for trained neural networks", Math. Programming 2020): with δ ∈ [0, 1] and, per
input i, L̆_i / Ŭ_i the box end that minimises / maximises w_i·x_i, for every subset I of the
inputs

    relu(z)  ≤  Σ_{i∈I} w_i (x_i − L̆_i (1 − δ))  +  (b + Σ_{i∉I} w_i Ŭ_i) δ .

(I = all and I = ∅ are the usual big-M pair.) On the VNN-COMP verivital average-pooling network
(2x2 convolution, 4 inputs per neuron) this LP bounds the open robustness rows at −0.3 to −0.8
where α-CROWN's optimum is +0.03 to +0.49.

Each row ``C_i·f(x) + d_i`` is maximised separately; a neuron enters only where its coefficient
is nonzero, and only those with a positive coefficient (whose relu is over-approximated from
above) get δ and the hull's inequalities. The LP is an oracle (HiGHS): the bound returned is
the weak-duality bound of its multipliers, evaluated with outward rounding
(:func:`assay._lp_certificate.dual_upper_bound`), plus the rounding of the suffix map M, m,
which is computed from the layers' exact float64 parameters. So it holds for the exact network
whatever the solver's accuracy.
"""

from __future__ import annotations

import itertools
import time
import weakref
from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp
import torch

from assay._lp import linprog
from assay._lp_certificate import dual_upper_bound, folded_row, ideal_cut_constants
from assay.bounds.plan import gamma
from assay.nn.layers import AvgPool2d, Conv2d, Flatten, Linear, ReLU, Reshape
from assay.nn.network import Network

__all__ = ["OneLayerForm", "one_layer_form", "root_lp_upper_bounds", "open_rows_lp_bounds"]

# Neurons with at most this many inputs get every subset's inequality (2^k − 2 rows each).
MAX_HULL_INPUTS = 8
# Networks with more first-layer neurons than this are not encoded (the LP grows with them).
MAX_NEURONS = 60_000
# At most this many hull inequalities per row's LP; a row that would need more is not bounded.
MAX_HULL_ROWS = 400_000


@dataclass(frozen=True, eq=False)
class OneLayerForm:
    """``f(x) = M relu(W x + b) + m`` for a flat input x: W (N, n) sparse and b (N,) exact;
    M (n_out, N) and m (n_out,) computed in float64, within ``M_error`` / ``m_error`` of the exact ones."""

    W: sp.csr_matrix
    b: np.ndarray
    M: np.ndarray
    m: np.ndarray
    M_error: np.ndarray
    m_error: np.ndarray


_FORMS: "weakref.WeakKeyDictionary[Network, OneLayerForm | None]" = weakref.WeakKeyDictionary()


def one_layer_form(network: Network) -> OneLayerForm | None:
    """The network as one affine layer, one ReLU layer and an affine suffix (cached); None when
    it is not of that shape (or too large to encode)."""
    if network not in _FORMS:
        _FORMS[network] = _build_form(network)
    return _FORMS[network]


def _build_form(network: Network) -> OneLayerForm | None:
    layers = network.layers
    affine = (Linear, Conv2d, AvgPool2d, Flatten, Reshape)
    if (not network.is_chain or len(layers) < 2 or not isinstance(layers[0], (Linear, Conv2d))
            or not isinstance(layers[1], ReLU) or not all(isinstance(layer, affine) for layer in layers[2:])):
        return None
    if int(np.prod(network.shapes[1])) > MAX_NEURONS:
        return None
    W, b = _layer_matrix(layers[0], network.shapes[0])
    M = sp.identity(W.shape[0], format="csr")
    M_abs = M.copy()
    m = np.zeros(W.shape[0])
    m_abs = np.zeros(W.shape[0])
    terms = 0
    for index in range(2, len(layers)):
        matrix = _layer_matrix(layers[index], network.shapes[index])
        if matrix is None:  # a reshape
            continue
        A, bias = matrix
        M, M_abs = A @ M, abs(A) @ M_abs
        m, m_abs = A @ m + bias, abs(A) @ m_abs + np.abs(bias)
        terms += int(np.diff(A.indptr).max(initial=0)) + 2
    factor = gamma(terms + 2, torch.float64)
    M_dense, M_abs_dense = M.toarray(), M_abs.toarray()
    return OneLayerForm(W, b, M_dense, m, factor * M_abs_dense, factor * m_abs)


def _layer_matrix(layer, in_shape) -> tuple[sp.csr_matrix, np.ndarray] | None:
    """An affine layer as (sparse matrix over flat tensors, bias), exactly: every entry is one
    weight (zero weights are left out). None for a reshape."""
    if isinstance(layer, (Flatten, Reshape)):
        return None
    if isinstance(layer, Linear):
        return sp.csr_matrix(layer.weight.numpy()), layer.bias.numpy().copy()
    conv = layer if isinstance(layer, Conv2d) else layer.as_conv(in_shape[0])
    out_shape = conv.output_shape(tuple(in_shape))
    bias = np.repeat(conv.bias.numpy(), int(np.prod(out_shape[1:])))
    return conv_matrix(conv, tuple(in_shape)), bias


def conv_matrix(conv: Conv2d, in_shape: tuple[int, int, int]) -> sp.csr_matrix:
    """The convolution's linear part as a sparse (outputs, inputs) matrix over flat (C, H, W)
    tensors, built from its weights' indices: the entry of output (o, r, c) and input (i, h, w)
    is the weight that the sliding window puts on that input (each pair meets at most one weight)."""
    weight = conv.weight.numpy()
    c_out, c_group, kh, kw = weight.shape
    channels, height, width = in_shape
    _, out_h, out_w = conv.output_shape(in_shape)
    per_group = c_out // conv.groups
    # Axes: output channel, input channel within its group, kernel row, kernel column, output row, output column.
    o = np.arange(c_out).reshape(-1, 1, 1, 1, 1, 1)
    i = (o // per_group) * c_group + np.arange(c_group).reshape(1, -1, 1, 1, 1, 1)
    h = (np.arange(out_h).reshape(1, 1, 1, 1, -1, 1) * conv.stride[0] - conv.padding[0]
         + np.arange(kh).reshape(1, 1, -1, 1, 1, 1) * conv.dilation[0])
    w = (np.arange(out_w).reshape(1, 1, 1, 1, 1, -1) * conv.stride[1] - conv.padding[1]
         + np.arange(kw).reshape(1, 1, 1, -1, 1, 1) * conv.dilation[1])
    shape = (c_out, c_group, kh, kw, out_h, out_w)
    rows = np.broadcast_to((o * out_h + np.arange(out_h).reshape(1, 1, 1, 1, -1, 1)) * out_w
                           + np.arange(out_w).reshape(1, 1, 1, 1, 1, -1), shape)
    h, w = np.broadcast_to(h, shape), np.broadcast_to(w, shape)
    values = np.broadcast_to(weight.reshape(c_out, c_group, kh, kw, 1, 1), shape)
    keep = (h >= 0) & (h < height) & (w >= 0) & (w < width) & (values != 0)
    columns = (np.broadcast_to(i, shape) * height + h) * width + w
    matrix = sp.csr_matrix((values[keep], (rows[keep], columns[keep])), shape=(c_out * out_h * out_w, channels * height * width))
    matrix.sort_indices()
    return matrix


def open_rows_lp_bounds(network: Network, query, root, deadline: float | None = None) -> torch.Tensor | None:
    """(1, S) upper bounds of the query's rows by the hull LP where the root's bounds (a
    :class:`~assay.bounds.BoundsResult` of the whole box, with intermediate bounds) leave a row
    open (≥ 0); +inf for the others. None when the network is not one ReLU layer between affine maps."""
    open_rows = (root.upper[0] >= 0).nonzero().flatten()
    if open_rows.numel() == 0:
        return None
    form = one_layer_form(network)
    if form is None:
        return None
    z_lower = root.intermediate.lower[0][0].reshape(-1).to(torch.float64).numpy()
    z_upper = root.intermediate.upper[0][0].reshape(-1).to(torch.float64).numpy()
    bounds = root_lp_upper_bounds(form, query.lower.numpy(), query.upper.numpy(), query.C[open_rows].numpy(),
                                  query.d[open_rows].numpy(), z_lower, z_upper, deadline)
    result = torch.full((1, query.C.shape[0]), torch.inf, dtype=torch.float64)
    result[0, open_rows] = torch.as_tensor(bounds, dtype=torch.float64)
    return result


def root_lp_upper_bounds(form: OneLayerForm, lower: np.ndarray, upper: np.ndarray, C: np.ndarray, d: np.ndarray,
                         z_lower: np.ndarray, z_upper: np.ndarray, deadline: float | None = None) -> np.ndarray:
    """Sound upper bounds (S,) of each row ``C_i f(x) + d_i`` over the box [lower, upper].

    ``z_lower``/``z_upper``: sound bounds of the first layer's pre-activations (N,) over the box.
    A row whose LP fails (or the deadline, a ``time.monotonic()`` instant, passes) gets +inf.
    """
    bounds = np.full(C.shape[0], np.inf)
    for i in range(C.shape[0]):
        if deadline is not None and time.monotonic() >= deadline:
            break
        bounds[i] = _row_bound(form, lower, upper, C[i], float(d[i]), z_lower, z_upper, deadline)
    return bounds


def _row_bound(form, lower, upper, row, offset, z_lower, z_upper, deadline) -> float:
    c, constant, c_error, constant_error = folded_row(row, offset, form.M, form.m, form.M_error, form.m_error)
    r_max = np.maximum(z_upper, 0.0)
    # Rounding of c, and of the constant: r ∈ [0, max(u, 0)] for every neuron (0 for dead ones).
    slack = float(c_error @ r_max) + constant_error
    n = len(lower)
    used = np.nonzero((c != 0) & (z_upper > 0))[0]
    active = z_lower[used] >= 0
    hull = ~active & (c[used] > 0)
    fan_in = np.diff(form.W.indptr)[used[hull]]
    subsets = np.where(fan_in <= MAX_HULL_INPUTS, 2.0 ** np.minimum(fan_in, MAX_HULL_INPUTS) - 2, 0).sum()
    if (hull.any() and subsets == 0) or subsets > MAX_HULL_ROWS:
        # Without the hull's inequalities the LP is the triangle relaxation, whose optimum α-CROWN
        # already approaches; past the budget it would not fit. Either way: no bound. (With no
        # neuron to relax from above, the LP is exact and runs.)
        return float("inf")
    r_of = {int(j): n + t for t, j in enumerate(used)}
    delta_of = {int(j): n + len(used) + t for t, j in enumerate(used[hull])}
    count = n + len(used) + len(delta_of)
    W = form.W
    ub_rows, ub_cols, ub_vals, ub_rhs = [], [], [], []
    eq_rows, eq_cols, eq_vals, eq_rhs = [], [], [], []

    def add(rows, cols, vals, rhs, entries, bound):
        number = len(rhs)
        for col, val in entries:
            rows.append(number)
            cols.append(col)
            vals.append(val)
        rhs.append(bound)

    for t, j in enumerate(used):
        j = int(j)
        inputs = W.indices[W.indptr[j]:W.indptr[j + 1]]
        weights = W.data[W.indptr[j]:W.indptr[j + 1]]
        z_terms = [(int(col), -float(w)) for col, w in zip(inputs, weights)]
        r = r_of[j]
        bias = float(form.b[j])
        if active[t]:  # r = W_j x + b_j
            add(eq_rows, eq_cols, eq_vals, eq_rhs, [(r, 1.0)] + z_terms, bias)
            continue
        # r ≥ z:  W_j x − r ≤ −b_j
        add(ub_rows, ub_cols, ub_vals, ub_rhs, [(col, -w) for col, w in z_terms] + [(r, -1.0)], -bias)
        if not hull[t]:
            continue
        delta = delta_of[j]
        low, high = float(z_lower[j]), float(z_upper[j])
        # r ≤ z − l (1 − δ)  and  r ≤ u δ, with the sound bounds l ≤ z ≤ u
        # (the right-hand side rounded up: a larger one only weakens the inequality)
        add(ub_rows, ub_cols, ub_vals, ub_rhs, [(r, 1.0)] + z_terms + [(delta, -low)],
            float(np.nextafter(bias - low, np.inf)))
        add(ub_rows, ub_cols, ub_vals, ub_rhs, [(r, 1.0), (delta, -high)], 0.0)
        if len(inputs) > MAX_HULL_INPUTS:
            continue
        box_low = np.where(weights >= 0, lower[inputs], upper[inputs])   # L̆
        box_high = np.where(weights >= 0, upper[inputs], lower[inputs])  # Ŭ
        for size in range(1, len(inputs)):
            for subset in itertools.combinations(range(len(inputs)), size):
                chosen = np.zeros(len(inputs), dtype=bool)
                chosen[list(subset)] = True
                K, R = ideal_cut_constants(weights, box_low, box_high, bias, chosen)
                entries = [(r, 1.0)] + [(int(inputs[k]), -float(weights[k])) for k in subset] + [(delta, -K)]
                add(ub_rows, ub_cols, ub_vals, ub_rhs, entries, R)
    A_ub = sp.csr_matrix((ub_vals, (ub_rows, ub_cols)), shape=(len(ub_rhs), count))
    A_eq = sp.csr_matrix((eq_vals, (eq_rows, eq_cols)), shape=(len(eq_rhs), count))
    b_ub, b_eq = np.asarray(ub_rhs, dtype=np.float64), np.asarray(eq_rhs, dtype=np.float64)
    var_lower = np.concatenate([lower, np.where(active, z_lower[used], 0.0), np.zeros(len(delta_of))])
    var_upper = np.concatenate([upper, z_upper[used], np.ones(len(delta_of))])
    objective = np.zeros(count)
    objective[n:n + len(used)] = c[used]
    options = {}
    if deadline is not None:
        options["time_limit"] = max(1.0, deadline - time.monotonic())
    solution = linprog(-objective, A_ub=A_ub if len(ub_rhs) else None, b_ub=b_ub if len(ub_rhs) else None,
                       A_eq=A_eq if len(eq_rhs) else None, b_eq=b_eq if len(eq_rhs) else None,
                       bounds=np.stack([var_lower, var_upper], 1), method="highs", options=options)
    if solution.status != 0:
        return float("inf")
    lam = -solution.ineqlin.marginals if len(ub_rhs) else None
    mu = -solution.eqlin.marginals if len(eq_rhs) else None
    value = dual_upper_bound(objective, A_ub, b_ub, A_eq, b_eq, var_lower, var_upper, lam, mu)
    return float(np.nextafter(value + constant + slack, np.inf))
