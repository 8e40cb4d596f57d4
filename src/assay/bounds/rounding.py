"""Floating-point error bounds shared by every bound method and every stage's rules.

A leaf module (torch only): the stage kinds (:mod:`assay.bounds.stages`), the relaxations and the
walks all read it, so it imports none of them.
"""

from __future__ import annotations

import torch


def unit_roundoff(dtype: torch.dtype) -> float:
    return float(torch.finfo(dtype).eps) / 2.0


def gamma(terms: int, dtype: torch.dtype) -> float:
    """γ_n (doubled): |computed − exact| ≤ γ · Σ|products| for a sum of ``terms`` products in
    ``dtype``, in any summation order (Higham, Accuracy and Stability of Numerical Algorithms,
    §3.1: γ_n = n·u/(1 − n·u)); doubled to cover the second-order terms of chained steps."""
    u = unit_roundoff(dtype)
    return 2.0 * terms * u / max(1.0 - terms * u, 0.5)


def center_radius(lower: torch.Tensor, upper: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Center and a radius such that [center - radius, center + radius] ⊇ [lower, upper] in floats."""
    center = (lower + upper) / 2
    u = unit_roundoff(lower.dtype)
    radius = torch.maximum(upper - center, center - lower).clamp(min=0) * (1 + 4 * u)
    return center, radius + torch.finfo(lower.dtype).tiny


def magnitude(lower: torch.Tensor, upper: torch.Tensor) -> torch.Tensor:
    """max(|lower|, |upper|) elementwise: the largest absolute value in the interval."""
    return torch.maximum(lower.abs(), upper.abs())


def capped_magnitude(lower: torch.Tensor, upper: torch.Tensor) -> torch.Tensor:
    """max(|l|, |u|), capped at the dtype's largest float so that a zero coefficient times it
    stays zero (an unbounded element with a nonzero coefficient still makes the bound −inf)."""
    big = torch.finfo(lower.dtype).max
    return torch.maximum(lower.abs(), upper.abs()).nan_to_num(nan=big, posinf=big)
