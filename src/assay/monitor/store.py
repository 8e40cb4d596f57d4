"""Checkpoint files: a monitor's whole state in one ``.npz`` file.

The file holds the options and counters (JSON, under ``meta``), the rows and ids still in the
history, and their outputs. This module knows the file format only; :meth:`Monitor.save` and
:meth:`Monitor.load` (also :func:`~assay.monitor.save_checkpoint` and
:func:`~assay.monitor.load_checkpoint`) turn a monitor into a :class:`CheckpointState` and back,
so the dependency goes one way: ``monitor`` uses ``store``. Labels must be JSON values (numbers,
strings, booleans). Written to a temporary file and renamed, so a crash never leaves half a
checkpoint.
"""

from __future__ import annotations

import json
import os
import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from assay.errors import DataError

__all__ = ["CheckpointState", "write_checkpoint", "read_checkpoint", "FORMAT"]

FORMAT = "assay.monitor.checkpoint/1"


@dataclass(frozen=True, eq=False)
class CheckpointState:
    """A monitor's state: ``meta`` (options, label table, counters: JSON values), ``rows`` float64
    (n, d) and ``ids`` int64 (n,) of the history, oldest first, and their ``outputs`` (label codes
    int64 (n,) or output rows float64 (n, m))."""

    meta: dict
    rows: np.ndarray
    ids: np.ndarray
    outputs: np.ndarray


def write_checkpoint(path, state: CheckpointState) -> Path:
    """Write ``state`` to ``path`` (``.npz`` appended if missing); return the path written."""
    path = Path(path)
    if path.suffix != ".npz":
        path = path.with_name(path.name + ".npz")
    meta = dict(state.meta, format=FORMAT)
    try:
        meta_text = json.dumps(meta)
    except TypeError as exc:
        raise DataError(f"cannot checkpoint labels that are not numbers or strings: {exc}") from exc
    temporary = path.with_name(path.name + ".tmp.npz")
    np.savez(temporary, meta=np.array(meta_text), rows=state.rows, ids=state.ids, outputs=state.outputs)
    os.replace(temporary, path)
    return path


def read_checkpoint(path) -> CheckpointState:
    """Read a checkpoint written by :func:`write_checkpoint`; a missing or foreign file raises DataError."""
    path = Path(path)
    try:
        with np.load(path, allow_pickle=False) as saved:
            meta = json.loads(str(saved["meta"]))
            rows, ids, outputs = saved["rows"], saved["ids"], saved["outputs"]
    except FileNotFoundError as exc:
        raise DataError(f"checkpoint {path} does not exist") from exc
    except (OSError, KeyError, ValueError, zipfile.BadZipFile, json.JSONDecodeError) as exc:
        raise DataError(f"{path} is not a monitor checkpoint written by Monitor.save: {exc}") from exc
    if meta.get("format") != FORMAT:
        raise DataError(f"{path} has checkpoint format {meta.get('format')!r}; this assay reads {FORMAT!r}")
    return CheckpointState(meta, rows, ids, outputs)
