"""Grid hashing for L∞: rows bucketed by the ε-cells of a few well-spread columns.

Cells have width w = ε·(1 + 1e-6) on k ≤ ``max_hashed_columns`` columns (those with the most
distinct cells in the data seen so far). Two rows within ε in L∞ are within ε on each hashed
column, so their cell coordinates differ by at most one: a query probes the 3^k neighbouring
cells and checks their rows with the canonical formula. The floor of x/w is exact enough for
this while |x|/w < 10⁹ (the slack 1e-6 of w absorbs the rounding); when larger values arrive, w
grows to keep that true (fewer, coarser cells, still exact). A cell is an int64 hash of its
coordinates (wrapping arithmetic; a collision only adds candidates), kept in a sorted array.
With ε = 0 a cell is an exact coordinate value (only identical rows are close).
"""

from __future__ import annotations

import itertools
from typing import ClassVar

import numpy as np

from assay.errors import OptionError
from assay.monitor.frnn._sorted import SortedKeyIndex

__all__ = ["GridIndex"]

# Odd 64-bit multipliers (from splitmix64's constants); products wrap modulo 2**64.
_MULTIPLIERS = np.array(
    [0x9E3779B97F4A7C15, 0xBF58476D1CE4E5B9, 0x94D049BB133111EB, 0xD6E8FEB86659FD93,
     0xA0761D6478BD642F, 0xE7037ED1A0B428DB, 0x8EBC6AF09C88C6E3, 0x589965CC75374CC3],
    dtype=np.uint64,
).view(np.int64)
_CLIP = float(2**40)


class GridIndex(SortedKeyIndex):
    """Exact L∞ range queries for one fixed ε by hashing rows into ε-cells on up to 8 columns.

    Args:
        dim: number of features.
        metric: only ``"linf"``.
        epsilon: the radius every query will use (a query with a larger radius is refused).
        max_hashed_columns: k, the number of hashed columns (3^k cells probed per query).
    """

    name: ClassVar[str] = "grid"
    metrics: ClassVar[tuple[str, ...]] = ("linf",)
    key_dtype = np.int64

    def __init__(self, dim: int, metric: str = "linf", epsilon: float = 0.0, max_hashed_columns: int = 4,
                 min_buffer: int = 256, max_buffer: int = 8192):
        super().__init__(dim, metric, min_buffer, max_buffer)
        epsilon = float(epsilon)
        if not (epsilon >= 0 and np.isfinite(epsilon)):
            raise OptionError(f"the `epsilon` of a grid index must be a finite number ≥ 0; got {epsilon!r}")
        if not 1 <= int(max_hashed_columns) <= len(_MULTIPLIERS):
            raise OptionError(f"the `max_hashed_columns` of a grid index must be in 1..{len(_MULTIPLIERS)}; got {max_hashed_columns!r}")
        self.epsilon = epsilon
        self._width = epsilon * (1.0 + 1e-6)
        self._columns = np.arange(min(self.dim, int(max_hashed_columns)))
        self.max_hashed_columns = int(max_hashed_columns)
        self._set_offsets()

    def _set_offsets(self) -> None:
        k = self._columns.size
        multipliers = _MULTIPLIERS[:k]
        if self.epsilon == 0.0:
            self._offsets = np.zeros(1, dtype=np.int64)
            return
        steps = np.array(list(itertools.product((-1, 0, 1), repeat=k)), dtype=np.int64)
        with np.errstate(over="ignore"):
            self._offsets = np.unique((steps * multipliers).sum(axis=1))  # unique: a collision must not duplicate rows

    def _needs_refit_for_range(self) -> bool:
        return self.epsilon > 0 and self._max_abs > 1e9 * self._width

    def _cells(self, rows: np.ndarray) -> np.ndarray:
        if self.epsilon == 0.0:
            return (rows + 0.0).view(np.int64)  # + 0.0 turns -0.0 into 0.0
        return np.clip(np.floor(rows / self._width), -_CLIP, _CLIP).astype(np.int64)

    def _fit(self, rows: np.ndarray) -> None:
        if self.epsilon > 0:
            self._width = max(self.epsilon * (1.0 + 1e-6), self._max_abs * 1e-9)
        if rows.shape[0] >= 2 and self.dim > self._columns.size:
            cells = self._cells(rows)
            spread = np.array([np.unique(cells[:, j]).size for j in range(self.dim)])
            self._columns = np.sort(np.argsort(-spread, kind="stable")[: self._columns.size])
            self._set_offsets()

    def _keys(self, rows: np.ndarray) -> np.ndarray:
        cells = self._cells(rows[:, self._columns])
        with np.errstate(over="ignore"):
            return (cells * _MULTIPLIERS[: self._columns.size]).sum(axis=1)

    def _ranges(self, queries, radius):
        if radius > self.epsilon:
            raise OptionError(f"this grid index was built for ε = {self.epsilon}; it cannot answer radius {radius}")
        codes = self._keys(queries)
        with np.errstate(over="ignore"):
            probes = (codes[:, None] + self._offsets[None, :]).reshape(-1)
        lo = np.searchsorted(self._sorted_keys, probes, side="left")
        hi = np.searchsorted(self._sorted_keys, probes, side="right")
        range_query = np.repeat(np.arange(queries.shape[0], dtype=np.int64), self._offsets.size)
        return range_query, lo.astype(np.int64), hi.astype(np.int64)
