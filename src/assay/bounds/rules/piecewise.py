"""Bound rules of the piecewise-linear element-wise operators ``Abs``, ``LeakyRelu``, ``Clip`` and
``Sign``.

Each operator is a short list of linear :class:`_Piece` s (``k·z + c`` on a closed, open or
half-open stretch of the real line; ``Sign`` jumps, so its pieces are open at 0 and the point 0 is
a piece of its own). Everything follows from one computation, :func:`_offset_range`: for a slope
``s``, the extremes of ``f(z) − s·z`` over ``[l, u]`` are attained (or approached, at an open end)
at the ends of the pieces' stretches inside ``[l, u]``, so

* the interval is ``s = 0``;
* for *any* slope, the intercept of the line above (below) ``f`` is the maximum (minimum) there:
  every slope gives a sound line that touches ``f`` (or its closure), and the slopes are chosen
  for tightness only.

**Slopes.** By default each side takes the slope whose line has the least mean over ``[l, u]``
(the least area between line and function), found exactly: the mean of the best line of slope
``s`` is convex and piecewise linear in ``s``, with its kinks at the chords between the points
above, so the best of those chords (and the pieces' own slopes) is the optimum. That is the exact
line on a linear stretch, the chord on the convex side across a kink, and CROWN's adaptive slope
(Zhang et al. 2018; DeepPoly's area heuristic) on the other side. Where a side has a free choice,
α-CROWN's ``alpha`` (``(lower, upper)``, each in [0, 1]) picks the slope in the range
:meth:`_PiecewiseRule.free_slopes` gives:

================  =========================================  ===========================================
operator          lower line                                 upper line
================  =========================================  ===========================================
Abs, l < 0 < u    slope in [−1, 1] through (0, 0)             chord
LeakyRelu (a≤1)   slope in [a, 1] through (0, 0)              chord
LeakyRelu (a>1)   chord                                       slope in [1, a] through (0, 0)
Clip, across lo   slope in [0, 1] through the corner          chord (or free, if across hi too)
Clip, across hi   chord (or free, if across lo too)           slope in [0, 1] through the corner
Sign, l < 0 < u   slope in [0, 2/u] through (0, −1)           slope in [0, 2/−l] through (0, 1)
Sign, l = 0 < u   slope in [0, 1/u] through (0, 0)            constant 1
Sign, l < 0 = u   constant −1                                 slope in [0, 1/−l] through (0, 0)
================  =========================================  ===========================================

Why the ``Sign`` lines hold (``sign(0) = 0``): across 0, ``−1 + s·z`` with ``0 ≤ s ≤ 2/u`` is
< −1 for z < 0, = −1 ≤ 0 at 0 and ≤ −1 + 2 = 1 on (0, u]; ``1 + s·z`` with ``0 ≤ s ≤ 2/−l``
mirrors it. With ``l = 0``, ``s·z`` with ``s ≤ 1/u`` is 0 at 0 and ≤ 1 on (0, u]. The slope's
end is the line that also touches the far end (``(u, 1)`` or ``(l, −1)``); the engine finds each
intercept by itself, the table only bounds α's range.

**Floating point.** Computed in float64 (float32 inputs convert exactly), each value
``(k − s)·x + c`` charged 8 ulps of its terms unless ``k = s`` exactly (then it is ``c`` itself,
so linear stretches stay exact), the slope rounded to the output dtype *first* and the intercept
computed for the stored slope and rounded outwards. An unbounded side (``Abs`` on an infinite
interval) is slope 0, intercept ±inf.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from assay.bounds.ibp import cast_outward
from assay.bounds.rules import register
from assay.bounds.rules.alphas import split_alpha
from assay.bounds.rules.base import ElementwiseRule, Relaxation, ulp_margin
from assay.nn.ops.activation import Abs, Clip, LeakyRelu, Sign

__all__ = ["AbsRule", "LeakyReluRule", "ClipRule", "SignRule"]

_WORK = torch.float64
# Slopes beyond this size (Sign across a tiny interval) are clipped: any slope is sound, and
# huge ones only cost downstream rounding.
_MAX_SLOPE = 2.0 ** 40


@dataclass(frozen=True)
class _Piece:
    """``f(z) = slope·z + intercept`` for z in the stretch from ``start`` to ``end`` (either
    infinite; ``*_open``: the end itself is not in it)."""

    start: float
    end: float
    slope: float
    intercept: float = 0.0
    start_open: bool = False
    end_open: bool = False


def _stretches(pieces, l, u):
    """Per piece: ``(present, a, b)``, the part ``[a, b]`` of the piece's stretch inside
    ``[l, u]`` and whether it is not empty."""
    out = []
    for piece in pieces:
        a = l.clamp(min=piece.start)
        b = u.clamp(max=piece.end)
        present = a < b
        point = a == b
        if piece.start_open:
            point = point & (a != piece.start)
        if piece.end_open:
            point = point & (b != piece.end)
        out.append((present | point, a, b))
    return out


def _difference(k: float, s: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``k − s`` and whether it is exact (Knuth's TwoSum: the rounding error, exactly)."""
    d = k - s
    k_back = d + s
    s_back = d - k_back
    error = (k - k_back) - (s + s_back)
    return d, error == 0


