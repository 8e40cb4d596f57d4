"""Bound rules of the convex and concave element-wise operators: ``Exp``, ``Log``, ``Reciprocal``,
``Sqrt`` and ``Pow`` with a constant exponent.

On a convex piece the chord is above and the tangent at ``lower + alpha·(upper − lower)`` below
(default: the midpoint); on a concave piece the other way round (CROWN, Zhang et al. 2018,
Table 1; DeepPoly's rule for convex functions). Odd powers ``x³, x⁵, …`` are concave below 0 and
convex above: across 0 they get the S-shaped treatment mirrored (tangents through an end).
The lines are built and made sound by :mod:`assay.bounds.rules.curvature`; ``interval`` is the
computed ``f`` at the ends (and 0 for even powers across 0), widened by the math library's error.

Where a function is unbounded or undefined on the interval the rule says so instead of guessing:

* ``Exp``: in float32 ``e^z`` overflows for z > 88.7; the exact value is then above every float,
  so ``interval``'s upper end and the upper line are ``+∞`` (sound, not useful); the tangent
  point below is kept where the tangent's intercept ``e^t·(1 − t)`` is finite (t ≲ 83 in float32).
* ``Log``: ``log 0 = −∞``, so an interval with ``lower = 0`` has an unbounded lower side (slope 0,
  intercept ``−∞``; ``interval`` low end ``−∞``). Below 0 the logarithm is NaN (ONNX): **an
  interval reaching below 0 is unbounded on both sides** — no finite bound holds for a NaN, and a
  certificate must not be issued for a network that can produce one. The same holds for ``Sqrt``
  and for non-integer exponents of ``Pow``.
* ``Reciprocal`` and negative integer powers: an interval containing 0 (either signed zero) is
  unbounded on both sides, except even powers (``x⁻²``), which keep their constant lower bound
  ``min(f(lower), f(upper))``.
* ``Pow`` with exponent 0 is the constant 1 (``0⁰ = 1``, as torch and ONNX); exponent 1 the identity.
"""

from __future__ import annotations

import math

import torch

from assay.bounds.rules import register
from assay.bounds.rules.base import LIBM_ULPS, ElementwiseRule, Relaxation
from assay.bounds.rules.curvature import Curve, monotone_interval, relax_s_curve, unbounded_where
from assay.nn.ops.activation import Exp, Log, Pow, Reciprocal, Sqrt

__all__ = ["ExpRule", "LogRule", "PowerRule", "power_curve"]

# a derivative p·z^(p−1) is one library value and one product
_SLOPE_ULPS = LIBM_ULPS + 2

EXP = Curve(torch.exp, torch.exp)
LOG = Curve(torch.log, torch.reciprocal)


def _substitute(mask: torch.Tensor, lower: torch.Tensor, upper: torch.Tensor):
    """``[1, 2]`` where ``mask`` (the elements whose result is overridden), so that no NaN is
    computed there (it would poison gradients through ``torch.where``)."""
    return torch.where(mask, torch.ones_like(lower), lower), torch.where(mask, torch.full_like(upper, 2.0), upper)


def _both_unbounded(mask: torch.Tensor, lo: torch.Tensor, hi: torch.Tensor):
    return (torch.where(mask, torch.full_like(lo, -math.inf), lo), torch.where(mask, torch.full_like(hi, math.inf), hi))


@register(Exp)
class ExpRule(ElementwiseRule):
    """``e^z``: convex and increasing; chord above, tangent below."""

    parameters = 1

    def interval(self, layer, lower, upper):
        lo, hi = monotone_interval(torch.exp, lower, upper)
        return lo.clamp(min=0.0), hi

    def relax(self, layer, lower, upper, alpha=None) -> Relaxation:
        # keep the tangent point where its intercept e^t·(1 − t) is finite: t·e^t < max float
        big = math.log(torch.finfo(lower.dtype).max)
        safe = big - math.log(big) - 1
        width = upper - lower
        cap = torch.where(width > 0, (safe - lower) / torch.where(width > 0, width, torch.ones_like(width)),
                          torch.ones_like(width)).clamp(0.0, 1.0)
        if alpha is None:
            a_low, a_up = torch.full_like(lower, 0.5), torch.full_like(lower, 0.5)
        else:
            a_low, a_up = alpha
            if a_low.dim() > cap.dim():
                cap = cap.unsqueeze(1)
        return relax_s_curve(EXP, math.inf, lower, upper, (torch.minimum(a_low, cap), a_up),
                             self.interval(layer, lower, upper))


@register(Log)
class LogRule(ElementwiseRule):
    """``log z``: concave and increasing on ``z > 0``; tangent above, chord below; see the module
    docstring for ``lower ≤ 0``."""

    parameters = 1

    def interval(self, layer, lower, upper):
        outside = lower < 0
        low, up = _substitute(outside, lower, upper)
        return _both_unbounded(outside, *monotone_interval(torch.log, low, up))

    def relax(self, layer, lower, upper, alpha=None) -> Relaxation:
        outside = lower < 0
        low, up = _substitute(outside, lower, upper)
        relaxation = relax_s_curve(LOG, -math.inf, low, up, alpha, self.interval(layer, low, up))
        return unbounded_where(outside, relaxation)


