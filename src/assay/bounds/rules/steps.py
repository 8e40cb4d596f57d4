"""Bound rules of the step functions ``Floor`` and ``Cast`` (rounding to a narrower float,
truncating to an integer, testing ``≠ 0`` for a bool).

``floor`` is constant on each cell ``[k, k + 1)`` and jumps by 1 at every integer, so

* the interval is ``[floor(l), floor(u)]`` (floor of a float is an exact float);
* on an interval inside one cell both lines are the constant ``floor(l)`` (exact);
* across an integer, a line of slope ``s ∈ [0, 1]`` is sound with the extremes of
  ``g(z) = floor(z) − s·z`` over ``[l, u]`` as intercepts. ``g`` decreases inside a cell and jumps
  up by 1 at an integer, so its maximum is at ``l`` or at an integer ``k`` in ``(l, u]`` (value
  ``(1 − s)·k``) and its infimum at ``u`` or just left of such an integer (``(1 − s)·k − 1``);
  ``(1 − s)·k`` is monotone in ``k``, so the first and the last such integer suffice. The default
  slope is 1 (``z − 1 < floor(z) ≤ z``: the lines are 1 apart, while any flatter pair is at least
  as far apart at one end); α-CROWN's ``alpha`` picks ``s`` on each side.

**Floating point.** Computed in float64 (float32 inputs convert exactly); every candidate value
is charged 8 ulps of its terms and the result is rounded outwards to the output dtype. An end at
±inf keeps the slope 1 (the lines ``z − 1`` and ``z`` hold on the whole line).

``Cast`` (:class:`CastRule`) is non-decreasing for every target but bool, so its interval is
``[cast(l), cast(u)]``; ``≠ 0`` is 0 only at 0. Its lines: the identity for a float at least as
wide as the input's dtype (exact); for a narrower float, slope 1 with intercepts
``±(ε_t/2·max(|l|, |u|) + the target's smallest subnormal)`` (round to nearest moves a value by
at most half an ulp of the target, ``ε_t/2`` relative, or half a subnormal), widened by 1 % for
the intercept's own arithmetic; for integers and bools, the interval as constant lines (exact
where the interval lies in one integer cell or away from 0).
"""

from __future__ import annotations

import math

import torch

from assay.bounds.ibp import cast_outward
from assay.bounds.rules import register
from assay.bounds.rules.alphas import split_alpha
from assay.bounds.rules.base import ElementwiseRule, Relaxation, ulp_margin
from assay.nn.ops.activation import Floor
from assay.nn.ops.decision import CAST_FLOATS, Cast

__all__ = ["FloorRule", "CastRule"]

_WORK = torch.float64


def _charged(value: torch.Tensor, magnitude: torch.Tensor, up: bool) -> torch.Tensor:
    """``value`` (computed with a few roundings of terms of size ``magnitude``) moved outwards by 8
    ulps of ``magnitude`` and one float more for that sum's own rounding."""
    margin = ulp_margin(magnitude, 8)
    if up:
        return torch.nextafter(value + margin, torch.full_like(value, math.inf))
    return torch.nextafter(value - margin, torch.full_like(value, -math.inf))


