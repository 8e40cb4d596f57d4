"""Decision streams (CSV, Parquet, JSON lines, or stdin): reading them in chunks, and monitoring them.

A stream is a table: one column holds the model's decision, the others are input features;
columns named in ``drop`` (e.g. a ground-truth label) are ignored. :func:`read_stream` delivers
the rows in file order, in chunks, as float64 features and the decision column's values (numbers
when they all parse as numbers, else strings). Every problem is a :class:`~assay.errors.DataError`
naming the file, the line (1-based, header = line 1 for CSV) and the column.

:func:`monitor_stream` feeds a whole stream to a :class:`~assay.monitor.Monitor` in batches and
returns a :class:`StreamRun`: the counts, per-decision latencies, the most-witnessed flagged
decisions, optionally a witness file and a checkpoint. ``assay monitor`` is a thin shell around it.
"""

from __future__ import annotations

import csv
import heapq
import json
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, fields
from pathlib import Path

import numpy as np

from assay._validate import check_int
from assay.errors import DataError, OptionError
from assay.monitor.monitor import Monitor
from assay.monitor.warmup import warm_up

__all__ = ["StreamChunk", "read_stream", "StreamRun", "monitor_stream"]


@dataclass(frozen=True, eq=False)
class StreamChunk:
    """Consecutive decisions of a stream: ``features`` float64 (n, d), ``decisions`` (n,), first line number."""

    features: np.ndarray
    decisions: np.ndarray
    first_line: int
    feature_names: tuple[str, ...]


def _format_of(source: str) -> str:
    if source == "-":
        return "csv"
    suffix = "".join(Path(source).suffixes[-2:]).lower()
    if suffix.endswith((".parquet", ".pq")):
        return "parquet"
    if suffix.endswith((".jsonl", ".ndjson", ".json")):
        return "jsonl"
    return "csv"


def _columns(name: str, header: list[str], decision_column: str, drop: tuple[str, ...]) -> tuple[int, list[int]]:
    if decision_column not in header:
        raise DataError(f"{name} has no decision column {decision_column!r}; its columns are {', '.join(header)} — pass --decision-column")
    unknown = [column for column in drop if column not in header]
    if unknown:
        raise DataError(f"{name} has no column {unknown[0]!r} to drop; its columns are {', '.join(header)}")
    duplicated = sorted({c for c in header if header.count(c) > 1})
    if duplicated:
        raise DataError(f"{name} has the column {duplicated[0]!r} more than once")
    features = [i for i, column in enumerate(header) if column != decision_column and column not in drop]
    if not features:
        raise DataError(f"{name} has no feature columns left after dropping {', '.join(drop) or 'nothing'}")
    return header.index(decision_column), features


def _decisions(values: list) -> np.ndarray:
    try:
        return np.asarray([float(v) for v in values])
    except (TypeError, ValueError):
        out = np.empty(len(values), dtype=object)
        out[:] = [str(v) for v in values]
        return out


def _to_chunk(name, rows, first_line, decision_index, feature_indices, feature_names) -> StreamChunk:
    width = max(decision_index, *feature_indices) + 1
    for offset, row in enumerate(rows):
        if len(row) < width:
            raise DataError(f"line {first_line + offset} of {name} has {len(row)} values but the header names {width} or more columns")
    try:
        features = np.array([[row[i] for i in feature_indices] for row in rows], dtype=np.float64)
    except (TypeError, ValueError):
        for offset, row in enumerate(rows):
            for column in feature_indices:
                try:
                    float(row[column])
                except (TypeError, ValueError):
                    raise DataError(
                        f"line {first_line + offset} of {name} has {row[column]!r} in column {feature_names[feature_indices.index(column)]!r}, "
                        "which is not a number"
                    ) from None
        raise
    finite = np.isfinite(features)
    if not finite.all():
        row, column = np.argwhere(~finite)[0]
        raise DataError(f"line {first_line + row} of {name} has NaN or an infinite value in column {feature_names[column]!r}; "
                        "the decisions before it were monitored — remove or impute it")
    decisions = [row[decision_index] for row in rows]
    for offset, value in enumerate(decisions):
        if value is None or value == "" or (isinstance(value, float) and value != value):
            raise DataError(f"line {first_line + offset} of {name} has no value in the decision column")
    return StreamChunk(features, _decisions(decisions), first_line, feature_names)


