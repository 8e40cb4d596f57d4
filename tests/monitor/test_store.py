"""Checkpoint files: the store knows the file format only; the monitor uses it (one-way dependency)."""

from __future__ import annotations

import ast
import inspect

import numpy as np
import pytest

import assay.monitor.store as store
from assay.errors import DataError
from assay.monitor import Monitor, load_checkpoint, save_checkpoint


def imported_modules(module) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(inspect.getsource(module))):
        if isinstance(node, ast.ImportFrom):
            names.add(node.module)
        elif isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
    return names


def test_the_store_does_not_import_the_monitor():
    assert store.__all__ == ["CheckpointState", "write_checkpoint", "read_checkpoint", "FORMAT"]
    assert not {name for name in imported_modules(store) if name.startswith("assay.monitor")}


def test_state_round_trip(tmp_path, rng):
    monitor = Monitor(0.2, "l2")
    X = rng.random((30, 3))
    monitor.observe_batch(X, rng.integers(0, 2, 30))
    path = save_checkpoint(monitor, tmp_path / "state")
    assert path.name == "state.npz"
    state = store.read_checkpoint(path)
    assert state.meta["format"] == store.FORMAT and state.meta["next_id"] == 30 and state.meta["config"]["metric"] == "l2"
    assert state.rows.tolist() == X.tolist() and state.ids.tolist() == list(range(30))
    copy = store.write_checkpoint(tmp_path / "copy.npz", state)
    assert Monitor.load(copy).stats == monitor.stats
    restored = load_checkpoint(path)
    x, y = rng.random(3), 1
    assert restored.observe(x, y) == monitor.observe(x, y)


def test_foreign_files_are_data_errors(tmp_path):
    path = tmp_path / "other.npz"
    np.savez(path, meta=np.array('{"format": "something/9"}'), rows=np.zeros((0, 1)), ids=np.zeros(0), outputs=np.zeros(0))
    with pytest.raises(DataError, match="something/9"):
        store.read_checkpoint(path)
    with pytest.raises(DataError, match="does not exist"):
        store.read_checkpoint(tmp_path / "absent.npz")
