"""The nearest Δ-robust counterfactual of a one-hidden-layer network, by one MILP.

Algorithm 2 (:func:`assay.cfx.robust_counterfactual`) searches by growing a margin and testing each
candidate; for a network with one hidden layer the robustness condition itself is a MILP constraint
of the same size as the network's, so the nearest Δ-robust counterfactual can be found directly.

For an input x ≥ 0 (min-max scaled features), every model within (δ₁, δ₂) of (W₁, b₁, W₂, b₂) puts
hidden pre-activation j somewhere in ``[l_j(x), u_j(x)]`` with
``l_j(x) = (W₁ − δ₁)_j · x + b₁_j − δ₁`` and ``u_j(x) = (W₁ + δ₁)_j · x + b₁_j + δ₁`` (both linear in
x because ‖x‖₁ = Σ x_i), independently per neuron, and the worst value of target row r is

    worst_r(x) = Σ_j a_rj · (relu(l_j(x)) if a_rj ≥ 0 else relu(u_j(x))) + C_r b₂ − δ₂‖C_r‖₁,
    a_r = C_r W₂ − δ₂‖C_r‖₁

(each hidden value h ≥ 0 meets an output weight that moves against the row; ReLU is monotone, so
each term is minimised at one end of its interval; see :mod:`assay.cfx.robustness`). The MILP
encodes ``relu(l_j)`` and ``relu(u_j)`` exactly (big-M constants from exact interval bounds of these
linear functions over the feature box) and asks ``worst_r(x) ≥ margin`` for every row: its optimum
is the nearest counterfactual that every model within δ classifies as the target. The point is
re-checked with the exact robustness check before it is returned.

Speed: a Δ-robust point found by greedy moves along the worst case's gradient
(:func:`assay.cfx._incumbent.greedy_point`) at distance D proves the nearest one lies within
``‖x′ − x‖ ≤ D``; the MILP is restricted to that ball, with the ranges of ``l_j`` and ``u_j`` taken over
the ball ∩ box (:func:`assay.cfx._incumbent.ball_range`). Its optimum and its proven lower bound are
those of the whole box.
"""

from __future__ import annotations

import time

import numpy as np

from assay.cfx._incumbent import CAP_SLACK, ball_range, greedy_point
from assay.cfx._model import MilpBuilder, check_mlp, relu_rows, target_rows
from assay.cfx.features import FeatureTypes
from assay.cfx.generate import RobustCounterfactual
from assay.cfx.milp import MIN_MARGIN, Counterfactual, default_target, input_variables, objective_constant
from assay.cfx.robustness import delta_robust, layer_deltas
from assay.errors import DataError, UnsupportedError

__all__ = ["nearest_robust_counterfactual", "robust_distance_bound"]


def _linear_range(coef: np.ndarray, const: np.ndarray, lower: np.ndarray, upper: np.ndarray):
    """Exact range of ``coef @ x + const`` over the box [lower, upper] (rows of coef)."""
    low = np.minimum(coef * lower, coef * upper).sum(1) + const
    high = np.maximum(coef * lower, coef * upper).sum(1) + const
    pad = 1e-9 * (1.0 + np.abs(coef).sum(1) * np.maximum(np.abs(lower), np.abs(upper)).max() + np.abs(const))
    return low - pad, high + pad