def _offset_extremes(l: torch.Tensor, u: torch.Tensor, s: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Sound ``(inf, sup)`` of ``floor(z) − s·z`` over ``[l, u]`` for ``0 ≤ s ≤ 1``, finite ends that
    lie in different cells (float64)."""
    first = torch.floor(l) + 1  # the first and last integers in (l, u]
    last = torch.floor(u)
    rest = 1 - s
    at_l = torch.floor(l) - s * l
    at_u = torch.floor(u) - s * u
    jumps = torch.stack([rest * first, rest * last])
    top = torch.stack([_charged(at_l, torch.floor(l).abs() + (s * l).abs(), True),
                       *(_charged(j, j.abs(), True) for j in jumps)]).amax(0)
    bottom = torch.stack([_charged(at_u, torch.floor(u).abs() + (s * u).abs(), False),
                          *(_charged(j - 1, j.abs() + 1, False) for j in jumps)]).amin(0)
    return bottom, top


@register(Floor)
class FloorRule(ElementwiseRule):
    """``floor(z)``: exact inside one cell; across integers, lines of slope in [0, 1] (default 1)."""

    parameters = 1

    def interval(self, layer, lower, upper):
        return torch.floor(lower), torch.floor(upper)

    def relax(self, layer, lower, upper, alpha=None):
        dtype = lower.dtype
        alpha_lower, alpha_upper, lower, upper = split_alpha(alpha, lower, upper)
        l, u = lower.to(_WORK), upper.to(_WORK)
        one = torch.ones_like(l)
        finite = torch.isfinite(l) & torch.isfinite(u)
        slopes = []
        for a in (alpha_lower, alpha_upper):
            s = one if a is None else a.to(_WORK).clamp(0.0, 1.0) * one
            slopes.append(torch.where(finite, s, one).to(dtype).to(_WORK))  # the slope as stored
        safe_l, safe_u = torch.where(finite, l, -one), torch.where(finite, u, one)
        bottom, _ = _offset_extremes(safe_l, safe_u, slopes[0])
        _, top = _offset_extremes(safe_l, safe_u, slopes[1])
        # an end at ±inf: z − 1 < floor(z) ≤ z everywhere
        bottom = torch.where(finite, bottom, -one)
        top = torch.where(finite, top, torch.zeros_like(l))
        one_cell = torch.floor(l) == torch.floor(u)
        cell = torch.where(one_cell & finite, torch.floor(l), torch.zeros_like(l))
        lower_slope = torch.where(one_cell, torch.zeros_like(l), slopes[0])
        upper_slope = torch.where(one_cell, torch.zeros_like(l), slopes[1])
        lower_icpt, upper_icpt = cast_outward(torch.where(one_cell, cell, bottom), torch.where(one_cell, cell, top), dtype)
        return Relaxation(lower_slope=lower_slope.to(dtype), lower_intercept=lower_icpt,
                          upper_slope=upper_slope.to(dtype), upper_intercept=upper_icpt)


@register(Cast)
class CastRule(ElementwiseRule):
    """``Cast`` to a float (rounding), an integer (truncation) or a bool (``≠ 0``)."""

    def interval(self, layer, lower, upper):
        if layer.kind != "bool":
            return layer.forward(lower), layer.forward(upper)
        zero_inside = (lower <= 0) & (0 <= upper)
        at_zero = (lower == 0) & (upper == 0)
        return torch.where(zero_inside, 0.0, 1.0).to(lower.dtype), torch.where(at_zero, 0.0, 1.0).to(lower.dtype)

    def relax(self, layer, lower, upper, alpha=None):
        dtype = lower.dtype
        zero, one = torch.zeros_like(lower), torch.ones_like(lower)
        if layer.kind == "float" and torch.finfo(CAST_FLOATS[layer.to]).bits >= torch.finfo(dtype).bits:
            return Relaxation(one, zero, one, zero)  # no rounding: the identity
        lo, hi = self.interval(layer, lower, upper)
        if layer.kind == "float":
            target = torch.finfo(CAST_FLOATS[layer.to])
            l, u = lower.to(_WORK), upper.to(_WORK)
            magnitude = torch.maximum(l.abs(), u.abs())
            step = (target.eps / 2 * magnitude + target.smallest_normal * target.eps) * 1.01
            fits = magnitude <= target.max  # beyond, a value may round to ±inf: the interval's lines
            _, step = cast_outward(-step, step, dtype)
            return Relaxation(torch.where(fits, one, zero), torch.where(fits, -step, lo),
                              torch.where(fits, one, zero), torch.where(fits, step, hi))
        return Relaxation(zero, lo, zero, hi)
