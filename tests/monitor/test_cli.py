"""``assay monitor`` end to end: formats, stdin, summary keys, witness file, errors with exit code 2."""

from __future__ import annotations

import json

import numpy as np
import pytest
import typer
from typer.testing import CliRunner

from assay.cli.monitor_cmd import monitor
from tests.monitor.oracle import oracle_witnesses
from tests.requirements import require

app = typer.Typer()
app.command()(monitor)
runner = CliRunner()

STREAM = "prediction,label,a,b\n1,0,0.0,0.0\n0,0,0.1,0.0\n1,1,0.9,0.9\n0,1,0.3,0.1\n1,0,0.2,0.05\n"


def run(*args, stdin=None):
    return runner.invoke(app, [str(a) for a in args], input=stdin)


def test_csv_summary_and_witness_file(tmp_path):
    stream = tmp_path / "stream.csv"
    stream.write_text(STREAM)
    out = tmp_path / "witnesses.jsonl"
    result = run(stream, "--epsilon", 0.1, "--drop", "label", "--out", out, "--json", "--batch-size", 2)
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    X = np.array([[0, 0], [0.1, 0], [0.9, 0.9], [0.3, 0.1], [0.2, 0.05]])
    Y = [1, 0, 1, 0, 1]
    expected = oracle_witnesses(X, Y, 0.1)
    assert summary["decisions"] == 5
    assert summary["pairs"] == sum(ids.size for ids, _ in expected)
    assert summary["flagged"] == sum(ids.size > 0 for ids, _ in expected)
    assert {"latency_ms_p50", "latency_ms_p99", "peak_memory_mb"} <= set(summary)
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert [(r["decision"], r["ids"]) for r in records] == [(i, ids.tolist()) for i, (ids, _) in enumerate(expected) if ids.size]
    assert records[0]["line"] == records[0]["decision"] + 2


def test_stdin_and_human_summary():
    result = run("-", "--epsilon", 0.1, "--drop", "label", stdin=STREAM)
    assert result.exit_code == 0, result.output
    assert "violating pairs" in result.stdout and "flagged" in result.stdout and "p99" in result.stdout


def test_json_lines_stream(tmp_path):
    stream = tmp_path / "stream.jsonl"
    lines = [dict(zip(["prediction", "label", "a", "b"], map(float, row.split(",")))) for row in STREAM.splitlines()[1:]]
    stream.write_text("\n".join(json.dumps(r) for r in lines))
    result = run(stream, "--epsilon", 0.1, "--drop", "label", "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["decisions"] == 5


def test_parquet_stream(tmp_path):
    pa = require("pyarrow")
    import pyarrow.parquet as pq

    table = pa.table({"prediction": [1, 0], "a": [0.0, 0.05]})
    pq.write_table(table, tmp_path / "s.parquet")
    result = run(tmp_path / "s.parquet", "--epsilon", 0.1, "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["pairs"] == 1


@pytest.mark.parametrize(
    "text,args,message",
    [
        (STREAM, ["--drop", "lbl"], "no column 'lbl' to drop"),
        (STREAM, ["--decision-column", "decision"], "no decision column 'decision'"),
        (STREAM.replace("0.3,0.1", "nan,0.1"), ["--drop", "label"], "line 5: NaN .* column 'a'"),
        (STREAM.replace("0.3,0.1", "high,0.1"), ["--drop", "label"], "line 5: 'high' in column 'a'"),
        (STREAM, ["--metric", "hamming"], "metric"),
        ("", [], "empty"),
    ],
)
def test_errors_exit_2_with_one_line(tmp_path, text, args, message):
    stream = tmp_path / "stream.csv"
    stream.write_text(text)
    result = run(stream, "--epsilon", 0.1, *args)
    assert result.exit_code == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ")
    import re

    assert re.search(message, lines[0]), lines[0]


def test_missing_file():
    result = run("/nonexistent/stream.csv", "--epsilon", 0.1)
    assert result.exit_code == 2 and "does not exist" in result.stderr


def test_checkpoint_option(tmp_path):
    stream = tmp_path / "stream.csv"
    stream.write_text(STREAM)
    result = run(stream, "--epsilon", 0.1, "--drop", "label", "--checkpoint", tmp_path / "state.npz", "--json")
    assert result.exit_code == 0, result.output
    from assay.monitor import load_checkpoint

    assert load_checkpoint(tmp_path / "state.npz").stats.decisions == 5


def test_html_report(tmp_path):
    stream = tmp_path / "stream.csv"
    stream.write_text(STREAM)
    report = tmp_path / "report.html"
    result = run(stream, "--epsilon", 0.1, "--drop", "label", "--report", report, "--json", "--batch-size", 1)
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    assert summary["report"] == str(report)
    page = report.read_text()
    assert page.startswith("<!DOCTYPE html>") and "</html>" in page
    assert "<svg" in page and "p99" in page  # the latency histogram and percentiles, inline
    assert "src=" not in page and "href=" not in page  # self-contained: no external assets
    # the most-witnessed flagged decision is listed first: decision 4 has witnesses 1 and 3
    expected = oracle_witnesses(np.array([[0, 0], [0.1, 0], [0.9, 0.9], [0.3, 0.1], [0.2, 0.05]]), [1, 0, 1, 0, 1], 0.1)
    top = max(range(5), key=lambda i: (expected[i][0].size, -i))
    table = page.split("Most-witnessed flagged decisions")[1]
    assert f"<tr><td>{top}</td>" in table


def test_report_unwritable_is_an_error(tmp_path):
    stream = tmp_path / "stream.csv"
    stream.write_text(STREAM)
    result = run(stream, "--epsilon", 0.1, "--drop", "label", "--report", tmp_path / "missing-folder" / "r.html")
    assert result.exit_code == 2 and "cannot write the report" in result.stderr
