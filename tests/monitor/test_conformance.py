"""Every index backend must answer exactly as the O(n²) oracle (scikit-learn-style estimator checks)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from assay.monitor import BACKENDS, Monitor, make_index
from tests.monitor.oracle import brute_range, oracle_witnesses
from tests.monitor.strategies import streams

# The packages of the optional backends (the `monitor` extra, part of the test extras): a missing
# one fails these tests in CI and skips them elsewhere (tests/requirements.py).
BACKEND_PACKAGES = {"faiss": "faiss", "bdd": "dd"}


def backend_marks(name: str) -> list:
    return [pytest.mark.requires(BACKEND_PACKAGES[name])] if name in BACKEND_PACKAGES else []


def _case(name, metric):
    return pytest.param(name, metric, marks=backend_marks(name), id=f"{name}-{metric}")


CASES = [_case(name, metric) for name, cls in BACKENDS.items() for metric in cls.metrics]
SETTINGS = settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def small_index(backend, dim, metric, epsilon):
    """A backend with tiny buffers, so that a short stream already exercises its trees / sorted keys."""
    options = {
        "kdtree": {"buffer_size": 4},
        "snn": {"min_buffer": 4},
        "grid": {"min_fit": 2, "hashed_columns": min(dim, 3)},
        "partition": {"groups": min(dim, 3)},
    }.get(backend, {})
    return make_index(backend, dim, metric, epsilon, **options)


def assert_same(witnesses, expected):
    assert len(witnesses) == len(expected)
    for i, (got, (ids, dists)) in enumerate(zip(witnesses, expected)):
        assert got.decision == i
        assert got.ids.tolist() == ids.tolist(), f"decision {i}"
        assert got.distances.tolist() == dists.tolist(), f"decision {i}"
        assert got.count == ids.size and not got.incomplete


@pytest.mark.parametrize("backend,metric", CASES)
def test_backend_class_attributes(backend, metric):
    index = make_index(backend, 3, metric, 0.1)
    assert index.metric == metric and index.dim == 3 and len(index) == 0
    assert isinstance(type(index).is_exact, bool) and isinstance(type(index).supports_remove, bool)
    assert metric in type(index).metrics


@pytest.mark.parametrize("backend,metric", CASES)
@SETTINGS
@given(data=st.data())
def test_monitor_equals_oracle(backend, metric, data):
    X, Y, epsilon, metric = data.draw(streams(metrics=(metric,)))
    # The BDD's variables grow with the columns: one 512-column case took up to 217 s of the suite;
    # the BDD's wide streams have a test of their own below.
    assume(backend != "bdd" or X.shape[1] <= 128)
    batch = data.draw(st.integers(1, 9))
    index = small_index(backend, X.shape[1], metric, epsilon) if data.draw(st.booleans()) else backend
    monitor = Monitor(epsilon, metric, index=index, batch_size=batch)
    got = []
    cuts = sorted(set(data.draw(st.lists(st.integers(0, len(X)), max_size=4))) | {0, len(X)})
    for lo, hi in zip(cuts[:-1], cuts[1:]):
        got.extend(monitor.observe_batch(X[lo:hi], Y[lo:hi]))
    assert_same(got, oracle_witnesses(X, Y, epsilon, metric))
    expected_pairs = sum(w.count for w in got)
    assert monitor.stats.pairs == expected_pairs and monitor.stats.decisions == len(X)


@pytest.mark.parametrize("backend,metric", CASES)
@SETTINGS
@given(data=st.data())
def test_index_range_query_with_removal(backend, metric, data):
    X, _, epsilon, metric = data.draw(streams(metrics=(metric,)))
    # The BDD's variables grow with the columns: with 512-column streams this test took 10–57 s for
    # the BDD alone from run to run. Its wide streams are covered by test_bdd_on_a_wide_stream.
    assume(backend != "bdd" or X.shape[1] <= 128)
    index = small_index(backend, X.shape[1], metric, epsilon)
    ids = np.arange(100, 100 + len(X), dtype=np.int64)
    half = len(X) // 2
    index.add(X[:half], ids[:half])
    index.add(X[half:], ids[half:])
    removed = np.asarray(data.draw(st.lists(st.sampled_from(ids.tolist()), max_size=len(X), unique=True)), dtype=np.int64)
    assert index.remove(removed) == removed.size
    keep = ~np.isin(ids, removed)
    assert len(index) == int(keep.sum())
    radius = data.draw(st.sampled_from([0.0, epsilon, epsilon * 2 + 0.1]))
    lims, distances, found = index.range_query(X, radius)
    assert lims.shape == (len(X) + 1,) and lims[0] == 0 and lims[-1] == found.size == distances.size
    got = [sorted(zip(found[lims[i] : lims[i + 1]].tolist(), distances[lims[i] : lims[i + 1]].tolist())) for i in range(len(X))]
    assert got == brute_range(X[keep], ids[keep], X, radius, metric)


@pytest.mark.parametrize("backend,metric", [case for case in CASES if case.values[1] != "cosine"])
def test_integer_pixels_are_exact(backend, metric, rng):
    """uint8 pixels given as integers with an integer ε: float64 arithmetic is exact, ties included."""
    pixels = rng.integers(0, 256, (400, 6)).astype(np.uint8)
    # Near-duplicates: one or two pixels moved by up to ±4 (uint8 wrap-around included).
    pixels[200:] = pixels[rng.integers(0, 200, 200)]
    for column in rng.integers(0, 6, (2, 200)):
        pixels[200 + np.arange(200), column] += rng.integers(-4, 5, 200).astype(np.uint8)
    labels = rng.integers(0, 3, 400)
    k = 3
    monitor = Monitor(k, metric, index=backend)
    got = monitor.observe_batch(pixels, labels)
    signed = pixels.astype(np.int64)
    for i, witnesses in enumerate(got):
        diff = np.abs(signed[:i] - signed[i])
        if metric == "linf":
            close = diff.max(axis=1) <= k
        elif metric == "l1":
            close = diff.sum(axis=1) <= k
        else:
            close = (diff * diff).sum(axis=1) <= k * k
        expected = np.flatnonzero(close & (labels[:i] != labels[i]))
        assert witnesses.ids.tolist() == expected.tolist()
    assert sum(w.count for w in got) > 0


@pytest.mark.requires("dd")
@pytest.mark.parametrize("metric", ["linf", "l1", "l2"])
def test_bdd_on_a_wide_stream(metric):
    """One 512-column stream through the BDD backend, against the pairwise oracle (the
    hypothesis tests keep the BDD to 128 columns, where it is fast)."""
    rng = np.random.default_rng(7)
    pool = rng.integers(0, 4, (3, 512)) / 255.0
    X = pool[rng.integers(0, 3, 14)]
    Y = rng.integers(0, 2, 14)
    epsilon = 2 / 255.0
    monitor = Monitor(epsilon, metric, index="bdd", batch_size=4)
    assert_same(monitor.observe_batch(X, Y), oracle_witnesses(X, Y, epsilon, metric))
