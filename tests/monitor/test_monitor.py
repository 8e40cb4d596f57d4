"""Monitor semantics and operations: batches, windows, caps, count-only, errors that keep state, checkpoints."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

import assay.monitor
from assay.errors import DataError, OptionError
from assay.monitor import BACKENDS, Monitor, Witnesses, load_checkpoint
from assay.monitor.frnn.scan import SCAN_LIMIT
from tests.monitor.oracle import oracle_witnesses
from tests.monitor.strategies import streams
from tests.monitor.test_conformance import backend_marks

BACKEND_NAMES = [pytest.param(name, marks=backend_marks(name)) for name in BACKENDS]

FAST = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def test_public_surface_is_pinned():
    assert sorted(assay.monitor.__all__) == sorted([
        "Monitor", "MonitorConfig", "MonitorStats", "Witnesses", "FrnnIndex", "BACKENDS",
        "choose_backend", "make_index", "save_checkpoint", "load_checkpoint", "monitor_stream", "StreamRun",
    ])


def test_closed_ball_and_label_filter():
    monitor = Monitor(0.5, "linf")
    assert monitor.observe([0.0, 0.0], 1).count == 0
    assert monitor.observe([0.5, -0.5], 1).count == 0  # close but same label
    hit = monitor.observe([0.5, 0.0], 0)  # d = 0.5 to decision 0 (tie at ε), 0.5 to decision 1
    assert hit.ids.tolist() == [0, 1] and hit.distances.tolist() == [0.5, 0.5] and hit.flagged
    assert monitor.observe([2.0, 2.0], 7).count == 0
    assert monitor.stats.to_json() == {"decisions": 4, "pairs": 2, "flagged": 1}


@pytest.mark.parametrize("backend", BACKEND_NAMES)
@FAST
@given(stream=streams(metrics=("linf",)))
def test_batch_equals_one_at_a_time(backend, stream):
    X, Y, epsilon, metric = stream
    # The BDD's variables grow with the columns: a 512-column stream costs it seconds per example
    # (one unlucky draw took 150 s). Its wide streams are covered by the conformance tests.
    assume(backend != "bdd" or X.shape[1] <= 128)
    one = Monitor(epsilon, metric, index=backend)
    sequential = [one.observe(x, y) for x, y in zip(X, Y)]
    assert Monitor(epsilon, metric, index=backend).observe_batch(X, Y) == sequential


@FAST
@given(stream=streams(), window=st.integers(1, 20), batch=st.integers(1, 8))
def test_sliding_window_equals_oracle(stream, window, batch):
    X, Y, epsilon, metric = stream
    monitor = Monitor(epsilon, metric, max_history=window, batch_size=batch)
    got = monitor.observe_batch(X, Y)
    for witnesses, (ids, _) in zip(got, oracle_witnesses(X, Y, epsilon, metric, max_history=window)):
        assert witnesses.ids.tolist() == ids.tolist()
    assert len(monitor) == min(window, len(X))


@FAST
@given(stream=streams(metrics=("linf", "l2")), delta=st.sampled_from([0.0, 0.1, 0.5]))
def test_output_metric_equals_oracle(stream, delta):
    X, Y, epsilon, metric = stream
    rng = np.random.default_rng(len(X))
    outputs = np.round(rng.random((len(X), 3)), 1)  # ties at δ too
    got = Monitor(epsilon, metric, output=("linf", delta), batch_size=5).observe_batch(X, outputs)
    for witnesses, (ids, _) in zip(got, oracle_witnesses(X, outputs, epsilon, metric, output=("linf", delta))):
        assert witnesses.ids.tolist() == ids.tolist()


def test_cap_and_count_only(rng):
    X = rng.random((300, 2)) * 0.1
    Y = np.arange(300) % 3
    full = Monitor(0.2).observe_batch(X, Y)
    capped = Monitor(0.2, max_witnesses=5).observe_batch(X, Y)
    counted = Monitor(0.2, count_only=True).observe_batch(X, Y)
    for f, c, n in zip(full, capped, counted):
        assert c.count == n.count == f.count
        assert n.ids.size == 0 and n.incomplete == (f.count > 0)
        assert c.incomplete == (f.count > 5) and c.ids.size == min(5, f.count)
        nearest = np.lexsort((f.ids, f.distances))[:5]
        assert c.ids.tolist() == sorted(f.ids[nearest].tolist())


def test_witnesses_are_frozen_values():
    w = Witnesses(3, [1, 2], [0.1, 0.0], 2)
    with pytest.raises(ValueError):
        w.ids[0] = 5
    with pytest.raises(AttributeError):
        w.count = 1
    assert w.to_json() == {"decision": 3, "count": 2, "incomplete": False, "ids": [1, 2], "distances": [0.1, 0.0]}
    with pytest.raises(ValueError):
        Witnesses(0, [1], [0.1], 3, incomplete=False)


@pytest.mark.parametrize("backend", BACKEND_NAMES)
def test_errors_keep_state(backend, rng):
    X = rng.random((50, 4))
    Y = rng.integers(0, 2, 50)
    reference = Monitor(0.3, index=backend)
    expected = reference.observe_batch(X, Y)
    monitor = Monitor(0.3, index=backend)
    monitor.observe_batch(X[:20], Y[:20])
    bad = X[20:30].copy()
    bad[4, 2] = np.nan
    with pytest.raises(DataError, match=r"decision 4 of the batch has NaN.*column 2.*20 earlier decisions"):
        monitor.observe_batch(bad, Y[20:30])
    with pytest.raises(DataError, match="X has 5 features, but the monitor was built on 4"):
        monitor.observe_batch(np.ones((2, 5)), [0, 1])
    with pytest.raises(DataError, match="expected 10 labels"):
        monitor.observe_batch(X[20:30], Y[20:29])
    with pytest.raises(DataError, match="NaN label"):
        monitor.observe_batch(X[20:22], [0.0, float("nan")])
    with pytest.raises(DataError):
        monitor.observe(np.ones((2, 4)), 0)
    assert monitor.stats.decisions == 20 and len(monitor) == 20
    assert monitor.observe_batch(X[20:], Y[20:]) == expected[20:]


def test_option_errors():
    with pytest.raises(OptionError, match="epsilon"):
        Monitor(-1.0)
    with pytest.raises(OptionError, match="metric"):
        Monitor(0.1, "hamming")
    with pytest.raises(OptionError, match="index"):
        Monitor(0.1, index="faiss-gpu")
    with pytest.raises(OptionError, match="grid"):
        Monitor(0.1, "cosine", index="grid")
    with pytest.raises(OptionError, match="partition"):
        Monitor(0.1, "l2", index="partition")
    with pytest.raises(OptionError, match="output"):
        Monitor(0.1, output="probabilities")
    with pytest.raises(DataError, match="zero vector"):
        Monitor(0.1, "cosine").observe([0.0, 0.0], 1)


def test_string_and_mixed_labels():
    monitor = Monitor(1.0)
    monitor.observe_batch([[0.0], [0.1]], ["yes", "no"])
    assert monitor.observe([0.2], 1).ids.tolist() == [0, 1]
    assert monitor.observe([0.3], 1.0).ids.tolist() == [0, 1]  # 1 == 1.0: the same label


@pytest.mark.parametrize("backend", BACKEND_NAMES)
@pytest.mark.parametrize("window", [None, 17])
def test_checkpoint_round_trip(backend, window, tmp_path, rng):
    X = np.round(rng.random((200, 3)) * 10) / 10
    Y = np.array(["a", "b", "c"])[rng.integers(0, 3, 200)]
    reference = Monitor(0.1, index=backend, max_history=window, max_witnesses=4)
    expected = reference.observe_batch(X, Y)
    monitor = Monitor(0.1, index=backend, max_history=window, max_witnesses=4)
    monitor.observe_batch(X[:120], Y[:120])
    path = monitor.save(tmp_path / "state")
    restored = load_checkpoint(path)
    assert restored.config == monitor.config and restored.stats == monitor.stats and len(restored) == len(monitor)
    assert restored.observe_batch(X[120:], Y[120:]) == expected[120:]
    assert restored.stats == reference.stats


def test_checkpoint_errors(tmp_path):
    with pytest.raises(DataError, match="does not exist"):
        load_checkpoint(tmp_path / "missing.npz")
    (tmp_path / "junk.npz").write_bytes(b"not a zip")
    with pytest.raises(DataError, match="not a monitor checkpoint"):
        load_checkpoint(tmp_path / "junk.npz")
    empty = Monitor(0.2, "l2", output=("l1", 0.5)).save(tmp_path / "empty.npz")
    restored = load_checkpoint(empty)
    assert restored.observe([1.0, 2.0], [0.0, 1.0]).count == 0 and restored.config.output_metric == "l1"


def test_auto_chooses_by_metric_dimension_and_size():
    from assay.monitor import choose_backend

    assert choose_backend("linf", 12) == "grid"
    assert choose_backend("l2", 512) == "grid"
    assert choose_backend("linf", 12, size=100) == "brute"
    assert choose_backend("cosine", 8) == "kdtree"
    assert choose_backend("cosine", 64) == "brute"
    monitor = Monitor(0.1)
    monitor.observe([0.0, 1.0, 2.0], 0)
    assert type(monitor.index).__name__ == "ScanIndex"  # a small history: numpy, nothing to compile
    monitor.observe_batch(np.zeros((SCAN_LIMIT, 3)), np.zeros(SCAN_LIMIT))
    assert type(monitor.index).__name__ == "GridIndex"


def test_grid_hashes_columns_once_the_history_is_large(rng):
    """The grid's cost model switches from scanning to hashed cells as the history grows."""
    X = rng.random((3000, 12))
    monitor = Monitor(0.05, "linf")
    monitor.observe_batch(X, rng.integers(0, 2, 3000))
    assert type(monitor.index).__name__ == "GridIndex" and len(monitor.index.hashed) >= 2


