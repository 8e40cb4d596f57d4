"""The Clemont paper's L∞ column partition (Sec. 4.3): sub-indexes over column groups, in parallel processes.

The columns are split into g contiguous groups; each group has its own exact index (any backend)
over its columns only, optionally in its own worker process. For L∞,
``max_j |x_j − q_j| ≤ r`` holds exactly when it holds on every group — with the same float64
numbers, since a maximum is exact — so the rows close to ``q`` are exactly the rows every
sub-index returns: the candidate ids are intersected, and the canonical distance on the full row
is only computed for reporting. Workers talk over pipes (one round trip per call), so the
partition pays off for wide rows and batches, not for single decisions of narrow rows.
"""

from __future__ import annotations

import multiprocessing
import weakref
from typing import ClassVar

import numpy as np

from assay.errors import OptionError
from assay.monitor import _kernels
from assay.monitor.frnn._base import FrnnIndex

__all__ = ["ColumnPartitionIndex"]


def _serve(connection, backend: str, dim: int, epsilon: float) -> None:  # pragma: no cover - runs in a worker process
    from assay.monitor.frnn import make_index

    index = make_index(backend, dim, "linf", epsilon)
    while True:
        command, *args = connection.recv()
        try:
            if command == "close":
                connection.send(("ok", None))
                return
            if command == "add":
                index.add(*args)
                reply = None
            elif command == "query":
                lims, _, ids = index.range_query(*args)
                reply = (lims, ids)
            elif command == "reset":
                index = make_index(backend, dim, "linf", epsilon)
                reply = None
            else:
                raise ValueError(f"unknown command {command!r}")
            connection.send(("ok", reply))
        except Exception as exc:  # sent back and raised in the parent
            connection.send(("error", repr(exc)))


class _Local:
    """A sub-index in this process, with the worker's interface."""

    def __init__(self, backend: str, dim: int, epsilon: float):
        from assay.monitor.frnn import make_index

        self._make = lambda: make_index(backend, dim, "linf", epsilon)
        self._index = self._make()
        self._reply = None

    def send(self, command: str, *args) -> None:
        if command == "add":
            self._index.add(*args)
            self._reply = None
        elif command == "query":
            lims, _, ids = self._index.range_query(*args)
            self._reply = (lims, ids)
        elif command == "reset":
            self._index = self._make()
            self._reply = None

    def receive(self):
        return self._reply

    def close(self) -> None:
        pass


class _Worker:
    """A sub-index in a worker process (spawned, so it is safe with threads in the parent)."""

    def __init__(self, backend: str, dim: int, epsilon: float):
        context = multiprocessing.get_context("spawn")
        self._connection, child = context.Pipe()
        self._process = context.Process(target=_serve, args=(child, backend, dim, epsilon), daemon=True)
        self._process.start()
        child.close()

    def send(self, command: str, *args) -> None:
        self._connection.send((command, *args))

    def receive(self):
        status, reply = self._connection.recv()
        if status != "ok":
            raise RuntimeError(f"a column-partition worker failed: {reply}")
        return reply

    def close(self) -> None:
        try:
            self._connection.send(("close",))
            self._connection.recv()
        except (OSError, EOFError):
            pass
        self._process.join(timeout=5)
        if self._process.is_alive():
            self._process.terminate()


def _close_all(workers) -> None:
    for worker in workers:
        worker.close()


class ColumnPartitionIndex(FrnnIndex):
    """Exact L∞ range queries as the intersection of exact sub-indexes over column groups.

    Args:
        dim: number of features.
        metric: only ``"linf"``.
        epsilon: the monitor's radius (passed to the sub-indexes).
        groups: number of column groups (default: up to 4, at least 1 column each).
        backend: the index of each group (any exact backend name, e.g. ``"grid"``, ``"kdtree"``).
        processes: True runs each group in its own worker process (the paper's setting), False
            in this process; None (default) uses processes when the groups are wide (≥ 256 columns).
    """

    name: ClassVar[str] = "partition"
    metrics: ClassVar[tuple[str, ...]] = ("linf",)

    def __init__(self, dim: int, metric: str = "linf", epsilon: float = 0.0, groups: int | None = None,
                 backend: str = "grid", processes: bool | None = None):
        super().__init__(dim, metric)
        from assay.monitor.frnn import BACKENDS

        if backend not in BACKENDS or backend == "partition":
            raise OptionError(f"the `backend` of a partition index must be one of {', '.join(b for b in BACKENDS if b != 'partition')}; got {backend!r}")
        groups = min(4, self.dim) if groups is None else int(groups)
        if not 1 <= groups <= self.dim:
            raise OptionError(f"the `groups` of a partition index must be in 1..{self.dim}; got {groups!r}")
        self.epsilon = float(epsilon)
        self.backend = backend
        self._columns = [np.asarray(part, dtype=np.int64) for part in np.array_split(np.arange(self.dim), groups)]
        if processes is None:
            processes = self.dim // groups >= 256
        self.processes = bool(processes)
        kind = _Worker if self.processes else _Local
        self._parts = [kind(backend, part.size, self.epsilon) for part in self._columns]
        self._finalizer = weakref.finalize(self, _close_all, list(self._parts))

    def close(self) -> None:
        """Stop the worker processes (also done when the index is garbage-collected)."""
        self._finalizer()

    def _broadcast(self, command: str, make_args) -> list:
        for part, columns in zip(self._parts, self._columns):
            part.send(command, *make_args(columns))
        return [part.receive() for part in self._parts]

    def _added(self, positions: slice) -> None:
        rows = self._store.data[positions]
        if rows.shape[0]:
            ids = np.arange(positions.start, positions.stop, dtype=np.int64)
            self._broadcast("add", lambda columns: (np.ascontiguousarray(rows[:, columns]), ids))

    def _reindex(self) -> None:
        self._broadcast("reset", lambda columns: ())
        self._added(slice(0, self._store.size))

    def _candidates(self, queries, query_norms, radius):
        store = self._store
        replies = self._broadcast("query", lambda columns: (np.ascontiguousarray(queries[:, columns]), radius))
        stride = np.int64(store.size + 1)
        common = None
        for lims, positions in replies:
            keys = np.repeat(np.arange(queries.shape[0], dtype=np.int64), np.diff(lims)) * stride + positions
            common = np.unique(keys) if common is None else np.intersect1d(common, keys, assume_unique=False)
            if not common.size:
                break
        pair_query, pair_position = common // stride, common % stride
        keep, distances = _kernels.verify_pairs(store.data, store.norms, store.alive, pair_query, pair_position,
                                                 queries, query_norms, radius, self._code)
        return pair_query[keep], pair_position[keep], distances[keep]
