"""Bound rule of ``Softmax`` along one axis: ``y_i = exp(x_i) / Σ_j exp(x_j)``.

* **Interval**: ``y_i`` grows with ``x_i`` and shrinks with every other ``x_j``, so over the box
  ``y_i ∈ [1 / (1 + Σ_{j≠i} e^{u_j − l_i}), 1 / (1 + Σ_{j≠i} e^{l_j − u_i})]``: the differences
  keep it stable (no overflow short of ``e^{88}`` in float32, and an overflow only loosens the
  bound), every difference and ``exp`` is rounded outwards (the exact difference lies within
  the next float, the math library's error is charged), and the ends are clamped to [0, 1].
  The pairwise differences make it O(n²) per softmax.
* **Linear bounds** (per row of ``A`` and per softmax group, the better of two, judged by their
  value over the box):

  - the interval's constant bound ``Σ_i A⁺_i·lo_i + A⁻_i·hi_i``;
  - a mean-value linearisation at ``c = l + α·(u − l)`` (α = ½, the centre, by default;
    ``parameters = 1``, any α sound): ``A·y(x) = A·y(c) + g(ξ)·(x − c)`` for some ``ξ`` in the
    box, where ``g_j = ∂(A·y)/∂x_j = y_j·(A_j − A·y)``. With ``g₀ = g(c)`` as coefficients,
    ``A·y(x) ≥ A·y(c) + g₀·(x − c) − remainder``, the smaller of two bounds of the remainder:
    the mean-value one ``Σ_j D_j·r_j`` (``D_j`` the largest distance from ``g₀_j`` to an
    enclosure of ``g_j`` over the box, from the intervals of ``y`` and ``A·y``; ``r_j`` the
    largest ``|x_j − c_j|``) and Taylor's ``½·Σ_jk |H_jk|·r_j·r_k`` with an O(n) bound of the
    Hessian of ``A·y`` over the box (plus the float ``g₀``'s distance from the exact gradient at
    ``c``). Both are second order in the box's width, so small boxes get near-exact slopes
    (width 1e-3, n = 8: about 1e-6 below the true minimum, against 5e-4 for the interval); from a
    width of about 0.3 the interval wins and is taken.
    Taylor's remainder is also bounded one-sidedly from the Hessian's quadratic form
    ``dᵀ·H·d = Σ_j y_j·(A_j − A·y)·(d_j − d̄)²`` (``d̄ = Σ_k y_k·d_k``): only the outputs with
    ``A_j < A·y`` bend ``A·y`` down, by at most ``½·Σ_j hi_j·(A·y − A_j)⁺·(|d_j − d̄|max)²``
    (the smaller of the two Taylor bounds is used; on ViT attention rows several times smaller).

  The offset of the linearisation is also bounded on sub-boxes, for groups of at most five
  elements: each group's box halved along every coordinate, 2ⁿ sub-boxes sharing their float
  midpoints (so they cover the box exactly). On each, ``A·y(x) − g₀·x`` is bounded below by its value at the sub-box's
  centre less the one-sided Taylor remainder there, with the whole box's slopes ``g₀`` (so it
  also charges ``Σ_j |g_j(c_s) − g₀_j|·r_j``); the smallest of them is an offset for the
  whole box, taken where it beats the whole box's own. Both remainders are second order in the
  width, so a half-width box has about a quarter of them: on a ViT's attention scores (width
  0.3–1, n = 5) the remainder falls to about a third, and CROWN's bound of vit_2023 pgd_2_3_16's
  worst property row from 2.35 to 0.20 (−0.26 with the one-sided Taylor bound above).

The enclosure of ``y(c)`` at the point is computed the same way as the interval, in O(n).
"""

from __future__ import annotations

from typing import ClassVar

import torch

from assay.bounds.rules import register
from assay.bounds.rules.base import MultiInputRule, ulp_margin
from assay.bounds.rules.multi import gamma, parameter, settled, underflow
from assay.nn.ops.softmax import Softmax

__all__ = ["SoftmaxRule"]


def _exp_above(d: torch.Tensor) -> torch.Tensor:
    """A float ≥ e^D for every real D that ``d`` is the rounded value of (D ≤ next float up)."""
    e = torch.exp(torch.nextafter(d, torch.full_like(d, torch.inf)))
    return e + ulp_margin(e)


def _exp_below(d: torch.Tensor) -> torch.Tensor:
    """A float ≤ e^D for every real D that ``d`` is the rounded value of; ≥ 0."""
    e = torch.exp(torch.nextafter(d, torch.full_like(d, -torch.inf)))
    return (e - ulp_margin(e)).clamp(min=0.0)


