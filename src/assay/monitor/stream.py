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
import math
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, fields
from pathlib import Path

import numpy as np

from assay._validate import check_int
from assay.datasets.csv_rows import BadRow
from assay.errors import DataError, OptionError
from assay.monitor.monitor import Monitor
from assay.monitor.warmup import warm_up

__all__ = ["StreamChunk", "read_stream", "StreamRun", "monitor_stream"]


@dataclass(frozen=True, eq=False)
class StreamChunk:
    """Consecutive decisions of a stream: ``features`` float64 (n, d), ``decisions`` (n,), the first
    decision's line and every decision's line (``lines``; bad rows left out leave gaps)."""

    features: np.ndarray
    decisions: np.ndarray
    first_line: int
    feature_names: tuple[str, ...]
    lines: tuple[int, ...] = ()


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
    except (TypeError, ValueError, OverflowError):  # labels as text (an integer beyond float64 too)
        out = np.empty(len(values), dtype=object)
        out[:] = [str(v) for v in values]
        return out


def _row_problem(row, width: int, decision_index: int, feature_indices, feature_names) -> str | None:
    """Why one row cannot be monitored, or None."""
    if len(row) < width:
        return f"{len(row)} values, but the header names {width} or more columns"
    for k, column in enumerate(feature_indices):
        value = row[column]
        if value is None:
            return f"no value in column {feature_names[k]!r}; remove or impute that row"
        try:
            number = float(value)
        except (TypeError, ValueError, OverflowError):
            return f"{str(value)[:40]!r} in column {feature_names[k]!r}, which is not a number"
        if not math.isfinite(number):
            return f"NaN or an infinite value in column {feature_names[k]!r}; remove or impute it"
    if _no_decision(row[decision_index]):
        return "no value in the decision column (empty or NaN)"
    return None


def _no_decision(value) -> bool:
    """Whether a decision cell is empty: None, blank text, or NaN (also written as text, "NaN")."""
    if value is None or (isinstance(value, str) and not value.strip()):
        return True
    try:
        return math.isnan(float(value))
    except (TypeError, ValueError, OverflowError):
        return False


@dataclass(frozen=True)
class _Bad:
    """A line that is no row at all (not JSON, not an object): why."""

    reason: str


class _Rows:
    """Turns a stream's rows into chunks, leaving out the bad rows (see :func:`read_stream`)."""

    def __init__(self, name, decision_index, feature_indices, feature_names, on_bad_row, stop_on_error):
        self.name, self.decision_index, self.feature_indices = name, decision_index, feature_indices
        self.feature_names, self.on_bad_row, self.stop_on_error = feature_names, on_bad_row, stop_on_error
        self.width = max(decision_index, *feature_indices) + 1
        self.seen = 0  # data rows so far, bad ones included
        self.stopped = False  # a bad row stopped the stream (stop_on_error)

    def chunk(self, rows: list, lines: list[int]) -> StreamChunk | None:
        """The good rows as a chunk (None if none is left); reports or raises for the bad ones."""
        try:
            features = np.array([[row[i] for i in self.feature_indices] for row in rows], dtype=np.float64)
            clean = (features.shape == (len(rows), len(self.feature_indices)) and bool(np.isfinite(features).all())
                     and not any(_no_decision(row[self.decision_index]) for row in rows))
        except (TypeError, ValueError, OverflowError, IndexError):
            clean = False
        if not clean:
            rows, lines = self._good(rows, lines)
            if not rows:
                return None
            features = np.array([[row[i] for i in self.feature_indices] for row in rows], dtype=np.float64)
        else:
            self.seen += len(rows)
        decisions = _decisions([row[self.decision_index] for row in rows])
        return StreamChunk(features, decisions, lines[0], self.feature_names, tuple(lines))

    def _good(self, rows, lines):
        kept_rows, kept_lines = [], []
        for row, line in zip(rows, lines):
            self.seen += 1
            problem = row.reason if isinstance(row, _Bad) else _row_problem(
                row, self.width, self.decision_index, self.feature_indices, self.feature_names)
            if problem is None:
                kept_rows.append(row)
                kept_lines.append(line)
                continue
            bad = BadRow(self.name, line, self.seen, problem)
            if self.on_bad_row is None:
                raise DataError(f"{bad}; the decisions before it were monitored")
            self.on_bad_row(bad)
            if self.stop_on_error:
                self.stopped = True
                break
        return kept_rows, kept_lines


