"""The runtime monitor: after each decision (x, y), the exact set of earlier decisions that witness a violation.

Implements the monitoring problem of *Monitoring Robustness and Individual Fairness* (Clemont,
KDD 2025, Sec. 2–3): decision ``i`` is flagged by an earlier decision ``j < i`` when

* their inputs are **close**: ``d_X(x_i, x_j) ≤ ε`` (closed ball, true — not squared — distance,
  evaluated by the canonical float64 formula of :mod:`assay.monitor._kernels`), and
* their outputs are **different**: with ``output="label"`` the labels differ (``!=``); with
  ``output=(output_metric, δ)`` the canonical ``d_Y(y_i, y_j) > δ``.

Soundness and completeness: every backend returns exactly the rows with canonical ``d ≤ ε``, so
the witness sets are exact (equal to an O(n²) scan) — ties at exactly ε included. One range query
per decision against a single index of all earlier decisions, filtered by output (not one index
per class). ``observe_batch`` gives the same answers as observing one decision at a time: each
decision of a batch is checked against the history before the batch *and* against the earlier
decisions of the same batch.

Speed. With labels as outputs and a *fused* index (``grid``, ``brute``: the defaults for L∞, L1
and L2), a batch runs as one compiled loop — query a decision, then store it — with the label
filter inside, and :meth:`Monitor.observe` takes a short path (a known label, a finite row of the
right width) that costs one compiled call and returns a :class:`Witnesses` built without copies.
Everything else (new labels, bad input, output metrics, windows, witness caps) takes the general
path, which gives the same answers.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from pathlib import Path

import numpy as np

from assay._validate import check_choice, check_float, check_int
from assay.errors import DataError, OptionError
from assay.monitor import _canonical
from assay.monitor.frnn import BACKENDS, FrnnIndex, choose_backend, make_index
from assay.monitor.frnn.scan import SCAN_LIMIT
from assay.monitor.store import CheckpointState, read_checkpoint, write_checkpoint
from assay.monitor.witnesses import Witnesses

__all__ = ["Monitor", "MonitorConfig", "MonitorStats", "save_checkpoint", "load_checkpoint"]

METRICS = ("linf", "l2", "l1", "cosine")


@dataclass(frozen=True)
class MonitorConfig:
    """The options of a :class:`Monitor`, checked when built (see :class:`Monitor` for their meaning)."""

    epsilon: float
    metric: str = "linf"
    output_metric: str | None = None
    delta: float = 0.0
    index: str = "auto"
    dim: int | None = None
    max_history: int | None = None
    max_witnesses: int | None = None
    count_only: bool = False
    batch_size: int = 2048

    def __post_init__(self):
        owner = "Monitor"
        object.__setattr__(self, "epsilon", check_float(self.epsilon, "epsilon", owner, minimum=0.0))
        check_choice(self.metric, "metric", owner, METRICS)
        if self.output_metric is not None:
            check_choice(self.output_metric, "output metric", owner, METRICS)
            object.__setattr__(self, "delta", check_float(self.delta, "output threshold δ", owner, minimum=0.0))
        check_choice(self.index, "index", owner, ("auto", *BACKENDS))
        if self.dim is not None:
            check_int(self.dim, "dim", owner, minimum=1)
        if self.max_history is not None:
            check_int(self.max_history, "max_history", owner, minimum=1)
        if self.max_witnesses is not None:
            check_int(self.max_witnesses, "max_witnesses", owner, minimum=0)
        if not isinstance(self.count_only, bool):
            raise OptionError(f"the `count_only` option of Monitor must be True or False; got {self.count_only!r}")
        check_int(self.batch_size, "batch_size", owner, minimum=1)


@dataclass(frozen=True)
class MonitorStats:
    """Running totals: decisions observed, violating pairs found, decisions flagged (≥ 1 witness)."""

    decisions: int
    pairs: int
    flagged: int

    def to_json(self) -> dict:
        return asdict(self)


class _OutputLog:
    """Outputs (label codes or output rows) of the decisions still in the history, by id."""

    def __init__(self, width: int | None):
        shape = (64,) if width is None else (64, width)
        self._buffer = np.empty(shape, dtype=np.int64 if width is None else np.float64)
        self.size = 0
        self.offset = 0

    @property
    def values(self) -> np.ndarray:
        return self._buffer[: self.size]

    def append(self, values: np.ndarray) -> None:
        needed = self.size + values.shape[0]
        if needed > self._buffer.shape[0]:  # grow geometrically: amortised O(1) per decision
            bigger = np.empty((max(needed, 2 * self._buffer.shape[0]),) + self._buffer.shape[1:], dtype=self._buffer.dtype)
            bigger[: self.size] = self._buffer[: self.size]
            self._buffer = bigger
        self._buffer[self.size : needed] = values
        self.size = needed

    def append_one(self, value) -> None:
        if self.size == self._buffer.shape[0]:
            self.append(np.asarray([value], dtype=self._buffer.dtype))
        else:
            self._buffer[self.size] = value
            self.size += 1

    def get(self, ids: np.ndarray) -> np.ndarray:
        return self._buffer[ids - self.offset]

    def drop_before(self, first_id: int) -> None:
        drop = first_id - self.offset
        # Move only once the dead prefix is as long as what is kept: amortised O(1) per decision.
        if drop > 0 and drop >= self.size - drop:
            kept = self.size - drop
            self._buffer[:kept] = self._buffer[drop : self.size].copy()
            self.size = kept
            self.offset = first_id


class Monitor:
    """Exact online monitor of robustness / individual fairness for a stream of decisions.

    Args:
        epsilon: input radius ε ≥ 0; inputs with ``d_X ≤ ε`` are close.
        metric: input distance, ``"linf"`` (the paper's default), ``"l2"``, ``"l1"`` or ``"cosine"``
            (``1 − cos``; zero vectors are refused).
        output: ``"label"`` (outputs differ when their labels differ) or ``(output_metric, δ)``:
            outputs are vectors (or numbers) that differ when canonical ``d_Y > δ``.
        index: ``"auto"`` (by metric, dimension and size, see :func:`assay.monitor.frnn.choose_backend`),
            a backend name (``"grid"``, ``"brute"``, ``"kdtree"``, ``"snn"``, ``"bdd"``,
            ``"partition"``, ``"faiss"``) or an empty :class:`~assay.monitor.frnn.FrnnIndex`
            instance (a test seam). All give the same answers; ``bdd`` and ``faiss`` need the
            ``monitor`` extra (dd, faiss-cpu).
        dim: number of input features; inferred from the first decision when None.
        max_history: sliding window W — decision i is compared with decisions i−W … i−1 only,
            and older rows are dropped from memory. None keeps everything.
        max_witnesses: list at most this many witnesses per decision (the nearest; ``count``
            stays exact and ``incomplete`` is set). None lists all.
        count_only: list no witness ids, only the exact counts (``incomplete`` set when count > 0).
        batch_size: ``observe_batch`` processes this many decisions per index query.
        reserve: memory for this many decisions is allocated with the index (an expected stream
            length: saves re-allocation copies, which matter for very wide rows). Not a limit.

    Bad input (NaN, wrong width, a label that is NaN) raises :class:`~assay.errors.DataError`
    before anything is recorded: the monitor's state is unchanged by a rejected batch.
    """

    def __init__(self, epsilon: float, metric: str = "linf", output="label", index="auto", *, dim: int | None = None,
                 max_history: int | None = None, max_witnesses: int | None = None, count_only: bool = False,
                 batch_size: int = 2048, reserve: int | None = None):
        injected = None
        if isinstance(index, FrnnIndex):
            injected, index = index, type(index).name
            if len(injected):
                raise OptionError("an index given to Monitor must be empty; the monitor adds every decision itself")
            if injected.metric != metric:
                raise OptionError(f"the index given to Monitor measures {injected.metric!r} but the monitor's metric is {metric!r}")
            if dim is not None and dim != injected.dim:
                raise OptionError(f"the index given to Monitor has dim {injected.dim} but dim={dim} was asked")
            dim = injected.dim
        if output == "label":
            output_metric, delta = None, 0.0
        elif isinstance(output, (tuple, list)) and len(output) == 2:
            output_metric, delta = output
        else:
            raise OptionError(f"the `output` option of Monitor must be 'label' or a pair (output_metric, δ) like ('linf', 0.1); got {output!r}")
        if injected is not None and index not in BACKENDS:
            index = "brute"  # what a restored checkpoint rebuilds (answers are equal for every exact index)
        self.config = MonitorConfig(epsilon, metric, output_metric, delta, index, dim, max_history, max_witnesses, count_only, batch_size)
        if injected is None and self.config.index != "auto" and metric not in BACKENDS[self.config.index].metrics:
            listed = ", ".join(BACKENDS[self.config.index].metrics)
            raise OptionError(f"the {self.config.index!r} index supports the metrics {listed}; got metric={metric!r} — use index='auto' or 'brute'")
        self._index: FrnnIndex | None = injected
        self._labels: dict = {}
        self._log: _OutputLog | None = None
        self._output_width: int | None = None
        self._next_id = 0
        self._pairs = 0
        self._flagged = 0
        self._fast = False
        self._fast_dim = 0
        self._finite = _canonical.all_finite
        if reserve is not None:
            check_int(reserve, "reserve", "Monitor", minimum=0)
        self._reserve = reserve

    # -- public state ---------------------------------------------------------------------
    @property
    def stats(self) -> MonitorStats:
        return MonitorStats(self._next_id, self._pairs, self._flagged)

    @property
    def dim(self) -> int | None:
        return self.config.dim if self._index is None else self._index.dim

    @property
    def index(self) -> FrnnIndex | None:
        """The index holding the history (None before the first decision)."""
        return self._index

    def __len__(self) -> int:
        """Decisions currently held in the history."""
        return 0 if self._index is None else len(self._index)

    def __repr__(self) -> str:
        c = self.config
        return f"Monitor(epsilon={c.epsilon}, metric={c.metric!r}, index={c.index!r}, decisions={self._next_id})"

    # -- observation ----------------------------------------------------------------------
    def observe(self, x, y) -> Witnesses:
        """Record one decision (input ``x`` (d,), output ``y``) and return its witnesses."""
        if self._fast:
            # The hot path: a known label, a finite row of the right width, a fused index. Anything
            # else (a new label, bad input, options the fused loop does not cover) takes the
            # general path below, which gives the same answers and the error messages.
            row = x if type(x) is np.ndarray and x.dtype == np.float64 else np.asarray(x, dtype=np.float64)
            if not row.flags.c_contiguous:  # one compiled layout (a column slice would compile another)
                row = row.copy()
            if row.ndim == 1 and row.shape[0] == self._fast_dim and self._finite(row):
                try:
                    code = self._labels.get(y)
                except TypeError:
                    code = None
                if code is not None:
                    decision = self._next_id
                    count, ids, distances = self._index.observe_row(row, decision, code, self.config.count_only, self.config.epsilon)
                    self._log.append_one(code)
                    self._next_id = decision + 1
                    if count:
                        self._pairs += count
                        self._flagged += 1
                        return Witnesses._trusted(decision, ids, distances, count, ids is None)
                    return Witnesses._trusted(decision, None, None, 0, False)
        x = np.asarray(x)
        if x.ndim != 1:
            raise DataError(f"observe takes one input vector of shape (d,); got shape {x.shape} — use observe_batch for many")
        return self.observe_batch(x[None, :], [y])[0]

    def observe_batch(self, X, Y) -> list[Witnesses]:
        """Record decisions ``X`` (n, d), ``Y`` (n,) or (n, m) in order; return their witnesses.

        Equal to ``[observe(x, y) for x, y in zip(X, Y)]``, pairs inside the batch included.
        """
        rows = self._check_rows(X)
        outputs, new_labels = self._check_outputs(Y, rows.shape[0])
        if rows.shape[0] == 0:
            return []
        if self._index is None:
            # index="auto" starts in the numpy scan (nothing to load or compile); prepare() moves
            # the history to the compiled grid once it outgrows the scan.
            first = "scan" if self.config.index == "auto" else self.config.index
            self._index = make_index(first, rows.shape[1], self.config.metric, self.config.epsilon)
            self.config = replace(self.config, dim=rows.shape[1])
            if self._reserve:
                self._index.reserve(self._reserve)
        self.prepare(rows.shape[0])
        if self._log is None:
            self._log = _OutputLog(self._output_width)
            self._log.offset = self._next_id
        self._update_fast()
        for label in new_labels:
            self._labels[label] = len(self._labels)
        results: list[Witnesses] = []
        step = self.config.batch_size
        for start in range(0, rows.shape[0], step):
            results.extend(self._process(rows[start : start + step], outputs[start : start + step]))
        return results

    def prepare(self, incoming: int = 0) -> None:
        """Do now the one-off work that observing ``incoming`` more decisions would do inside the next call.

        With ``index="auto"`` the history starts in the numpy ``scan`` index, which loads nothing,
        and moves to :func:`~assay.monitor.frnn.choose_backend`'s index (the hash grid for L∞, L1
        and L2) once it would hold more than :data:`~assay.monitor.frnn.scan.SCAN_LIMIT` rows;
        that index's compiled kernels are then loaded, or compiled once
        (:func:`assay.monitor.warmup.warm_up`, which says so on stderr). :meth:`observe_batch` calls
        this itself; a caller that times its calls calls it first, so that the timed call does
        only its own work. Answers never depend on the index.
        """
        index = self._index
        if index is None or self.config.index != "auto" or index.name != "scan":
            return
        if len(index) + incoming <= SCAN_LIMIT:
            return
        from assay.monitor.warmup import warm_up

        target = choose_backend(self.config.metric, index.dim)
        warm_up(self.config.metric, target)
        grown = make_index(target, index.dim, self.config.metric, self.config.epsilon)
        rows, ids, tags = index.export_tagged()
        grown.reserve(rows.shape[0] + incoming)
        if rows.shape[0]:
            grown.add_rows(rows, ids, tags)
        self._index = grown
        self._update_fast()

    def _process(self, rows: np.ndarray, outputs: np.ndarray) -> list[Witnesses]:
        config, index, log = self.config, self._index, self._log
        count = rows.shape[0]
        first_id = self._next_id
        ids = np.arange(first_id, first_id + count, dtype=np.int64)
        labels = config.output_metric is None
        if labels and index.fused:
            # One compiled loop: each row is queried against the history and the earlier rows of
            # the batch, then stored; the label filter and the window are applied inside.
            window = -1 if config.max_history is None else config.max_history
            counts, other, distance = index.observe_rows(rows, ids, outputs, True, window, config.count_only, config.epsilon)
            results = self._group_counts(first_id, counts, other, distance)
        else:
            query, other, distance = index.query_pairs(rows, config.epsilon)
            other_output = log.get(other)
            if count > 1:  # pairs inside the batch: each later row against the earlier rows of the batch
                later, earlier, inner_distance = self._pairs_within(rows)
                query = np.concatenate([query, later])
                other = np.concatenate([other, earlier + first_id])
                distance = np.concatenate([distance, inner_distance])
                other_output = np.concatenate([other_output, outputs[earlier]])
            keep = self._different(outputs[query], other_output)
            if config.max_history is not None:
                keep &= other >= query + first_id - config.max_history
            query, other, distance = query[keep], other[keep], distance[keep]
            results = self._group(first_id, count, query, other, distance)
            index.add_rows(rows, ids, outputs if labels else None)
        log.append(outputs)
        self._next_id += count
        if config.max_history is not None:
            # Later decisions compare with ids ≥ next_id − W only; older rows leave memory.
            oldest_kept = self._next_id - config.max_history
            already_removed = max(0, first_id - config.max_history)
            if oldest_kept > already_removed:
                index.remove(np.arange(already_removed, oldest_kept, dtype=np.int64))
                log.drop_before(oldest_kept)
        return results

    def _group_counts(self, first_id: int, counts: np.ndarray, other: np.ndarray, distance: np.ndarray) -> list[Witnesses]:
        """Witnesses from per-row counts and the concatenated (ascending) ids of each row."""
        config = self.config
        total = int(counts.sum())
        self._pairs += total
        flagged = np.flatnonzero(counts)
        self._flagged += int(flagged.size)
        trusted = Witnesses._trusted
        results = [trusted(first_id + i, None, None, 0, False) for i in range(counts.shape[0])]
        if not flagged.size:
            return results
        cap = 0 if config.count_only else config.max_witnesses
        if config.count_only:
            for i in flagged.tolist():
                results[i] = trusted(first_id + i, None, None, int(counts[i]), True)
            return results
        bounds = np.zeros(counts.shape[0] + 1, dtype=np.int64)
        np.cumsum(counts, out=bounds[1:])
        for i in flagged.tolist():
            lo, hi = int(bounds[i]), int(bounds[i + 1])
            ids, dists = other[lo:hi], distance[lo:hi]
            size = hi - lo
            if cap is not None and size > cap:
                nearest = np.lexsort((ids, dists))[:cap]
                nearest.sort()
                results[i] = trusted(first_id + i, ids[nearest], dists[nearest], size, bool(cap < size))
            else:
                results[i] = trusted(first_id + i, ids.copy(), dists.copy(), size, False)
        return results

    def _update_fast(self) -> None:
        config = self.config
        # Not while the history is in the scan index: observe_batch checks when it must move to the grid.
        self._fast = bool(self._index is not None and self._index.fused and self._log is not None and config.output_metric is None
                          and config.max_history is None and config.max_witnesses is None and config.metric != "cosine"
                          and not (config.index == "auto" and self._index.name == "scan"))
        self._fast_dim = self._index.dim if self._index is not None else 0
        self._finite = self._index.row_is_finite if self._index is not None else _canonical.all_finite

    def _pairs_within(self, rows: np.ndarray):
        """``(later, earlier, distance)``: the pairs of the batch's rows within ε, grouped by later row."""
        config = self.config
        code = _canonical.METRIC_CODES[config.metric]
        norms = _canonical.canonical_norms(rows) if config.metric == "cosine" else np.ones(rows.shape[0])
        if self._index.name == "scan":  # a small job: numpy, no compiled kernel to load
            block = _canonical.pair_block(rows, rows, code, norms, norms)
            later, earlier = np.nonzero(np.tril(block <= config.epsilon, k=-1))
            return later.astype(np.int64), earlier.astype(np.int64), block[later, earlier]
        from assay.monitor import _kernels

        return _kernels.all_pairs_within(rows, norms, config.epsilon, code)

    def _different(self, mine: np.ndarray, theirs: np.ndarray) -> np.ndarray:
        if self.config.output_metric is None:
            return mine != theirs
        code = _canonical.METRIC_CODES[self.config.output_metric]
        return _canonical.rowwise_distances(mine, theirs, code) > self.config.delta

    def _group(self, first_id, count, query, other, distance) -> list[Witnesses]:
        config = self.config
        if count == 1 and config.max_witnesses is None and not config.count_only:
            order = np.argsort(other, kind="stable")
            self._pairs += int(other.size)
            self._flagged += int(other.size > 0)
            return [Witnesses(first_id, other[order], distance[order], int(other.size), False)]
        order = np.lexsort((other, query))
        query, other, distance = query[order], other[order], distance[order]
        counts = np.bincount(query, minlength=count)
        bounds = np.concatenate([[0], np.cumsum(counts)])
        self._pairs += int(query.size)
        self._flagged += int(np.count_nonzero(counts))
        cap = 0 if config.count_only else config.max_witnesses
        results = []
        for i in range(count):
            lo, hi = bounds[i], bounds[i + 1]
            total = hi - lo
            ids, dists = other[lo:hi], distance[lo:hi]
            if cap is not None and total > cap:
                nearest = np.lexsort((ids, dists))[:cap]
                nearest.sort()  # back to ascending id (ids are sorted within the group)
                ids, dists = ids[nearest], dists[nearest]
            results.append(Witnesses(first_id + i, ids, dists, int(total), bool(ids.size < total)))
        return results

    # -- validation at the boundary -------------------------------------------------------
    def _check_rows(self, X) -> np.ndarray:
        try:
            rows = np.asarray(X, dtype=np.float64)
        except (TypeError, ValueError) as exc:
            raise DataError(f"the inputs must be numbers convertible to float64: {exc}") from exc
        if rows.ndim != 2:
            raise DataError(f"observe_batch takes inputs of shape (n, d); got shape {rows.shape}")
        dim = self.dim
        if dim is not None and rows.shape[1] != dim:
            raise DataError(f"X has {rows.shape[1]} features, but the monitor was built on {dim}; "
                            f"the monitor keeps its {self._next_id} earlier decisions")
        finite = np.isfinite(rows)
        if not finite.all():
            row, column = np.argwhere(~finite)[0]
            raise DataError(f"decision {row} of the batch has NaN or infinite values (column {column}); "
                            f"nothing of this batch was recorded and the {self._next_id} earlier decisions are kept — "
                            "remove or impute the value and observe it again")
        if self.config.metric == "cosine" and rows.shape[0]:
            zero = np.flatnonzero(_canonical.canonical_norms(np.ascontiguousarray(rows)) == 0)
            if zero.size:
                raise DataError(f"decision {zero[0]} of the batch is the zero vector, which has no cosine distance; nothing was recorded")
        return np.ascontiguousarray(rows)

    def _check_outputs(self, Y, count: int):
        if self.config.output_metric is None and count == 1 and isinstance(Y, list) and len(Y) == 1:
            label = Y[0]
            if isinstance(label, np.generic):
                label = label.item()
            try:
                code = self._labels.get(label)
            except TypeError as exc:
                raise DataError(f"labels must be hashable (numbers or strings); got {label!r}") from exc
            if code is not None:
                return np.array([code], dtype=np.int64), []
            if isinstance(label, float) and label != label:
                raise DataError("decision 0 of the batch has a NaN label; nothing of this batch was recorded")
            return np.array([len(self._labels)], dtype=np.int64), [label]
        if self.config.output_metric is None:
            labels = np.asarray(Y)
            if labels.dtype.kind not in "iufb":
                # Mixed or string labels: keep the Python objects (numpy would turn 1 into "1").
                labels = np.empty(len(Y), dtype=object) if labels.ndim == 1 else labels
                if labels.dtype == object:
                    labels[:] = list(Y)
            if labels.ndim != 1 or labels.shape[0] != count:
                raise DataError(f"expected {count} labels (one per input) as a 1-D sequence; got shape {np.shape(Y)}")
            unique, inverse = np.unique(labels, return_inverse=True) if labels.dtype != object else _unique_objects(labels)
            codes, new = [], []
            for position, label in enumerate(unique.tolist() if isinstance(unique, np.ndarray) else unique):
                if isinstance(label, float) and label != label:
                    bad = int(np.flatnonzero(inverse == position)[0])
                    raise DataError(f"decision {bad} of the batch has a NaN label; nothing of this batch was recorded")
                try:
                    code = self._labels.get(label)
                except TypeError as exc:
                    raise DataError(f"labels must be hashable (numbers or strings); got {label!r}") from exc
                if code is None:
                    code = len(self._labels) + len(new)
                    new.append(label)
                codes.append(code)
            return np.asarray(codes, dtype=np.int64)[np.asarray(inverse, dtype=np.int64).reshape(-1)], new
        try:
            values = np.asarray(Y, dtype=np.float64)
        except (TypeError, ValueError) as exc:
            raise DataError(f"the outputs must be numbers convertible to float64: {exc}") from exc
        if values.ndim == 1:
            values = values[:, None]
        if values.ndim != 2 or values.shape[0] != count:
            raise DataError(f"expected {count} outputs of shape (m,) or numbers; got shape {np.shape(Y)}")
        if self._output_width is not None and values.shape[1] != self._output_width:
            raise DataError(f"the outputs have {values.shape[1]} values, but earlier decisions had {self._output_width}")
        if not np.isfinite(values).all():
            bad = int(np.flatnonzero(~np.isfinite(values).all(axis=1))[0])
            raise DataError(f"decision {bad} of the batch has a NaN or infinite output; nothing of this batch was recorded")
        if self._output_width is None and count:
            self._output_width = values.shape[1]
        return np.ascontiguousarray(values), []

    # -- checkpoints ----------------------------------------------------------------------
    def save(self, path) -> Path:
        """Write the monitor's full state to ``path`` (an ``.npz`` file: :mod:`assay.monitor.store`); see :meth:`load`."""
        return write_checkpoint(path, self._state())

    @classmethod
    def load(cls, path) -> "Monitor":
        """Rebuild a monitor from a checkpoint written by :meth:`save`; it answers as the original would.

        The index is rebuilt from the saved rows (every backend is exact, so it answers as the saved one).
        """
        state = read_checkpoint(path)
        config = state.meta["config"]
        output = "label" if config["output_metric"] is None else (config["output_metric"], config["delta"])
        monitor = cls(
            config["epsilon"], config["metric"], output, config["index"], dim=config["dim"],
            max_history=config["max_history"], max_witnesses=config["max_witnesses"],
            count_only=config["count_only"], batch_size=config["batch_size"],
        )
        monitor._restore(state)
        return monitor

    def _state(self) -> CheckpointState:
        rows, ids = self._index.export() if self._index is not None else (np.empty((0, self.dim or 0)), np.empty(0, dtype=np.int64))
        outputs = self._log.get(ids) if self._log is not None else np.empty(0)
        meta = {
            "config": asdict(self.config),
            "labels": list(self._labels),
            "output_width": self._output_width,
            "next_id": self._next_id,
            "pairs": self._pairs,
            "flagged": self._flagged,
        }
        return CheckpointState(meta, rows, ids, outputs)

    def _restore(self, state: CheckpointState) -> None:
        meta, rows, ids, outputs = state.meta, state.rows, state.ids, state.outputs
        self._labels = {label: code for code, label in enumerate(meta["labels"])}
        self._output_width = meta["output_width"]
        self._next_id, self._pairs, self._flagged = meta["next_id"], meta["pairs"], meta["flagged"]
        self._log = None  # made at the next observation, when nothing is kept
        if ids.size:
            self._log = _OutputLog(self._output_width)
            self._log.offset = int(ids[0])
            self._log.append(outputs)
        if self.config.dim is not None:
            self._index = make_index(self.config.index, self.config.dim, self.config.metric, self.config.epsilon)
            # Label codes are the tags fused indexes filter by.
            self._index.add(rows, ids, outputs if self.config.output_metric is None else None)
        self._update_fast()


def save_checkpoint(monitor: Monitor, path) -> Path:
    """Write ``monitor``'s state to ``path`` (``.npz`` appended if missing); return the path written (:meth:`Monitor.save`)."""
    return monitor.save(path)


def load_checkpoint(path) -> Monitor:
    """Rebuild the :class:`Monitor` saved at ``path`` (:meth:`Monitor.load`)."""
    return Monitor.load(path)


def _unique_objects(labels: np.ndarray):
    """``np.unique`` for object arrays of mixed types: first-seen order, by equality and hash."""
    seen: dict = {}
    inverse = np.empty(labels.shape[0], dtype=np.int64)
    for position, label in enumerate(labels.tolist()):
        try:
            inverse[position] = seen.setdefault(label, len(seen))
        except TypeError as exc:
            raise DataError(f"labels must be hashable (numbers or strings); decision {position} has {label!r}") from exc
    return list(seen), inverse