def _sum_above(t: torch.Tensor) -> torch.Tensor:
    """An upper bound of the exact sum of ``t`` (≥ 0) over the last dimension."""
    total = t.sum(-1)
    return total + ulp_margin(total, 2 * t.shape[-1] + 4)


def _sum_below(t: torch.Tensor) -> torch.Tensor:
    """A lower bound (≥ 0) of the exact sum of ``t`` (≥ 0) over the last dimension."""
    total = t.sum(-1)
    return (total - ulp_margin(total, 2 * t.shape[-1] + 4)).clamp(min=0.0)


def _reciprocal_of_one_plus(s: torch.Tensor, up: bool) -> torch.Tensor:
    """``1/(1 + s)`` rounded outwards (up or down) and clamped to [0, 1], for exact ``s`` ≥ 0."""
    r = 1.0 / (1.0 + s)
    r = r + ulp_margin(r, 4) if up else r - ulp_margin(r, 4)
    return torch.where(torch.isnan(r), torch.full_like(r, 1.0 if up else 0.0), r).clamp(0.0, 1.0)


def box_interval(lower: torch.Tensor, upper: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Softmax over the last dimension of every point of ``[lower, upper]`` lies in the returned
    ``(lo, hi)`` (exactly; see the module docstring)."""
    n = lower.shape[-1]
    off_diagonal = ~torch.eye(n, dtype=torch.bool, device=lower.device)
    # [..., i, j]: x_j − x_i at the corner that makes y_i smallest (resp. largest)
    worst = _exp_above(upper.unsqueeze(-2) - lower.unsqueeze(-1))
    best = _exp_below(lower.unsqueeze(-2) - upper.unsqueeze(-1))
    worst = torch.where(off_diagonal, worst, torch.zeros_like(worst))
    best = torch.where(off_diagonal, best, torch.zeros_like(best))
    return _reciprocal_of_one_plus(_sum_above(worst), up=False), _reciprocal_of_one_plus(_sum_below(best), up=True)


def point_interval(point: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """An enclosure of the exact softmax (last dimension) of the float ``point``, in O(n)."""
    shifted = point - point.amax(-1, keepdim=True)
    above, below = _exp_above(shifted), _exp_below(shifted)
    lo = below / _sum_above(above).unsqueeze(-1)
    hi = above / _sum_below(below).unsqueeze(-1)
    lo, hi = lo - ulp_margin(lo, 4), hi + ulp_margin(hi, 4)
    lo = torch.where(torch.isnan(lo), torch.zeros_like(lo), lo).clamp(0.0, 1.0)
    hi = torch.where(torch.isnan(hi), torch.ones_like(hi), hi).clamp(0.0, 1.0)
    return lo, hi


def _dot_below(positive, negative, lo, hi):
    """A lower bound of ``Σ_last (A⁺·y + A⁻·y)`` for y in [lo, hi] (A⁺ ≥ 0 ≥ A⁻)."""
    terms = positive * lo + negative * hi
    return terms.sum(-1) - gamma(terms.shape[-1] + 2, terms.dtype) * terms.abs().sum(-1) - underflow(terms.dtype) * 4 * terms.shape[-1]


def _dot_above(positive, negative, lo, hi):
    terms = positive * hi + negative * lo
    return terms.sum(-1) + gamma(terms.shape[-1] + 2, terms.dtype) * terms.abs().sum(-1) + underflow(terms.dtype) * 4 * terms.shape[-1]


def _up(t: torch.Tensor, operations: int) -> torch.Tensor:
    """``t`` (≥ 0, the float result of ``operations`` roundings of non-negative terms) raised to
    an upper bound of the exact value."""
    return t + ulp_margin(t, 2 * operations + 2)


def _scaled_range(lo, hi, t_lo, t_hi):
    """The smallest and largest products ``y·t`` for ``y ∈ [lo, hi] ⊂ [0, 1]`` and ``t ∈ [t_lo, t_hi]``
    (finite; computed, not yet widened): with ``y ≥ 0`` the ends are ``t_lo`` times ``hi`` (where
    ``t_lo < 0``) or ``lo``, and ``t_hi`` times ``hi`` (where ``t_hi > 0``) or ``lo``; two products
    instead of :func:`product_corners`' four and no stacking."""
    return (torch.where(t_lo < 0, hi * t_lo, lo * t_lo), torch.where(t_hi > 0, hi * t_hi, lo * t_hi))


def _taylor_remainder(lo, hi, t_lo, t_hi, radius):
    """An upper bound of ``−½·(x − c)ᵀ·H(ξ)·(x − c)`` over the box, ``H`` the Hessian of ``A·y``:
    ``H_jk = y_j·((δ_jk − y_k)·(A_j − A·y) − y_k·(A_k − A·y))``, so with ``T_j ≥ |A_j − A·y|``,
    ``|H_jk| ≤ hi_j·(|δ_jk − y_k|·T_j + hi_k·T_k)`` and
    ``Σ_k |δ_jk − y_k|·r_k ≤ (1 − lo_j)·r_j + Σ_{k≠j} hi_k·r_k``. O(n) per row."""
    n = lo.shape[-1]
    T = torch.maximum(t_lo.abs(), t_hi.abs())  # t = A_j − A·y over the box (already widened)
    weighted = _up(hi * radius, 1)
    Y = _up(weighted.sum(-1, keepdim=True), n)
    others = (Y - weighted).clamp(min=0)
    others = others + ulp_margin(Y, 4)
    spread = _up((1 - lo) * radius, 2) + others
    Z = _up((weighted * T).sum(-1, keepdim=True), n + 1)
    total = (weighted * (T * spread + Z)).sum(-1)
    return _up(0.5 * total, n + 6)


def _curvature_remainder(lo, hi, t_lo, radius):
    """An upper bound of ``−½·(x − c)ᵀ·H(ξ)·(x − c)`` over the box from the Hessian's quadratic
    form: with ``d = x − c``, ``t_j = A_j − A·y`` and ``d̄ = Σ_k y_k·d_k``,
    ``dᵀ·H·d = Σ_j y_j·t_j·(d_j − d̄)²`` (``Σ_j y_j·t_j = 0``), so only the ``t_j < 0`` bend it
    down, and ``|d_j − d̄| ≤ (1 − lo_j)·r_j + Σ_{k≠j} hi_k·r_k``: the bound is
    ``½·Σ_j hi_j·max(−t_lo_j, 0)·spread_j²`` (one-sided, where :func:`_taylor_remainder` charges
    every ``|H_jk|``). O(n) per row."""
    n = lo.shape[-1]
    weighted = _up(hi * radius, 1)
    Y = _up(weighted.sum(-1, keepdim=True), n)
    others = (Y - weighted).clamp(min=0) + ulp_margin(Y, 4)
    spread = _up((1 - lo) * radius, 2) + others
    spread = _up(spread, 1)
    bend = (-t_lo).clamp(min=0)  # t_lo is already widened down
    return _up(0.5 * (hi * bend * spread * spread).sum(-1), n + 6)


def _slope_error(a, positive, negative, yc_lo, yc_hi, at_c, slopes, radius):
    """An upper bound of ``Σ_j |g_j(c) − g₀_j|·r_j``: the Taylor form needs the exact gradient at
    ``c``, the coefficients are its float value ``g₀``."""
    n = yc_lo.shape[-1]
    t_lo = a - _dot_above(positive, negative, yc_lo, yc_hi).unsqueeze(-1)
    t_hi = a - at_c.unsqueeze(-1)
    t_lo, t_hi = t_lo - ulp_margin(t_lo.abs(), 2), t_hi + ulp_margin(t_hi.abs(), 2)
    g_lo, g_hi = _scaled_range(yc_lo, yc_hi, t_lo, t_hi)
    g_lo, g_hi = g_lo - ulp_margin(g_lo.abs(), 2), g_hi + ulp_margin(g_hi.abs(), 2)
    distance = torch.maximum(g_hi - slopes, slopes - g_lo).clamp(min=0)
    distance = _up(distance, 1)
    return _up((distance * radius).sum(-1), n + 1)


def _halves(l: torch.Tensor, u: torch.Tensor, dims: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Sub-boxes covering each group's box ``[l, u]`` (…, n): its ``dims`` widest coordinates
    halved at their float midpoint (shared by both halves, so the halves cover the box exactly),
    the others whole; ``2**dims`` sub-boxes on a new dimension before the last: (…, 2**dims, n)."""
    n = l.shape[-1]
    mid = torch.minimum(torch.maximum(l + (u - l) / 2, l), u)
    widest = (u - l).topk(dims, dim=-1).indices  # (…, dims)
    bits = (torch.arange(2 ** dims, device=l.device).unsqueeze(-1) >> torch.arange(dims, device=l.device)) & 1  # (K, dims)
    side = torch.full((*l.shape[:-1], 2 ** dims, n), 2, dtype=torch.long, device=l.device)  # 2: the whole range
    side.scatter_(-1, widest.unsqueeze(-2).expand(*l.shape[:-1], 2 ** dims, dims),
                  bits.expand(*l.shape[:-1], 2 ** dims, dims))
    l, u, mid = l.unsqueeze(-2), u.unsqueeze(-2), mid.unsqueeze(-2)
    return torch.where(side == 1, mid, l), torch.where(side == 0, mid, u)


def _subdivided_offset(a, positive, negative, l, u, slopes):
    """``(offset, rounding)`` (B, S, G) with ``A·y(x) ≥ slopes·x + offset − rounding`` on the
    whole box: the minimum over sub-boxes (:func:`_halves`, at most :data:`_SPLIT_DIMS`
    coordinates halved) of the rule's own bound of ``A·y(x) − slopes·x`` on each, centred there
    (halving the worst sub-box once more gained 0.03 on vit_2023 at three times the cost). The remainders
    (mean-value and Taylor) shrink about fourfold on a half-width box; the slopes stay those of
    the whole box (any are sound)."""
    n = l.shape[-1]
    dims = min(n, _SPLIT_DIMS)
    lower, upper = _halves(l, u, dims)  # (B, 1, G, K, n)
    a, positive, negative, slopes = (t.unsqueeze(-2) for t in (a, positive, negative, slopes))
    offsets, rounding = _box_offsets(a, positive, negative, lower, upper, slopes)  # (B, S, G, K)
    rounding = rounding.amax(-1)
    # min over sub-boxes of the offsets − max of their roundings is below every sub-box's own bound
    return offsets.amin(-1), rounding


def _box_offsets(a, positive, negative, lower, upper, slopes):
    """Per sub-box ``[lower, upper]`` (…, K, n): ``(offset, rounding)`` (…, K) with
    ``A·y(x) − slopes·x ≥ offset − rounding`` on it (``a``, ``positive``, ``negative``,
    ``slopes``: (B, S, G, 1, n)): the value at the sub-box's centre less the one-sided Taylor
    remainder there (:func:`_curvature_remainder`) and the slopes' distance from the gradient at
    the centre. (The mean-value form and the two-sided Taylor bound, which the whole box also
    tries, never won on a sub-box of vit_2023's attention and cost half the time.)"""
    n = lower.shape[-1]
    c = torch.minimum(torch.maximum(lower + (upper - lower) / 2, lower), upper)
    radius = torch.maximum(upper - c, c - lower)
    radius = radius + ulp_margin(radius, 2)
    lo, hi = box_interval(lower, upper)
    t_lo = a - _dot_above(positive, negative, lo, hi).unsqueeze(-1)
    t_lo = t_lo - ulp_margin(t_lo.abs(), 2)
    yc_lo, yc_hi = point_interval(c)
    at_c = _dot_below(positive, negative, yc_lo, yc_hi)
    remainder = _curvature_remainder(lo, hi, t_lo, radius) \
        + _slope_error(a, positive, negative, yc_lo, yc_hi, at_c, slopes, radius)
    moved = (slopes * c).sum(-1)
    offset = at_c - moved - remainder
    with torch.no_grad():
        rounding = 2 * gamma(n + 4, a.dtype) * (at_c.abs() + (slopes * c).abs().sum(-1) + remainder) \
            + 16 * n * underflow(a.dtype) * (1 + torch.maximum(lower.abs(), upper.abs()).amax(-1))
    return offset, rounding


# Groups of at most this many elements get their offset bounded on halved boxes too
# (_subdivided_offset: 2**n sub-boxes). Halving only some coordinates of a longer group leaves
# the others' share of the remainder whole: on vit_2023's ibp_3_3_8 (groups of 17) halving 2 or 5
# of them gained nothing and took 3 to 20 times as long.
_SPLIT_DIMS = 5


@register(Softmax)
class SoftmaxRule(MultiInputRule):
    """Softmax over ``layer.axis`` of one sample (module docstring)."""

    parameters: ClassVar[int] = 1
    keeps_order: ClassVar[bool] = True  # exp is increasing and the denominator is shared

    def interval(self, layer, inputs):
        (lower, upper), = inputs
        dim = layer.axis + 1
        lo, hi = box_interval(lower.movedim(dim, -1), upper.movedim(dim, -1))
        return lo.movedim(-1, dim), hi.movedim(-1, dim)

    def backward(self, layer, A, inputs, alpha=None):
        (lower, upper), = inputs
        dim = layer.axis + 1
        batch, rows = A.shape[:2]
        shape = tuple(lower.shape[1:])
        n = shape[layer.axis]
        # groups: (B, 1, G, n) bounds, (B, S, G, n) rows
        l = lower.movedim(dim, -1).reshape(batch, 1, -1, n)
        u = upper.movedim(dim, -1).reshape(batch, 1, -1, n)
        a = A.movedim(dim + 1, -1).reshape(batch, rows, -1, n)
        positive, negative = a.clamp(min=0), a.clamp(max=0)
        lo, hi = box_interval(l, u)
        constant = _dot_below(positive, negative, lo, hi)  # the interval's bound, (B, S, G)
        # the mean-value linearisation at c
        share = parameter(alpha, 0, A, 0.5)
        share = share.expand(batch, share.shape[1], *shape).movedim(dim + 1, -1).reshape(batch, share.shape[1], -1, n)
        c = torch.minimum(torch.maximum(l + share * (u - l), l), u)
        yc = torch.softmax(c, -1)
        slopes = yc * (a - (a * yc).sum(-1, keepdim=True))  # g₀ (any float is sound)
        radius = torch.maximum(u - c, c - l)
        radius = radius + ulp_margin(radius, 2)
        # an enclosure of g_j = y_j·(A_j − A·y) over the box
        t_lo, t_hi = a - _dot_above(positive, negative, lo, hi).unsqueeze(-1), a - constant.unsqueeze(-1)
        t_lo, t_hi = t_lo - ulp_margin(t_lo.abs(), 2), t_hi + ulp_margin(t_hi.abs(), 2)
        g_lo, g_hi = _scaled_range(lo, hi, t_lo, t_hi)
        g_lo, g_hi = g_lo - ulp_margin(g_lo.abs(), 2), g_hi + ulp_margin(g_hi.abs(), 2)
        spread = torch.maximum(g_hi - slopes, slopes - g_lo)
        spread = spread + ulp_margin(spread.abs(), 2)
        mean_value = (spread * radius).sum(-1)
        yc_lo, yc_hi = point_interval(c)
        at_c = _dot_below(positive, negative, yc_lo, yc_hi)
        taylor = torch.minimum(_taylor_remainder(lo, hi, t_lo, t_hi, radius), _curvature_remainder(lo, hi, t_lo, radius))
        taylor = taylor + _slope_error(a, positive, negative, yc_lo, yc_hi, at_c, slopes, radius)
        remainder = torch.minimum(mean_value, taylor)
        moved = (slopes * c).sum(-1)
        linear = at_c - moved - remainder
        with torch.no_grad():
            linear_rounding = 2 * gamma(n + 4, A.dtype) * (at_c.abs() + (slopes * c).abs().sum(-1) + remainder) \
                + 16 * n * underflow(A.dtype) * (1 + torch.maximum(l.abs(), u.abs()).amax(-1))
        if 1 < n <= _SPLIT_DIMS:  # the same slopes, their offset bounded on halves of the box (module docstring)
            split, split_rounding = _subdivided_offset(a, positive, negative, l, u, slopes)
            with torch.no_grad():
                take = (split - split_rounding) > (linear - linear_rounding)
            linear = torch.where(take, split, linear)
            linear_rounding = torch.where(take, split_rounding, linear_rounding)
        with torch.no_grad():
            # which of the two bounds is higher over the box, per row and group
            reach = torch.minimum(slopes * l, slopes * u).sum(-1)
            better = (linear - linear_rounding + reach) > constant
        coefficients = torch.where(better.unsqueeze(-1), slopes, torch.zeros_like(slopes))
        offset_groups = torch.where(better, linear, constant)
        with torch.no_grad():
            rounding_groups = torch.where(better, linear_rounding, torch.zeros_like(linear_rounding))
            groups = offset_groups.shape[-1]
            rounding = rounding_groups.sum(-1) * (1 + gamma(groups + 1, A.dtype)) \
                + gamma(groups + 1, A.dtype) * offset_groups.abs().sum(-1) + 4 * groups * underflow(A.dtype)
        offset = offset_groups.sum(-1)
        moved_back = shape[:layer.axis] + shape[layer.axis + 1:] + (n,)
        coefficients = coefficients.reshape(batch, rows, *moved_back).movedim(-1, dim + 1)
        return settled((coefficients,), offset, rounding)
