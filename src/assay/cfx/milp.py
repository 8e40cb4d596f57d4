"""The nearest counterfactual of a ReLU network, by MILP (or a fast gradient search for large networks).

:func:`counterfactual` finds ``x′`` minimising ``‖x′ − x‖₁`` (or ``‖x′ − x‖∞``) over the encoded
variables subject to: the network classifies ``x′`` as ``target`` with every target row
``C f(x′) ≥ margin`` (see :mod:`assay.cfx._model`), and ``x′`` respects the
:class:`~assay.cfx.FeatureTypes` (bounds, one-hot, thermometer, immutables).

The network is encoded exactly: each unstable ReLU gets a binary variable and big-M constraints whose
constants are **sound pre-activation bounds** over the feasible input box (the first layer's exact
range, later layers' from :func:`assay.bounds.compute_bounds`, CROWN by default), never a fixed
large constant; stable ReLUs are linear. The MILP is therefore an exact model of the network over
the feature box, and an optimal solve returns the nearest counterfactual whose target rows are all
≥ max(margin, MIN_MARGIN) (up to HiGHS's absolute gap, 1e-6).

Speed (``tighten=True``, the default): a valid point found cheaply (:mod:`assay.cfx._incumbent`)
at distance D proves the nearest one lies within ``‖x′ − x‖ ≤ D``; the MILP is restricted to that
ball, with bounds taken over the ball ∩ box, which leaves most neurons stable. The optimum is the
same; ``tighten=False`` solves the plain MILP.
The point returned is snapped onto the encoding (bits rounded, bounds clipped) and **re-checked with
a plain forward pass**: it is returned as found only if every target row is > 0 there.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import torch

from assay._validate import check_choice
from assay.cfx._incumbent import CAP_SLACK, ball_range, greedy_point, network_margin
from assay.cfx._model import MilpBuilder, check_mlp, predicted_class, relu_rows, row_margins, target_rows
from assay.cfx.features import FeatureTypes
from assay.errors import DataError, OptionError

__all__ = ["Counterfactual", "counterfactual", "default_target"]

# The MILP asks for every target row ≥ max(margin, MIN_MARGIN): solver tolerances (1e-7 … 1e-6)
# cannot then turn an accepted point into one that sits on the decision boundary.
MIN_MARGIN = 1e-4


@dataclass(frozen=True)
class Counterfactual:
    """A counterfactual explanation of ``x`` for class ``target``.

    Attributes:
        x: the explained input (encoded), float64.
        x_cf: the counterfactual, or None when none was found.
        target: the class ``x_cf`` is classified as.
        status: ``"found"``, ``"infeasible"`` (no point of the feature box with the required
            margin: proven by the solver), ``"timeout"`` (the time limit passed with no point)
            or ``"failed"`` (the solver's point did not pass the forward-pass check).
        distance: ``‖x_cf − x‖`` in ``norm`` (inf when not found).
        norm: ``"l1"`` or ``"linf"``.
        margin: the margin asked for (every target row of the output ≥ margin).
        achieved_margin: ``min_s (C f(x_cf))_s`` by a plain forward pass (> 0: valid).
        optimal: the solver proved ``x_cf`` nearest (within its relative gap) for this margin.
        lower_bound: the solver's proven lower bound on the distance of any such counterfactual.
        method: ``"milp"`` or ``"gradient"``.
        seconds: wall time.
        message: a sentence for people.
    """

    x: np.ndarray
    x_cf: np.ndarray | None
    target: int
    status: str
    distance: float
    norm: str
    margin: float
    achieved_margin: float
    optimal: bool
    lower_bound: float
    method: str
    seconds: float
    message: str

    @property
    def found(self) -> bool:
        return self.status == "found"

    def to_json(self) -> dict:
        return {
            "x": self.x.tolist(), "x_cf": None if self.x_cf is None else self.x_cf.tolist(), "target": self.target,
            "status": self.status, "distance": _finite(self.distance), "norm": self.norm, "margin": self.margin,
            "achieved_margin": _finite(self.achieved_margin), "optimal": self.optimal,
            "lower_bound": _finite(self.lower_bound), "method": self.method, "seconds": self.seconds,
            "message": self.message,
        }


def _finite(value: float):
    return float(value) if np.isfinite(value) else None


def default_target(network, x) -> int:
    """The class a counterfactual of ``x`` aims at by default: the other class of a binary model."""
    if network.output_size > 2:
        raise OptionError(f"{network.source} has {network.output_size} classes: say which class the counterfactual "
                          "should reach (target=..., --target)")
    return 1 - int(predicted_class(network, x)[0])


def counterfactual(
    network,
    x,
    distance: str = "l1",
    features: FeatureTypes | None = None,
    target: int | None = None,
    margin: float = 0.0,
    *,
    method: str = "milp",
    time_limit: float | None = None,
    bounds_method: str = "crown",
    rng: np.random.Generator | None = None,
    bounds_cache: dict | None = None,
    start=None,
    tighten: bool = True,
) -> Counterfactual:
    """The nearest input classified as ``target`` (see the module docstring for the contract).

    Args:
        network: a :class:`~assay.nn.Network` Linear/ReLU chain over a flat input (e.g. loaded from a
            scikit-learn ``MLPClassifier`` with :func:`assay.nn.load`).
        x: the input to explain, in the network's encoded space (respecting ``features``).
        distance: ``"l1"`` (default, the paper's) or ``"linf"``.
        features: the :class:`FeatureTypes`; default: every variable continuous in [0, 1].
        target: the class to reach; default: the other class of a binary classifier.
        margin: every target row of the output must be ≥ ``margin`` (Algorithm 2 grows it);
            at least :data:`MIN_MARGIN` is asked so that the answer is strictly valid.
        method: ``"milp"`` (exact, default) or ``"gradient"`` (projected gradient descent on a
            hinge loss plus the distance; fast for large networks, no optimality claim).
        time_limit: seconds for the solver (None: no limit); a point found by then (the solver's,
            or the greedy point of ``tighten``) is returned with ``optimal=False``.
        bounds_method: how the big-M constants of the second and later hidden layers are bounded
            (``"crown"``, ``"ibp"``, ``"alpha"``); the first layer's are its exact range.
        rng: random generator of the gradient method's restarts (default: seeded 0).
        bounds_cache: a dict to keep the big-M pre-activation bounds in between calls on the same
            network (keyed by the feature box and method): Algorithm 2 solves one box many times.

        start: a point of the feature spec (same immutable values) near which a valid point is likely,
            e.g. the previous candidate of Algorithm 2; only used to speed up the solve (``tighten``).
        tighten: first look for a valid point cheaply (:mod:`assay.cfx._incumbent`) and restrict the
            MILP to the ball around ``x`` it proves the nearest point lies in, with tighter big-M
            constants (default True; the optimum is the same, False solves the plain MILP). Not
            applied when ``features.cost`` weighs the ℓ1 distance (the ball is the plain norm's).

    Returns:
        a :class:`Counterfactual`; infeasible requests get ``status="infeasible"`` with a message
        naming the immutable variables and bounds, not an exception.
    """
    started = time.perf_counter()
    check_choice(distance, "distance", "counterfactual", ("l1", "linf"))
    check_choice(method, "method", "counterfactual", ("milp", "gradient"))
    affine = check_mlp(network, "counterfactual")
    features = features if features is not None else FeatureTypes.continuous(network.input_size)
    if features.size != network.input_size:
        raise DataError(f"the feature spec has {features.size} variables but {network.source} takes {network.input_size} inputs")
    x = features.check_input(x, "the input to explain")
    if not np.isfinite(margin) or margin < 0:
        raise OptionError(f"the margin of counterfactual must be a finite number ≥ 0; got {margin}")
    target = default_target(network, x) if target is None else target
    C = target_rows(network, target)
    required = max(float(margin), MIN_MARGIN)
    if method == "gradient":
        from assay.cfx.gradient import gradient_counterfactual

        point = gradient_counterfactual(network, x, C, features, required, distance,
                                        rng if rng is not None else np.random.default_rng(0))
        return _finish(network, x, point, C, int(target), distance, margin, features, "gradient", False, -np.inf,
                       started, "no point found by the gradient search" if point is None else "")

    lower, upper = features.lower.copy(), features.upper.copy()
    frozen = features.frozen_variables()
    lower[frozen] = upper[frozen] = x[frozen]
    key = (id(network), lower.tobytes(), upper.tobytes(), bounds_method)
    if bounds_cache is not None and key in bounds_cache:
        pre_bounds = bounds_cache[key]
    else:
        pre_bounds = _box_bounds(network, affine, x, lower, upper, bounds_method)
        if bounds_cache is not None:
            bounds_cache[key] = pre_bounds

    cap = _distance_cap(network, affine, C, x, start, features, frozen, lower, upper, required, distance,
                        bounds_method) if tighten and not features.weighted else None
    solution, xs, binary = _solve(affine, C, x, features, lower, upper, pre_bounds, required, distance, time_limit,
                                  cap)
    if cap is not None and solution.status == "infeasible":  # cannot be (the cap holds a valid point): be safe
        solution, xs, binary = _solve(affine, C, x, features, lower, upper, pre_bounds, required, distance,
                                      time_limit, None)
    constant = objective_constant(features, x, binary, distance)
    if solution.x is None:
        if solution.status == "infeasible":
            message = _infeasible_message(features, frozen, target, required)
            return _not_found(x, target, "infeasible", distance, margin, np.inf, started, message)
        if cap is not None and solution.status == "timeout":  # the greedy point is valid: anytime answer
            return _finish(network, x, cap[2], C, int(target), distance, margin, features, "milp", False,
                           solution.bound + constant, started, "")
        return _not_found(x, target, "timeout" if solution.status == "timeout" else "failed", distance, margin, -np.inf,
                          started, f"the MILP solver stopped without a point: {solution.message}")
    point = features.snap(solution.x[xs])
    point[frozen] = x[frozen]
    return _finish(network, x, point, C, int(target), distance, margin, features, "milp",
                   solution.status == "optimal", solution.bound + constant, started, "")


def _solve(affine, C, x, features, lower, upper, pre_bounds, required, distance, time_limit, cap):
    """Build and solve the MILP; with ``cap = (D, bounds, point)`` restricted to distance ≤ D with those bounds."""
    builder = MilpBuilder()
    if cap is not None:
        radius, tighter, _ = cap  # both bound the same neurons over supersets of the ball ∩ box: keep the tighter
        pre_bounds = [(np.maximum(lo, tlo), np.minimum(hi, thi)) for (lo, hi), (tlo, thi) in zip(pre_bounds, tighter)]
        lower, upper = np.maximum(lower, x - radius), np.minimum(upper, x + radius)
    xs, binary = input_variables(builder, features, x, lower, upper, distance)
    if cap is not None:
        objective = {i: c for i, c in enumerate(builder.cost) if c != 0.0}
        constant = objective_constant(features, x, binary, distance)
        builder.row(objective, -np.inf, radius - constant)
    previous = xs
    for k, (W, b) in enumerate(affine[:-1]):
        terms = [{int(previous[j]): float(W[i, j]) for j in range(W.shape[1]) if W[i, j] != 0.0} for i in range(W.shape[0])]
        previous = relu_rows(builder, terms, b, pre_bounds[k][0], pre_bounds[k][1])
    W, b = affine[-1]
    builder.linear_rows(C @ W, previous, None, required - C @ b, np.full(len(C), np.inf))
    return builder.solve(time_limit=time_limit), xs, binary


def _distance_cap(network, affine, C, x, start, features, frozen, lower, upper, required, distance, bounds_method):
    """(D, pre-activation bounds over the ball ‖x′ − x‖ ≤ D ∩ box, the point) from the nearest valid
    point that :func:`~assay.cfx._incumbent.greedy_point` finds from ``x`` and from ``start``; None
    without one."""
    binary = np.array([features.is_binary(i) for i in range(features.size)], dtype=bool)
    movable = ~binary
    movable[frozen] = False
    best, best_point = np.inf, None
    margin = network_margin(affine, C)
    for origin in ([] if start is None else [np.asarray(start, dtype=np.float64)]) + [x]:
        point = greedy_point(margin, origin, movable, lower, upper, required)
        # Re-checked by the network's own forward pass: the cap must hold a valid point.
        if point is not None and not features.violations(point, x) and row_margins(network, point, C)[0] >= required:
            found = features.distance(x, point, distance)
            if found < best:
                best, best_point = found, point
    if not np.isfinite(best):
        return None
    radius = best * (1.0 + CAP_SLACK) + CAP_SLACK
    box_lower, box_upper = np.maximum(lower, x - radius), np.minimum(upper, x + radius)
    if len(affine) > 2:  # later layers: the engine's bounds over the box around the ball
        deeper = _pre_activation_bounds(network, box_lower, box_upper, bounds_method)
    else:
        deeper = []
    if len(affine) == 1:
        return radius, [], best_point
    W, b = affine[0]
    return radius, [ball_range(W, b, x, lower, upper, radius, distance)] + deeper[1:], best_point


def _box_bounds(network, affine, x, lower, upper, method):
    """Pre-activation bounds over the feature box: the first layer's exact range (a linear map of the
    box), later layers' from :func:`assay.bounds.compute_bounds` (``method``)."""
    if len(affine) == 1:  # no hidden layer
        return []
    W, b = affine[0]
    first = ball_range(W, b, x, lower, upper, np.inf, "l1")
    if len(affine) == 2:
        return [first]
    later = _pre_activation_bounds(network, lower, upper, method)
    return [(np.maximum(first[0], later[0][0]), np.minimum(first[1], later[0][1]))] + later[1:]


def _pre_activation_bounds(network, lower, upper, method):
    from assay.bounds import compute_bounds
    from assay.sets import Box

    result = compute_bounds(network, Box(torch.as_tensor(lower), torch.as_tensor(upper)), method=method)
    return [(lo[0].numpy().astype(np.float64), hi[0].numpy().astype(np.float64))
            for lo, hi in zip(result.intermediate.lower, result.intermediate.upper)]


def input_variables(builder: MilpBuilder, features: FeatureTypes, x, lower, upper, distance):
    """The encoded input as MILP variables (bounds, binaries, one-hot and thermometer rows) and the
    distance objective; returns the variables' indices and which are binary."""
    binary = np.array([features.is_binary(i) for i in range(features.size)])
    # Bits get whole-number bounds: HiGHS's presolve (highspy 1.15) returned a wrong optimum, with a
    # wrong dual bound, for binaries bounded by [0.6, 1] (a ball around x cutting the unit interval).
    lower = np.where(binary, np.ceil(np.asarray(lower, float) - 1e-9), lower)
    upper = np.where(binary, np.floor(np.asarray(upper, float) + 1e-9), upper)
    xs = np.empty(features.size, dtype=int)
    for i in range(features.size):
        xs[i] = builder.add(1, lower[i], upper[i], integer=bool(binary[i]))[0]
    for group in features.one_hot:
        builder.row({int(xs[i]): 1.0 for i in group}, 1.0, 1.0)
    for group in features.ordinal:
        builder.row({int(xs[group[0]]): 1.0}, 1.0, 1.0)
        for a, b in zip(group, group[1:]):
            builder.row({int(xs[a]): 1.0, int(xs[b]): -1.0}, 0.0, np.inf)
    _distance_objective(builder, xs, x, binary, distance, features.cost)
    return xs, binary


def objective_constant(features: FeatureTypes, x, binary, distance: str) -> float:
    """What the MILP objective of :func:`input_variables` leaves out of the distance: for ℓ1, the
    bits at 1 contribute ``cost_i·(1 − bit)``, whose constant part is Σ cost_i over them."""
    return float((features.cost * x)[binary].sum()) if distance == "l1" else 0.0


def _distance_objective(builder: MilpBuilder, xs, x, binary, distance, cost):
    """l1: Σ cost_i·t_i with t_i ≥ |x′_i − x_i| (continuous) and the linear cost_i·|bit − bit₀| for
    bits; linf: one s ≥ every |x′_i − x_i|."""
    if distance == "l1":
        for i in range(len(xs)):
            if binary[i]:
                builder.cost[int(xs[i])] = -float(cost[i]) if x[i] > 0.5 else float(cost[i])
            else:
                t = int(builder.add(1, 0.0, np.inf, cost=float(cost[i]))[0])
                builder.row({t: 1.0, int(xs[i]): -1.0}, -x[i], np.inf)
                builder.row({t: 1.0, int(xs[i]): 1.0}, x[i], np.inf)
    else:
        s = int(builder.add(1, 0.0, np.inf, cost=1.0)[0])
        for i in range(len(xs)):
            builder.row({s: 1.0, int(xs[i]): -1.0}, -x[i], np.inf)
            builder.row({s: 1.0, int(xs[i]): 1.0}, x[i], np.inf)


def _infeasible_message(features, frozen, target, required) -> str:
    parts = [f"no input within the feature bounds is classified as class {target} with margin {required:g}"]
    if len(frozen):
        names = ", ".join(features.name(i) for i in frozen[:8]) + (" …" if len(frozen) > 8 else "")
        parts.append(f"while the immutable variables ({names}) keep their values")
    return " ".join(parts) + "; allow more variables to change, widen their bounds, or lower the margin"


def _not_found(x, target, status, distance, margin, bound, started, message) -> Counterfactual:
    return Counterfactual(x, None, int(target), status, np.inf, distance, float(margin), -np.inf, False, bound, "milp", time.perf_counter() - started, message)


def _finish(network, x, point, C, target, distance, margin, features, method, optimal, bound, started, message):
    if point is None:
        return Counterfactual(x, None, target, "failed", np.inf, distance, float(margin), -np.inf, False, bound, method,
                              time.perf_counter() - started, message)
    achieved = float(row_margins(network, point, C)[0])
    problems = features.violations(point, x)
    if achieved <= 0 or problems:
        why = f"its target margin is {achieved:.3g} ≤ 0" if achieved <= 0 else "; ".join(problems)
        return Counterfactual(x, None, target, "failed", np.inf, distance, float(margin), achieved, False, bound, method,
                              time.perf_counter() - started, f"the solver's point failed the forward-pass check: {why}")
    dist = features.distance(x, point, distance)
    text = message or (f"class {target} at {distance} distance {dist:.4g}" + (" (optimal)" if optimal else ""))
    return Counterfactual(x, point, target, "found", dist, distance, float(margin), achieved, optimal,
                          min(bound, dist), method, time.perf_counter() - started, text)
