"""Sorted projection (SNN): rows sorted by their projection on one direction; a query scans a window.

For a unit direction v (‖v‖₂ = 1) and any rows x, q: ``|v·x − v·q| ≤ ‖v‖₂‖x − q‖₂`` (L2),
``≤ ‖v‖₁‖x − q‖∞`` (L∞) and ``≤ ‖v‖∞‖x − q‖₁`` (L1). So every row within ε of q has its projection
inside ``v·q ± ε·c`` (c the dual norm of v), widened by a bound on the rounding of the two dot
products; the window is found by binary search and checked with the canonical formula.
v is the first principal direction of the data seen so far (re-fitted while the index is small),
as in SNN (Chen & Güttel, "Fast and exact fixed-radius neighbor search based on sorting").
"""

from __future__ import annotations

from typing import ClassVar

import numpy as np

from assay.monitor.frnn._sorted import SortedKeyIndex

__all__ = ["SortedProjectionIndex"]

_UNIT_ROUNDOFF = 2.0**-53


class SortedProjectionIndex(SortedKeyIndex):
    """Exact range queries by a window on the sorted first-principal-component projection."""

    name: ClassVar[str] = "snn"
    metrics: ClassVar[tuple[str, ...]] = ("linf", "l2", "l1")

    def __init__(self, dim: int, metric: str = "l2", min_buffer: int = 256, max_buffer: int = 8192):
        super().__init__(dim, metric, min_buffer, max_buffer)
        self._direction = np.full(self.dim, 1.0 / np.sqrt(self.dim))

    def _fit(self, rows: np.ndarray) -> None:
        if rows.shape[0] < 2:
            return
        centred = rows - rows.mean(axis=0)
        # Power iteration from a fixed start: deterministic, and O(n·d) even when d is large.
        direction = np.full(self.dim, 1.0 / np.sqrt(self.dim))
        for _ in range(30):
            image = centred.T @ (centred @ direction)
            norm = float(np.linalg.norm(image))
            if norm == 0.0 or not np.isfinite(norm):
                return
            direction = image / norm
        self._direction = direction

    def _keys(self, rows: np.ndarray) -> np.ndarray:
        return rows @ self._direction

    def _ranges(self, queries, radius):
        direction = self._direction
        dual = {"l2": float(np.linalg.norm(direction)), "linf": float(np.abs(direction).sum()), "l1": float(np.abs(direction).max())}[self.metric]
        scale = max(self._max_abs, float(np.max(np.abs(queries))))
        # Each dot product errs by at most about d·u·‖v‖₁·max|x|; both sides err, and we round up generously.
        rounding = 4.0 * (self.dim + 4) * _UNIT_ROUNDOFF * float(np.abs(direction).sum()) * scale
        half_width = radius * dual * (1.0 + 1e-9) + rounding + 1e-300
        centre = self._keys(queries)
        lo = np.searchsorted(self._sorted_keys, centre - half_width, side="left")
        hi = np.searchsorted(self._sorted_keys, centre + half_width, side="right")
        return np.arange(queries.shape[0], dtype=np.int64), lo.astype(np.int64), hi.astype(np.int64)
