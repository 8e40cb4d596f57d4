"""A cheap valid point, and the tighter MILP it allows (speed only: the optimum is unchanged).

The nearest-counterfactual MILP of :mod:`assay.cfx.milp` takes its big-M constants from bounds over
the whole feature box, which makes its LP relaxation weak (its root bound is often 0) and leaves
every neuron that changes sign somewhere in the box with a binary variable. A valid point ``p``
(every target row ≥ the required margin, checked by a forward pass) at distance ``D`` from ``x``
proves that the nearest one lies in the ball ``‖x′ − x‖ ≤ D``. Restricting the MILP to that ball
(one row) keeps its optimum and lets the pre-activation bounds be taken over the ball ∩ box: for the
first layer exactly (:func:`ball_range`, a fractional knapsack per neuron), and for later layers by
:func:`assay.bounds.compute_bounds` over the box ``[x − D, x + D]`` ∩ feature box. Most neurons are
then stable over the ball and lose their binary variable, and the bounds are far tighter.

:func:`greedy_point` finds such a point in a few forward passes: from a start (the input, or the
previous candidate of Algorithm 2) it moves one continuous variable at a time along the target
margin's gradient, the variable whose gradient is the largest in magnitude first (the ℓ1-cheapest
way up for a locally linear network), until the margin is met.
"""

from __future__ import annotations

import numpy as np

__all__ = ["greedy_point", "network_margin", "ball_range", "CAP_SLACK"]

# The cap asks distance ≤ D·(1 + CAP_SLACK) + CAP_SLACK: rounding in D or in the solver's rows can
# never cut off a point at distance D.
CAP_SLACK = 1e-7


def _margins_and_gradient(affine, C, point):
    """min_s (C f(point))_s and its gradient w.r.t. the point (the active row, this activation region)."""
    h = point
    masks = []
    for W, b in affine[:-1]:
        z = W @ h + b
        masks.append(z > 0)
        h = np.maximum(z, 0.0)
    W, b = affine[-1]
    rows = C @ (W @ h + b)
    r = int(np.argmin(rows))
    gradient = C[r] @ W
    for (W, _), mask in zip(reversed(affine[:-1]), reversed(masks)):
        gradient = (gradient * mask) @ W
    return float(rows[r]), gradient


def network_margin(affine, C):
    """The function ``point -> (min_s (C f(point))_s, its gradient)`` of a Linear/ReLU chain, for :func:`greedy_point`."""
    return lambda point: _margins_and_gradient(affine, C, point)


def greedy_point(margin_and_gradient, start, movable, lower, upper, required, max_moves: int | None = None):
    """A point with ``margin ≥ required`` reached from ``start`` by moving the ``movable`` variables
    within [lower, upper], or None (see the module docstring).

    Args:
        margin_and_gradient: ``point -> (margin, gradient)``, piecewise linear (e.g. :func:`network_margin`).
        start: the starting point (feasible for the feature spec).
        movable: boolean mask of the variables that may move (continuous, not immutable).
        lower, upper: their bounds.
        required: the margin to reach; the point returned exceeds it by 1e-9 (float64), so the caller's
            check (a forward pass) accepts it.
        max_moves: at most this many single-variable moves (default 4 per movable variable).
    """
    point = np.array(start, dtype=np.float64)
    goal = required + 1e-9
    moves = 4 * int(movable.sum()) if max_moves is None else int(max_moves)
    for _ in range(moves + 1):
        value, gradient = margin_and_gradient(point)
        if value >= goal:
            return point
        need = goal - value
        room = np.where(gradient > 0, upper - point, point - lower)
        score = np.where(movable & (room > 0), np.abs(gradient), 0.0)
        i = int(np.argmax(score))
        if score[i] <= 0:
            return None
        # Overshoot the linear prediction a little: leaving the activation region usually costs margin.
        step = min(room[i], 1.05 * need / score[i] + 1e-12)
        point[i] += step if gradient[i] > 0 else -step
        point[i] = min(max(point[i], lower[i]), upper[i])
    return None


def ball_range(W, b, x, lower, upper, radius: float, distance: str):
    """Exact range of ``W x′ + b`` over {x′ ∈ [lower, upper] : ‖x′ − x‖ ≤ radius}, padded outward by rounding.

    ℓ∞: the box [max(lower, x − r), min(upper, x + r)]. ℓ1: for each row, the largest increase spends
    the budget r on the variables with the largest |W_ij| first, each up to its room (a fractional
    knapsack); the largest decrease likewise.
    """
    x = np.asarray(x, dtype=np.float64)
    center = W @ x + b
    if distance == "linf":
        lo_box, hi_box = np.maximum(lower, x - radius), np.minimum(upper, x + radius)
        down = np.minimum(W * (lo_box - x), W * (hi_box - x)).sum(1)
        up = np.maximum(W * (lo_box - x), W * (hi_box - x)).sum(1)
    else:
        up, down = _knapsack(W, upper - x, x - lower, radius), -_knapsack(W, x - lower, upper - x, radius)
    pad = 1e-9 * (1.0 + np.abs(center) + np.abs(W) @ (upper - lower))
    return center + down - pad, center + up + pad


def _knapsack(W, room_up, room_down, radius):
    """max Σ_i W_ji Δ_i over Σ|Δ_i| ≤ radius, −room_down ≤ Δ ≤ room_up, for each row j."""
    rate = np.abs(W)
    room = np.where(W > 0, room_up[None, :], room_down[None, :]).clip(min=0.0)
    order = np.argsort(-rate, axis=1)
    rate = np.take_along_axis(rate, order, 1)
    room = np.take_along_axis(room, order, 1)
    spent_before = np.cumsum(room, axis=1) - room
    take = np.clip(radius - spent_before, 0.0, room)
    return (rate * take).sum(1)
