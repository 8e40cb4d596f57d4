"""Linear relaxation of ReLU over a pre-activation interval [l, u].

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

from assay.bounds.plan import unit_roundoff


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