@pytest.mark.parametrize("backend", ["grid", "brute"])
@FAST
@given(stream=streams(metrics=("linf", "l2", "l1")), options=st.sampled_from([{}, {"count_only": True}, {"max_witnesses": 2}]))
def test_fast_single_path_equals_batch(backend, stream, options):
    """observe (the compiled single-decision path) and observe_batch agree, options included."""
    X, Y, epsilon, metric = stream
    one = Monitor(epsilon, metric, index=backend, **options)
    sequential = [one.observe(x, y) for x, y in zip(X, Y)]
    batched = Monitor(epsilon, metric, index=backend, batch_size=7, **options).observe_batch(X, Y)
    assert sequential == batched
    for witnesses in sequential:
        assert not witnesses.ids.flags.writeable and not witnesses.distances.flags.writeable


def test_optional_backends_say_what_to_install(monkeypatch):
    import sys

    from assay.errors import UnsupportedError
    from assay.monitor.frnn import bdd

    monkeypatch.setitem(sys.modules, "faiss", None)
    with pytest.raises(UnsupportedError, match="faiss-cpu"):
        Monitor(0.1, index="faiss").observe([0.0], 0)
    monkeypatch.setitem(sys.modules, "dd", None)
    monkeypatch.setitem(sys.modules, "dd.cudd", None)
    monkeypatch.setitem(sys.modules, "dd.autoref", None)
    with pytest.raises(UnsupportedError, match="dd"):
        bdd.BDDIndex(2, "linf", 0.1)


