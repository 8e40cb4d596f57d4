"""Sound linear bounds of functions of known curvature: one piece, or convex then concave (S).

The rules of :mod:`assay.bounds.rules.s_shaped` (sigmoid, tanh) and
:mod:`assay.bounds.rules.convex` (exp, log, reciprocal, sqrt, powers) all relax a function that
is convex on ``(−∞, c]`` and concave on ``[c, ∞)`` for an inflection point ``c`` (``c = +∞``: convex
everywhere; ``c = −∞``: concave everywhere), or the mirror image of one (``x³``). The shape of the
relaxation is CROWN's for general activations (Zhang et al., NeurIPS 2018, §3.2 and Table 1) as
auto_LiRPA's ``s_shaped`` implements it:

* on a convex piece the **chord** is above and a **tangent** below (its point chosen by alpha);
* on a concave piece the other way round;
* across the inflection point the upper line is the tangent of the concave part that passes
  through ``(lower, f(lower))`` — or, when no such tangent touches inside the interval, the
  chord — and alpha may move the touching point towards ``upper`` (every such tangent passes
  above ``f(lower)``); the lower line mirrors it. The touching point is found by a vectorised
  bisection with a fixed number of steps.

**Soundness does not rest on the bisection or on any float evaluation being exact.** Every line
is built by choosing a slope, then raising its intercept until it provably clears ``f``:

* :func:`clear_point` clears ``f`` at one point (charging the error of the computed ``f``);
* :func:`clear_concave` clears ``f`` on a whole concave piece ``[a, b]`` from one touching point
  ``t`` in it and *any* slope: ``f(z) ≤ f(t) + f'(t)(z − t)`` on the piece, and a slope ``s ≠ f'(t)``
  costs ``max(0, s − f'(t))·(t − a) + max(0, f'(t) − s)·(b − t)`` (with ``f'(t)`` widened by its error);
* a line that clears a convex piece at both of its ends clears it everywhere.

Upper line across the inflection = clear the concave part ``[c, u]`` from the touching point,
and clear the point ``lower`` (the convex part ``[lower, c]`` is then cleared at both ends, ``c``
being in the concave part). Whatever the bisection returned, the result is above ``f``; a poor
touching point only makes it looser. Lower lines are upper lines of ``−f(−z)``.

Every intermediate that overflows makes its side unbounded (intercept ``+∞`` for the upper
side), and :func:`relax_s_curve` replaces a non-finite side by the constant ``interval`` end.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

from assay.bounds.rules.alphas import split_alpha
from assay.bounds.rules.base import LIBM_ULPS, Relaxation, ulp_margin, widen
from assay.bounds.rules.shapes import chord_slope

__all__ = ["Curve", "clear_point", "clear_concave", "upper_line", "lower_line", "relax_s_curve",
           "monotone_interval", "constant_where"]


# The touching point's search: each round evaluates this many points across the bracket at once
# (one batch of tensor operations instead of one per halving: small tensors pay the operations'
# fixed cost, not their size).
_SEARCH_POINTS = 8


def _search_rounds(dtype: torch.dtype) -> int:
    """Rounds of the touching point's search: the bracket shrinks by 8 per round, to 2⁻²⁴ (float32)
    or 2⁻³³ (float64) of the interval. The point only picks a slope (see the module docstring):
    a line tangent a hair away from the exact point costs the bound about f''·(width·2⁻³³)·width."""
    return 8 if dtype == torch.float32 else 11


@dataclass(frozen=True)
class Curve:
    """A function ``f`` and its derivative as torch computes them, with bounds on their errors.

    ``value(z)`` and ``slope(z)`` are within ``value_ulps`` / ``slope_ulps`` unit roundoffs of the
    exact ``f(z)`` / ``f'(z)``, relatively (plus the smallest normal number: :func:`ulp_margin`), or
    non-finite (overflow; the callers then give up the side).
    """

    value: Callable[[torch.Tensor], torch.Tensor]
    slope: Callable[[torch.Tensor], torch.Tensor]
    value_ulps: float = LIBM_ULPS
    slope_ulps: float = LIBM_ULPS

    def negated(self) -> Curve:
        """``−f(z)``."""
        value, slope = self.value, self.slope
        return Curve(lambda z: -value(z), lambda z: -slope(z), self.value_ulps, self.slope_ulps)

    def reflected(self) -> Curve:
        """``f(−z)``."""
        value, slope = self.value, self.slope
        return Curve(lambda z: value(-z), lambda z: -slope(-z), self.value_ulps, self.slope_ulps)


def _finite(*tensors: torch.Tensor) -> torch.Tensor:
    ok = torch.isfinite(tensors[0])
    for t in tensors[1:]:
        ok = ok & torch.isfinite(t)
    return ok


def clear_point(curve: Curve, slope: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
    """The smallest intercept (rounded up) of a line of ``slope`` that is ≥ the exact ``f(z)`` at ``z``;
    ``+∞`` where ``f(z)`` or ``slope·z`` overflowed."""
    fz = curve.value(z)
    sz = slope * z
    intercept = fz + ulp_margin(fz.abs(), curve.value_ulps) - sz
    # sz, the two sums and the final addition: four roundings of terms at most |fz| + |sz| (+ margins)
    intercept = intercept + ulp_margin(fz.abs() + sz.abs(), 8)
    return torch.where(_finite(fz, sz, intercept), intercept, torch.full_like(intercept, math.inf))


def clear_concave(curve: Curve, slope: torch.Tensor, t: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """An intercept such that ``slope·z + intercept ≥ f(z)`` for every z in ``[a, b]``, for ``f``
    concave on ``[a, b]`` and a touching point ``a ≤ t ≤ b`` (floats; any slope).

    By concavity ``f(z) ≤ f(t) + f'(t)(z − t)``; the line minus that tangent is smallest at ``a``
    or ``b``, hence the two penalty terms. ``f(t)`` and ``f'(t)`` are widened by their errors;
    the subtraction inside each penalty is widened by its own rounding (it may cancel). ``+∞``
    where anything overflowed.
    """
    ft = curve.value(t)
    dt = curve.slope(t)
    value_error = ulp_margin(ft.abs(), curve.value_ulps)
    # exact f'(t) is within slope_error of dt; the differences below round by ≤ 2u of their terms
    slope_error = ulp_margin(dt.abs(), curve.slope_ulps) + ulp_margin(dt.abs() + slope.abs(), 4)
    left = (slope - dt + slope_error).clamp(min=0) * (t - a)
    right = (dt + slope_error - slope).clamp(min=0) * (b - t)
    st = slope * t
    intercept = ft + value_error - st + left + right
    # st, (t − a), (b − t), two products and five sums: ≤ 9 roundings of terms bounded by the sum below
    intercept = intercept + ulp_margin(ft.abs() + value_error + st.abs() + left + right, 16)
    return torch.where(_finite(ft, dt, st, left, right, intercept), intercept, torch.full_like(intercept, math.inf))


def _touching_point(curve: Curve, anchor: torch.Tensor, lo: torch.Tensor, hi: torch.Tensor):
    """For ``f`` concave on ``[lo, hi]`` and ``anchor ≤ lo`` (convex between): the touching point
    ``d`` in ``[lo, hi]`` of the tangent through ``(anchor, f(anchor))`` — the tangent at t, read at
    the anchor, rises with t, so bisect for where it reaches ``f(anchor)`` — and whether the
    tangent at ``hi`` already reaches it (else no tangent through the anchor touches inside).
    In the tensors' dtype, without gradient; the returned point is a guess (callers clear the
    line whatever it is).
    """
    with torch.no_grad():
        f_anchor = curve.value(anchor)

        def reaches(t):
            return curve.value(t) + curve.slope(t) * (anchor - t) >= f_anchor

        found = reaches(hi)
        # k-section: the tangent's height at the anchor rises with t, so the points that reach
        # form a suffix of the grid; the bracket becomes the cell where that suffix starts
        fractions = torch.arange(1, _SEARCH_POINTS + 1, dtype=lo.dtype) / _SEARCH_POINTS
        anchor_, f_anchor_ = anchor.unsqueeze(-1), f_anchor.unsqueeze(-1)
        for _ in range(_search_rounds(anchor.dtype)):
            grid = lo.unsqueeze(-1) + (hi - lo).unsqueeze(-1) * fractions
            up = curve.value(grid) + curve.slope(grid) * (anchor_ - grid) >= f_anchor_
            below = (~up).sum(-1, keepdim=True)  # grid points before the first that reaches
            new_hi = torch.where(below < _SEARCH_POINTS, grid.gather(-1, below.clamp(max=_SEARCH_POINTS - 1)),
                                 hi.unsqueeze(-1))
            new_lo = torch.where(below > 0, grid.gather(-1, (below - 1).clamp(min=0)), lo.unsqueeze(-1))
            lo, hi = new_lo.squeeze(-1), new_hi.squeeze(-1)
        return hi, found


def upper_line(curve: Curve, inflection, lower: torch.Tensor, upper: torch.Tensor, alpha=None):
    """``(slope, intercept)`` of a line ≥ f on ``[lower, upper]``, for f convex on
    ``(−∞, inflection]`` and concave on ``[inflection, ∞)`` (``inflection``: a float or a tensor
    broadcastable to ``lower``, ±inf allowed).

    * ``upper ≤ inflection`` (convex): the chord;
    * ``lower ≥ inflection`` (concave): the tangent at ``t = lower + alpha·(upper − lower)``
      (default alpha 0.5, the midpoint);
    * across: the tangent through ``(lower, f(lower))``, touching at ``d``; alpha moves the touching
      point to ``d + alpha·(upper − d)`` (default 0: through the end). Where no tangent through
      ``lower`` touches in ``[inflection, upper]``, the chord (alpha is unused).

    The intercept may be ``+∞`` (overflow); see the module docstring for why it is sound.
    """
    c = torch.as_tensor(inflection, dtype=lower.dtype, device=lower.device).expand_as(lower)
    convex = upper <= c
    concave = lower >= c
    across = ~convex & ~concave
    f_lower, f_upper = curve.value(lower), curve.value(upper)
    chord = chord_slope(lower, upper, f_lower, f_upper)

    # the concave part [start, upper] and the touching point in it
    start = torch.where(concave | convex, lower, c)
    d, found = torch.zeros_like(lower), torch.zeros_like(across)
    if bool(across.any()):  # search only where the interval crosses the inflection point
        with torch.no_grad():
            d[across], found[across] = _touching_point(curve, lower.detach()[across], c.detach()[across],
                                                       upper.detach()[across])
    tangent_across = across & found
    base = torch.where(tangent_across, d, lower)
    default = torch.where(tangent_across, torch.zeros_like(lower), torch.full_like(lower, 0.5))
    a = default if alpha is None else alpha
    t = base + a * (upper - base)
    t = torch.where(across & ~tangent_across, upper, t)  # the chord touches the concave part's right end
    t = torch.minimum(torch.maximum(t, start), upper)
    slope = torch.where(concave | tangent_across, curve.slope(t), chord)
    # a slope that overflowed (or a chord between overflowed ends) gives its side up: intercept +inf
    bad = ~torch.isfinite(slope)
    slope = torch.where(bad, torch.zeros_like(slope), slope)

    # convex: clear both ends; otherwise clear the concave part from t, and the point lower
    at_lower = clear_point(curve, slope, lower)
    at_upper = clear_point(curve, slope, upper)
    on_concave = clear_concave(curve, slope, t, start, upper)
    intercept = torch.where(convex, torch.maximum(at_lower, at_upper),
                            torch.where(across, torch.maximum(on_concave, at_lower), on_concave))
    intercept = torch.where(bad, torch.full_like(intercept, math.inf), intercept)
    return slope, intercept


def lower_line(curve: Curve, inflection, lower: torch.Tensor, upper: torch.Tensor, alpha=None):
    """``(slope, intercept)`` of a line ≤ f on ``[lower, upper]`` (f as for :func:`upper_line`):
    the upper line of ``−f(−z)`` on ``[−upper, −lower]``, mirrored. A tangent point is
    ``lower + alpha·(upper − lower)`` on a convex interval (default the midpoint); across the
    inflection it is ``lower + alpha·(d − lower)`` for the tangent through ``(upper, f(upper))``
    touching at ``d`` (default alpha 1: through the end). The intercept may be ``−∞``.
    """
    mirrored = curve.reflected().negated()
    c = -torch.as_tensor(inflection, dtype=lower.dtype, device=lower.device)
    slope, intercept = upper_line(mirrored, c, -upper, -lower, None if alpha is None else 1 - alpha)
    return slope, -intercept


def relax_s_curve(curve: Curve, inflection, lower, upper, alpha, interval, *, concave_first: bool = False) -> Relaxation:
    """The relaxation of f on ``[lower, upper]`` (convex then concave at ``inflection``; with
    ``concave_first``, concave then convex, e.g. ``x³``), each side falling back to the constant
    end of ``interval = (lo, hi)`` where its line overflowed."""
    lo, hi = interval
    a_low, a_up, lower, upper = split_alpha(alpha, lower, upper)
    a_low, a_up = (None if a is None else a.to(lower.dtype) for a in (a_low, a_up))
    if isinstance(inflection, torch.Tensor) and inflection.dim() < lower.dim():  # per element, (B, *shape)
        inflection = inflection.unsqueeze(1)
    if concave_first:  # f(z) = g(−z) with g convex then concave at −inflection: mirror the slopes
        g = curve.reflected()
        c = -torch.as_tensor(inflection, dtype=lower.dtype, device=lower.device)
        flip = (lambda x: None if x is None else 1 - x)
        ls, li = lower_line(g, c, -upper, -lower, flip(a_low))
        us, ui = upper_line(g, c, -upper, -lower, flip(a_up))
        ls, us = -ls, -us
    else:
        ls, li = lower_line(curve, inflection, lower, upper, a_low)
        us, ui = upper_line(curve, inflection, lower, upper, a_up)
    if lo.dim() < li.dim():
        lo, hi = lo.unsqueeze(1), hi.unsqueeze(1)
    low_ok = torch.isfinite(ls) & torch.isfinite(li)
    up_ok = torch.isfinite(us) & torch.isfinite(ui)
    zero = torch.zeros_like(li)
    return Relaxation(torch.where(low_ok, ls, zero), torch.where(low_ok, li, lo.expand_as(li)),
                      torch.where(up_ok, us, zero), torch.where(up_ok, ui, hi.expand_as(ui)))


def monotone_interval(value: Callable, lower: torch.Tensor, upper: torch.Tensor,
                      ulps: float = LIBM_ULPS) -> tuple[torch.Tensor, torch.Tensor]:
    """``(lo, hi)`` of an f monotone (either way) on ``[lower, upper]`` from its computed ends,
    widened by ``ulps``. A computed end that overflowed towards the wrong side (``lo = +∞``) is
    replaced by a large finite value the exact one exceeds (a 2⁻⁸ relative margin dwarfs any libm
    error)."""
    a, b = value(lower), value(upper)
    lo, hi = torch.minimum(a, b), torch.maximum(a, b)
    big = torch.finfo(lower.dtype).max * (1 - 2.0 ** -8)
    lo = torch.where(lo == math.inf, torch.full_like(lo, big), lo)
    hi = torch.where(hi == -math.inf, torch.full_like(hi, -big), hi)
    return widen(lo, hi, ulps)


def constant_where(mask: torch.Tensor, relaxation: Relaxation, low=-math.inf, high=math.inf) -> Relaxation:
    """``relaxation`` with constant sides (slope 0, intercepts ``low`` and ``high``: floats or
    ``(B, *shape)`` tensors; ∓∞ by default, i.e. unbounded) where ``mask`` (``(B, *shape)``)."""

    def pick(value, fill):
        m = mask if mask.dim() == value.dim() else mask.unsqueeze(1)
        if isinstance(fill, torch.Tensor):
            fill = (fill if fill.dim() == value.dim() else fill.unsqueeze(1)).expand_as(value)
        else:
            fill = torch.full_like(value, fill)
        return torch.where(m, fill, value)

    return Relaxation(pick(relaxation.lower_slope, 0.0), pick(relaxation.lower_intercept, low),
                      pick(relaxation.upper_slope, 0.0), pick(relaxation.upper_intercept, high))
