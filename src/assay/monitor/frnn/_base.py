"""What every FRNN index shares: the faiss-like protocol, row storage, ids, removal, validation.

The protocol (faiss's, trimmed to what a monitor needs)::

    index = SomeIndex(dim, metric)
    index.add(X, ids)                        # X float (n, dim), ids int64 (n,)
    lims, distances, ids = index.range_query(Q, radius)
    # the answers of query i are distances[lims[i]:lims[i+1]], ids[lims[i]:lims[i+1]]
    index.remove(ids)
    rows, ids = index.export()
    len(index), index.dim, index.metric

Class attributes: ``metrics`` (the metrics a backend supports), ``is_exact``, ``supports_remove``,
``name`` (its key in :data:`~assay.monitor.frnn.BACKENDS`), ``fused``.
Every exact backend returns exactly the stored rows with canonical ``d ≤ radius``
(see :mod:`assay.monitor._kernels`): true, not squared, distances and a closed ball.

**The monitor's side of the protocol.** :class:`~assay.monitor.Monitor` validates a batch once
(float64, C-contiguous, shape (n, dim), finite, no zero rows for cosine) and then drives its index
through methods that skip the checks:

* :meth:`FrnnIndex.reserve` — room for an expected number of rows;
* :meth:`FrnnIndex.query_pairs` — ``range_query`` as flat ``(query, id, distance)`` triples;
* :meth:`FrnnIndex.add_rows` — ``add`` with a *tag* per row (the monitor's label code);
* on *fused* backends (``fused = True``: ``grid``, ``brute``), the query-then-insert loop in one
  compiled call: :meth:`FrnnIndex.observe_rows` for a batch, and the fast single-decision path
  :meth:`FrnnIndex.observe_row` (what :meth:`Monitor.observe` costs on its hot path). Both filter
  by tag (only rows with a different label are witnesses) and store the rows they query.

**Writing a backend.** Subclass :class:`FrnnIndex`, set the class attributes and implement three
hooks: ``_added(positions)`` (index the rows the store just received at ``positions``, a slice),
``_candidates(queries, query_norms, radius)`` (verified ``(query, position, distance)`` triples:
exactly the live positions with canonical ``d ≤ radius``) and ``_reindex()`` (rebuild from the live
rows after the store was compacted). Rows, ids, tags, removal and validation come from the base
class. A fused backend also overrides ``observe_rows`` and ``observe_row`` and sets ``fused = True``.
``tests/monitor/test_conformance.py`` is the suite every backend must pass.
"""

from __future__ import annotations

from typing import ClassVar

import numpy as np

from assay.errors import DataError, OptionError
from assay.monitor import _canonical

__all__ = ["FrnnIndex", "RowStore", "assemble"]


