"""Monitor semantics and operations: batches, windows, caps, count-only, errors that keep state, checkpoints."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import assay.monitor
from assay.errors import DataError, OptionError
from assay.monitor import BACKENDS, Monitor, Witnesses, load_checkpoint
from tests.monitor.oracle import oracle_witnesses
from tests.monitor.strategies import streams

FAST = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def test_public_surface_is_pinned():
    assert sorted(assay.monitor.__all__) == sorted([
        "Monitor", "MonitorConfig", "MonitorStats", "Witnesses", "FrnnIndex", "BACKENDS",
        "choose_backend", "make_index", "save_checkpoint", "load_checkpoint",
    ])


def test_closed_ball_and_label_filter():
    monitor = Monitor(0.5, "linf")
    assert monitor.observe([0.0, 0.0], 1).count == 0
    assert monitor.observe([0.5, -0.5], 1).count == 0  # close but same label
    hit = monitor.observe([0.5, 0.0], 0)  # d = 0.5 to decision 0 (tie at ε), 0.5 to decision 1
    assert hit.ids.tolist() == [0, 1] and hit.distances.tolist() == [0.5, 0.5] and hit.flagged
    assert monitor.observe([2.0, 2.0], 7).count == 0
    assert monitor.stats.to_json() == {"decisions": 4, "pairs": 2, "flagged": 1}


@pytest.mark.parametrize("backend", list(BACKENDS))
@FAST
@given(stream=streams(metrics=("linf",)))
def test_batch_equals_one_at_a_time(backend, stream):
    X, Y, epsilon, metric = stream
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


@pytest.mark.parametrize("backend", list(BACKENDS))
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
        Monitor(0.1, "l2", index="grid")
    with pytest.raises(OptionError, match="output"):
        Monitor(0.1, output="probabilities")
    with pytest.raises(DataError, match="zero vector"):
        Monitor(0.1, "cosine").observe([0.0, 0.0], 1)


def test_string_and_mixed_labels():
    monitor = Monitor(1.0)
    monitor.observe_batch([[0.0], [0.1]], ["yes", "no"])
    assert monitor.observe([0.2], 1).ids.tolist() == [0, 1]
    assert monitor.observe([0.3], 1.0).ids.tolist() == [0, 1]  # 1 == 1.0: the same label


@pytest.mark.parametrize("backend", list(BACKENDS))
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
