"""VNN-COMP style benchmarks: the instances CSV, one worker per instance, the results CSV.

An instances file has one row per instance, ``network,property,timeout`` (no header; VNN-COMP's
``instances.csv``), with paths relative to the CSV's folder (absolute paths are kept). Model and
property files may be gzipped (``.onnx.gz``, ``.vnnlib.gz``), as some VNN-COMP benchmarks ship them:
:func:`assay.nn.load` and :func:`assay.sets.read_vnnlib` read them as they are.

:func:`verify_instance` is the module-level worker that :func:`assay.run.run_tasks` sends to a
process pool or a Dask cluster: it loads, verifies and returns a plain dict, and records a bad
file as status ``"error"`` (the other instances still run).
"""

from __future__ import annotations

import csv
import io
import json
import math
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from assay.datasets.csv_rows import BadRow
from assay.errors import AssayError, DataError
from assay.verify.result import VerificationStatus

__all__ = [
    "Instance",
    "read_instances",
    "read_instance_rows",
    "verify_instance",
    "write_results",
    "summarize",
    "STATUSES",
    "RESULT_COLUMNS",
]

STATUSES = tuple(status.value for status in VerificationStatus)
RESULT_COLUMNS = ("network", "property", "timeout", "status", "seconds", "verify_seconds", "counterexample", "error",
                  "reason")


@dataclass(frozen=True)
class Instance:
    """One row of an instances CSV: paths as written, resolved paths, timeout (s), line number."""

    network: str
    property: str
    timeout: float
    network_path: Path
    property_path: Path
    line: int


def read_instances(path, default_timeout: float | None = None) -> list[Instance]:
    """The instances of :func:`read_instance_rows`; the first malformed row raises DataError."""
    instances, bad = read_instance_rows(path, default_timeout)
    if bad:
        raise DataError(str(bad[0]))
    return instances


def read_instance_rows(path, default_timeout: float | None = None) -> tuple[list[Instance], list[BadRow]]:
    """Parse ``network,property[,timeout]`` rows; a header row (non-numeric timeout) is skipped.

    Rows without a timeout take ``default_timeout``; without one either, the row is bad. Returns the
    good instances and the malformed rows (wrong number of columns, a timeout that is not a positive
    number), each a :class:`~assay.datasets.csv_rows.BadRow` naming its line.

    Raises:
        DataError: the file is missing, not UTF-8 or not CSV, or holds no rows at all.
    """
    from assay.datasets.csv_rows import read_utf8_text

    path = Path(path)
    text = read_utf8_text(path, "an instances CSV (rows network,property,timeout)")
    reader = csv.reader(io.StringIO(text, newline=""))
    try:
        rows = list(reader)
    except csv.Error as exc:
        raise DataError(f"{path}, line {reader.line_num}: not valid CSV ({exc}); fix the quoting of that line") from exc
    instances, bad = [], []
    for line, row in enumerate(rows, start=1):
        row = [cell.strip() for cell in row]
        if not any(row) or row[0].startswith("#"):
            continue
        found = _instance(path, line, row, default_timeout, header_allowed=not instances and not bad and line == 1)
        if isinstance(found, Instance):
            instances.append(found)
        elif found is not None:
            bad.append(BadRow(str(path), line, len(instances) + len(bad) + 1, found))
    if not instances and not bad:
        raise DataError(f"{path}: no instances (expected rows `network,property,timeout`)")
    return instances, bad