def nearest_robust_counterfactual(
    network,
    x,
    delta,
    *,
    features: FeatureTypes | None = None,
    target: int | None = None,
    distance: str = "l1",
    margin: float = 0.0,
    time_limit: float | None = None,
) -> RobustCounterfactual:
    """The nearest counterfactual that every model within δ classifies as ``target`` (module docstring).

    Args:
        network: a network with exactly one hidden ReLU layer.
        x, features, target, distance, time_limit: as for :func:`assay.cfx.counterfactual`; the
            feature box must be non-negative (min-max scaled data).
        delta: δ for every weight and bias, or one δ per Linear layer.
        margin: every target row must stay ≥ max(margin, MIN_MARGIN) under every shifted model.

    Raises:
        UnsupportedError: a network without exactly one hidden layer, or negative feature bounds
            (use :func:`assay.cfx.robust_counterfactual` there).
    """
    started = time.perf_counter()
    features = features if features is not None else FeatureTypes.continuous(network.input_size)
    _check(network, features)
    x = features.check_input(x, "the input to explain")
    deltas = layer_deltas(network, delta)
    target = default_target(network, x) if target is None else int(target)
    C = target_rows(network, target)
    required = max(float(margin), MIN_MARGIN)
    solution, xs, binary, frozen = _solve(network, x, deltas, features, target, distance, required, time_limit)
    constant = objective_constant(features, x, binary, distance)

    def result(cf: Counterfactual, robust: bool, guarantee: str) -> RobustCounterfactual:
        return RobustCounterfactual(cf, robust, "exact", deltas, float(margin), 1, 1.0 if robust else 0.0, guarantee,
                                    time.perf_counter() - started)

    if solution.x is None:
        status = "infeasible" if solution.status == "infeasible" else ("timeout" if solution.status == "timeout" else "failed")
        message = (f"no input within the feature bounds stays class {target} for every model within δ = {max(deltas):g}"
                   if status == "infeasible" else f"the MILP solver stopped without a point: {solution.message}")
        cf = Counterfactual(x, None, target, status, np.inf, distance, float(margin), -np.inf, False,
                            np.inf if status == "infeasible" else -np.inf, "robust-milp", time.perf_counter() - started,
                            message)
        return result(cf, False, message)
    point = features.snap(solution.x[xs])
    point[frozen] = x[frozen]
    check = delta_robust(network, point, list(deltas), target)
    base = float((network.forward(point[None], dtype="float64").numpy() @ C.T).min())
    dist = features.distance(x, point, distance)
    optimal = solution.status == "optimal"
    if not check.robust or base <= 0 or features.violations(point, x):
        cf = Counterfactual(x, None, target, "failed", np.inf, distance, float(margin), base, False, -np.inf,
                            "robust-milp", time.perf_counter() - started,
                            f"the solver's point failed the exact re-check: {check.message}")
        return result(cf, False, cf.message)
    cf = Counterfactual(x, point, target, "found", dist, distance, float(margin), base, optimal,
                        min(solution.bound + constant, dist), "robust-milp", time.perf_counter() - started,
                        f"class {target} for every model within δ, at {distance} distance {dist:.4g}"
                        + (" (nearest)" if optimal else ""))
    return result(cf, True, "proven: every model within δ classifies x_cf as the target"
                  + (", and no nearer input has that property" if optimal else ""))


def _check(network, features: FeatureTypes):
    """The (W, b) of a one-hidden-layer network whose robust MILP applies, or an error saying why not."""
    affine = check_mlp(network, "nearest_robust_counterfactual")
    if len(affine) != 2:
        raise UnsupportedError(f"nearest_robust_counterfactual handles networks with one hidden layer; {network.source} "
                               f"has {len(affine) - 1}: use robust_counterfactual (Algorithm 2) instead")
    if features.size != network.input_size:
        raise DataError(f"the feature spec has {features.size} variables but {network.source} takes {network.input_size}")
    if (features.lower < 0).any():
        raise UnsupportedError("nearest_robust_counterfactual needs non-negative feature bounds (min-max scaled data); "
                               "use robust_counterfactual (Algorithm 2) instead")
    return affine