def _power_of_two_or_zero(d: torch.Tensor) -> torch.Tensor:
    mantissa, _ = torch.frexp(d)
    return (mantissa.abs() == 0.5) | (d == 0)


def _offset_range(pieces, l, u, slope):
    """Sound ``(min, max)`` of ``f(z) − slope·z`` over ``[l, u]`` (float64 tensors; the sup/inf
    where an open end is approached). A value computed without rounding — the piece's own slope
    (``c``), ``x = 0``, or a power-of-two difference of slopes times ``x`` (a normal result) and
    no intercept — is charged nothing, so linear stretches and lines through a kink at 0 stay
    exact."""
    top, bottom = [], []
    for piece, (present, a, b) in zip(pieces, _stretches(pieces, l, u)):
        d, d_exact = _difference(piece.slope, slope)
        same = d == 0
        scaled = d_exact & _power_of_two_or_zero(d) & (piece.intercept == 0)
        for x in (a, b):
            # 0·inf is NaN: a piece of the line's own slope contributes its intercept exactly
            dx = torch.where(same, torch.zeros_like(d * x), d * x)
            value = dx + piece.intercept
            with torch.no_grad():  # an infinite value needs no margin (and inf − inf would be NaN)
                exact = (d_exact & same) | (x == 0) | (scaled & (dx.abs() >= torch.finfo(_WORK).tiny))
                loose = ~exact & torch.isfinite(value)
                margin = torch.where(loose, ulp_margin(dx.abs() + abs(piece.intercept), 8), torch.zeros_like(value))
            high, low = value + margin, value - margin
            # the margin's own sum rounds to nearest: one float outwards makes it ≥ (≤) the exact sum
            high = torch.where(loose, torch.nextafter(high, torch.full_like(high, math.inf)), high)
            low = torch.where(loose, torch.nextafter(low, torch.full_like(low, -math.inf)), low)
            top.append(torch.where(present, high, torch.full_like(value, -math.inf)))
            bottom.append(torch.where(present, low, torch.full_like(value, math.inf)))
    low = torch.stack(torch.broadcast_tensors(*bottom)).amin(0)
    high = torch.stack(torch.broadcast_tensors(*top)).amax(0)
    # a product that overflowed says nothing about its side: never let it close that side
    return low.masked_fill(low == math.inf, -math.inf), high.masked_fill(high == -math.inf, math.inf)


def _breakpoints(pieces) -> list[tuple[float, list[tuple[float, set[str]]]]]:
    """Each finite end ``p`` of a piece, with the distinct values ``f`` approaches from the left,
    takes at ``p`` and approaches from the right (one value where ``f`` is continuous), each with
    the ways (``"left"``, ``"at"``, ``"right"``) it is reached."""
    ends = sorted({e for piece in pieces for e in (piece.start, piece.end) if math.isfinite(e)})
    out = []
    for p in ends:
        values: dict[float, set[str]] = {}
        for piece in pieces:
            value = piece.slope * p + piece.intercept
            if piece.end == p and piece.start < p:
                values.setdefault(value, set()).add("left")
            if piece.start <= p <= piece.end and not (piece.start == p and piece.start_open) \
                    and not (piece.end == p and piece.end_open):
                values.setdefault(value, set()).add("at")
            if piece.start == p and piece.end > p:
                values.setdefault(value, set()).add("right")
        out.append((p, sorted(values.items())))
    return out


def _slope_points(pieces, l, u):
    """``(z, f, present)`` stacked: the points whose chords hold the least-mean slopes — ``l``
    and ``u`` (unless a breakpoint) and, at each breakpoint inside ``[l, u]``, each value ``f``
    takes or approaches from inside the interval. Finite ``l``, ``u`` only."""
    breaks = _breakpoints(pieces)
    zs, vs, oks = [], [], []
    for x, from_right in ((l, True), (u, False)):
        value = torch.zeros_like(x)
        for piece in pieces:  # the piece [start, end) holding l, (start, end] holding u
            inside = (x >= piece.start) & (x < piece.end) if from_right else (x > piece.start) & (x <= piece.end)
            value = torch.where(inside, piece.slope * x + piece.intercept, value)
        on_break = torch.zeros_like(x, dtype=torch.bool)
        for p, _ in breaks:
            on_break = on_break | (x == p)
        zs.append(x)
        vs.append(value)
        oks.append(~on_break)
    for p, values in breaks:
        reach = {"left": (l < p) & (p <= u), "at": (l <= p) & (p <= u), "right": (l <= p) & (p < u)}
        for value, ways in values:
            present = torch.zeros_like(l, dtype=torch.bool)
            for way in ways:
                present = present | reach[way]
            zs.append(torch.full_like(l, p))
            vs.append(torch.full_like(l, value))
            oks.append(present)
    return tuple(torch.stack(torch.broadcast_tensors(*t)) for t in (zs, vs, oks))


