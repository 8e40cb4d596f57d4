"""Sound lines under and over convex and concave pieces of a function, in floating point.

Every element-wise rule builds its relaxation from these two facts about a function ``f`` that is
convex on ``[l, u]``:

* a line that lies above ``f`` at both ends lies above it on the whole interval
  (:func:`line_above_convex`, any slope: the chord is the tightest);
* the tangent at any ``t`` in ``[l, u]`` lies below it (:func:`tangent_below_convex`).

For a concave piece, negate: ``line_above_convex(−f)`` is a line below ``f``. The functions take
the *computed* values of ``f`` and ``f'`` and charge their error (:data:`LIBM_ULPS` ulps) and the
rounding of the line's own arithmetic, so the returned line is sound for the exact ``f``.
Tensors broadcast; the result has their broadcast shape.
"""

from __future__ import annotations

import torch

from assay.bounds.rules.base import LIBM_ULPS, ulp_margin

__all__ = ["line_above_convex", "tangent_below_convex", "chord_slope"]


def chord_slope(lower: torch.Tensor, upper: torch.Tensor, f_lower: torch.Tensor, f_upper: torch.Tensor) -> torch.Tensor:
    """(f(u) − f(l)) / (u − l), and 0 where the interval is a point (any slope is then sound)."""
    width = upper - lower
    safe = torch.where(width > 0, width, torch.ones_like(width))
    return torch.where(width > 0, (f_upper - f_lower) / safe, torch.zeros_like(width))


def line_above_convex(lower, upper, f_lower, f_upper, slope=None) -> tuple[torch.Tensor, torch.Tensor]:
    """``(slope, intercept)`` of a line ≥ f on ``[lower, upper]`` for ``f`` convex there, given
    the computed ``f(lower)``, ``f(upper)``. ``slope`` defaults to the chord's; with any slope the
    intercept is raised until the line clears both (error-inflated) end values, which by
    convexity clears ``f`` everywhere between.
    """
    if slope is None:
        slope = chord_slope(lower, upper, f_lower, f_upper)
    f_lower = f_lower + ulp_margin(f_lower.abs())
    f_upper = f_upper + ulp_margin(f_upper.abs())
    at_lower = f_lower - slope * lower
    at_upper = f_upper - slope * upper
    # each candidate is one product and one subtraction: 4 ulps of its terms cover both roundings
    at_lower = at_lower + ulp_margin(f_lower.abs() + (slope * lower).abs(), 4)
    at_upper = at_upper + ulp_margin(f_upper.abs() + (slope * upper).abs(), 4)
    return slope, torch.maximum(at_lower, at_upper)


def tangent_below_convex(point, f_point, df_point, lower, upper) -> tuple[torch.Tensor, torch.Tensor]:
    """``(slope, intercept)`` of the tangent of a convex ``f`` at ``point`` (in ``[lower, upper]``),
    lowered so that it stays ≤ f on ``[lower, upper]`` although ``f(point)`` and ``f'(point)`` were
    computed: an error Δs in the slope moves the line by at most |Δs|·|z − t| ≤ |Δs|·(u − l).
    """
    slope = df_point
    intercept = f_point - slope * point
    spread = (upper - lower).abs() + point.abs()
    margin = ulp_margin(f_point.abs() + slope.abs() * spread, LIBM_ULPS + 4)
    return slope, intercept - margin
