"""Start-up: index="auto" starts in the numpy scan and moves to the grid as the history grows; the compile message."""

from __future__ import annotations

import io

import numpy as np
import pytest

from assay.monitor import Monitor, warmup
from tests.monitor.oracle import oracle_witnesses


def assert_same(witnesses, expected, first=0):
    for offset, (got, (ids, distances)) in enumerate(zip(witnesses, expected[first:])):
        assert got.decision == first + offset
        assert got.ids.tolist() == ids.tolist(), f"decision {first + offset}"
        assert got.distances.tolist() == distances.tolist(), f"decision {first + offset}"


@pytest.mark.parametrize("metric", ["linf", "l2", "cosine"])
def test_auto_moves_from_scan_to_its_compiled_index_with_the_same_answers(monkeypatch, metric):
    monkeypatch.setattr("assay.monitor.monitor.SCAN_LIMIT", 40)
    rng = np.random.default_rng(3)
    X = rng.integers(0, 4, size=(130, 3)) / 8.0 + 0.01  # a coarse lattice: many ties at exactly ε
    Y = rng.integers(0, 2, 130)
    expected = oracle_witnesses(X, Y, 0.125, metric)
    monitor = Monitor(0.125, metric)
    got = monitor.observe_batch(X[:30], Y[:30])
    assert monitor.index.name == "scan"
    got += [monitor.observe(X[i], Y[i]) for i in range(30, 45)]  # single decisions across the limit
    got += monitor.observe_batch(X[45:], Y[45:])
    assert monitor.index.name == ("grid" if metric != "cosine" else "kdtree")
    assert_same(got, expected)
    assert monitor.stats.decisions == 130


def test_a_batch_larger_than_the_limit_goes_to_the_grid_at_once(monkeypatch):
    monkeypatch.setattr("assay.monitor.monitor.SCAN_LIMIT", 40)
    rng = np.random.default_rng(4)
    X, Y = rng.random((60, 2)), rng.integers(0, 2, 60)
    monitor = Monitor(0.1, "l1")
    assert_same(monitor.observe_batch(X, Y), oracle_witnesses(X, Y, 0.1, "l1"))
    assert monitor.index.name == "grid"


def test_the_compile_message_is_printed_only_when_numba_must_compile(monkeypatch):
    for cached, expected in ((False, 1), (True, 0)):
        monkeypatch.setattr(warmup, "_warmed", set())
        monkeypatch.setattr(warmup, "_announced", [])
        monkeypatch.setattr(warmup, "kernels_cached", lambda index="grid", cached=cached: cached)
        stream = io.StringIO()
        warmup.warm_up("linf", "grid", stream=stream)
        lines = stream.getvalue().splitlines()
        assert len(lines) == expected
        if expected:
            assert lines[0].startswith("compiling the monitor's kernels once (about ")
            assert lines[0].endswith("later runs start at once")