def read_stream(source: str, decision_column: str = "prediction", drop: tuple[str, ...] = (), chunk_size: int = 256,
                stdin=None) -> Iterator[StreamChunk]:
    """Yield the decisions of ``source`` (a path or ``"-"`` for stdin, CSV there) in chunks of ``chunk_size``."""
    kind = _format_of(source)
    name = "stdin" if source == "-" else str(source)
    if source != "-" and not Path(source).is_file():
        raise DataError(f"the stream {source} does not exist (give a CSV, Parquet or JSON-lines file, or - for stdin)")
    if kind == "parquet":
        yield from _read_parquet(source, name, decision_column, drop, chunk_size)
        return
    if kind == "jsonl":
        yield from _read_jsonl(source, name, decision_column, drop, chunk_size)
        return
    handle = (stdin or sys.stdin) if source == "-" else open(source, newline="", encoding="utf-8")
    try:
        reader = csv.reader(handle)
        header = next(reader, None)
        if header is None:
            raise DataError(f"{name} is empty; a stream needs a header line naming its columns")
        header = [column.strip() for column in header]
        decision_index, features = _columns(name, header, decision_column, drop)
        names = tuple(header[i] for i in features)
        rows, first_line = [], 2
        for row in reader:
            if not row:
                continue
            rows.append(row)
            if len(rows) == chunk_size:
                yield _to_chunk(name, rows, first_line, decision_index, features, names)
                first_line += len(rows)
                rows = []
        if rows:
            yield _to_chunk(name, rows, first_line, decision_index, features, names)
    except csv.Error as exc:
        raise DataError(f"{name} is not valid CSV: {exc}") from exc
    finally:
        if handle is not (stdin or sys.stdin):
            handle.close()


def _read_jsonl(source, name, decision_column, drop, chunk_size):
    header = None
    rows, first_line = [], 1
    with open(source, encoding="utf-8") as handle:
        for number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as exc:
                raise DataError(f"line {number} of {name} is not valid JSON: {exc}") from exc
            if not isinstance(record, dict):
                raise DataError(f"line {number} of {name} is not a JSON object of column: value")
            if header is None:
                header = list(record)
                decision_index, features = _columns(name, header, decision_column, drop)
                names = tuple(header[i] for i in features)
                first_line = number
            missing = [column for column in header if column not in record]
            if missing:
                raise DataError(f"line {number} of {name} has no value for column {missing[0]!r}")
            rows.append([record[column] for column in header])
            if len(rows) == chunk_size:
                yield _to_chunk(name, rows, first_line, decision_index, features, names)
                first_line, rows = number + 1, []
    if rows:
        yield _to_chunk(name, rows, first_line, decision_index, features, names)
    elif header is None:
        raise DataError(f"{name} has no records")


def _read_parquet(source, name, decision_column, drop, chunk_size):
    try:
        import pyarrow.parquet as pq
    except ImportError as exc:
        raise DataError(f"reading {name} needs pyarrow (pip install pyarrow), or convert the stream to CSV") from exc
    try:
        table = pq.ParquetFile(source)
        header = list(table.schema_arrow.names)
    except Exception as exc:  # pyarrow raises several types; translate at this boundary
        raise DataError(f"{name} is not a readable Parquet file: {exc}") from exc
    decision_index, features = _columns(name, header, decision_column, drop)
    names = tuple(header[i] for i in features)
    first_line = 1
    for batch in table.iter_batches(batch_size=chunk_size):
        columns = [batch.column(i).to_pylist() for i in range(len(header))]
        rows = [list(values) for values in zip(*columns)]
        rows = [[(np.nan if v is None else v) if i != decision_index else v for i, v in enumerate(row)] for row in rows]
        yield _to_chunk(name, rows, first_line, decision_index, features, names)
        first_line += len(rows)



@dataclass(frozen=True, eq=False)
class StreamRun:
    """What monitoring a stream gave: counts, timings, and the evidence kept (see :func:`monitor_stream`).

    ``to_json()`` is the summary ``assay monitor --json`` prints: every field but ``latencies``
    and ``top_flagged``. Latencies are wall-clock seconds per decision, amortised over each batch;
    ``latency_ms_*`` summarise them in milliseconds. ``peak_memory_mb`` is the process's peak
    resident memory. ``interrupted`` says Ctrl-C stopped the run early (the counts cover the
    decisions monitored until then). ``top_flagged`` holds the witness records (as in the witness
    file, plus ``decision_value``) of the most-witnessed flagged decisions, most first.
    """

    stream: str
    decisions: int
    pairs: int
    flagged: int
    epsilon: float
    metric: str
    index: str
    latency_ms_p50: float
    latency_ms_p99: float
    latency_ms_mean: float
    batch_size: int
    seconds: float
    peak_memory_mb: float
    interrupted: bool
    witnesses_file: str | None
    latencies: np.ndarray = field(repr=False)
    top_flagged: tuple[dict, ...] = field(default=(), repr=False)

    def to_json(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name not in ("latencies", "top_flagged")}


def _peak_memory_mb() -> float:
    import resource

    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / 1024.0 / (1024.0 if sys.platform == "darwin" else 1.0)


