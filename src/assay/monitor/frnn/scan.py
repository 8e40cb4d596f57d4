"""Scan: every stored row checked against every query, vectorised with numpy (no compiled code).

The index a small job needs: it loads nothing beyond numpy, so it answers at once in a fresh
process, where the compiled indexes first load numba and their kernels (about a second; minutes
when they must be compiled). Its cost is O(history × dimension) per decision, so the monitor's
``index="auto"`` starts with it and moves the history to the hash grid once it outgrows
:data:`SCAN_LIMIT` rows (see :meth:`assay.monitor.Monitor.prepare`). Exact: the distances are the
canonical formula's bits (:mod:`assay.monitor._canonical`). It is *fused*: a batch's
query-then-insert loop runs as a few whole-array operations (the batch against the history, and
the batch against its own earlier rows).
"""

from __future__ import annotations

from typing import ClassVar

import numpy as np

from assay.monitor._canonical import rowwise_distances
from assay.monitor.frnn._base import FrnnIndex

__all__ = ["ScanIndex", "SCAN_LIMIT"]

#: ``index="auto"`` moves to the hash grid when the history would hold more than this many rows.
#: A scan's cost grows with rows² (first column of every pair, then the whole formula for the
#: pairs that pass): measured on 5 columns, ε = 0.05, 1,000 rows take 0.05 s, 2,000 rows 0.15 s and
#: 4,000 rows 0.5 s in all, while a fresh process needs about a second to load the grid's compiled
#: kernels (benchmarks/startup.py).
SCAN_LIMIT = 2048

# At most this many (query, row) pairs are screened at once (a 4 MB mask).
_BLOCK = 1 << 22


class ScanIndex(FrnnIndex):
    """Exact range queries by whole-array numpy scans of every stored row; numpy only."""

    name: ClassVar[str] = "scan"
    fused: ClassVar[bool] = True

    def _added(self, positions: slice) -> None:
        pass

    def _reindex(self) -> None:
        pass

    def _pairs(self, queries: np.ndarray, radius: float, stops: np.ndarray, tags=None, min_ids=None):
        """``(query, position, distance)``: live positions below ``stops[query]`` with canonical ``d ≤ radius``.

        Optional filters: stored tag ≠ ``tags[query]``, stored id ≥ ``min_ids[query]``. Grouped by
        query, positions ascending within each. A first pass on column 0 keeps the pairs with
        ``|x_0 − q_0| ≤ radius(1 + 1e-12)`` (for L∞, L1 and L2 every close pair passes: the
        canonical distance is at least that column's difference, up to rounding that the margin
        covers); only those get the whole formula.
        """
        store = self._store
        count = queries.shape[0]
        stop = int(stops.max()) if count else 0
        step = max(1, _BLOCK // max(count, 1))
        parts = []
        for lo in range(0, stop, step):
            hi = min(stop, lo + step)
            if self._code == 3:
                keep = np.ones((count, hi - lo), dtype=bool)
            else:
                keep = np.abs(queries[:, 0, None] - store.data[None, lo:hi, 0]) <= radius * (1.0 + 1e-12)
            keep &= store.alive[None, lo:hi]
            keep &= np.arange(lo, hi)[None, :] < stops[:, None]
            query, position = np.nonzero(keep)
            position += lo
            if tags is not None:
                other = store.tags[position] != tags[query]
                query, position = query[other], position[other]
            if min_ids is not None:
                recent = store.ids[position] >= min_ids[query]
                query, position = query[recent], position[recent]
            distance = rowwise_distances(store.data[position], queries[query], self._code)
            close = distance <= radius
            parts.append((query[close], position[close], distance[close]))
        if not parts:
            return np.empty(0, dtype=np.int64), np.empty(0, dtype=np.int64), np.empty(0)
        query, position, distance = (np.concatenate([part[k] for part in parts]) for k in range(3))
        if len(parts) > 1:  # blocks come in position order: a stable sort by query keeps positions ascending
            order = np.argsort(query, kind="stable")
            query, position, distance = query[order], position[order], distance[order]
        return query.astype(np.int64), position.astype(np.int64), distance

    def _candidates(self, queries, query_norms, radius):
        return self._pairs(queries, radius, np.full(queries.shape[0], self._store.size))

    def observe_rows(self, rows, ids, tags, use_tags: bool, window: int, count_only: bool, radius: float):
        store = self._store
        count = rows.shape[0]
        first = store.size
        store.add(rows, ids, tags)
        # Row i of the batch sees the history and the batch's rows before it: positions < first + i.
        query, position, distance = self._pairs(rows, radius, first + np.arange(count), tags if use_tags else None,
                                                ids - window if window >= 0 else None)
        counts = np.bincount(query, minlength=count).astype(np.int64)
        if count_only:
            return counts, np.empty(0, dtype=np.int64), np.empty(0)
        return counts, store.ids[position], distance

    def observe_row(self, row, row_id: int, tag: int, count_only: bool, radius: float):
        counts, ids, distances = self.observe_rows(row[None, :], np.array([row_id], dtype=np.int64),
                                                   np.array([tag], dtype=np.int64), True, -1, count_only, radius)
        count = int(counts[0])
        if count == 0 or count_only:
            return count, None, None
        return count, ids, distances