def power_curve(exponent: float, value=None) -> Curve:
    """``z^exponent`` and its derivative (``value`` overrides how the power is computed, e.g.
    ``torch.sqrt``); an integral exponent is applied as an integer, as :class:`Pow` does."""
    p = int(exponent) if float(exponent).is_integer() else float(exponent)
    q = int(exponent - 1) if float(exponent).is_integer() else float(exponent - 1)
    value = value or (lambda z: torch.pow(z, p))
    return Curve(value, lambda z: p * torch.pow(z, q), LIBM_ULPS, _SLOPE_ULPS)


class PowerRule(ElementwiseRule):
    """``z^p`` for a constant ``p`` (``Pow``, ``Reciprocal`` = ``p = −1``, ``Sqrt`` = ``p = ½``).

    ======================  =====================================================
    exponent                shape
    ======================  =====================================================
    0, 1                    the constant 1, the identity (exact)
    even integer > 0        convex; minimum 0 at 0
    odd integer ≥ 3         concave below 0, convex above (S-shaped, mirrored)
    negative integer        convex above 0; below 0 convex (even) or concave (odd);
                            unbounded across 0 (even: lower side kept)
    non-integer             domain z ≥ 0 (NaN below: unbounded); convex for p > 1
                            or p < 0, concave for 0 < p < 1
    ======================  =====================================================
    """

    parameters = 1

    def exponent(self, layer) -> float:
        return float(layer.exponent)

    def curve(self, layer) -> Curve:
        return power_curve(self.exponent(layer))

    def _cases(self, layer, lower, upper):
        """(p, integral, outside: where both sides are unbounded, pole: where an even negative
        power's interval holds 0 and only its lower side is bounded)."""
        p = self.exponent(layer)
        integral = p.is_integer()
        if not integral:
            outside = lower < 0
        elif p < 0:
            outside = (lower <= 0) & (upper >= 0)
        else:
            outside = torch.zeros_like(lower, dtype=torch.bool)
        pole = outside if integral and p < 0 and int(p) % 2 == 0 else torch.zeros_like(outside)
        return p, integral, outside & ~pole, pole

    def interval(self, layer, lower, upper):
        p, integral, outside, pole = self._cases(layer, lower, upper)
        if p == 0:
            return torch.ones_like(lower), torch.ones_like(upper)
        if p == 1:
            return lower, upper
        low, up = _substitute(outside, lower, upper)
        lo, hi = monotone_interval(self.curve(layer).value, low, up)
        if integral and p > 0 and int(p) % 2 == 0:  # the minimum 0 at 0
            lo = torch.where((lower <= 0) & (upper >= 0), torch.zeros_like(lo), lo)
        if not integral or int(p) % 2 == 0:  # even powers and powers of z ≥ 0 are ≥ 0
            lo = lo.clamp(min=0.0)
        # an even negative power across 0: at least its smaller end value (computed above), no maximum
        hi = torch.where(pole, torch.full_like(hi, math.inf), hi)
        return _both_unbounded(outside, lo, hi)

    def relax(self, layer, lower, upper, alpha=None) -> Relaxation:
        p, integral, outside, pole = self._cases(layer, lower, upper)
        if p in (0, 1):
            slope = torch.full_like(lower, float(p == 1))
            intercept = torch.full_like(lower, float(p == 0))
            return Relaxation(slope, intercept, slope, intercept)
        interval = self.interval(layer, lower, upper)
        masked = outside | pole
        low, up = _substitute(masked, lower, upper)
        curve = self.curve(layer)
        if integral and p > 0 and int(p) % 2 == 1:
            relaxation = relax_s_curve(curve, 0.0, low, up, alpha, interval, concave_first=True)
        else:
            if integral and p < 0 and int(p) % 2 == 1:  # concave below 0, convex above
                inflection = torch.where(up <= 0, torch.full_like(up, -math.inf), torch.full_like(up, math.inf))
            else:
                concave = not integral and 0 < p < 1
                inflection = -math.inf if concave else math.inf
            relaxation = relax_s_curve(curve, inflection, low, up, alpha, interval)
        relaxation = unbounded_where(outside, relaxation)
        if bool(pole.any()):  # the constant lower side, no upper side
            lo = interval[0] if interval[0].dim() == relaxation.lower_slope.dim() else interval[0].unsqueeze(1)
            mask = pole if pole.dim() == relaxation.lower_slope.dim() else pole.unsqueeze(1)
            relaxation = Relaxation(torch.where(mask, torch.zeros_like(relaxation.lower_slope), relaxation.lower_slope),
                                    torch.where(mask, lo.expand_as(relaxation.lower_intercept), relaxation.lower_intercept),
                                    torch.where(mask, torch.zeros_like(relaxation.upper_slope), relaxation.upper_slope),
                                    torch.where(mask, torch.full_like(relaxation.upper_intercept, math.inf),
                                                relaxation.upper_intercept))
        return relaxation


@register(Pow)
class PowRule(PowerRule):
    """``Pow`` with a constant exponent."""


@register(Reciprocal)
class ReciprocalRule(PowerRule):
    """``1 / z``: ``z⁻¹``."""

    def exponent(self, layer) -> float:
        return -1.0

    def curve(self, layer) -> Curve:
        return power_curve(-1.0, torch.reciprocal)


@register(Sqrt)
class SqrtRule(PowerRule):
    """``√z``: ``z^½`` (NaN below 0: unbounded there)."""

    def exponent(self, layer) -> float:
        return 0.5

    def curve(self, layer) -> Curve:
        return power_curve(0.5, torch.sqrt)
