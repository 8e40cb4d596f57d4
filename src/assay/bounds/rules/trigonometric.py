"""Bound rules of the periodic operators ``Sin`` and ``Cos``, sound over intervals of any width
and magnitude.

**The one fact everything rests on.** For a slope ``s``, the line ``s·z + b`` lies above ``f`` on
``[l, u]`` exactly when ``b ≥ max (f(z) − s·z)`` over ``[l, u]``, and below it when
``b ≤ min (f(z) − s·z)``. The extremes of ``g(z) = f(z) − s·z`` lie at ``l``, ``u`` or at the
critical points where ``f'(z) = s`` — for ``sin``, ``z = ±arccos(s) + 2kπ``; for ``cos``,
``z = −arcsin(s) + 2kπ`` and ``π + arcsin(s) + 2kπ`` — of which an interval narrower than 2π holds
at most one per branch. :meth:`_Periodic._offset_range` enumerates them (vectorised: four
values of ``k`` per branch around the interval) and bounds ``g`` there. So *every* slope gives a
sound line that touches ``f``, and the slope is free to be chosen for tightness:

* on a concave piece (``f ≥ 0``: ``f'' = −f`` for both functions) the upper line is the tangent
  (at the midpoint by default, at ``l + α·(u − l)`` under α-CROWN) and the lower line the chord;
  on a convex piece the other way round (CROWN, Zhang et al. 2018, §3.2);
* across pieces the default slope minimises the line's mean over the interval (the area between
  line and function), found by bisection: ``h(s) = s·m + max g`` is convex in ``s`` with
  subgradient ``m − argmax g``, so the optimum is where the touching point crosses the midpoint
  ``m``. On a single piece this *is* the tangent at the midpoint or the chord. Under α-CROWN the
  slope is ``f'(l + α·(u − l))``, which sweeps every slope between ``min f'`` and ``max f'``;
* intervals wider than 2π (or unbounded) get slope 0 and intercepts ∓1, which are exact.

**Floating point.** Everything is computed in float64 whatever the input dtype (float32 inputs
convert exactly). The critical points are computed, not exact: a computed point ``c'`` is within
``Δ = 2⁻⁴⁴·(|c'| + 8)`` of the true ``c`` (the error of ``arccos``/``arcsin``, of ``2π`` and ``π``
as floats, and of the products and sums, with a wide margin), and since ``|g'(z)| =
|f'(z) − f'(c)| ≤ |z − c|`` (``|f''| ≤ 1``), ``g`` at the projection of ``c'`` onto ``[l, u]``
is within ``Δ²/2`` of ``g(c)``; candidates within ``2Δ`` outside the interval are kept, so no
critical point inside is missed. Each value of ``g`` is charged the math library's error
(:data:`LIBM_ULPS`) and its own rounding. The slope is rounded to the output dtype *first* and
the intercept computed for the stored slope, then rounded outwards; a line whose mean exceeds the
constant interval bound (float32 intercepts at large magnitudes are coarse) falls back to that
constant (a default line only: an α-chosen one stays, so that α-CROWN's gradient is the line's).

**Cost.** A relaxation is three enumerations (the interval and one per side) of ten candidate
points per element; the default slope of a side across pieces adds a 41-step bisection over the
intervals that need it (the others have the closed-form tangent or chord).
"""

from __future__ import annotations

import math

import torch

from assay.bounds.ibp import cast_outward
from assay.bounds.rules import register
from assay.bounds.rules.alphas import split_alpha
from assay.bounds.rules.base import LIBM_ULPS, ElementwiseRule, Relaxation, ulp_margin
from assay.nn.ops.activation import Cos, Sin

__all__ = ["SinRule", "CosRule"]

_TWO_PI = 2 * math.pi
# At or above this width (just under 2π) an interval gets the constant bounds ∓1: the
# enumeration of critical points assumes an interval shorter than one period.
_WIDE = 6.28
# Bisection steps for the default slope: the bracket [min f', max f'] ⊂ [−1, 1] shrinks to 2⁻⁴⁰.
_BISECTION_STEPS = 41
_WORK = torch.float64


def _next_up(value: torch.Tensor) -> torch.Tensor:
    """The next float above (a computed sum rounded to nearest, moved up once, is ≥ the exact sum)."""
    return value + (torch.nextafter(value.detach(), torch.full_like(value.detach(), math.inf)) - value.detach())


