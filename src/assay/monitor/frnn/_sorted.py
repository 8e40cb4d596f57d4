"""Shared core of the indexes that keep one sort key per row (sorted projection, grid hashing).

Rows live in the store; a key per row is kept in one sorted array (``keys``, with the rows'
positions in ``order``) plus an unsorted buffer of the newest rows, scanned by brute force.
When the buffer outgrows about ``4·sqrt(n)`` rows it is sorted and merged in (O(n) memory moves
of two 1-D arrays; rows are never copied). While the index is small the key function itself is
re-fitted to the data (``_fit``) each time the row count doubles, until it passes 65,536 rows.

Subclasses give ``_fit(rows)``, ``_keys(rows)`` and ``_ranges(queries, radius)`` — index ranges
into the sorted keys, grouped by query, that must contain every row with canonical
``d ≤ radius``; the canonical check then decides.
"""

from __future__ import annotations

import math

import numpy as np

from assay.monitor import _kernels
from assay.monitor.frnn._base import FrnnIndex

__all__ = ["SortedKeyIndex"]

_REFIT_UNTIL = 1 << 16


class SortedKeyIndex(FrnnIndex):
    """Base of :class:`~assay.monitor.frnn.snn.SortedProjectionIndex` and the grid index."""

    key_dtype = np.float64

    def __init__(self, dim: int, metric: str = "linf", min_buffer: int = 256, max_buffer: int = 8192):
        super().__init__(dim, metric)
        self.min_buffer = int(min_buffer)
        self.max_buffer = int(max_buffer)
        self._sorted_keys = np.empty(0, dtype=self.key_dtype)
        self._order = np.empty(0, dtype=np.int64)
        self._main_end = 0
        self._fitted_at = 0
        self._max_abs = 0.0

    # -- maintenance ----------------------------------------------------------------------
    def _buffer_limit(self) -> int:
        return int(min(self.max_buffer, max(self.min_buffer, 4 * math.sqrt(self._store.size))))

    def _added(self, positions: slice) -> None:
        new_max = float(np.max(np.abs(self._store.data[positions]))) if positions.stop > positions.start else 0.0
        grew = new_max > self._max_abs
        self._max_abs = max(self._max_abs, new_max)
        size = self._store.size
        if (grew and self._needs_refit_for_range()) or (self._fitted_at < _REFIT_UNTIL and size >= 2 * max(self._fitted_at, self.min_buffer // 2)):
            self._refit()
        elif size - self._main_end >= self._buffer_limit():
            self._merge_buffer()

    def _needs_refit_for_range(self) -> bool:
        return False

    def _refit(self) -> None:
        store = self._store
        live = np.flatnonzero(store.alive[: store.size])
        sample = live if live.size <= 4096 else live[np.linspace(0, live.size - 1, 4096).astype(np.int64)]
        self._fit(store.data[sample])
        keys = self._keys(store.data[live]) if live.size else np.empty(0, dtype=self.key_dtype)
        order = np.argsort(keys, kind="stable")
        self._sorted_keys = keys[order]
        self._order = live[order]
        self._main_end = store.size
        self._fitted_at = store.size

    def _merge_buffer(self) -> None:
        store = self._store
        new = np.arange(self._main_end, store.size, dtype=np.int64)
        new = new[store.alive[new]]
        keys = self._keys(store.data[new])
        order = np.argsort(keys, kind="stable")
        keys, new = keys[order], new[order]
        slots = np.searchsorted(self._sorted_keys, keys, side="right")
        self._sorted_keys = np.insert(self._sorted_keys, slots, keys)
        self._order = np.insert(self._order, slots, new)
        self._main_end = store.size

    def _reindex(self) -> None:
        self._fitted_at = 0
        self._max_abs = float(np.max(np.abs(self._store.data[: self._store.size]))) if self._store.size else 0.0
        self._refit()

    # -- queries --------------------------------------------------------------------------
    def _candidates(self, queries, query_norms, radius):
        store = self._store
        buffer = self._verify_slice(queries, query_norms, radius, self._main_end, store.size)
        if not self._sorted_keys.size:
            return buffer
        range_query, lo, hi = self._ranges(queries, radius)
        nonempty = hi > lo
        main = _kernels.verify_ranges(
            store.data, store.norms, store.alive, self._order, True,
            range_query[nonempty], lo[nonempty], hi[nonempty], queries, query_norms, radius, self._code,
        )
        return tuple(np.concatenate([buffer[k], main[k]]) for k in range(3))

    def _fit(self, rows: np.ndarray) -> None:  # pragma: no cover - abstract
        raise NotImplementedError

    def _keys(self, rows: np.ndarray) -> np.ndarray:  # pragma: no cover - abstract
        raise NotImplementedError

    def _ranges(self, queries: np.ndarray, radius: float):  # pragma: no cover - abstract
        raise NotImplementedError
