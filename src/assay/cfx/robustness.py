"""Δ-robustness of a counterfactual: does ``x_cf`` stay valid for every model whose weights moved by ≤ δ?

A counterfactual ``x_cf`` is **Δ-robust** (Jiang et al., AAAI 2023; Marzari, Leofante et al., ECAI
2024) when every network obtained by moving each weight and bias of Linear layer k by at most δ_k
(the *interval network*) still classifies it as the target: every target row ``C f′(x_cf) > margin``.

Two checks, answering in order (:func:`delta_robust`):

1. **Interval-weight bound propagation** (sound, incomplete, fast): :func:`assay.bounds.compute_bounds`
   with ``weight_perturbation`` bounds the target rows over the interval network at the point
   ``x_cf``; a positive lower bound proves robustness at once. Its pre-activation bounds are also
   the MILP's big-M constants.
2. **An exact MILP** when the bounds cannot decide. It is exact because of two facts:

   * the first layer sees the fixed input x: each neuron's pre-activation
     ``(W + ΔW)_i·x + (b + Δb)_i`` ranges exactly over ``c_i ± δ₁(‖x‖₁ + 1)`` (c = W x + b), every
     value reached by ``ΔW_ij = t·δ₁·sign(x_j)``, ``Δb_i = t·δ₁`` for one t ∈ [−1, 1], and rows are
     independent (each neuron has its own weights);
   * every later layer sees post-ReLU values h ≥ 0, so for that h its neuron i ranges exactly over
     ``W_i·h + b_i ± δ_k(1ᵀh + 1)`` — the bilinear term ``ΔW·h`` is bounded by a term *linear* in h
     because h has a known sign — again reached by shifting row i uniformly by t·δ_k.

   So the set of activation vectors of all shifted models is exactly the MILP's feasible set: a
   variable z_i per neuron between those two linear bounds, and ``h = relu(z)`` encoded exactly with
   one binary per unstable neuron and big-M constants from the sound bounds of step 1. The worst
   output row is linear in the last hidden layer: ``min C_r(W h + b) − δ_L‖C_r‖₁(1ᵀh + 1)``. Layers'
   weights are disjoint, so per-layer choices combine into one model. The MILP's proven lower bound
   (HiGHS's dual bound) certifies robustness when it exceeds ``margin + tolerance``; otherwise the
   optimum is turned into a **witness**: the shifted model built from the t's above, re-checked with
   a plain forward pass. Only a confirmed witness makes the answer ``"not_robust"``; anything else
   (a witness within rounding of the boundary, a timeout) is ``"unknown"``.

:func:`max_certified_delta` bisects on a uniform δ with the exact check.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import torch

from assay._validate import check_choice
from assay.cfx._model import MilpBuilder, check_mlp, relu_rows, row_margins, target_rows
from assay.errors import DataError, OptionError
from assay.nn import Linear, Network

__all__ = ["DeltaRobustness", "MaxDelta", "delta_robust", "max_certified_delta", "layer_deltas", "shifted_network"]


@dataclass(frozen=True)
class DeltaRobustness:
    """The verdict of a Δ-robustness check.

    Attributes:
        verdict: ``"robust"`` (proven for every shifted model), ``"not_robust"`` (``witness``
            invalidates ``x_cf``, re-checked by a forward pass) or ``"unknown"``.
        deltas: δ per Linear layer, in order.
        decided_by: ``"bounds"`` (interval-weight propagation), ``"milp"``, ``"closed_form"``
            (a network with one Linear layer, or one hidden layer: exact), or ``"none"``.
        worst_lower: a sound lower bound on the worst target row over the interval network.
        worst_upper: the smallest target row seen on a concrete model (the witness's, by a
            forward pass), +inf if none was built.
        witness: the shifted network that invalidates ``x_cf`` (``"not_robust"`` only).
        seconds: wall time.
        message: a sentence for people.
    """

    verdict: str
    deltas: tuple[float, ...]
    margin: float
    decided_by: str
    worst_lower: float
    worst_upper: float
    witness: Network | None
    seconds: float
    message: str

    @property
    def robust(self) -> bool:
        return self.verdict == "robust"

    def to_json(self) -> dict:
        witness = None
        if self.witness is not None:
            witness = [{"weight": layer.weight.tolist(), "bias": layer.bias.tolist()}
                       for layer in self.witness.layers if isinstance(layer, Linear)]
        return {"verdict": self.verdict, "deltas": list(self.deltas), "margin": self.margin,
                "decided_by": self.decided_by, "worst_lower": _json_float(self.worst_lower),
                "worst_upper": _json_float(self.worst_upper), "witness": witness, "seconds": self.seconds,
                "message": self.message}


@dataclass(frozen=True)
class MaxDelta:
    """The largest uniform δ at which ``x_cf`` is proven Δ-robust (bisection on the exact check).

    ``delta`` is certified (``"robust"`` was proven there); ``upper`` is the smallest δ tried that
    was not proven (``"not_robust"`` or ``"unknown"``), so the true maximum lies in
    [delta, upper] when every check in between was decided. ``checks`` counts the checks made;
    ``interrupted`` says Ctrl-C stopped the bisection (``delta`` is still certified).
    """

    delta: float
    upper: float
    checks: int
    undecided: int
    seconds: float
    interrupted: bool = False

    def to_json(self) -> dict:
        return {"delta": self.delta, "upper": _json_float(self.upper), "checks": self.checks,
                "undecided": self.undecided, "seconds": self.seconds, "interrupted": self.interrupted}


def _json_float(value):
    return float(value) if np.isfinite(value) else None


def layer_deltas(network: Network, delta) -> tuple[float, ...]:
    """δ per Linear layer from a number, a sequence (one per Linear layer) or a dict {layer index: δ}."""
    linear = [i for i, layer in enumerate(network.layers) if isinstance(layer, Linear)]
    if isinstance(delta, dict):
        unknown = set(delta) - set(linear)
        if unknown:
            raise OptionError(f"delta names layers {sorted(unknown)}, which are not Linear layers; those are {linear}")
        values = [float(delta.get(i, 0.0)) for i in linear]
    elif np.ndim(delta) == 0:
        values = [float(delta)] * len(linear)
    else:
        values = [float(v) for v in delta]
        if len(values) != len(linear):
            raise OptionError(f"delta needs one value per Linear layer ({len(linear)}); got {len(values)}")
    if any(not np.isfinite(v) or v < 0 for v in values):
        raise OptionError(f"every δ must be a finite number ≥ 0; got {values}")
    return tuple(values)


def shifted_network(network: Network, shifts) -> Network:
    """``network`` with ``(ΔW, Δb)`` added to each Linear layer (``shifts`` in Linear-layer order)."""
    layers, k = [], 0
    for layer in network.layers:
        if isinstance(layer, Linear):
            dW, db = shifts[k]
            layers.append(Linear(layer.weight + torch.as_tensor(dW), layer.bias + torch.as_tensor(db)))
            k += 1
        else:
            layers.append(layer)
    return Network(tuple(layers), network.input_shape, network.input_name, network.output_name,
                   f"{network.source} (shifted)")


def delta_robust(
    network: Network,
    x_cf,
    delta,
    target: int,
    *,
    margin: float = 0.0,
    method: str = "auto",
    bounds_method: str = "crown",
    time_limit: float | None = None,
    tolerance: float = 1e-6,
) -> DeltaRobustness:
    """Is ``x_cf`` classified as ``target`` by every model within δ of ``network``? (module docstring)

    Args:
        network: a Linear/ReLU chain over flat inputs.
        x_cf: the counterfactual (encoded), shape (n,).
        delta: δ ≥ 0 for every weight and bias, or one δ per Linear layer, or {layer index: δ}.
        target: the class ``x_cf`` must keep.
        margin: every target row must stay > ``margin`` (0: plain validity).
        method: ``"auto"`` (default: the exact closed form for one hidden layer, else bounds
            first, then the MILP), ``"bounds"`` (sound but incomplete: "robust" or "unknown"),
            or ``"milp"`` (the exact MILP).
        bounds_method: the bound method of step 1 and of the big-M constants.
        time_limit: seconds for each MILP (None: no limit); an undecided MILP gives "unknown".
        tolerance: the MILP's lower bound must exceed ``margin`` by this much to certify
            (HiGHS's feasibility tolerances are ~1e-7; the check is then sound in practice).
    """
    started = time.perf_counter()
    check_choice(method, "method", "delta_robust", ("auto", "bounds", "milp"))
    affine = check_mlp(network, "delta_robust")
    deltas = layer_deltas(network, delta)
    x = np.asarray(x_cf, dtype=np.float64).reshape(-1)
    if x.shape != (network.input_size,) or not np.isfinite(x).all():
        raise DataError(f"x_cf must be {network.input_size} finite values for {network.source}; got shape {x.shape}")
    C = target_rows(network, target)
    margin = float(margin)

    def answer(verdict, decided_by, lower, upper, witness, message):
        return DeltaRobustness(verdict, deltas, margin, decided_by, float(lower), float(upper), witness,
                               time.perf_counter() - started, message)

    if len(affine) == 1:
        return _single_layer(network, x, C, deltas[0], margin, answer)
    if len(affine) == 2 and method == "auto":
        return _one_hidden_layer(network, affine, x, C, deltas, margin, answer)

    bounds = _interval_bounds(network, x, C, deltas, bounds_method)
    lower = float(bounds.lower.min())
    if method != "milp" and lower > margin:
        return answer("robust", "bounds", lower, np.inf, None,
                      f"robust: interval-weight bounds keep every target row ≥ {lower:.4g} > {margin:g}")
    if method == "bounds":
        return answer("unknown", "none", lower, np.inf, None,
                      f"undecided: the interval-weight lower bound {lower:.4g} does not exceed {margin:g}")
    pre = [(lo[0].numpy().astype(np.float64), hi[0].numpy().astype(np.float64))
           for lo, hi in zip(bounds.intermediate.lower, bounds.intermediate.upper)]
    worst_lower, best_witness, best_value, undecided = np.inf, None, np.inf, False
    for r in range(len(C)):
        solution, layout = _worst_row_milp(affine, x, C[r], deltas, pre, time_limit)
        if solution.x is None:
            undecided = True
            worst_lower = min(worst_lower, solution.bound)
            continue
        worst_lower = min(worst_lower, solution.bound + layout["constant"])
        if solution.objective + layout["constant"] <= margin + tolerance:
            witness = _witness(network, affine, x, C[r], deltas, solution.x, layout)
            value = float(row_margins(witness, x, C)[0])
            if value < best_value:
                best_witness, best_value = witness, value
        if solution.status != "optimal":
            undecided = True
    worst_lower = max(worst_lower, lower)
    if best_witness is not None and best_value <= margin:
        return answer("not_robust", "milp", worst_lower, best_value, best_witness,
                      f"not robust: a model within δ moves a target row to {best_value:.4g} ≤ {margin:g} "
                      "(re-checked by a forward pass)")
    if not undecided and worst_lower > margin + tolerance:
        return answer("robust", "milp", worst_lower, best_value, None,
                      f"robust: the exact MILP keeps every target row ≥ {worst_lower:.4g} > {margin:g}")
    return answer("unknown", "none", worst_lower, best_value, None,
                  "undecided: the worst case lies within the solver's tolerance of the margin, or the MILP was stopped")


def _single_layer(network, x, C, delta, margin, answer):
    """One Linear layer: the worst row is C(Wx + b) − δ‖C_r‖₁(‖x‖₁ + 1), reached by a shifted model."""
    W = network.layers[0].weight.numpy()
    b = network.layers[0].bias.numpy()
    nominal = C @ (W @ x + b)
    worst = nominal - delta * np.abs(C).sum(1) * (np.abs(x).sum() + 1.0)
    r = int(np.argmin(worst))
    direction = -np.sign(C[r])  # push each output against row r
    sign_x = np.where(x >= 0, 1.0, -1.0)
    witness = shifted_network(network, [(delta * np.outer(direction, sign_x), delta * direction)])
    value = float(row_margins(witness, x, C)[0])
    # Rounding: the closed form and the forward pass agree to ~1e-12; keep a relative guard.
    guard = 1e-9 * (1.0 + np.abs(nominal).max() + delta * (np.abs(x).sum() + 1.0))
    if worst[r] > margin + guard:
        return answer("robust", "closed_form", worst[r] - guard, value, None,
                      f"robust: the worst target row is {worst[r]:.4g} > {margin:g} (closed form)")
    if value <= margin:
        return answer("not_robust", "closed_form", worst[r] - guard, value, witness,
                      f"not robust: a model within δ moves a target row to {value:.4g} ≤ {margin:g}")
    return answer("unknown", "none", worst[r] - guard, value, None, "undecided: the worst case is within rounding of the margin")


def _one_hidden_layer(network, affine, x, C, deltas, margin, answer):
    """One hidden layer: the exact worst case in closed form, O(hidden units) per target row.

    Each hidden pre-activation ranges independently over [l_j, u_j] = c_j ∓ δ₁(‖x‖₁ + 1) and the
    worst row is ``a·h + C_r b − δ₂‖C_r‖₁`` with ``a = C_r W − δ₂‖C_r‖₁`` (h ≥ 0): each term is
    minimised on its own, by h_j = relu(l_j) where a_j ≥ 0 and relu(u_j) where a_j < 0 (ReLU is
    monotone). The same choice, as a shifted model, is the witness.
    """
    (W1, b1), (W2, b2) = affine
    center = W1 @ x + b1
    radius = deltas[0] * (np.abs(x).sum() + 1.0)
    spread = deltas[1] * np.abs(C).sum(1)
    a = C @ W2 - spread[:, None]
    h = np.where(a >= 0, np.maximum(center - radius, 0.0), np.maximum(center + radius, 0.0))
    worst = (a * h).sum(1) + C @ b2 - spread
    r = int(np.argmin(worst))
    t = np.where(a[r] >= 0, -1.0, 1.0)
    sign_x = np.where(x >= 0, 1.0, -1.0)
    direction = -np.sign(C[r])
    witness = shifted_network(network, [(deltas[0] * np.outer(t, sign_x), deltas[0] * t),
                                        (deltas[1] * np.outer(direction, np.ones(W2.shape[1])), deltas[1] * direction)])
    value = float(row_margins(witness, x, C)[0])
    scale = 1.0 + np.abs(C @ W2).sum() * (np.abs(center).max() + radius) + np.abs(C @ b2).max() + spread.max()
    guard = 1e-9 * scale
    if worst[r] > margin + guard:
        return answer("robust", "closed_form", worst[r] - guard, np.inf, None,
                      f"robust: the worst target row is {worst[r]:.4g} > {margin:g} (exact, one hidden layer)")
    if value <= margin:
        return answer("not_robust", "closed_form", worst[r] - guard, value, witness,
                      f"not robust: a model within δ moves a target row to {value:.4g} ≤ {margin:g} "
                      "(re-checked by a forward pass)")
    return answer("unknown", "none", worst[r] - guard, value, None, "undecided: the worst case is within rounding of the margin")


def _interval_bounds(network, x, C, deltas, method):
    from assay.bounds import compute_bounds
    from assay.sets import Box

    point = torch.as_tensor(x)
    return compute_bounds(network, Box(point, point), (torch.as_tensor(C), torch.zeros(len(C), dtype=torch.float64)),
                          method=method, weight_perturbation=list(deltas))


def _worst_row_milp(affine, x, row, deltas, pre, time_limit):
    """Minimise target row ``row · f′(x)`` over the interval network (exact; see the module docstring)."""
    builder = MilpBuilder()
    layout = {"z": [], "h": []}
    W, b = affine[0]
    center = W @ x + b
    radius = deltas[0] * (np.abs(x).sum() + 1.0)
    lo, hi = np.maximum(center - radius, pre[0][0]), np.minimum(center + radius, pre[0][1])
    hi = np.maximum(lo, hi)
    z = builder.add(len(center), lo, hi)
    layout["z"].append(z)
    h = relu_rows(builder, [{int(z[i]): 1.0} for i in range(len(z))], np.zeros(len(z)), lo, hi)
    layout["h"].append(h)
    for k in range(1, len(affine) - 1):
        W, b = affine[k]
        d = deltas[k]
        lo, hi = pre[k]
        z = builder.add(W.shape[0], lo, hi)
        for i in range(W.shape[0]):
            upper_terms = {int(z[i]): 1.0, **{int(h[j]): -(W[i, j] + d) for j in range(W.shape[1])}}
            lower_terms = {int(z[i]): 1.0, **{int(h[j]): -(W[i, j] - d) for j in range(W.shape[1])}}
            builder.row(upper_terms, -np.inf, b[i] + d)  # z ≤ (W + δ)h + b + δ
            builder.row(lower_terms, b[i] - d, np.inf)  # z ≥ (W − δ)h + b − δ
        layout["z"].append(z)
        h = relu_rows(builder, [{int(z[i]): 1.0} for i in range(len(z))], np.zeros(len(z)), lo, hi)
        layout["h"].append(h)
    W, b = affine[-1]
    spread = deltas[-1] * np.abs(row).sum()
    cost = np.zeros(len(builder.lower))
    cost[h] = row @ W - spread
    layout["constant"] = float(row @ b - spread)
    return builder.solve(cost=cost, time_limit=time_limit), layout


def _witness(network, affine, x, row, deltas, values, layout):
    """The shifted model realising the MILP's activations: row i of layer k moved uniformly by t_i·δ_k."""
    shifts = []
    W, b = affine[0]
    z = values[layout["z"][0]]
    radius = deltas[0] * (np.abs(x).sum() + 1.0)
    t = np.clip((z - (W @ x + b)) / radius, -1, 1) if radius > 0 else np.zeros(len(z))
    sign_x = np.where(x >= 0, 1.0, -1.0)
    shifts.append((deltas[0] * np.outer(t, sign_x), deltas[0] * t))
    for k in range(1, len(affine) - 1):
        W, b = affine[k]
        h = np.maximum(values[layout["h"][k - 1]], 0.0)
        z = values[layout["z"][k]]
        scale = deltas[k] * (h.sum() + 1.0)
        t = np.clip((z - (W @ h + b)) / scale, -1, 1) if scale > 0 else np.zeros(len(z))
        shifts.append((deltas[k] * np.outer(t, np.ones(W.shape[1])), deltas[k] * t))
    W, b = affine[-1]
    direction = -np.sign(row)
    shifts.append((deltas[-1] * np.outer(direction, np.ones(W.shape[1])), deltas[-1] * direction))
    return shifted_network(network, shifts)


def max_certified_delta(
    network: Network,
    x_cf,
    target: int,
    *,
    margin: float = 0.0,
    tolerance: float = 1e-4,
    start: float = 0.01,
    delta_max: float = 10.0,
    time_limit: float | None = None,
) -> MaxDelta:
    """The largest uniform δ with ``x_cf`` proven Δ-robust, to within ``tolerance``, by bisection.

    The upper end is found by doubling ``start`` until a check fails (or ``delta_max``); then the
    interval is halved until shorter than ``tolerance``. Robustness is monotone in δ (a larger box
    contains the smaller one), so bisection is valid; an "unknown" check is treated as a failure,
    which keeps the returned δ certified.
    """
    started = time.perf_counter()
    checks = undecided = 0

    def robust(d: float) -> bool:
        nonlocal checks, undecided
        checks += 1
        result = delta_robust(network, x_cf, d, target, margin=margin, time_limit=time_limit)
        undecided += result.verdict == "unknown"
        return result.robust

    if not robust(0.0):
        return MaxDelta(0.0, 0.0, checks, undecided, time.perf_counter() - started)
    lo, hi = 0.0, min(start, delta_max)
    try:
        while robust(hi):
            lo = hi
            if hi >= delta_max:
                return MaxDelta(lo, np.inf, checks, undecided, time.perf_counter() - started)
            hi = min(2 * hi, delta_max)
        while hi - lo > tolerance:
            mid = (lo + hi) / 2
            if robust(mid):
                lo = mid
            else:
                hi = mid
    except KeyboardInterrupt:  # anytime: lo is certified whenever the bisection stops
        return MaxDelta(lo, hi, checks, undecided, time.perf_counter() - started, interrupted=True)
    return MaxDelta(lo, hi, checks, undecided, time.perf_counter() - started)