@pytest.mark.requires("dd")
def test_bdd_engine_is_reported():
    from assay.monitor.frnn.bdd import BDD_ENGINE, BDDIndex

    assert BDD_ENGINE in ("dd.cudd", "dd.autoref")
    index = BDDIndex(2, "linf", 0.1)
    index.add(np.array([[0.0, 0.0], [0.05, 0.1], [0.5, 0.5]]), [0, 1, 2])
    lims, distances, ids = index.range_query([[0.0, 0.0]], 0.1)
    assert ids.tolist() == [0, 1] and index.engine == BDD_ENGINE


def test_partition_in_worker_processes_equals_oracle(rng):
    """The paper's setting: each column group's index in its own process, candidate ids intersected."""
    from assay.monitor.frnn import ColumnPartitionIndex

    X = np.round(rng.random((120, 6)) * 8) / 8
    Y = rng.integers(0, 3, 120)
    index = ColumnPartitionIndex(6, "linf", 0.125, groups=2, processes=True)
    try:
        got = Monitor(0.125, index=index, batch_size=16).observe_batch(X, Y)
    finally:
        index.close()
    for witnesses, (ids, distances) in zip(got, oracle_witnesses(X, Y, 0.125)):
        assert witnesses.ids.tolist() == ids.tolist() and witnesses.distances.tolist() == distances.tolist()


def test_reserve_option(rng):
    monitor = Monitor(0.1, reserve=5000)
    monitor.observe_batch(rng.random((10, 4)), rng.integers(0, 2, 10))
    assert monitor.index._store.capacity >= 5000
    with pytest.raises(OptionError, match="reserve"):
        Monitor(0.1, reserve=-1)