def read_stream(source: str, decision_column: str = "prediction", drop: tuple[str, ...] = (), chunk_size: int = 256,
                stdin=None, on_bad_row: Callable[[BadRow], None] | None = None,
                stop_on_error: bool = False) -> Iterator[StreamChunk]:
    """Yield the decisions of ``source`` (a path or ``"-"`` for stdin, CSV there) in chunks of at most ``chunk_size``.

    A bad row (too few values, a feature that is not a finite number, no decision) raises a
    DataError naming its line, unless ``on_bad_row`` is given: then it is called with the row's
    :class:`~assay.datasets.csv_rows.BadRow` and the row is left out; with ``stop_on_error`` the
    stream then ends (the good rows before it are still yielded). Problems of the file as a whole
    (missing, not UTF-8, not CSV/JSON/Parquet, no such column) always raise.
    """
    kind = _format_of(source)
    name = "stdin" if source == "-" else str(source)
    if source != "-" and not Path(source).is_file():
        raise DataError(f"the stream {source} does not exist (give a CSV, Parquet or JSON-lines file, or - for stdin)")
    options = (on_bad_row, stop_on_error)
    if kind == "parquet":
        yield from _read_parquet(source, name, decision_column, drop, chunk_size, options)
        return
    if kind == "jsonl":
        yield from _read_jsonl(source, name, decision_column, drop, chunk_size, options)
        return
    yield from _read_csv(source, name, decision_column, drop, chunk_size, options, stdin)


def _chunks(rows_of: _Rows, pairs: Iterator[tuple[int, list]], chunk_size: int) -> Iterator[StreamChunk]:
    """Group (line, row) pairs into chunks of the good rows, stopping where ``rows_of`` stopped."""
    rows, lines = [], []
    for line, row in pairs:
        rows.append(row)
        lines.append(line)
        if len(rows) == chunk_size:
            chunk = rows_of.chunk(rows, lines)
            if chunk is not None:
                yield chunk
            if rows_of.stopped:
                return
            rows, lines = [], []
    if rows:
        chunk = rows_of.chunk(rows, lines)
        if chunk is not None:
            yield chunk


def _read_csv(source, name, decision_column, drop, chunk_size, options, stdin):
    handle = (stdin or sys.stdin) if source == "-" else open(source, newline="", encoding="utf-8")
    reader = csv.reader(handle)
    try:
        header = next(reader, None)
        if header is None:
            raise DataError(f"{name} is empty; a stream needs a header line naming its columns")
        header = [column.strip() for column in header]
        decision_index, features = _columns(name, header, decision_column, drop)
        rows_of = _Rows(name, decision_index, features, tuple(header[i] for i in features), *options)

        def pairs():
            start = reader.line_num + 1
            for row in reader:
                if row:
                    yield start, row
                start = reader.line_num + 1

        yield from _chunks(rows_of, pairs(), chunk_size)
    except csv.Error as exc:
        raise DataError(f"{name}, line {reader.line_num}: not valid CSV ({exc}); fix the quoting of that line") from exc
    except UnicodeDecodeError as exc:
        raise DataError(f"{name}, line {reader.line_num + 1}: not UTF-8 text; save the stream as UTF-8 "
                        "(e.g. with iconv -t utf-8)") from exc
    finally:
        if handle is not (stdin or sys.stdin):
            handle.close()


def _json_records(source, name) -> Iterator[tuple[int, object]]:
    """(line, parsed JSON value or a _Bad) for each non-blank line of a JSON-lines file."""
    number = 0
    try:
        with open(source, encoding="utf-8") as handle:
            for number, line in enumerate(handle, start=1):
                if not line.strip():
                    continue
                try:
                    yield number, json.loads(line)
                except (json.JSONDecodeError, RecursionError) as exc:
                    yield number, _Bad(f"not valid JSON ({str(exc)[:80]}); write one JSON object per line")
    except UnicodeDecodeError as exc:
        raise DataError(f"{name}, line {number + 1}: not UTF-8 text; save the stream as UTF-8") from exc


