"""Reading decision streams (CSV, Parquet, JSON lines, or stdin) in chunks of (X, Y).

A stream is a table: one column holds the model's decision, the others are input features;
columns named in ``drop`` (e.g. a ground-truth label) are ignored. Rows are delivered in file
order, in chunks, as float64 features and the decision column's values (numbers when they all
parse as numbers, else strings). Every problem is a :class:`~assay.errors.DataError` naming the
file, the line (1-based, header = line 1 for CSV) and the column.
"""

from __future__ import annotations

import csv
import json
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from assay.errors import DataError

__all__ = ["StreamChunk", "read_stream"]


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

