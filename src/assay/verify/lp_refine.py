"""Tighten a dense ReLU network's pre-activation bounds by LP, certified by weak duality.

For a chain ``Linear → ReLU → … → Linear`` (after an optional Flatten), the bounds of ReLU layer
K ≥ 1 are the extremes of ``W_K h_{K−1} + b_K`` over a relaxation of the layers before it:

* each earlier neuron with a known sign is exact (h = z, or h = 0);
* each unstable one has ``h ≥ z``, ``h ≥ 0``, the big-M pair ``h ≤ z − l (1 − δ)``, ``h ≤ u δ``
  with δ ∈ [0, 1], and the cuts of Anderson et al.'s ideal formulation ("Strong mixed-integer
  programming formulations for trained neural networks", 2020) that the LP's solutions violate
  (separated in linear time per neuron: for inputs i in a box, subset I of the inputs,
  ``h ≤ Σ_{i∈I} w_i (h_i − L̆_i (1 − δ)) + (b + Σ_{i∉I} w_i Ŭ_i) δ``).

This is what α,β-CROWN's MIP refinement (``bab-refine``) buys on MNIST networks, at LP cost:
on mnist 256x2 prop_10 (ε 0.05) the refined second layer lets α-CROWN refute 8 of the 9
conjunctions at the root, where it refuted none.

HiGHS (highspy, warm-started between objectives) is only the oracle: every bound returned is
the weak-duality bound of its multipliers over the LP's variable box, evaluated with outward
rounding (:func:`assay._lp_certificate.dual_upper_bound`), on constraint data that are exact or
rounded outwards (the cuts' coefficients of δ and right-hand sides rounded up). New bounds are
intersected with the given ones, so the result is never looser.
"""

from __future__ import annotations

import time

import numpy as np
import scipy.sparse as sp
import torch

from assay._lp import silent_highs
from assay._lp_certificate import dual_upper_bound, folded_row, ideal_cut_constants
from assay.bounds import IntermediateBounds, compute_bounds
from assay.bounds.ibp import cast_outward
from assay.bounds.plan import gamma
from assay.nn.layers import Flatten, Linear, ReLU, Reshape
from assay.nn.network import Network

__all__ = ["dense_layers", "refine_bounds", "row_upper_bounds"]

# Networks with more hidden neurons than this are not refined (one LP per unstable neuron and side).
MAX_HIDDEN = 4096
# Separation rounds per objective (each adds the cuts the LP's solution violates). On mnist 256x4
# prop_0 (ε 0.05), with slack cuts dropped (CUT_POOL), 1 round refines all three layers in 20 s
# and leaves [45, 66, 1, 37] neurons unstable, 3 rounds in 24 s leave [45, 59, 1, 28], 6 rounds
# in 38 s leave [45, 57, 1, 24].
SEPARATION_ROUNDS = 3
# A cut is added when the solution violates it by more than this.
_VIOLATION = 1e-6
# Past this many cuts in the LP, the cuts slack at an objective's optimum are dropped. Cuts
# separated for one objective pile up over the next ones: on mnist 256x4 prop_0 (ε 0.05) the LP
# grew to 4,000 rows after 150 objectives and each solve slowed tenfold (0.02 s → 0.2 s).
CUT_POOL = 200


def dense_layers(network: Network) -> list[tuple[np.ndarray, np.ndarray]] | None:
    """The (W, b) of ``Linear → ReLU → … → Linear`` (a leading Flatten/Reshape allowed), or None."""
    layers = list(network.layers)
    while layers and isinstance(layers[0], (Flatten, Reshape)):
        layers.pop(0)
    if not network.is_chain or len(layers) < 3 or len(layers) % 2 == 0:
        return None
    if not all(isinstance(layer, Linear if i % 2 == 0 else ReLU) for i, layer in enumerate(layers)):
        return None
    if sum(layer.weight.shape[0] for layer in layers[:-1:2]) > MAX_HIDDEN:
        return None
    return [(layer.weight.numpy(), layer.bias.numpy()) for layer in layers[::2]]


