"""Box geometry of online verification: leaf domains, containment, distances, volumes.

Every function works on batches of boxes given as ``(lower, upper)`` tensors of shape (N, n).
A *cell* is a leaf of the split tree before it meets the input domain: its faces are split
planes, or ±inf where the leaf reaches the domain's boundary. Intersecting the cells with any
domain X gives boxes that partition X, which is what lets the leaves of one step cover the
domain of the next even when it grows (BMI).
"""

from __future__ import annotations

import torch

__all__ = ["leaf_domains", "contains", "hausdorff_excess", "relative_volumes", "cells_of", "enlarge"]


def leaf_domains(cell_lower, cell_upper, lower, upper):
    """cell ∩ [lower, upper] for every cell: ((N, n), (N, n), (N,) bool nonempty)."""
    dom_lower = torch.maximum(cell_lower, lower.unsqueeze(0))
    dom_upper = torch.minimum(cell_upper, upper.unsqueeze(0))
    return dom_lower, dom_upper, (dom_lower <= dom_upper).all(1)


def contains(outer_lower, outer_upper, inner_lower, inner_upper) -> torch.Tensor:
    """(N,) bool: box i of ``inner`` lies inside box i of ``outer`` (exact comparisons)."""
    return ((outer_lower <= inner_lower) & (inner_upper <= outer_upper)).all(1)


def hausdorff_excess(new_lower, new_upper, old_lower, old_upper, norm: str = "inf") -> torch.Tensor:
    """The directed Hausdorff distance from each new box to its old box: (N,).

    sup over x' in the new box of the distance from x' to the old box. Per coordinate the
    farthest excess is e_k = max(l0_k − l_k, u_k − u0_k, 0); the distance separates over
    coordinates, so it is max_k e_k in ℓ∞ and (Σ e_k²)^½ in ℓ2. The ℓ2 value is attained at a
    corner of the new box when it sticks out in several coordinates at once; taking only the
    largest single-coordinate excess there (as a per-face reading does) under-estimates it by
    up to a factor √n, which would make a Lipschitz skip unsound.
    """
    excess = torch.maximum(torch.maximum(old_lower - new_lower, new_upper - old_upper), torch.zeros_like(new_lower))
    if norm == "inf":
        return excess.amax(1)
    if norm == "2":
        # Rounding: the computed norm is within a few ulps; inflate so it never falls short.
        return torch.linalg.vector_norm(excess, dim=1) * (1 + 4 * torch.finfo(excess.dtype).eps * excess.shape[1])
    raise ValueError(f"norm must be 'inf' or '2'; got {norm!r}")


def relative_volumes(lower, upper, domain_lower, domain_upper) -> torch.Tensor:
    """Volume of each box as a fraction of the domain's: (N,). Coordinates where the domain is a
    single point count as 1 (a box meeting the domain there covers it in that coordinate)."""
    width = (domain_upper - domain_lower).unsqueeze(0)
    part = (upper - lower).clamp(min=0)
    ratio = torch.where(width > 0, part / torch.where(width > 0, width, 1.0), (part >= 0).to(part.dtype))
    return ratio.prod(1)


def enlarge(lower, upper, offset: float):
    """The box grown by ``offset`` on both sides of every input that varies (RSR's relaxed
    domain); inputs fixed to one value (lower = upper, e.g. pixels outside a patch) stay fixed:
    widening them would make the box a higher-dimensional one, far harder to verify."""
    varies = upper > lower
    return torch.where(varies, lower - offset, lower), torch.where(varies, upper + offset, upper)


def cells_of(lower, upper, root_lower, root_upper, root_cell_lower, root_cell_upper):
    """The cells of boxes obtained by splitting root boxes: ((M, n), (M, n), (M,) root index).

    Each box lies in exactly one root box (roots have disjoint interiors; a box is matched by
    its centre). Its faces on its root's faces inherit the root cell's faces (±inf where the
    root reached the domain's boundary); its other faces are split planes and stay.
    """
    centre = (lower + upper) / 2
    inside = ((root_lower.unsqueeze(0) <= centre.unsqueeze(1)) & (centre.unsqueeze(1) <= root_upper.unsqueeze(0))).all(2)
    if not inside.any(1).all():
        raise AssertionError("a split box lies in none of its roots")  # a bug, never bad input
    root = inside.to(torch.int8).argmax(1)
    cell_lower = torch.where(lower == root_lower[root], root_cell_lower[root], lower)
    cell_upper = torch.where(upper == root_upper[root], root_cell_upper[root], upper)
    return cell_lower, cell_upper, root
