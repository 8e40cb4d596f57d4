"""Shared core of the brute-force and hash-grid indexes: a row store, an optional cell table, compiled loops.

Both indexes answer through :mod:`assay.monitor.frnn._cells`: with no hashed column every query
scans the rows (brute force); with hashed columns it walks the buckets of the cells its ball can
reach. Both are *fused*: the monitor's loop (query a decision, then store it) runs in one
compiled call per batch, so observing one decision costs one call into compiled code.
"""

from __future__ import annotations

from typing import ClassVar

import numpy as np

from assay.monitor import _kernels
from assay.monitor.frnn import _cells
from assay.monitor.frnn._base import FrnnIndex

__all__ = ["CellIndex"]

# Odd 64-bit multipliers for the cell keys (splitmix64-style constants and their relatives).
_MULTIPLIER_SEED = 0x5EED_CE11


def _multipliers(count: int) -> np.ndarray:
    rng = np.random.default_rng(_MULTIPLIER_SEED)
    return (rng.integers(0, 2**62, count, dtype=np.int64) * 2 + 1).astype(np.int64)


def _empty_table(size: int) -> np.ndarray:
    table = np.zeros((size, 2), dtype=np.int64)
    table[:, 1] = -1
    return table


class CellIndex(FrnnIndex):
    """Rows in a :class:`RowStore`, hung in buckets of a cell table keyed by the hashed columns (none: scan)."""

    fused: ClassVar[bool] = True
    name: ClassVar[str] = "cells"
    #: Estimated nanoseconds per scanned row, per probed cell and per candidate row (the cost model).
    scan_cost: ClassVar[float] = 2.0
    probe_cost: ClassVar[float] = 30.0
    candidate_cost: ClassVar[float] = 15.0
    # One compiled call: cheaper than numpy's on the single-decision path.
    row_is_finite = staticmethod(_kernels.all_finite)

    def __init__(self, dim: int, metric: str = "linf"):
        super().__init__(dim, metric)
        self._columns = np.empty(0, dtype=np.int64)
        self._widths = np.empty(0)
        self._shifts = np.empty(0)
        self._mults = np.empty(0, dtype=np.int64)
        self._table = _empty_table(2)
        self._next = np.empty(16, dtype=np.int64)
        self._buckets = 0
        self._lead = 0
        self._one_id = np.zeros(1, dtype=np.int64)
        self._one_tag = np.zeros(1, dtype=np.int64)

    # -- cells ----------------------------------------------------------------------------
    def _set_cells(self, columns: np.ndarray, widths: np.ndarray, shifts: np.ndarray) -> None:
        """Hash these columns with these widths and shifts from now on (rebuilds the table)."""
        self._columns = np.ascontiguousarray(columns, dtype=np.int64)
        self._widths = np.ascontiguousarray(widths, dtype=np.float64)
        self._shifts = np.ascontiguousarray(shifts, dtype=np.float64)
        self._mults = _multipliers(self._columns.size)
        self._rebuild()

    def _rebuild(self) -> None:
        store = self._store
        if self._next.shape[0] < store.capacity:
            self._next = np.empty(store.capacity, dtype=np.int64)
        size = 16
        while size < 2 * (store.live + 1):
            size *= 2
        self._table = _empty_table(size if self._columns.size else 2)
        self._buckets = _cells.rebuild(store.data, store.alive, store.size, self._columns, self._widths, self._shifts,
                                       self._mults, self._table, self._next)

    def reserve(self, count: int) -> None:
        """Make room for ``count`` more rows in the store, the chains and the table (at most half full)."""
        store = self._store
        store.reserve(count)
        if self._next.shape[0] < store.capacity:
            bigger = np.empty(store.capacity, dtype=np.int64)
            bigger[: store.size] = self._next[: store.size]
            self._next = bigger
        if self._columns.size and 2 * (self._buckets + count) > self._table.shape[0]:
            self._rebuild_for(self._buckets + count)

    def _rebuild_for(self, buckets: int) -> None:
        size = self._table.shape[0]
        while 2 * buckets > size:
            size *= 2
        self._table = _empty_table(size)
        store = self._store
        self._buckets = _cells.rebuild(store.data, store.alive, store.size, self._columns, self._widths, self._shifts,
                                       self._mults, self._table, self._next)

    def _maybe_refit(self, incoming: int) -> int:
        """Re-fit the cells if due; return how many of ``incoming`` rows to add before asking again."""
        return incoming

    # -- FrnnIndex hooks ------------------------------------------------------------------
    def _added(self, positions: slice) -> None:
        store = self._store
        count = positions.stop - positions.start
        if self._next.shape[0] < store.capacity:
            bigger = np.empty(store.capacity, dtype=np.int64)
            bigger[: positions.start] = self._next[: positions.start]
            self._next = bigger
        if self._columns.size and 2 * (self._buckets + count) > self._table.shape[0]:
            self._rebuild_for(self._buckets + count)  # hangs the new rows too
        elif self._columns.size:
            self._buckets += _cells.insert_rows(store.data, positions.start, positions.stop, self._columns, self._widths,
                                                self._shifts, self._mults, self._table, self._next)
        self._maybe_refit(0)

    def _reindex(self) -> None:
        self._rebuild()

    def _candidates(self, queries, query_norms, radius):
        store = self._store
        return _cells.query_rows(queries, query_norms, radius, self._code, store.data, store.norms, store.alive, store.ids,
                                 store.size, self._columns, self._widths, self._shifts, self._mults, self._table,
                                 self._next, self.scan_cost, self.probe_cost, self._lead)

    def observe_rows(self, rows, ids, tags, use_tags: bool, window: int, count_only: bool, radius: float):
        store = self._store
        total = rows.shape[0]
        done = 0
        parts = []
        while done < total:
            take = max(1, min(total - done, self._maybe_refit(total - done)))
            self.reserve(take)
            start = store.size
            counts, positions, distances, buckets = _cells.observe_rows(
                rows[done : done + take], ids[done : done + take], tags[done : done + take], use_tags, window, count_only,
                radius, self._code, store.data, store.norms, store.alive, store.ids, store.tags, start, store.with_norms,
                self._columns, self._widths, self._shifts, self._mults, self._table, self._next,
                self.scan_cost, self.probe_cost, self._lead)
            store.appended(take, int(ids[done + take - 1]))
            self._buckets += buckets
            if self._columns.size and not count_only:
                positions, distances = _cells.by_position(counts, positions, distances)
            parts.append((counts, store.ids[positions], distances))
            done += take
        if len(parts) == 1:
            return parts[0]
        return tuple(np.concatenate([part[k] for part in parts]) for k in range(3))

    def observe_row(self, row, row_id: int, tag: int, count_only: bool, radius: float):
        store = self._store
        self._maybe_refit(1)
        if (store.size >= store.capacity or store.size >= self._next.shape[0]
                or (self._columns.size and 2 * (self._buckets + 1) > self._table.shape[0])):
            self.reserve(1)
        self._one_id[0] = row_id
        self._one_tag[0] = tag
        start = store.size
        counts, positions, distances, buckets = _cells.observe_rows(
            row[None, :], self._one_id, self._one_tag, True, -1, count_only,
            radius, self._code, store.data, store.norms, store.alive, store.ids, store.tags, start, store.with_norms,
            self._columns, self._widths, self._shifts, self._mults, self._table, self._next,
            self.scan_cost, self.probe_cost, self._lead)
        store.size = start + 1
        store.live += 1
        self._buckets += buckets
        count = int(counts[0])
        if count == 0 or count_only:
            return count, None, None
        if count > 1 and self._columns.size:
            order = np.argsort(positions)
            positions, distances = positions[order], distances[order]
        return count, store.ids[positions], distances