class _Periodic(ElementwiseRule):
    """``sin``/``cos``: both have ``f'' = −f``, ``|f''| ≤ 1`` and ``f'(z) = f(z + π/2)``.

    ``alpha`` (optional): ``(lower, upper)``, each in [0, 1]; where a side is not a chord, its
    slope is ``f'(l + α·(u − l))``. ``parameters = 1`` per side.
    """

    parameters = 1

    @staticmethod
    def _f(z: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    @staticmethod
    def _branches(slope: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The two base angles ``a`` with ``f'(a + 2kπ) = slope`` (|slope| ≤ 1)."""
        raise NotImplementedError

    def _df(self, z: torch.Tensor) -> torch.Tensor:
        return self._f(z + math.pi / 2)

    # -- the extremes of g(z) = f(z) − s·z ------------------------------------------------------

    def _offset_range(self, lower, upper, slope):
        """Sound ``(min, max)`` of ``f(z) − slope·z`` over ``[lower, upper]`` (float64, width < 2π,
        |slope| ≤ 1). Per branch ``a``, ``k₀ = ⌊(l − a)/2π⌋``: ``a + (k₀ + 1)·2π`` is the first
        critical point at or after ``l`` (the only one the interval can hold); ``k₀ − 1``,
        ``k₀`` and ``k₀ + 2`` cover a quotient rounded across an integer.
        """
        points = [lower, upper]
        critical_margin = [torch.zeros_like(lower), torch.zeros_like(upper)]
        valid = [torch.ones_like(lower, dtype=torch.bool)] * 2
        with torch.no_grad():
            s = slope.detach()
            l, u = lower.detach(), upper.detach()
            for base in self._branches(s):
                first = torch.floor((l - base) / _TWO_PI)
                for shift in (-1.0, 0.0, 1.0, 2.0):
                    c = base + (first + shift) * _TWO_PI
                    delta = 2.0 ** -44 * (c.abs() + 8.0)
                    valid.append((c >= l - 2 * delta) & (c <= u + 2 * delta))
                    points.append(torch.minimum(torch.maximum(c, l), u))
                    critical_margin.append(delta * delta / 2)
        z = torch.stack(torch.broadcast_tensors(*points))
        crit = torch.stack(torch.broadcast_tensors(*critical_margin))
        ok = torch.stack(torch.broadcast_tensors(*valid))
        fz = self._f(z)
        sz = slope * z
        g = fz - sz
        with torch.no_grad():
            margin = ulp_margin(fz.abs() + sz.abs(), LIBM_ULPS + 8) + crit
        high = torch.where(ok, g + margin, torch.full_like(g, -math.inf))
        low = torch.where(ok, g - margin, torch.full_like(g, math.inf))
        return -_next_up(-low.amin(0)), _next_up(high.amax(0))

    # -- the contract -----------------------------------------------------------------------------

    @staticmethod
    def _prepare(lower, upper):
        """float64 copies, the mask of intervals too wide to enumerate, and those with the
        wide ones replaced by [0, 0] (so nothing below sees inf or NaN)."""
        l, u = lower.to(_WORK), upper.to(_WORK)
        wide = ~((u - l) < _WIDE)  # also true for inf and NaN widths
        zero = torch.zeros_like(l)
        return torch.where(wide, zero, l), torch.where(wide, zero, u), wide

    def _range64(self, l, u, wide):
        low, high = self._offset_range(l, u, torch.zeros_like(l))
        one = torch.ones_like(low)
        low = torch.where(wide, -one, low.clamp(min=-1.0))
        high = torch.where(wide, one, high.clamp(max=1.0))
        return low, high

    def interval(self, layer, lower, upper):
        l, u, wide = self._prepare(lower, upper)
        return cast_outward(*self._range64(l, u, wide), lower.dtype)

    def _chord(self, l, u):
        width = u - l
        flat = width <= 0
        safe = torch.where(flat, torch.ones_like(width), width)
        return torch.where(flat, self._df(l), (self._f(u) - self._f(l)) / safe).clamp(-1.0, 1.0)

    @torch.no_grad()
    def _area_slope(self, l, u, upper_side: bool):
        """The slope whose touching line (above f if ``upper_side``, else below) has the least
        mean over ``[l, u]``: its mean ``s·m + max g`` is convex in ``s`` with subgradient
        ``m − (touching point)``, so bisect on the side of ``m`` the line touches. (A choice, not
        a bound: the touching point is found without margins, and the first critical point at
        or after ``l`` on each branch is the only one an interval narrower than 2π can hold.)"""
        d_low, d_high = self._range64(l + math.pi / 2, u + math.pi / 2, torch.zeros_like(l, dtype=torch.bool))
        a, b = d_low.clamp(-1.0, 1.0), d_high.clamp(-1.0, 1.0)
        middle = (l + u) / 2
        sign = 1.0 if upper_side else -1.0  # the lower line touches where −g is largest
        f_l, f_u = sign * self._f(l), sign * self._f(u)
        for _ in range(_BISECTION_STEPS):
            s = (a + b) / 2
            best, touch = f_l - sign * s * l, l.clone()
            at_u = f_u - sign * s * u
            touch = torch.where(at_u > best, u, touch)
            best = torch.maximum(at_u, best)
            for base in self._branches(s):
                c = base + (torch.floor((l - base) / _TWO_PI) + 1.0) * _TWO_PI
                at_c = sign * (self._f(c) - s * c)
                better = (c <= u) & (at_c > best)
                touch = torch.where(better, c, touch)
                best = torch.where(better, at_c, best)
            steeper = touch > middle if upper_side else touch < middle
            a = torch.where(steeper, s, a)
            b = torch.where(steeper, b, s)
        return (a + b) / 2

    def _side_slope(self, l, u, low, high, alpha, upper_side: bool):
        """The slope of the upper (lower) line: the chord where ``f`` is convex (concave) on the
        whole interval; elsewhere ``f'`` at the tangent point ``l + α·(u − l)``, or by default
        the least-mean slope (on a single piece: the tangent at the midpoint)."""
        # f'' = −f: convex where f ≤ 0, concave where f ≥ 0
        chord_side = high <= 0 if upper_side else low >= 0
        if alpha is not None:
            free = self._df(l + alpha.to(_WORK).clamp(0.0, 1.0) * (u - l)).clamp(-1.0, 1.0)
        else:
            tangent_side = low >= 0 if upper_side else high <= 0
            free = self._df((l + u) / 2).clamp(-1.0, 1.0)
            across = ~(chord_side | tangent_side)
            if bool(across.any()):  # the bisection runs only on the intervals across pieces
                with torch.no_grad():
                    area = torch.zeros_like(free)
                    area[across] = self._area_slope(l.detach()[across], u.detach()[across], upper_side)
                free = torch.where(across, area, free)
        return torch.where(chord_side, self._chord(l, u), free)

    def relax(self, layer, lower, upper, alpha=None):
        dtype = lower.dtype
        a_low, a_high, lower, upper = split_alpha(alpha, lower, upper)
        l, u, wide = self._prepare(lower, upper)
        low, high = self._range64(l, u, wide)
        given = [a for a in (a_low, a_high) if a is not None]
        if given:
            l, u, wide, low, high = torch.broadcast_tensors(l, u, wide, low, high, *given)[:5]
        upper_slope = self._side_slope(l, u, low, high, a_high, upper_side=True).to(dtype)
        lower_slope = self._side_slope(l, u, low, high, a_low, upper_side=False).to(dtype)
        _, upper_icpt = self._offset_range(l, u, upper_slope.to(_WORK))
        lower_icpt, _ = self._offset_range(l, u, lower_slope.to(_WORK))
        lower_icpt, upper_icpt = cast_outward(lower_icpt, upper_icpt, dtype)
        # wide intervals (whose enumeration above ran on [0, 0]) get the constant bounds, and so
        # does a default line whose mean is worse than theirs: only rounding does that (coarse
        # float32 intercepts at large magnitudes), since the least-mean slope range holds 0.
        # An α-chosen line stays, so that α-CROWN's gradient is the line's.
        middle = (l + u) / 2
        flat_low, flat_high = cast_outward(low, high, dtype)
        worse_high, worse_low = wide, wide
        if a_high is None:
            worse_high = wide | (upper_slope.to(_WORK) * middle + upper_icpt.to(_WORK) > high)
        if a_low is None:
            worse_low = wide | (lower_slope.to(_WORK) * middle + lower_icpt.to(_WORK) < low)
        zero = torch.zeros_like(upper_slope)
        return Relaxation(
            lower_slope=torch.where(worse_low, zero, lower_slope),
            lower_intercept=torch.where(worse_low, flat_low, lower_icpt),
            upper_slope=torch.where(worse_high, zero, upper_slope),
            upper_intercept=torch.where(worse_high, flat_high, upper_icpt),
        )


@register(Sin)
class SinRule(_Periodic):
    """``sin``: critical points of ``sin z − s·z`` at ``±arccos(s) + 2kπ``."""

    _f = staticmethod(torch.sin)

    @staticmethod
    def _branches(slope):
        base = torch.arccos(slope)
        return base, -base


@register(Cos)
class CosRule(_Periodic):
    """``cos``: critical points of ``cos z − s·z`` (``−sin z = s``) at ``−arcsin(s) + 2kπ`` and
    ``π + arcsin(s) + 2kπ``."""

    _f = staticmethod(torch.cos)

    @staticmethod
    def _branches(slope):
        base = torch.arcsin(slope)
        return -base, math.pi + base
