"""The index protocol the monitor drives is public: every backend honours it, and nothing reaches past it."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

import assay.monitor.frnn
from assay.errors import DataError
from assay.monitor import BACKENDS, make_index
from tests.monitor.oracle import oracle_witnesses
from tests.monitor.test_conformance import CASES, small_index

ROOT = Path(__file__).resolve().parents[2]
PUBLIC = {"FrnnIndex", "ScanIndex", "BruteForceIndex", "KDTreeIndex", "SortedProjectionIndex", "GridIndex", "BDDIndex",
          "ColumnPartitionIndex", "FaissFlatIndex", "BACKENDS", "make_index", "choose_backend", "warm_up"}
PROTOCOL = ("add", "range_query", "remove", "export", "reserve", "query_pairs", "add_rows", "observe_rows", "observe_row")


def test_frnn_public_names_are_pinned():
    assert set(assay.monitor.frnn.__all__) == PUBLIC and len(assay.monitor.frnn.__all__) == len(PUBLIC)
    assert set(BACKENDS) == {"scan", "brute", "grid", "kdtree", "snn", "bdd", "partition", "faiss"}
    for name in PROTOCOL:
        assert (getattr(assay.monitor.frnn.FrnnIndex, name).__doc__ or "").strip(), name


def test_the_monitor_calls_only_public_index_methods():
    source = (ROOT / "src/assay/monitor/monitor.py").read_text()
    assert not re.findall(r"index\._\w+", source)


IMPORT_PRIVATE = re.compile(r"^\s*(from|import)\s+assay\.monitor\.frnn\._|^\s*from\s+assay\.monitor\.frnn\s+import\s+\(?\s*_", re.M)


def test_no_module_outside_the_monitor_imports_private_frnn_modules():
    offenders = []
    for folder in ("src/assay", "tests", "benchmarks"):
        for path in (ROOT / folder).rglob("*.py"):
            if path.is_relative_to(ROOT / "src/assay/monitor"):
                continue
            if IMPORT_PRIVATE.search(path.read_text(encoding="utf-8")):
                offenders.append(str(path.relative_to(ROOT)))
    assert offenders == []


def stream(rng, metric, n=60, d=3):
    """Rows on a coarse grid (many ties at the radius) and label tags; no zero rows for cosine."""
    X = rng.integers(0, 4, (n, d)) / 4.0 + (0.25 if metric == "cosine" else 0.0)
    return np.ascontiguousarray(X), rng.integers(0, 3, n).astype(np.int64)


@pytest.mark.parametrize("backend,metric", CASES)
def test_query_pairs_and_add_rows_equal_range_query_and_add(backend, metric, rng):
    X, tags = stream(rng, metric)
    ids = np.arange(10, 10 + len(X), dtype=np.int64)
    checked, trusted = small_index(backend, X.shape[1], metric, 0.3), small_index(backend, X.shape[1], metric, 0.3)
    trusted.reserve(1000)
    assert len(trusted) == 0
    checked.add(X[:40], ids[:40], tags[:40])
    trusted.add_rows(X[:40], ids[:40], tags[:40])
    for index in (checked, trusted):
        rows, kept = index.export()
        assert rows.tolist() == X[:40].tolist() and kept.tolist() == ids[:40].tolist()
        lims, distances, found = index.range_query(X[40:], 0.3)
        query, pair_ids, pair_distances = index.query_pairs(X[40:], 0.3)
        expected = sorted((i, int(j), float(dist)) for i in range(20)
                          for j, dist in zip(found[lims[i] : lims[i + 1]], distances[lims[i] : lims[i + 1]]))
        assert sorted(zip(query.tolist(), pair_ids.tolist(), pair_distances.tolist())) == expected
    if not type(checked).fused:
        with pytest.raises(NotImplementedError, match="no fused loop"):
            checked.observe_rows(X[40:], ids[40:], tags[40:], True, -1, False, 0.3)
        with pytest.raises(NotImplementedError, match="no fused loop"):
            checked.observe_row(X[40], 99, 0, False, 0.3)


FUSED = [case for case in CASES if BACKENDS[case.values[0]].fused]


@pytest.mark.parametrize("backend,metric", FUSED)
@pytest.mark.parametrize("count_only", [False, True])
def test_fused_loops_equal_the_oracle(backend, metric, count_only, rng):
    X, tags = stream(rng, metric)
    expected = oracle_witnesses(X, tags, 0.3, metric)
    ids = np.arange(len(X), dtype=np.int64)
    batch = make_index(backend, X.shape[1], metric, 0.3)
    counts, found, distances = batch.observe_rows(X[:30], ids[:30], tags[:30], True, -1, count_only, 0.3)
    single = make_index(backend, X.shape[1], metric, 0.3)
    single.observe_rows(X[:30], ids[:30], tags[:30], True, -1, count_only, 0.3)
    assert counts.tolist() == [e[0].size for e in expected[:30]]
    if not count_only:
        bounds = np.concatenate([[0], np.cumsum(counts)])
        for i in range(30):
            assert found[bounds[i] : bounds[i + 1]].tolist() == expected[i][0].tolist()
            assert distances[bounds[i] : bounds[i + 1]].tolist() == expected[i][1].tolist()
    for i in range(30, len(X)):  # the fast single-decision path, after a batch
        count, found_one, distances_one = single.observe_row(X[i], i, int(tags[i]), count_only, 0.3)
        assert count == expected[i][0].size
        if count_only or count == 0:
            assert found_one is None and distances_one is None
        else:
            assert found_one.tolist() == expected[i][0].tolist() and distances_one.tolist() == expected[i][1].tolist()
    assert len(single) == len(X) and len(batch) == 30


@pytest.mark.parametrize("backend,metric", FUSED)
def test_fused_window_and_untagged(backend, metric, rng):
    X, tags = stream(rng, metric)
    ids = np.arange(len(X), dtype=np.int64)
    counts, _, _ = make_index(backend, X.shape[1], metric, 0.3).observe_rows(X, ids, tags, False, 5, False, 0.3)
    # Untagged: every close row of the window counts, as if every decision had its own label.
    expected = oracle_witnesses(X, np.arange(len(X)), 0.3, metric, max_history=5)
    assert counts.tolist() == [e[0].size for e in expected]


def test_add_checks_tags():
    index = make_index("brute", 3, "linf", 0.1)
    with pytest.raises(DataError, match="2 tags"):
        index.add(np.zeros((3, 3)), [0, 1, 2], [0, 1])