class _Relaxation:
    """The LP over the input and the ReLU layers added so far, kept in HiGHS and as sparse rows
    (for the certificate)."""

    def __init__(self, lower: np.ndarray, upper: np.ndarray):
        import highspy

        self.highs = silent_highs()
        self.kOptimal = highspy.HighsModelStatus.kOptimal
        self.lb, self.ub = list(lower), list(upper)
        self.highs.addVars(len(lower), np.asarray(lower, float), np.asarray(upper, float))
        self.rows: list[tuple[np.ndarray, np.ndarray, float, bool]] = []  # (columns, values, bound, equality)
        self.outputs = np.arange(len(lower))  # the columns of the last layer added (h_{K−1})
        self.box = (np.asarray(lower, float), np.asarray(upper, float))  # its bounds
        self.neurons: list[tuple] = []  # per unstable neuron: (h column, δ column, inputs, w, b, box low, box high)
        self.is_cut: list[bool] = []  # per row: whether it is a separated cut (which may be dropped)

    def _vars(self, lower, upper) -> np.ndarray:
        start = len(self.lb)
        self.lb += list(lower)
        self.ub += list(upper)
        self.highs.addVars(len(lower), np.asarray(lower, float), np.asarray(upper, float))
        return np.arange(start, start + len(lower))

    def _row(self, columns, values, bound: float, equality: bool = False, cut: bool = False) -> None:
        columns, values = np.asarray(columns, dtype=np.int32), np.asarray(values, dtype=np.float64)
        self.rows.append((columns, values, float(bound), equality))
        self.is_cut.append(cut)
        low = bound if equality else -np.inf
        self.highs.addRow(low, float(bound), len(columns), columns, values)

    def add_layer(self, W: np.ndarray, b: np.ndarray, l: np.ndarray, u: np.ndarray) -> None:
        """h = relu(W · outputs + b) with pre-activation bounds [l, u], relaxed."""
        inputs = self.outputs
        h = self._vars(np.maximum(l, 0.0), np.maximum(u, 0.0))
        unstable = np.nonzero((l < 0) & (u > 0))[0]
        delta = self._vars(np.zeros(len(unstable)), np.ones(len(unstable)))
        for j in np.nonzero(l >= 0)[0]:  # h = W_j x + b_j
            self._row(np.concatenate([[h[j]], inputs]), np.concatenate([[1.0], -W[j]]), b[j], equality=True)
        box_low, box_high = self.box
        for t, j in enumerate(unstable):
            w = W[j]
            self._row(np.concatenate([inputs, [h[j]]]), np.concatenate([w, [-1.0]]), -b[j])  # h ≥ z
            # h ≤ z − l (1 − δ), the right-hand side b − l rounded up; h ≤ u δ
            self._row(np.concatenate([[h[j]], inputs, [delta[t]]]), np.concatenate([[1.0], -w, [-l[j]]]),
                      float(np.nextafter(b[j] - l[j], np.inf)))
            self._row([h[j], delta[t]], [1.0, -u[j]], 0.0)
            self.neurons.append((h[j], delta[t], inputs, w, float(b[j]), box_low, box_high))
        # (dead neurons: h's bounds are [0, 0])
        self.outputs = h
        self.box = (np.maximum(l, 0.0), np.maximum(u, 0.0))

    def separate(self, x: np.ndarray) -> int:
        """Add the ideal formulation's most violated cut of every neuron that x violates."""
        added = 0
        for h, delta, inputs, w, b, box_low, box_high in self.neurons:
            low = np.where(w >= 0, box_low, box_high)   # L̆
            high = np.where(w >= 0, box_high, box_low)  # Ŭ
            d, values = x[delta], x[inputs]
            chosen = w * (values - low * (1 - d)) < w * high * d
            bound = (w[chosen] * (values[chosen] - low[chosen] * (1 - d))).sum() + (
                b + (w[~chosen] * high[~chosen]).sum()) * d
            if x[h] <= bound + _VIOLATION:
                continue
            K, R = ideal_cut_constants(w, low, high, b, chosen)
            self._row(np.concatenate([[h], inputs[chosen], [delta]]), np.concatenate([[1.0], -w[chosen], [-K]]), R,
                      cut=True)
            added += 1
        return added

    def drop_slack_cuts(self) -> None:
        """Past :data:`CUT_POOL` cuts, delete those with a zero multiplier at the last optimum.

        Any subset of valid cuts leaves a valid relaxation (only looser), and the LP's basis stays
        valid: a slack row's own slack variable is what leaves with it.
        """
        if sum(self.is_cut) <= CUT_POOL:
            return
        duals = np.asarray(self.highs.getSolution().row_dual)
        drop = [r for r, cut in enumerate(self.is_cut) if cut and duals[r] == 0.0]
        if not drop:
            return
        self.highs.deleteRows(len(drop), np.asarray(drop, dtype=np.int32))
        dropped = set(drop)
        self.rows = [row for r, row in enumerate(self.rows) if r not in dropped]
        self.is_cut = [cut for r, cut in enumerate(self.is_cut) if r not in dropped]

    def maximum(self, columns: np.ndarray, weights: np.ndarray, deadline: float | None) -> float:
        """A sound upper bound of Σ weights · v[columns] over the relaxation (+inf on failure)."""
        count = len(self.lb)
        cost = np.zeros(count)
        self.highs.changeColsCost(count, np.arange(count, dtype=np.int32), cost)
        self.highs.changeColsCost(len(columns), np.asarray(columns, dtype=np.int32), -np.asarray(weights, float))
        for round_ in range(SEPARATION_ROUNDS + 1):
            if deadline is not None:
                # HiGHS' time limit counts its object's whole run time (its clocks are not reset
                # between runs): a solve may use what is left before the deadline, no more.
                left = deadline - time.monotonic()
                if left <= 0:
                    return float("inf")
                self.highs.setOptionValue("time_limit", self.highs.getRunTime() + left)
            self.highs.run()
            if self.highs.getModelStatus() != self.kOptimal:
                return float("inf")
            if round_ == SEPARATION_ROUNDS or (deadline is not None and time.monotonic() >= deadline):
                break
            if not self.separate(np.asarray(self.highs.getSolution().col_value)):
                break
        bound = self._certificate(columns, weights)
        self.drop_slack_cuts()
        return bound

    def _certificate(self, columns, weights) -> float:
        count = len(self.lb)
        objective = np.zeros(count)
        objective[columns] = weights
        duals = -np.asarray(self.highs.getSolution().row_dual)  # HiGHS minimises −objective
        ub_rows = [r for r, row in enumerate(self.rows) if not row[3]]
        eq_rows = [r for r, row in enumerate(self.rows) if row[3]]

        def matrix(which):
            if not which:
                return None, None
            data = np.concatenate([self.rows[r][1] for r in which])
            cols = np.concatenate([self.rows[r][0] for r in which])
            indptr = np.concatenate([[0], np.cumsum([len(self.rows[r][0]) for r in which])])
            return sp.csr_matrix((data, cols, indptr), shape=(len(which), count)), np.array([self.rows[r][2] for r in which])

        A_ub, b_ub = matrix(ub_rows)
        A_eq, b_eq = matrix(eq_rows)
        return dual_upper_bound(objective, A_ub, b_ub, A_eq, b_eq, np.array(self.lb), np.array(self.ub),
                                duals[ub_rows] if ub_rows else None, duals[eq_rows] if eq_rows else None)