def _read_jsonl(source, name, decision_column, drop, chunk_size, options):
    # The first JSON object names the columns; every line is then read against them.
    header = next((list(record) for _, record in _json_records(source, name) if isinstance(record, dict)), None)
    if header is None:
        raise DataError(f"{name} has no records; write one JSON object of column: value per line")
    decision_index, features = _columns(name, header, decision_column, drop)
    rows_of = _Rows(name, decision_index, features, tuple(header[i] for i in features), *options)

    def pairs():
        for number, record in _json_records(source, name):
            if isinstance(record, dict):
                missing = [column for column in header if column not in record]
                row = _Bad(f"no value for column {missing[0]!r}") if missing else [record[c] for c in header]
            else:
                row = record if isinstance(record, _Bad) else _Bad("not a JSON object of column: value")
            yield number, row

    yield from _chunks(rows_of, pairs(), chunk_size)


def _read_parquet(source, name, decision_column, drop, chunk_size, options):
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
    rows_of = _Rows(name, decision_index, features, tuple(header[i] for i in features), *options)

    def pairs():
        first_line = 1
        try:
            for batch in table.iter_batches(batch_size=chunk_size):
                columns = [batch.column(i).to_pylist() for i in range(len(header))]
                for offset, row in enumerate(zip(*columns)):
                    yield first_line + offset, list(row)
                first_line += batch.num_rows
        except Exception as exc:  # a damaged row group: pyarrow's errors, translated at this boundary
            if isinstance(exc, DataError):
                raise
            raise DataError(f"{name}, row {first_line}: the Parquet data cannot be read ({exc})") from exc

    yield from _chunks(rows_of, pairs(), chunk_size)


@dataclass(frozen=True, eq=False)
class StreamRun:
    """What monitoring a stream gave: counts, timings, and the evidence kept (see :func:`monitor_stream`).

    ``to_json()`` is the summary ``assay monitor --json`` prints: every field but ``latencies``
    and ``top_flagged``. Latencies are wall-clock seconds per decision, amortised over each batch;
    ``latency_ms_*`` summarise them in milliseconds. ``peak_memory_mb`` is the process's peak
    resident memory. ``interrupted`` says Ctrl-C stopped the run early (the counts cover the
    decisions monitored until then). ``bad_rows`` counts the rows left out (see ``on_bad_row`` of
    :func:`monitor_stream`); ``stopped_at`` is the line of the bad row that ended the run under
    ``stop_on_error``, else None. ``top_flagged`` holds the witness records (as in the witness
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
    bad_rows: int = 0
    stopped_at: int | None = None
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
                   keep_top: int = 0, progress: Callable[[int, int], None] | None = None, stdin=None,
                   on_bad_row: Callable[[BadRow], None] | None = None, stop_on_error: bool = False) -> StreamRun:
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
        on_bad_row, stop_on_error: as in :func:`read_stream`. Without ``on_bad_row`` the first bad
            row raises; with it, bad rows are reported there and left out (``stop_on_error``: the
            run ends at the first, as after Ctrl-C).

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
    bad_rows: list[BadRow] = []

    def bad_row(problem: BadRow) -> None:
        bad_rows.append(problem)
        on_bad_row(problem)

    try:
        for chunk in read_stream(source, decision_column, drop, chunk_size=batch_size, stdin=stdin,
                                 on_bad_row=None if on_bad_row is None else bad_row, stop_on_error=stop_on_error):
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
                    record = witnesses.to_json() | {"line": chunk.lines[offset]}
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
        bad_rows=len(bad_rows),
        stopped_at=bad_rows[0].line if stop_on_error and bad_rows else None,
        top_flagged=tuple(record for _, _, record in sorted(top, key=lambda item: item[:2], reverse=True)),
    )