def _instance(path: Path, line: int, row: list[str], default_timeout, header_allowed: bool) -> Instance | str | None:
    """The row's instance, or why it is malformed, or None for a header row."""
    if len(row) not in (2, 3):
        return f"expected `network,property,timeout`; got {len(row)} columns"
    if not row[0] or not row[1]:
        return "the network or the property path is empty; give both"
    if len(row) == 3 and row[2]:
        try:
            timeout = float(row[2])
        except ValueError:
            if header_allowed:  # a header such as network,property,timeout
                return None
            return f"the timeout {row[2][:40]!r} is not a number of seconds"
    elif default_timeout is not None:
        timeout = float(default_timeout)
    else:
        return "no timeout; add a third column or pass a default timeout"
    if not (timeout > 0 and math.isfinite(timeout)):
        return f"the timeout must be a finite number of seconds > 0; got {timeout:g}"
    folder = path.parent
    return Instance(row[0], row[1], timeout, _resolve(folder, row[0]), _resolve(folder, row[1]), line)


def _resolve(folder: Path, name: str) -> Path:
    candidate = Path(name).expanduser()
    return candidate if candidate.is_absolute() else folder / candidate


def verify_instance(instance: Instance, method: str = "alpha", raise_errors: bool = False, strategy: str = "auto") -> dict:
    """Load, verify with the instance's timeout, and return a row of the results CSV (as a dict).

    ``seconds`` counts loading and verifying (as VNN-COMP does); ``verify_seconds`` the verifier
    alone; ``line`` is the instance's line in the instances CSV; ``reason`` says why an ``unknown``
    is no verdict where the verifier says (e.g. onnxruntime rejected the counterexample of assay's
    forward pass on the original file), else None. A bad model or property file gives
    status ``"error"`` with the message, or with ``raise_errors`` raises its AssayError (so that
    :func:`assay.run.run_tasks` cancels the pending instances: ``--stop-on-error``). ``method`` and
    ``strategy`` are :class:`~assay.verify.VerifyOptions`'.
    """
    started = time.perf_counter()
    row = {"network": instance.network, "property": instance.property, "timeout": instance.timeout,
           "status": VerificationStatus.ERROR.value, "seconds": 0.0, "verify_seconds": 0.0, "counterexample": None,
           "error": None, "reason": None, "line": instance.line}
    try:
        from assay.nn import load
        from assay.sets import read_vnnlib
        from assay.verify import verify_vnnlib

        network = load(instance.network_path)
        prop = read_vnnlib(instance.property_path, num_inputs=network.input_size, num_outputs=network.output_size)
        # The instance's timeout covers loading too (as VNN-COMP counts it).
        left = max(instance.timeout - (time.perf_counter() - started), 1e-9)
        result = verify_vnnlib(network, prop, timeout=left, method=method, strategy=strategy)
    except AssayError as exc:
        if raise_errors:
            raise
        row["error"] = str(exc)
    else:
        row["status"] = result.status.value
        row["verify_seconds"] = result.stats.seconds
        row["reason"] = result.reason
        if result.counterexample is not None:
            row["counterexample"] = result.counterexample.to_json()
    row["seconds"] = time.perf_counter() - started
    return row


def write_results(path, results: list[dict]) -> Path:
    """Write result rows as CSV (counterexamples as JSON in one column); returns the path."""
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "w", newline="", encoding="utf-8") as handle:
            writer = csv.DictWriter(handle, fieldnames=RESULT_COLUMNS)
            writer.writeheader()
            for row in results:
                cells = {column: row.get(column) for column in RESULT_COLUMNS}
                if cells["counterexample"] is not None:
                    cells["counterexample"] = json.dumps(cells["counterexample"])
                for column in ("seconds", "verify_seconds"):
                    cells[column] = f"{cells[column]:.4f}"
                writer.writerow({k: "" if v is None else v for k, v in cells.items()})
    except OSError as exc:
        raise DataError(f"{path}: cannot write the results ({exc})") from exc
    return path


def summarize(results: list[dict]) -> dict:
    """Counts per status, total instance time (sum of ``seconds``), number of instances."""
    counts = Counter(row["status"] for row in results)
    return {
        "instances": len(results),
        "counts": {status: counts.get(status, 0) for status in STATUSES},
        "total_seconds": sum(row["seconds"] for row in results),
    }