@torch.no_grad()
def _area_slopes(pieces, l, u):
    """The slopes of the lines below and above ``f`` with the largest/least mean over finite
    ``[l, u]``: the best of the pieces' own slopes and the chords between the points of
    :func:`_slope_points` (the optimum of a convex piecewise-linear function of the slope is at
    a kink). Where an end is infinite, the slope of the piece that reaches it."""
    finite = torch.isfinite(l) & torch.isfinite(u)
    zero = torch.zeros_like(l)
    fl, fu = torch.where(finite, l, zero), torch.where(finite, u, zero)
    z, v, ok = _slope_points(pieces, fl, fu)
    candidates = [torch.full_like(fl, p.slope) for p in pieces]
    n = z.shape[0]
    for i in range(n):
        for j in range(i + 1, n):
            width = z[j] - z[i]
            usable = (width != 0) & ok[i] & ok[j]
            safe = torch.where(usable, width, torch.ones_like(width))
            candidates.append(torch.where(usable, (v[j] - v[i]) / safe, torch.full_like(width, math.nan)))
    s = torch.stack(candidates).clamp(-_MAX_SLOPE, _MAX_SLOPE)  # (Q, ...); NaN: no chord
    g = v.unsqueeze(0) - s.unsqueeze(1) * z.unsqueeze(0)  # (Q, P, ...)
    middle = (fl + fu) / 2
    high = torch.where(ok.unsqueeze(0), g, torch.full_like(g, -math.inf)).amax(1) + s * middle
    low = torch.where(ok.unsqueeze(0), g, torch.full_like(g, math.inf)).amin(1) + s * middle
    high = torch.where(torch.isnan(high), torch.full_like(high, math.inf), high)
    low = torch.where(torch.isnan(low), torch.full_like(low, -math.inf), low)
    upper = s.gather(0, high.argmin(0, keepdim=True)).squeeze(0)
    lower = s.gather(0, low.argmax(0, keepdim=True)).squeeze(0)
    at_end = torch.full_like(l, pieces[-1].slope if pieces[-1].end == math.inf else 0.0)
    at_end = torch.where(l == -math.inf, torch.full_like(l, pieces[0].slope), at_end)
    return torch.where(finite, lower, at_end), torch.where(finite, upper, at_end)


class _PiecewiseRule(ElementwiseRule):
    """A piecewise-linear ``f`` given by :meth:`pieces`; ``alpha`` (``(lower, upper)``, each in
    [0, 1]) picks a side's slope within :meth:`free_slopes` where that side has a choice."""

    parameters = 1

    def pieces(self, layer) -> tuple[_Piece, ...]:
        raise NotImplementedError

    def free_slopes(self, layer, l, u):
        """``((lo, hi, free), (lo, hi, free))`` for the lower and the upper line: where ``free``,
        α picks the slope ``lo + α·(hi − lo)``; elsewhere the side keeps its default slope."""
        raise NotImplementedError

    def interval(self, layer, lower, upper):
        l, u = lower.to(_WORK), upper.to(_WORK)
        low, high = _offset_range(self.pieces(layer), l, u, torch.zeros_like(l))
        return cast_outward(low, high, lower.dtype)

    def relax(self, layer, lower, upper, alpha=None):
        dtype = lower.dtype
        alpha_lower, alpha_upper, lower, upper = split_alpha(alpha, lower, upper)
        pieces = self.pieces(layer)
        l, u = lower.to(_WORK), upper.to(_WORK)
        lower_slope, upper_slope = _area_slopes(pieces, l, u)
        if alpha_lower is not None or alpha_upper is not None:
            (lo_l, hi_l, free_l), (lo_u, hi_u, free_u) = self.free_slopes(layer, l, u)
            if alpha_lower is not None:
                chosen = lo_l + alpha_lower.to(_WORK).clamp(0.0, 1.0) * (hi_l - lo_l)
                lower_slope = torch.where(free_l, chosen, lower_slope)
            if alpha_upper is not None:
                chosen = lo_u + alpha_upper.to(_WORK).clamp(0.0, 1.0) * (hi_u - lo_u)
                upper_slope = torch.where(free_u, chosen, upper_slope)
        lower_slope = lower_slope.clamp(-_MAX_SLOPE, _MAX_SLOPE).to(dtype)
        upper_slope = upper_slope.clamp(-_MAX_SLOPE, _MAX_SLOPE).to(dtype)
        lower_icpt, _ = _offset_range(pieces, l, u, lower_slope.to(_WORK))
        _, upper_icpt = _offset_range(pieces, l, u, upper_slope.to(_WORK))
        lower_icpt, upper_icpt = cast_outward(lower_icpt, upper_icpt, dtype)
        zero = torch.zeros_like(lower_slope)
        return Relaxation(
            lower_slope=torch.where(torch.isinf(lower_icpt), zero, lower_slope), lower_intercept=lower_icpt,
            upper_slope=torch.where(torch.isinf(upper_icpt), zero, upper_slope), upper_intercept=upper_icpt)


