"""Checkpoints: a monitor's whole state in one ``.npz`` file, restored to a monitor that answers the same.

The file holds the options and counters (JSON), the rows and ids still in the history, their
outputs, and the label table. The index is rebuilt from the rows on load (every backend is exact,
so the rebuilt one answers exactly as the saved one). Labels must be JSON values (numbers, strings,
booleans). Written to a temporary file and renamed, so a crash never leaves half a checkpoint.
"""

from __future__ import annotations

import json
import os
import zipfile
from pathlib import Path

import numpy as np

from assay.errors import DataError

__all__ = ["save_checkpoint", "load_checkpoint"]

FORMAT = "assay.monitor.checkpoint/1"


def save_checkpoint(monitor, path) -> Path:
    """Write ``monitor``'s state to ``path`` (``.npz`` appended if missing); return the path written."""
    path = Path(path)
    if path.suffix != ".npz":
        path = path.with_name(path.name + ".npz")
    state = monitor._state()
    meta = json.loads(state["meta"])
    meta["format"] = FORMAT
    try:
        meta_text = json.dumps(meta)
    except TypeError as exc:  # pragma: no cover - labels come from JSON-able data in practice
        raise DataError(f"cannot checkpoint labels that are not numbers or strings: {exc}") from exc
    temporary = path.with_name(path.name + ".tmp.npz")
    np.savez(temporary, meta=np.array(meta_text), rows=state["rows"], ids=state["ids"], outputs=state["outputs"])
    os.replace(temporary, path)
    return path


def load_checkpoint(path):
    """Rebuild the :class:`~assay.monitor.Monitor` saved at ``path``."""
    from assay.monitor.monitor import Monitor

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
    config = meta["config"]
    output = "label" if config["output_metric"] is None else (config["output_metric"], config["delta"])
    monitor = Monitor(
        config["epsilon"], config["metric"], output, config["index"], dim=config["dim"],
        max_history=config["max_history"], max_witnesses=config["max_witnesses"],
        count_only=config["count_only"], batch_size=config["batch_size"],
    )
    monitor._restore(meta, rows, ids, outputs)
    return monitor
