"""monitor_stream, the driver behind `assay monitor`, at its library home (the CLI tests' cases, and more)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from assay.errors import DataError, OptionError
from assay.monitor import StreamRun, load_checkpoint, monitor_stream
from tests.monitor.oracle import oracle_witnesses

STREAM = "prediction,label,a,b\n1,0,0.0,0.0\n0,0,0.1,0.0\n1,1,0.9,0.9\n0,1,0.3,0.1\n1,0,0.2,0.05\n"
X = np.array([[0, 0], [0.1, 0], [0.9, 0.9], [0.3, 0.1], [0.2, 0.05]])
Y = [1, 0, 1, 0, 1]
SUMMARY_KEYS = ["stream", "decisions", "pairs", "flagged", "epsilon", "metric", "index", "latency_ms_p50",
                "latency_ms_p99", "latency_ms_mean", "batch_size", "seconds", "peak_memory_mb", "interrupted",
                "witnesses_file", "bad_rows", "stopped_at"]


@pytest.fixture
def stream(tmp_path):
    path = tmp_path / "stream.csv"
    path.write_text(STREAM)
    return path


@pytest.mark.parametrize("batch_size", [1, 2, 256])
def test_counts_witness_file_and_summary(stream, tmp_path, batch_size):
    out = tmp_path / "witnesses.jsonl"
    run = monitor_stream(str(stream), 0.1, drop=("label",), witnesses_out=out, batch_size=batch_size)
    expected = oracle_witnesses(X, Y, 0.1)
    assert isinstance(run, StreamRun) and not run.interrupted
    assert run.decisions == 5 and run.pairs == sum(ids.size for ids, _ in expected)
    assert run.flagged == sum(ids.size > 0 for ids, _ in expected)
    assert run.latencies.shape == (5,) and (run.latencies >= 0).all() and run.top_flagged == ()
    summary = run.to_json()
    assert list(summary) == SUMMARY_KEYS and json.loads(json.dumps(summary)) == summary
    assert summary["witnesses_file"] == str(out) and summary["batch_size"] == batch_size and summary["index"] == "scan"  # five decisions: the numpy scan
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert [(r["decision"], r["ids"]) for r in records] == [(i, ids.tolist()) for i, (ids, _) in enumerate(expected) if ids.size]
    assert all(r["line"] == r["decision"] + 2 for r in records)


def test_stdin_jsonl_and_keep_top(tmp_path):
    import io

    run = monitor_stream("-", 0.1, drop=("label",), stdin=io.StringIO(STREAM), keep_top=2, batch_size=1)
    expected = oracle_witnesses(X, Y, 0.1)
    ranked = sorted(range(5), key=lambda i: (-expected[i][0].size, i))[:2]
    assert [r["decision"] for r in run.top_flagged] == ranked
    assert all(r["decision_value"] == Y[r["decision"]] for r in run.top_flagged)
    lines = tmp_path / "s.jsonl"
    rows = [dict(zip(["prediction", "label", "a", "b"], map(float, row.split(",")))) for row in STREAM.splitlines()[1:]]
    lines.write_text("\n".join(json.dumps(r) for r in rows))
    assert monitor_stream(str(lines), 0.1, drop=("label",)).decisions == 5


def test_checkpoint_and_options(stream, tmp_path):
    run = monitor_stream(str(stream), 0.1, "l2", drop=("label",), checkpoint=tmp_path / "state.npz", index="brute",
                         max_history=2, max_witnesses=1)
    restored = load_checkpoint(tmp_path / "state.npz")
    assert restored.stats.decisions == run.decisions == 5 and restored.config.max_history == 2
    assert run.index == "brute" and run.metric == "l2"


def test_ctrl_c_keeps_what_was_monitored(stream, tmp_path):
    seen = []

    def progress(count, flagged):
        seen.append((count, flagged))
        if len(seen) == 2:
            raise KeyboardInterrupt

    run = monitor_stream(str(stream), 0.1, drop=("label",), batch_size=2, progress=progress,
                         checkpoint=tmp_path / "state.npz")
    assert run.interrupted and run.decisions == 4 and [count for count, _ in seen] == [2, 2]
    assert load_checkpoint(tmp_path / "state.npz").stats.decisions == 4


def test_bad_input_and_options(stream, tmp_path):
    with pytest.raises(DataError, match="no column 'lbl' to drop"):
        monitor_stream(str(stream), 0.1, drop=("lbl",))
    bad = tmp_path / "bad.csv"
    bad.write_text(STREAM.replace("0.3,0.1", "nan,0.1"))
    out = tmp_path / "w.jsonl"
    with pytest.raises(DataError, match="line 5: NaN .* column 'a'"):
        monitor_stream(str(bad), 0.1, drop=("label",), batch_size=1, witnesses_out=out)
    assert len(out.read_text().splitlines()) == 1  # the witnesses found before the bad line stay written
    with pytest.raises(OptionError, match="batch_size"):
        monitor_stream(str(stream), 0.1, batch_size=0)
    with pytest.raises(OptionError, match="metric"):
        monitor_stream(str(stream), 0.1, "hamming")
    from assay.monitor import make_index

    with pytest.raises(OptionError, match="backend name"):
        monitor_stream(str(stream), 0.1, index=make_index("brute", 2, "linf", 0.1))