def refine_bounds(network: Network, lower: torch.Tensor, upper: torch.Tensor, intermediate: IntermediateBounds,
                  deadline: float | None = None) -> IntermediateBounds | None:
    """Tighter pre-activation bounds of ReLU layers 1, 2, … of a dense network over the box
    [lower, upper] (flat), from the sound ``intermediate`` bounds of one domain (batch 1).

    Layer by layer: each unstable neuron's upper and lower bound by the LP of the layers before
    it, whose relaxations use the bounds refined so far (no lower bound for a neuron the upper
    one proves inactive); after each layer, CROWN over the refined layers tightens the later
    ones. Stops at ``deadline`` (a ``time.monotonic()`` instant) with what it has. None for a
    network that is not dense. Every bound returned is sound and at least as tight as the given one.
    """
    layers = dense_layers(network)
    if layers is None:
        return None
    lows = [t[0].reshape(-1).to(torch.float64).numpy().copy() for t in intermediate.lower]
    highs = [t[0].reshape(-1).to(torch.float64).numpy().copy() for t in intermediate.upper]
    lp = _Relaxation(lower.reshape(-1).numpy(), upper.reshape(-1).numpy())
    for k in range(1, len(lows)):
        W, b = layers[k - 1]
        lp.add_layer(W, b, lows[k - 1], highs[k - 1])
        W, b = layers[k]
        for j in np.nonzero((lows[k] < 0) & (highs[k] > 0))[0]:
            # The upper bound first: a neuron it proves inactive needs no lower bound (its output
            # is 0 whatever the lower bound is), which saves one LP of two.
            for sign in (1.0, -1.0):
                if deadline is not None and time.monotonic() >= deadline:
                    return _result(intermediate, lows, highs)
                if sign < 0 and highs[k][j] <= 0:
                    break
                value = lp.maximum(lp.outputs, sign * W[j], deadline)
                if not np.isfinite(value):
                    continue
                # the bias, added outwards
                total = value + sign * b[j]
                total = float(np.nextafter(total + gamma(3, torch.float64) * (abs(value) + abs(b[j])), np.inf))
                if sign > 0:
                    highs[k][j] = min(highs[k][j], total)
                else:
                    lows[k][j] = max(lows[k][j], -total)
        if k + 1 < len(lows):
            _propagate(network, lower, upper, intermediate, lows, highs, k + 1)
    return _result(intermediate, lows, highs)


