"""Bound rules of the S-shaped activations: ``Sigmoid`` and ``Tanh``.

Both are increasing, convex on ``(−∞, 0]`` and concave on ``[0, ∞)``. The relaxation is CROWN's
for general activations (Zhang et al. 2018, Table 1; auto_LiRPA's ``s_shaped``), built and made
sound by :mod:`assay.bounds.rules.curvature`:

* ``upper ≤ 0``: chord above, tangent below at ``lower + alpha·(upper − lower)`` (default midpoint);
* ``lower ≥ 0``: tangent above, chord below;
* across 0: above, the tangent of the concave part through ``(lower, f(lower))`` (alpha moves its
  touching point towards ``upper``), or the chord where that tangent would touch beyond ``upper``;
  below, the mirror image through ``(upper, f(upper))``.

``interval`` is the computed ``(f(lower), f(upper))`` widened by the math library's error, and
clipped to the function's range (``[0, 1]``, ``[−1, 1]``). Derivatives are computed without
cancellation: ``σ'(z) = σ(z)·σ(−z)``, ``tanh'(z) = 4·σ(2z)·σ(−2z)``.
"""

from __future__ import annotations

import torch

from assay.bounds.rules import register
from assay.bounds.rules.base import LIBM_ULPS, ElementwiseRule, Relaxation
from assay.bounds.rules.curvature import Curve, monotone_interval, relax_s_curve
from assay.nn.ops.activation import Sigmoid, Tanh

__all__ = ["SigmoidRule", "TanhRule", "SIGMOID", "TANH"]

# a derivative is a product of two library values: their errors add, plus the product's rounding
_PRODUCT_ULPS = 2 * LIBM_ULPS + 2

SIGMOID = Curve(torch.sigmoid, lambda z: torch.sigmoid(z) * torch.sigmoid(-z), LIBM_ULPS, _PRODUCT_ULPS)
TANH = Curve(torch.tanh, lambda z: 4 * torch.sigmoid(2 * z) * torch.sigmoid(-2 * z), LIBM_ULPS, _PRODUCT_ULPS)


class _SShapedRule(ElementwiseRule):
    """An increasing function, convex below 0 and concave above, with values in ``[floor, ceiling]``."""

    parameters = 1
    curve: Curve
    floor: float
    ceiling: float

    def interval(self, layer, lower, upper):
        lo, hi = monotone_interval(self.curve.value, lower, upper)
        return lo.clamp(min=self.floor), hi.clamp(max=self.ceiling)

    def relax(self, layer, lower, upper, alpha=None) -> Relaxation:
        return relax_s_curve(self.curve, 0.0, lower, upper, alpha, self.interval(layer, lower, upper))


@register(Sigmoid)
class SigmoidRule(_SShapedRule):
    """``σ(z) = 1 / (1 + e^−z)``."""

    curve, floor, ceiling = SIGMOID, 0.0, 1.0


@register(Tanh)
class TanhRule(_SShapedRule):
    """``tanh(z)``."""

    curve, floor, ceiling = TANH, -1.0, 1.0
