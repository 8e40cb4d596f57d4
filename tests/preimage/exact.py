"""Exact areas for 2-D checks: convex polygon clipping and the exact preimage of a 2-D ReLU network.

Independent of assay's bound engine: a ReLU network is affine on each cell of the arrangement of
its first layer's lines (for one hidden layer), so its preimage of ``C y + d ≥ 0`` in a box is a
union of convex polygons, clipped out cell by cell.
"""

from __future__ import annotations

import numpy as np


def clip(polygon: list[tuple[float, float]], a: np.ndarray, c: float) -> list[tuple[float, float]]:
    """The part of a convex polygon where a · p + c ≥ 0 (Sutherland–Hodgman, one half-plane)."""
    out = []
    n = len(polygon)
    for i in range(n):
        p, q = np.asarray(polygon[i]), np.asarray(polygon[(i + 1) % n])
        fp, fq = float(a @ p + c), float(a @ q + c)
        if fp >= 0:
            out.append(tuple(p))
        if (fp >= 0) != (fq >= 0):
            t = fp / (fp - fq)
            out.append(tuple(p + t * (q - p)))
    return out


def area(polygon) -> float:
    if len(polygon) < 3:
        return 0.0
    x, y = np.asarray(polygon).T
    return 0.5 * abs(float(np.dot(x, np.roll(y, -1)) - np.dot(y, np.roll(x, -1))))


def box_polygon(lower, upper):
    (x0, y0), (x1, y1) = lower, upper
    return [(x0, y0), (x1, y0), (x1, y1), (x0, y1)]


def polytope_area(lower, upper, A, b) -> float:
    """Area of {z ∈ [lower, upper] : A z + b ≥ 0} (2-D)."""
    polygon = box_polygon(lower, upper)
    for row, offset in zip(A, b):
        polygon = clip(polygon, np.asarray(row, dtype=np.float64), float(offset))
        if not polygon:
            return 0.0
    return area(polygon)


def one_hidden_layer_preimage_area(W1, b1, W2, b2, C, d, lower, upper) -> float:
    """Exact area of {z ∈ box : C (W2 relu(W1 z + b1) + b2) + d ≥ 0} for a 2-D input."""
    cells = [box_polygon(lower, upper)]
    for row, offset in zip(W1, b1):  # refine the cells by each neuron's line
        refined = []
        for cell in cells:
            for sign in (1.0, -1.0):
                part = clip(cell, sign * row, sign * offset)
                if area(part) > 0:
                    refined.append(part)
        cells = refined
    total = 0.0
    for cell in cells:
        centre = np.mean(np.asarray(cell), axis=0)
        active = (W1 @ centre + b1) > 0
        W = W2 @ (W1 * active[:, None])
        c = W2 @ (b1 * active) + b2
        polygon = cell
        for row, offset in zip(C @ W, C @ c + d):
            polygon = clip(polygon, row, float(offset))
            if not polygon:
                break
        total += area(polygon)
    return total