def row_upper_bounds(network: Network, lower: torch.Tensor, upper: torch.Tensor, intermediate: IntermediateBounds,
                     C: torch.Tensor, d: torch.Tensor, deadline: float | None = None) -> torch.Tensor | None:
    """Sound upper bounds (S,) of the rows ``C f(x) + d`` (C (S, n_out), d (S,)) over the box
    [lower, upper] (flat), by the LP over every ReLU layer with pre-activation bounds
    ``intermediate`` (one domain, e.g. those of :func:`refine_bounds`), with separated cuts.

    Tighter than α-CROWN over the same bounds where the cuts bite (α-CROWN reaches at best the
    triangle relaxation's LP). A row left when ``deadline`` passes, or whose LP fails, gets +inf.
    None for a network that is not dense.
    """
    layers = dense_layers(network)
    if layers is None:
        return None
    C64 = C.reshape(C.shape[0], -1).to(torch.float64).numpy()
    d64 = d.reshape(-1).to(torch.float64).numpy()
    lp = _Relaxation(lower.reshape(-1).numpy(), upper.reshape(-1).numpy())
    for k, (W, b) in enumerate(layers[:-1]):
        lp.add_layer(W, b, intermediate.lower[k][0].reshape(-1).to(torch.float64).numpy(),
                     intermediate.upper[k][0].reshape(-1).to(torch.float64).numpy())
    W, b = layers[-1]
    h_max = np.maximum(lp.box[1], 0.0)  # the last hidden layer's outputs lie in [0, h_max]
    bounds = np.full(len(C64), np.inf)
    for i, (row, offset) in enumerate(zip(C64, d64)):
        if deadline is not None and time.monotonic() >= deadline:
            break
        # C_i (W h + b) + d_i = weights · h + constant, both rounded: their errors are charged below
        weights, constant, weights_error, constant_error = folded_row(
            row, float(offset), W.astype(np.float64), b.astype(np.float64))
        value = lp.maximum(lp.outputs, weights, deadline)
        if not np.isfinite(value):
            continue
        error = float(weights_error @ h_max) + constant_error + gamma(3, torch.float64) * (abs(value) + abs(constant))
        bounds[i] = float(np.nextafter(value + constant + error, np.inf))
    return torch.as_tensor(bounds)


def _propagate(network: Network, lower: torch.Tensor, upper: torch.Tensor, intermediate: IntermediateBounds,
               lows: list[np.ndarray], highs: list[np.ndarray], fixed: int) -> None:
    """Tighten the bounds of ReLU layers ``fixed``, … in place by CROWN over the refined bounds
    of layers 0 … ``fixed`` − 1.

    Every neuron the LP made stable or narrower loosens no later bound and tightens many: the
    next layers' LPs then start from fewer unstable neurons (fewer LPs, each with fewer rows).
    """
    current = _result(intermediate, lows, highs)
    shape = network.input_shape
    box = (lower.reshape(1, *shape).to(torch.float64), upper.reshape(1, *shape).to(torch.float64))
    later = compute_bounds(network, box, method="crown", dtype="float64", intermediate=current,
                           refine_intermediate=True, fixed_layers=fixed).intermediate
    for k in range(fixed, len(lows)):
        lows[k] = np.maximum(lows[k], later.lower[k][0].reshape(-1).to(torch.float64).numpy())
        highs[k] = np.minimum(highs[k], later.upper[k][0].reshape(-1).to(torch.float64).numpy())


def _result(intermediate: IntermediateBounds, lows, highs) -> IntermediateBounds:
    shape = [t.shape for t in intermediate.lower]
    dtype = intermediate.lower[0].dtype
    # float64 → the bounds' dtype rounded outwards (round to nearest could cut into the range)
    cast = [cast_outward(torch.as_tensor(l), torch.as_tensor(h), dtype) for l, h in zip(lows, highs)]
    return IntermediateBounds(
        tuple(torch.maximum(t, low.reshape(s)) for t, (low, _), s in zip(intermediate.lower, cast, shape)),
        tuple(torch.minimum(t, high.reshape(s)) for t, (_, high), s in zip(intermediate.upper, cast, shape)))