def _solve(network, x, deltas, features, target, distance, required, time_limit, tighten: bool = True):
    """The robust MILP (module docstring) asking every worst-case target row ≥ ``required``.

    Returns the solver's answer, the input variables' indices, which of them are bits, and the
    frozen (immutable) variables."""
    affine = _check(network, features)
    C = target_rows(network, target)
    (W1, b1), (W2, b2) = affine
    d1, d2 = deltas
    lower, upper = features.lower.copy(), features.upper.copy()
    frozen = features.frozen_variables()
    lower[frozen] = upper[frozen] = x[frozen]
    spread = d2 * np.abs(C).sum(1)
    a = C @ W2 - spread[:, None]
    radius = None
    if tighten and not features.weighted:  # the ball below is the plain norm's
        radius = _robust_cap(x, W1, b1, d1, a, C @ b2 - spread, features, frozen, lower, upper, required, distance)
    builder = MilpBuilder()
    box_lower, box_upper = lower, upper
    if radius is not None:  # the nearest robust point lies within ‖x′ − x‖ ≤ radius (see _robust_cap)
        box_lower, box_upper = np.maximum(lower, x - radius), np.minimum(upper, x + radius)
    xs, binary = input_variables(builder, features, x, box_lower, box_upper, distance)
    if radius is not None:
        objective = {i: c for i, c in enumerate(builder.cost) if c != 0.0}
        builder.row(objective, -np.inf, radius - objective_constant(features, x, binary, distance))
    ends = {}
    for name, sign, needed in (("low", -1.0, (a >= 0).any(0)), ("high", 1.0, (a < 0).any(0))):
        coef, const = W1 + sign * d1, b1 + sign * d1
        lo, hi = _linear_range(coef, const, lower, upper)
        if radius is not None:
            ball_lo, ball_hi = ball_range(coef, const, x, lower, upper, radius, distance)
            lo, hi = np.maximum(lo, ball_lo), np.minimum(hi, ball_hi)
        units = np.flatnonzero(needed)
        terms = [{int(xs[i]): float(coef[j, i]) for i in range(len(xs)) if coef[j, i] != 0.0} for j in units]
        h = relu_rows(builder, terms, const[units], lo[units], hi[units]) if len(units) else np.array([], int)
        ends[name] = dict(zip(units.tolist(), h.tolist()))
    for r in range(len(C)):
        row = {}
        for j in range(W2.shape[1]):
            var = ends["low"][j] if a[r, j] >= 0 else ends["high"][j]
            row[int(var)] = row.get(int(var), 0.0) + float(a[r, j])
        builder.row(row, required - float(C[r] @ b2 - spread[r]), np.inf)
    solution = builder.solve(time_limit=time_limit)
    if radius is not None and solution.status == "infeasible":  # cannot be (the ball holds a robust point): be safe
        return _solve(network, x, deltas, features, target, distance, required, time_limit, tighten=False)
    return solution, xs, binary, frozen


def _worst_case(W1, b1, d1, a, offset):
    """``x -> (min_r worst_r(x), its gradient)`` for x ≥ 0 (module docstring), for :func:`greedy_point`."""
    low_W, low_b, high_W, high_b = W1 - d1, b1 - d1, W1 + d1, b1 + d1

    def value_and_gradient(x):
        low, high = low_W @ x + low_b, high_W @ x + high_b
        h = np.where(a >= 0, np.maximum(low, 0.0), np.maximum(high, 0.0))
        rows = (a * h).sum(1) + offset
        r = int(np.argmin(rows))
        gradient = np.where(a[r] >= 0, a[r] * (low > 0), 0.0) @ low_W + np.where(a[r] < 0, a[r] * (high > 0), 0.0) @ high_W
        return float(rows[r]), gradient

    return value_and_gradient


def _robust_cap(x, W1, b1, d1, a, offset, features, frozen, lower, upper, required, distance):
    """The distance of a Δ-robust point found by :func:`~assay.cfx._incumbent.greedy_point` on the
    worst case (its worst target row ≥ ``required``), padded by rounding; None without one. The
    nearest such point lies within it, so the MILP may be restricted to that ball (speed only)."""
    movable = np.array([not features.is_binary(i) for i in range(features.size)], dtype=bool)
    movable[frozen] = False
    point = greedy_point(_worst_case(W1, b1, d1, a, offset), x, movable, lower, upper, required)
    if point is None or features.violations(point, x):
        return None
    return features.distance(x, point, distance) * (1.0 + CAP_SLACK) + CAP_SLACK


def robust_distance_bound(network, x, deltas, features: FeatureTypes, target: int, distance: str = "l1",
                          time_limit: float | None = None) -> tuple[float, np.ndarray | None]:
    """A proven lower bound on the distance of every Δ-robust counterfactual of ``x``, and the point reaching it.

    The robust MILP with the weakest requirement (every worst-case target row ≥ 0) contains every
    point that :func:`assay.cfx.delta_robust` proves robust (worst > 0), so its optimum — and the
    solver's proven dual bound, returned here — is at most the distance of any of them. ``inf``
    when no input of the feature box is Δ-robust; the point is None when none was found (the bound
    may still be finite after a timeout). Raises :class:`UnsupportedError` where the robust MILP
    does not apply (not one hidden layer, negative feature bounds)."""
    solution, xs, binary, frozen = _solve(network, x, deltas, features, target, distance, 0.0, time_limit)
    constant = objective_constant(features, x, binary, distance)
    if solution.status == "infeasible":
        return np.inf, None
    point = None
    if solution.x is not None:
        point = features.snap(solution.x[xs])
        point[frozen] = x[frozen]
    return float(solution.bound + constant), point
