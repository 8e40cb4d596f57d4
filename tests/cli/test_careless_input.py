"""Issue 33, the command line as a careless user meets it: a CSV that is not UTF-8, one bad row in a
batch, a header that does not name the features, and torch's warning on float64 ONNX models."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from tests.cli.models import write_logit_onnx

REPO_ROOT = Path(__file__).resolve().parents[2]


def error_lines(result) -> list[str]:
    return [line for line in result.stderr.splitlines() if line.startswith("error:")]


def write_float64_matmul_add(path: Path) -> Path:
    """x (1, 2) → MatMul(W) → Add(b) → y (1, 2), every tensor float64."""
    initializers = [numpy_helper.from_array(np.array([[1.0, -1.0], [0.5, 2.0]]), "W"),
                    numpy_helper.from_array(np.array([0.1, -0.2]), "b")]
    nodes = [helper.make_node("MatMul", ["input", "W"], ["z"]), helper.make_node("Add", ["z", "b"], ["output"])]
    graph = helper.make_graph(nodes, "f64", [helper.make_tensor_value_info("input", TensorProto.DOUBLE, [1, 2])],
                              [helper.make_tensor_value_info("output", TensorProto.DOUBLE, [1, 2])], initializers)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]), str(path))
    return path


# ------------------------------------------------------------------ a CSV that is not UTF-8
def test_a_latin1_csv_is_one_error_naming_the_file_and_the_line(invoke, tmp_path):
    model = write_logit_onnx(tmp_path / "logit.onnx")
    rows = tmp_path / "latin1.csv"
    rows.write_bytes("a,b\n0.2,0.3\n0.4,0.5\nrésumé,0.1\n".encode("latin-1"))
    result = invoke("cfx", model, "--inputs", rows)
    assert result.exit_code == 2, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    (line,) = error_lines(result)
    assert str(rows) in line and "line 4" in line and "UTF-8" in line


def test_random_bytes_named_csv_are_one_error(invoke, tmp_path):
    model = write_logit_onnx(tmp_path / "logit.onnx")
    rows = tmp_path / "random.csv"
    rows.write_bytes(bytes(np.random.default_rng(3).integers(0, 256, 600, dtype=np.uint8)))
    result = invoke("cfx", model, "--inputs", rows)
    assert result.exit_code == 2, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    (line,) = error_lines(result)
    assert str(rows) in line


# ------------------------------------------------------------------ one bad row in a batch
def test_one_out_of_range_row_is_reported_and_the_others_are_kept(invoke, tmp_path):
    model = write_logit_onnx(tmp_path / "logit.onnx")
    rows = tmp_path / "rows.csv"
    rows.write_text("a,b\n0.2,0.3\n1.5,0.1\n0.4,0.4\n")
    result = invoke("cfx", model, "--inputs", rows, "--json")
    assert result.exit_code == 2, result.output
    (line,) = error_lines(result)
    assert str(rows) in line and "line 3" in line and "1.5" in line
    payload = json.loads(result.stdout)
    assert [r["row"] for r in payload["results"]] == [1, 3]
    assert [r["line"] for r in payload["results"]] == [2, 4]
    assert all(r["counterfactual"]["x_cf"] is not None for r in payload["results"])
    assert [(e["row"], e["line"]) for e in payload["errors"]] == [(2, 3)]


def test_the_text_summary_counts_the_bad_rows(invoke, tmp_path):
    model = write_logit_onnx(tmp_path / "logit.onnx")
    rows = tmp_path / "rows.csv"
    rows.write_text("a,b\n0.2,0.3\nnan,0.1\n\n0.4,oops\n0.4,0.4\n")
    result = invoke("cfx", model, "--inputs", rows)
    assert result.exit_code == 2, result.output
    errors = error_lines(result)
    assert len(errors) == 2 and "line 3" in errors[0] and "line 5" in errors[1]
    assert "input 1:" in result.stdout and "input 4:" in result.stdout
    assert "2/2 inputs have a counterfactual" in result.stdout and "2 bad rows" in result.stdout


def test_stop_on_error_stops_at_the_first_bad_row_and_keeps_what_came_before(invoke, tmp_path):
    model = write_logit_onnx(tmp_path / "logit.onnx")
    rows = tmp_path / "rows.csv"
    rows.write_text("a,b\n0.2,0.3\n1.5,0.1\n0.4,0.4\n")
    result = invoke("cfx", model, "--inputs", rows, "--json", "--stop-on-error")
    assert result.exit_code == 2, result.output
    assert len(error_lines(result)) == 1
    payload = json.loads(result.stdout)
    assert [r["row"] for r in payload["results"]] == [1] and payload["stopped_at"] == 3


# ------------------------------------------------------------------ a header that does not name the features
def _named_spec(tmp_path: Path) -> Path:
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps({"size": 2, "names": ["age", "income"]}))
    return spec


def test_a_header_that_does_not_name_the_features_is_an_error_listing_both(invoke, tmp_path):
    model = write_logit_onnx(tmp_path / "logit.onnx")
    rows = tmp_path / "rows.csv"
    rows.write_text("income,agex\n0.2,0.3\n")
    result = invoke("cfx", model, "--inputs", rows, "--features", _named_spec(tmp_path))
    assert result.exit_code == 2, result.output
    (line,) = error_lines(result)
    assert str(rows) in line and "income, agex" in line and "age, income" in line and "--positional" in line


def test_positional_reads_the_columns_in_order_when_asked(invoke, tmp_path):
    model = write_logit_onnx(tmp_path / "logit.onnx")
    rows = tmp_path / "rows.csv"
    rows.write_text("income,agex\n0.2,0.3\n")
    result = invoke("cfx", model, "--inputs", rows, "--features", _named_spec(tmp_path), "--positional", "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["results"][0]["counterfactual"]["x"] == [0.2, 0.3]


def test_a_header_in_another_order_is_read_by_name(invoke, tmp_path):
    model = write_logit_onnx(tmp_path / "logit.onnx")
    rows = tmp_path / "rows.csv"
    rows.write_text("id,income,age\n7,0.2,0.3\n")
    result = invoke("cfx", model, "--inputs", rows, "--features", _named_spec(tmp_path), "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["results"][0]["counterfactual"]["x"] == [0.3, 0.2]


# ------------------------------------------------------------------ float64 ONNX: no torch warning
def test_a_float64_matmul_add_model_loads_without_a_warning(tmp_path):
    """In a fresh process: torch prints this warning once per process, so an in-process test could pass by luck."""
    model = write_float64_matmul_add(tmp_path / "f64.onnx")
    done = subprocess.run([sys.executable, "-W", "default", "-m", "assay.cli.main", "info", str(model)],
                          capture_output=True, text=True, timeout=120, cwd=REPO_ROOT)
    assert done.returncode == 0, done.stderr
    assert "Linear" in done.stdout
    assert "Warning" not in done.stderr and "not writable" not in done.stderr, done.stderr


# ------------------------------------------------------------------ knn-fairness --test is a batch too
def _knn_files(tmp_path: Path, test_text: str) -> tuple[Path, Path]:
    rng = np.random.default_rng(5)
    X = rng.integers(0, 4, size=(30, 2))
    train = tmp_path / "train.csv"
    train.write_text("a,b,y\n" + "".join(f"{a},{b},{int(a + b > 3)}\n" for a, b in X))
    test = tmp_path / "test.csv"
    test.write_text(test_text)
    return train, test


def test_knn_bad_test_rows_are_reported_and_the_others_certified(invoke, tmp_path):
    train, test = _knn_files(tmp_path, "a,b\n1,2\n1,x\n3,3\nnan,1\n0,0\n")
    result = invoke("knn-fairness", train, "--label", "y", "--flips", 1, "--test", test, "--k", "3", "--folds", 3,
                    "--json")
    assert result.exit_code == 2, result.output
    errors = error_lines(result)
    assert len(errors) == 2 and "line 3" in errors[0] and "'x'" in errors[0] and "line 5" in errors[1]
    payload = json.loads(result.stdout)
    assert [c["line"] for c in payload["certificates"]] == [2, 4, 6]
    assert [e["line"] for e in payload["errors"]] == [3, 5]


def test_knn_stop_on_error_certifies_the_rows_before_the_first_bad_one(invoke, tmp_path):
    train, test = _knn_files(tmp_path, "a,b\n1,2\n1,x\n3,3\n")
    result = invoke("knn-fairness", train, "--label", "y", "--flips", 1, "--test", test, "--k", "3", "--folds", 3,
                    "--json", "--stop-on-error")
    assert result.exit_code == 2, result.output
    assert len(error_lines(result)) == 1
    assert [c["line"] for c in json.loads(result.stdout)["certificates"]] == [2]


# ------------------------------------------------------------------ verify --instances: malformed rows
def test_instances_malformed_rows_are_reported_and_the_others_run(invoke, tiny, tmp_path):
    instances = tmp_path / "instances.csv"
    instances.write_text("tiny.onnx,holds.vnnlib,30\ntiny.onnx,holds.vnnlib,soon\nonly-one-column\n"
                         "tiny.onnx,missing.vnnlib,30\ntiny.onnx,violated.vnnlib,30\n")
    result = invoke("verify", "--instances", instances, "--workers", 1, "--json")
    assert result.exit_code == 2, result.output
    errors = error_lines(result)
    assert len(errors) == 3 and all(str(instances) in line for line in errors)
    assert "line 2" in errors[0] and "'soon'" in errors[0] and "line 3" in errors[1]
    assert "line 4" in errors[2] and "missing.vnnlib" in errors[2]
    payload = json.loads(result.stdout)
    assert [row["status"] for row in payload["results"]] == ["holds", "error", "violated"]
    assert [e["line"] for e in payload["errors"]] == [2, 3]


@pytest.mark.parametrize(("second_row", "named"), [
    ("tiny.onnx,holds.vnnlib,-1", ["instances.csv", "line 2"]),  # a malformed row: only the rows before it run
    ("tiny.onnx,missing.vnnlib,30", ["instances.csv", "line 2", "missing.vnnlib"]),  # cannot be read: the rest is cancelled
])
def test_instances_stop_on_error_stops_at_the_first_bad_row(invoke, tiny, tmp_path, second_row, named):
    instances = tmp_path / "instances.csv"
    instances.write_text(f"tiny.onnx,holds.vnnlib,30\n{second_row}\ntiny.onnx,violated.vnnlib,30\n")
    out = tmp_path / "out.csv"
    result = invoke("verify", "--instances", instances, "--workers", 1, "--out", out, "--stop-on-error")
    assert result.exit_code == 2, result.output
    (line,) = error_lines(result)
    assert all(part in line for part in named), line
    assert out.read_text().count("\n") == 2  # the header and the one instance before the bad row


# ------------------------------------------------------------------ monitor: bad rows of a stream
STREAM = "prediction,a,b\n1,0.0,0.0\n0,oops,0.0\n0,0.05,0.0\n1,nan,0.0\n1,0.5,0.5\n"


def test_monitor_reports_bad_rows_and_monitors_the_others(invoke, tmp_path):
    stream = tmp_path / "stream.csv"
    stream.write_text(STREAM)
    witnesses = tmp_path / "w.jsonl"
    result = invoke("monitor", stream, "--epsilon", 0.1, "--json", "--out", witnesses)
    assert result.exit_code == 2, result.output
    errors = error_lines(result)
    assert len(errors) == 2 and "line 3" in errors[0] and "'oops'" in errors[0] and "line 5" in errors[1]
    summary = json.loads(result.stdout)
    assert summary["decisions"] == 3 and summary["pairs"] == 1 and summary["bad_rows"] == 2
    assert [json.loads(line)["line"] for line in witnesses.read_text().splitlines()] == [4]  # lines, not positions


def test_monitor_jsonl_lines_that_are_not_json_are_bad_rows(invoke, tmp_path):
    stream = tmp_path / "stream.jsonl"
    stream.write_text('{"prediction": 1, "a": 0.0}\n{"prediction": 0, "a": \n[1, 2]\n{"prediction": 0, "a": 0.05}\n')
    result = invoke("monitor", stream, "--epsilon", 0.1, "--json")
    assert result.exit_code == 2, result.output
    errors = error_lines(result)
    assert len(errors) == 2 and "line 2" in errors[0] and "line 3" in errors[1]
    assert json.loads(result.stdout)["pairs"] == 1


def test_monitor_stop_on_error_ends_at_the_first_bad_row_with_the_summary(invoke, tmp_path):
    stream = tmp_path / "stream.csv"
    stream.write_text(STREAM)
    result = invoke("monitor", stream, "--epsilon", 0.1, "--stop-on-error")
    assert result.exit_code == 2, result.output
    assert len(error_lines(result)) == 1
    assert "decisions       1" in result.stdout and "stopped at line 3" in result.stdout