def _straddles(l, u, point: float):
    return (l < point) & (point < u)


@register(Abs)
class AbsRule(_PiecewiseRule):
    """``|z|``: across 0, the chord above and a line through (0, 0) of slope in [−1, 1] below."""

    def pieces(self, layer):
        return (_Piece(-math.inf, 0.0, -1.0), _Piece(0.0, math.inf, 1.0))

    def free_slopes(self, layer, l, u):
        free = _straddles(l, u, 0.0)
        one = torch.ones_like(l)
        return (-one, one, free), (one, one, torch.zeros_like(free))


@register(LeakyRelu)
class LeakyReluRule(_PiecewiseRule):
    """``z`` for z ≥ 0, ``alpha·z`` below, for any ``alpha``: convex for alpha ≤ 1 (the lower line
    is free in [alpha, 1]), concave for alpha > 1 (the upper line is free in [1, alpha])."""

    def pieces(self, layer):
        return (_Piece(-math.inf, 0.0, layer.alpha), _Piece(0.0, math.inf, 1.0))

    def free_slopes(self, layer, l, u):
        across = _straddles(l, u, 0.0)
        low, high = torch.full_like(l, min(layer.alpha, 1.0)), torch.full_like(l, max(layer.alpha, 1.0))
        none = torch.zeros_like(across)
        if layer.alpha <= 1.0:
            return (low, high, across), (low, high, none)
        return (low, high, none), (low, high, across)


@register(Clip)
class ClipRule(_PiecewiseRule):
    """``min(max(z, lower), upper)`` (either end may be None): across the lower corner the
    lower line is free in [0, 1], across the upper corner the upper line; across both, both."""

    def pieces(self, layer):
        low = -math.inf if layer.lower is None else layer.lower
        high = math.inf if layer.upper is None else layer.upper
        out = [_Piece(low, high, 1.0)]
        if layer.lower is not None:
            out.insert(0, _Piece(-math.inf, low, 0.0, low))
        if layer.upper is not None:
            out.append(_Piece(high, math.inf, 0.0, high))
        return tuple(out)

    def free_slopes(self, layer, l, u):
        zero, one = torch.zeros_like(l), torch.ones_like(l)
        none = torch.zeros_like(l, dtype=torch.bool)
        across_low = none if layer.lower is None else _straddles(l, u, layer.lower)
        across_high = none if layer.upper is None else _straddles(l, u, layer.upper)
        return (zero, one, across_low), (zero, one, across_high)


@register(Sign)
class SignRule(_PiecewiseRule):
    """``sign(z)`` with ``sign(0) = 0`` (ONNX, torch): −1 on (−inf, 0), 0 at 0, 1 on (0, inf).
    The lower line is free where ``l ≤ 0 < u`` (slopes from 0 up to the chord from the lowest
    value at 0 to (u, 1)), the upper line where ``l < 0 ≤ u``."""

    attack_gradient = "surrogate"  # piecewise constant: zero gradient almost everywhere

    def pieces(self, layer):
        return (_Piece(-math.inf, 0.0, 0.0, -1.0, end_open=True), _Piece(0.0, 0.0, 0.0, 0.0),
                _Piece(0.0, math.inf, 0.0, 1.0, start_open=True))

    def free_slopes(self, layer, l, u):
        zero, one = torch.zeros_like(l), torch.ones_like(l)
        lower_free = (l <= 0) & (0 < u)
        upper_free = (l < 0) & (0 <= u)
        lowest = torch.where(l < 0, -one, zero)  # f near 0 from inside the interval
        highest = torch.where(u > 0, one, zero)
        safe_u = torch.where(lower_free, u, one)
        safe_l = torch.where(upper_free, -l, one)
        return (zero, (1 - lowest) / safe_u, lower_free), (zero, (highest + 1) / safe_l, upper_free)
