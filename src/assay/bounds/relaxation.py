"""Linear relaxations of ReLU over a pre-activation interval [l, u], and of max pooling.

For z ∈ [l, u]:  lower_slope · z  ≤  relu(z)  ≤  upper_slope · z + upper_intercept.

* stable active (l ≥ 0): both sides are z;
* stable inactive (u ≤ 0): both sides are 0;
* unstable (l < 0 < u): the upper side is the chord through (l, 0) and (u, u); the lower side
  is α·z for any α ∈ [0, 1] (CROWN's adaptive choice: α = 1 if u > −l else 0; α-CROWN optimises α).

The chord's intercept is nudged upwards by a few ulps so that rounding in the slope and
intercept can never put it below relu at the endpoints (the chord lies above relu on [l, u]
exactly when it does at both endpoints).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from assay.bounds.rounding import unit_roundoff


@dataclass(frozen=True, eq=False)
class ReluRelaxation:
    """Tensors of shape (B, *shape); ``unstable`` is a bool mask."""

    lower_slope: torch.Tensor
    upper_slope: torch.Tensor
    upper_intercept: torch.Tensor
    unstable: torch.Tensor


def relax_relu(lower: torch.Tensor, upper: torch.Tensor) -> ReluRelaxation:
    """CROWN's relaxation of relu over [lower, upper] (shapes (B, *shape))."""
    active = lower >= 0
    unstable = (lower < 0) & (upper > 0)
    width = (upper - lower).clamp(min=torch.finfo(lower.dtype).tiny)
    chord_slope = torch.where(unstable, upper / width, active.to(lower.dtype))
    intercept = torch.where(unstable, -chord_slope * lower, torch.zeros_like(lower))
    u = unit_roundoff(lower.dtype)
    nudge = 8 * u * (intercept.abs() + chord_slope * torch.maximum(lower.abs(), upper.abs()))
    intercept = torch.where(unstable, intercept + nudge, intercept)
    adaptive = (upper > -lower).to(lower.dtype)
    lower_slope = torch.where(unstable, adaptive, active.to(lower.dtype))
    return ReluRelaxation(lower_slope, chord_slope, intercept, unstable)


@dataclass(frozen=True, eq=False)
class MaxPoolRelaxation:
    """Per window (tensors of shape (B, C, out_h, out_w)): ``index``, the flat position (within
    its channel's H·W) of the element with the largest lower bound; ``dominant``, where that
    element's lower bound is at least every other element's upper bound; ``upper``, the
    largest upper bound in the window."""

    index: torch.Tensor
    dominant: torch.Tensor
    upper: torch.Tensor


def relax_maxpool(lower: torch.Tensor, upper: torch.Tensor, kernel, stride) -> MaxPoolRelaxation:
    """The relaxation of ``y = max(x_1 … x_k)`` over each window, for x within [lower, upper]
    (shapes (B, C, H, W)), as DeepPoly and CROWN bound max pooling:

    * lower side: ``y ≥ x_i`` for the element i with the largest lower bound (any element is a
      valid lower bound; this one is the tightest at the box's lower corner);
    * upper side: ``y ≤ x_i`` where i dominates the window (l_i ≥ u_j for every j ≠ i: then
      y = x_i exactly), else ``y ≤ max_j u_j``.

    Both sides are exact comparisons of the given bounds (no arithmetic), so they hold in any dtype.
    """
    batch, channels, height, width = lower.shape
    out_h, out_w = (height - kernel[0]) // stride[0] + 1, (width - kernel[1]) // stride[1] + 1

    def windows(t):  # (B, C, H, W) -> (B, C, kh·kw, out_h·out_w): each window's elements
        return F.unfold(t.reshape(-1, 1, height, width), kernel, stride=stride).reshape(
            t.shape[0], t.shape[1], kernel[0] * kernel[1], out_h * out_w)

    low, up = windows(lower), windows(upper)
    best_lower, chosen = low.max(2, keepdim=True)
    # The largest upper bound among the window's other elements (each window its own copy, so
    # overlapping windows never hide an element from one another).
    other_upper = up.scatter(2, chosen, -torch.inf).amax(2)
    positions = torch.arange(height * width, dtype=lower.dtype).reshape(1, 1, height, width)
    index = windows(positions).expand(batch, channels, -1, -1).gather(2, chosen).squeeze(2).round().long()
    shape = (batch, channels, out_h, out_w)
    return MaxPoolRelaxation(index.reshape(shape), (best_lower.squeeze(2) >= other_upper).reshape(shape),
                             up.amax(2).reshape(shape))