def monitor_stream(source: str, epsilon: float, metric: str = "linf", *, decision_column: str = "prediction",
                   drop: tuple[str, ...] = (), index: str = "auto", max_history: int | None = None,
                   max_witnesses: int | None = None, batch_size: int = 256, witnesses_out=None, checkpoint=None,
                   keep_top: int = 0, progress: Callable[[int, int], None] | None = None, stdin=None) -> StreamRun:
    """Monitor every decision of ``source`` (see :func:`read_stream`) and summarise the run.

    Args:
        source: a CSV, Parquet (``.parquet``) or JSON-lines (``.jsonl``) path, or ``"-"`` for CSV
            on ``stdin`` (default ``sys.stdin``).
        epsilon, metric, index, max_history, max_witnesses: the :class:`~assay.monitor.Monitor`'s
            options (``index`` by name).
        decision_column, drop: which column is the decision and which are not features.
        batch_size: decisions per :meth:`~assay.monitor.Monitor.observe_batch` call (≥ 1); latencies
            are amortised over a batch, so 1 measures single decisions.
        witnesses_out: a path; one JSON line per flagged decision (its witnesses and its ``line``
            in the stream) is written there as the stream is read.
        checkpoint: a path; the monitor's state is saved there at the end (also after Ctrl-C).
        keep_top: keep the witness records of this many most-witnessed flagged decisions
            (ties: the earlier decision first) in :attr:`StreamRun.top_flagged`.
        progress: called after each batch with the batch's size and the flagged count so far.

    One-off work is done before a batch's clock starts: loading (or compiling once) the compiled
    kernels of the index, and with ``index="auto"`` moving a grown history from the numpy scan to
    the grid (:meth:`~assay.monitor.Monitor.prepare`). Ctrl-C stops
    reading and returns what was monitored (``interrupted`` set). Bad input raises the
    :class:`~assay.errors.DataError` of :func:`read_stream` or the monitor; the witness lines
    written before it stay in ``witnesses_out``.
    """
    check_int(batch_size, "batch_size", "monitor_stream", minimum=1)
    check_int(keep_top, "keep_top", "monitor_stream", minimum=0)
    if not isinstance(index, str):  # the warm-up monitor builds its own index of the same kind
        raise OptionError(f"the `index` option of monitor_stream must be a backend name such as 'auto' or 'grid'; got {index!r}")
    monitor = Monitor(epsilon, metric, index=index, max_history=max_history, max_witnesses=max_witnesses,
                      batch_size=batch_size)
    latencies: list[np.ndarray] = []
    interrupted = False
    started = time.perf_counter()
    handle = open(witnesses_out, "w", encoding="utf-8") if witnesses_out is not None else None
    top: list = []  # a min-heap of (count, -decision, record): the most-witnessed flagged decisions
    try:
        for chunk in read_stream(source, decision_column, drop, chunk_size=batch_size, stdin=stdin):
            if monitor.index is None and index not in ("auto", "scan"):  # a compiled index: load its kernels untimed
                warm_up(metric, index)
            monitor.prepare(len(chunk.features))  # moving to a compiled index: not on the batch's clock
            tic = time.perf_counter()
            found = monitor.observe_batch(chunk.features, chunk.decisions)
            elapsed = time.perf_counter() - tic
            latencies.append(np.full(len(found), elapsed / max(len(found), 1)))
            if handle is not None or keep_top:
                for offset, witnesses in enumerate(found):
                    if not witnesses.flagged:
                        continue
                    record = witnesses.to_json() | {"line": chunk.first_line + offset}
                    if handle is not None:
                        handle.write(json.dumps(record) + "\n")
                    if keep_top:
                        value = chunk.decisions[offset]
                        record["decision_value"] = value.item() if hasattr(value, "item") else value
                        item = (witnesses.count, -witnesses.decision, record)
                        if len(top) < keep_top:
                            heapq.heappush(top, item)
                        elif item[:2] > top[0][:2]:
                            heapq.heapreplace(top, item)
            if progress is not None:
                progress(len(found), monitor.stats.flagged)
    except KeyboardInterrupt:
        interrupted = True
    finally:
        if handle is not None:
            handle.close()
    if checkpoint is not None:
        monitor.save(checkpoint)
    latency = np.concatenate(latencies) if latencies else np.zeros(0)
    stats = monitor.stats
    return StreamRun(
        stream=str(source),
        decisions=stats.decisions,
        pairs=stats.pairs,
        flagged=stats.flagged,
        epsilon=epsilon,
        metric=metric,
        index=type(monitor.index).name if monitor.index is not None else index,
        latency_ms_p50=float(np.percentile(latency, 50) * 1e3) if latency.size else 0.0,
        latency_ms_p99=float(np.percentile(latency, 99) * 1e3) if latency.size else 0.0,
        latency_ms_mean=float(latency.mean() * 1e3) if latency.size else 0.0,
        batch_size=batch_size,
        seconds=time.perf_counter() - started,
        peak_memory_mb=_peak_memory_mb(),
        interrupted=interrupted,
        witnesses_file=None if witnesses_out is None else str(witnesses_out),
        latencies=latency,
        top_flagged=tuple(record for _, _, record in sorted(top, key=lambda item: item[:2], reverse=True)),
    )