class RowStore:
    """Growable float64 rows with int64 ids, lazily deleted (``alive``), positions stable until compaction.

    ``tags`` holds one int64 per row for the monitor's output filter (the label code); indexes
    that ignore it leave it 0. Capacity grows by half when full (wide rows make doubling costly).
    """

    def __init__(self, dim: int, with_norms: bool):
        self.dim = dim
        self.with_norms = with_norms
        self.size = 0
        self.live = 0
        self.data = np.empty((16, dim))
        self.ids = np.empty(16, dtype=np.int64)
        self.alive = np.zeros(16, dtype=bool)
        self.norms = np.ones(16)
        self.tags = np.zeros(16, dtype=np.int64)
        self.ids_sorted = True

    @property
    def capacity(self) -> int:
        return self.data.shape[0]

    def reserve(self, extra: int) -> None:
        needed = self.size + extra
        if needed <= self.data.shape[0]:
            return
        capacity = max(needed, self.data.shape[0] + self.data.shape[0] // 2, 16)
        for name in ("data", "ids", "alive", "norms", "tags"):
            old = getattr(self, name)
            new = np.empty((capacity,) + old.shape[1:], dtype=old.dtype)
            new[: self.size] = old[: self.size]
            if name == "alive":
                new[self.size :] = False
            setattr(self, name, new)

    def add(self, rows: np.ndarray, ids: np.ndarray, tags: np.ndarray | None = None) -> slice:
        """Append rows; return the slice of positions they got."""
        count = rows.shape[0]
        self.reserve(count)
        start = self.size
        if count and self.ids_sorted:
            previous = self.ids[start - 1] if start else np.iinfo(np.int64).min
            self.ids_sorted = bool(ids[0] > previous and (count == 1 or np.all(ids[1:] > ids[:-1])))
        self.data[start : start + count] = rows
        self.ids[start : start + count] = ids
        self.alive[start : start + count] = True
        self.norms[start : start + count] = _canonical.canonical_norms(rows) if self.with_norms else 1.0
        self.tags[start : start + count] = 0 if tags is None else tags
        self.size += count
        self.live += count
        return slice(start, start + count)

    def positions_of(self, ids: np.ndarray) -> np.ndarray:
        """Positions of the live rows with these ids (unknown ids are ignored)."""
        stored = self.ids[: self.size]
        if self.ids_sorted:
            found = np.searchsorted(stored, ids)
            found = found[found < self.size]
            found = found[np.isin(stored[found], ids)]
        else:
            found = np.flatnonzero(np.isin(stored, ids))
        return found[self.alive[found]]

    def kill(self, positions: np.ndarray) -> None:
        self.alive[positions] = False
        self.live -= positions.size

    def compacted(self) -> tuple[np.ndarray, np.ndarray]:
        """The live rows and their ids, in insertion order."""
        keep = np.flatnonzero(self.alive[: self.size])
        return self.data[keep].copy(), self.ids[keep].copy()

    def compacted_tags(self) -> np.ndarray:
        return self.tags[np.flatnonzero(self.alive[: self.size])].copy()

    def appended(self, count: int, last_id: int) -> None:
        """Book ``count`` rows that a compiled loop wrote at positions size..size+count−1 (ids ascending)."""
        if self.ids_sorted and self.size and self.ids[self.size - 1] >= self.ids[self.size]:
            self.ids_sorted = False
        self.size += count
        self.live += count

    def reset(self) -> None:
        self.size = 0
        self.live = 0
        self.alive[:] = False
        self.ids_sorted = True


def assemble(count: int, query: np.ndarray, position: np.ndarray, distance: np.ndarray, ids: np.ndarray):
    """Turn (query, position, distance) triples into faiss's ``(lims, distances, ids)``, grouped by query."""
    if query.size and np.any(query[1:] < query[:-1]):
        order = np.argsort(query, kind="stable")
        query, position, distance = query[order], position[order], distance[order]
    lims = np.zeros(count + 1, dtype=np.int64)
    np.cumsum(np.bincount(query, minlength=count), out=lims[1:])
    return lims, np.ascontiguousarray(distance, dtype=np.float64), ids[position]


class FrnnIndex:
    """Base class of the exact fixed-radius near-neighbour indexes: the protocol, public and documented.

    Users call :meth:`add`, :meth:`range_query`, :meth:`remove`, :meth:`export`; the monitor also
    :meth:`reserve`, :meth:`query_pairs`, :meth:`add_rows` and, on fused backends,
    :meth:`observe_rows` and :meth:`observe_row` (see the module docstring). Backends implement
    ``_added(positions)``, ``_candidates(queries, query_norms, radius)`` returning verified
    ``(query, position, distance)`` triples, and ``_reindex()`` (rebuild from the live rows after
    compaction). Dead rows are skipped by the kernels; the store is compacted when more than half
    of it is dead.
    """

    metrics: ClassVar[tuple[str, ...]] = ("linf", "l2", "l1", "cosine")
    is_exact: ClassVar[bool] = True
    supports_remove: ClassVar[bool] = True
    name: ClassVar[str] = "base"
    #: True when the index has a compiled query-then-insert loop (:meth:`observe_rows`, :meth:`observe_row`).
    fused: ClassVar[bool] = False

    def __init__(self, dim: int, metric: str = "linf"):
        if isinstance(dim, bool) or not isinstance(dim, (int, np.integer)) or dim < 1:
            raise OptionError(f"the `dim` of a {self.name} index must be an int ≥ 1; got {dim!r}")
        if metric not in self.metrics:
            listed = ", ".join(repr(m) for m in self.metrics)
            raise OptionError(f"the {self.name} index supports the metrics {listed}; got {metric!r}")
        self.dim = int(dim)
        self.metric = metric
        self._code = _canonical.METRIC_CODES[metric]
        self._store = RowStore(self.dim, with_norms=metric == "cosine")

    def __len__(self) -> int:
        return self._store.live

    def __repr__(self) -> str:
        return f"{type(self).__name__}(dim={self.dim}, metric={self.metric!r}, rows={len(self)})"

    # -- validation shared by add and range_query -------------------------------------------
    def _rows(self, X, what: str) -> np.ndarray:
        try:
            rows = np.asarray(X, dtype=np.float64)
        except (TypeError, ValueError) as exc:
            raise DataError(f"{what} must be numbers convertible to float64: {exc}") from exc
        if rows.ndim == 1 and self.dim == rows.shape[0]:
            rows = rows[None, :]
        if rows.ndim != 2 or rows.shape[1] != self.dim:
            raise DataError(f"{what} must have shape (n, {self.dim}); got {rows.shape} — the index was built on {self.dim} features")
        if not np.all(np.isfinite(rows)):
            bad = int(np.flatnonzero(~np.all(np.isfinite(rows), axis=1))[0])
            raise DataError(f"row {bad} of {what} has NaN or infinite values; remove or impute them")
        rows = np.ascontiguousarray(rows)
        if self.metric == "cosine":
            norms = _canonical.canonical_norms(rows)
            if np.any(norms == 0):
                bad = int(np.flatnonzero(norms == 0)[0])
                raise DataError(f"row {bad} of {what} is the zero vector, which has no cosine distance")
        return rows

    # -- the protocol -----------------------------------------------------------------------
    def add(self, X, ids, tags=None) -> None:
        """Store rows ``X`` (n, dim) under int64 ``ids`` (n,), with optional int64 ``tags`` (n,) (default 0)."""
        rows = self._rows(X, "X")
        ids = np.asarray(ids, dtype=np.int64).reshape(-1)
        if ids.shape[0] != rows.shape[0]:
            raise DataError(f"add got {rows.shape[0]} rows but {ids.shape[0]} ids")
        if tags is not None:
            tags = np.asarray(tags, dtype=np.int64).reshape(-1)
            if tags.shape[0] != rows.shape[0]:
                raise DataError(f"add got {rows.shape[0]} rows but {tags.shape[0]} tags")
        if rows.shape[0] == 0:
            return
        positions = self._store.add(rows, ids, tags)
        self._added(positions)

    def range_query(self, X, radius: float):
        """All stored rows with canonical ``d(row, x) ≤ radius`` for each query ``x``.

        Returns ``(lims, distances, ids)``: int64 (m+1,), float64 (L,), int64 (L,), faiss-style.
        """
        queries = self._rows(X, "the queries")
        radius = float(radius)
        if not (radius >= 0 and np.isfinite(radius)):
            raise OptionError(f"the radius of a range query must be a finite number ≥ 0; got {radius!r}")
        query_norms = _canonical.canonical_norms(queries) if self.metric == "cosine" else np.ones(queries.shape[0])
        count = queries.shape[0]
        if self._store.live == 0 or count == 0:
            return np.zeros(count + 1, dtype=np.int64), np.empty(0), np.empty(0, dtype=np.int64)
        query, position, distance = self._candidates(queries, query_norms, radius)
        return assemble(count, query, position, distance, self._store.ids)

    # -- the monitor's side: validated input, no checks (see the module docstring) ----------
    def reserve(self, count: int) -> None:
        """Make room for ``count`` more rows without re-allocating (a hint; nothing is stored)."""
        self._store.reserve(count)

    def query_pairs(self, queries: np.ndarray, radius: float):
        """:meth:`range_query` for validated rows, as flat triples ``(query, ids, distances)``.

        ``queries`` float64 (m, dim), C-contiguous, finite (no zero rows for cosine); ``radius``
        a finite float ≥ 0. Returns int64 query positions (0..m−1), int64 ids and float64
        canonical distances, one entry per (query, stored row) pair with ``d ≤ radius``, grouped in
        no particular order.
        """
        if self._store.live == 0:
            empty = np.empty(0, dtype=np.int64)
            return empty, empty, np.empty(0)
        query_norms = _canonical.canonical_norms(queries) if self.metric == "cosine" else np.ones(queries.shape[0])
        query, position, distance = self._candidates(queries, query_norms, radius)
        return query, self._store.ids[position], distance

    def add_rows(self, rows: np.ndarray, ids: np.ndarray, tags: np.ndarray | None = None) -> None:
        """:meth:`add` for validated rows (as for :meth:`query_pairs`), int64 ``ids`` and ``tags`` (n,)."""
        self._added(self._store.add(rows, ids, tags))

    def observe_rows(self, rows, ids, tags, use_tags: bool, window: int, count_only: bool, radius: float):
        """Query each row against the history and the earlier rows of the batch, then store it (fused backends only).

        Args:
            rows: validated float64 (n, dim) rows (as for :meth:`query_pairs`), in stream order.
            ids: int64 (n,) ids, ascending and above every stored id.
            tags: int64 (n,) tags (label codes), stored with the rows.
            use_tags: count only stored rows whose tag differs from the row's tag.
            window: count only stored rows with id ≥ row id − window; −1 for no window.
            count_only: return counts only (empty ids and distances).
            radius: the closed-ball radius (the monitor's ε).

        Returns:
            ``(counts, ids, distances)``: int64 (n,) witness counts, and the witnesses' int64 ids
            and float64 distances, each row's ascending by id, concatenated row after row.
        """
        raise NotImplementedError(f"the {self.name} index has no fused loop (fused = False); use query_pairs and add_rows")

    def observe_row(self, row: np.ndarray, row_id: int, tag: int, count_only: bool, radius: float):
        """The fast single-decision path: :meth:`observe_rows` for one validated 1-D row with a tag (fused backends only).

        Returns ``(count, ids, distances)``: the exact witness count, and the witnesses' int64 ids
        (ascending) and float64 distances — both None when ``count`` is 0 or ``count_only``. The
        arrays are fresh: the caller may keep them.
        """
        raise NotImplementedError(f"the {self.name} index has no fused loop (fused = False); use query_pairs and add_rows")

    def remove(self, ids) -> int:
        """Remove the rows with these ids (unknown ids are ignored); return how many were removed."""
        positions = self._store.positions_of(np.asarray(ids, dtype=np.int64).reshape(-1))
        self._store.kill(positions)
        if self._store.size > 64 and self._store.live < self._store.size // 2:
            self._compact()
        return int(positions.size)

    def export(self) -> tuple[np.ndarray, np.ndarray]:
        """The live rows and their ids (float64 (n, dim), int64 (n,)), oldest first."""
        return self._store.compacted()

    def export_tagged(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """:meth:`export` and the rows' int64 tags: what :meth:`add_rows` takes to move the history to another index."""
        rows, ids = self._store.compacted()
        return rows, ids, self._store.compacted_tags()

    @staticmethod
    def row_is_finite(row: np.ndarray) -> bool:
        """True only if every value of the 1-D float64 ``row`` is finite (the monitor's single-decision check).

        May say False for a finite row (the caller then takes its careful path), never True wrongly.
        """
        return _canonical.all_finite(row)

    # -- helpers for subclasses -------------------------------------------------------------
    def _compact(self) -> None:
        tags = self._store.compacted_tags()
        rows, ids = self._store.compacted()
        self._store.reset()
        if rows.shape[0]:
            self._store.add(rows, ids, tags)
        self._reindex()

    def _verify_slice(self, queries, query_norms, radius, start: int, end: int):
        """Brute-force check of the positions ``start:end`` against every query."""
        from assay.monitor import _kernels  # compiled: loaded by the backends that scan this way

        count = queries.shape[0]
        store = self._store
        return _kernels.verify_ranges(
            store.data, store.norms, store.alive, np.empty(0, dtype=np.int64), False,
            np.arange(count, dtype=np.int64), np.full(count, start, dtype=np.int64), np.full(count, end, dtype=np.int64),
            queries, query_norms, radius, self._code,
        )

    def _added(self, positions: slice) -> None:  # pragma: no cover - abstract
        raise NotImplementedError

    def _candidates(self, queries, query_norms, radius):  # pragma: no cover - abstract
        raise NotImplementedError

    def _reindex(self) -> None:  # pragma: no cover - abstract
        raise NotImplementedError
