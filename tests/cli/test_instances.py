"""assay verify --instances: CSV parsing, relative and absolute paths, results CSV, errors kept per row."""

from __future__ import annotations

import csv
import json
import os

import pytest

from assay.errors import DataError
from assay.run.vnncomp import read_instances
from tests.requirements import require


def read_results(path):
    with open(path, newline="") as handle:
        return list(csv.DictReader(handle))


def test_instances_with_relative_and_absolute_paths(invoke, tiny, tmp_path):
    instances = tmp_path / "instances.csv"
    instances.write_text(f"tiny.onnx,holds.vnnlib,30\n{tiny['model']},{tiny['violated']},30\n")
    out = tmp_path / "results" / "out.csv"
    result = invoke("verify", "--instances", instances, "--workers", 1, "--out", out)
    assert result.exit_code == 0, result.output
    assert "holds" in result.stdout and "violated" in result.stdout and "total" in result.stdout
    rows = read_results(out)
    assert [row["status"] for row in rows] == ["holds", "violated"]
    assert rows[0]["network"] == "tiny.onnx" and rows[1]["network"] == str(tiny["model"])
    assert rows[0]["counterexample"] == "" and len(json.loads(rows[1]["counterexample"])["input"]) == 2
    assert float(rows[0]["timeout"]) == 30 and float(rows[0]["seconds"]) > 0


def test_instances_json_summary_and_a_bad_row_that_does_not_stop_the_others(invoke, tiny, tmp_path):
    instances = tmp_path / "instances.csv"
    instances.write_text("network,property,timeout\ntiny.onnx,missing.vnnlib,30\ntiny.onnx,violated.vnnlib,30\n")
    result = invoke("verify", "--instances", instances, "--workers", 1, "--json")
    assert result.exit_code == 2, result.output  # one instance could not be run
    payload = json.loads(result.stdout)
    assert payload["summary"]["counts"] == {"holds": 0, "violated": 1, "unknown": 0, "timeout": 0, "error": 1}
    first, second = payload["results"]
    assert first["status"] == "error" and "missing.vnnlib" in first["error"]
    assert second["status"] == "violated"


def test_instances_on_a_process_pool(invoke, tiny, tmp_path):
    instances = tmp_path / "instances.csv"
    instances.write_text("tiny.onnx,holds.vnnlib,30\ntiny.onnx,violated.vnnlib,30\n")
    result = invoke("verify", "--instances", instances, "--workers", 2, "--json")
    assert result.exit_code == 0, result.output
    assert [row["status"] for row in json.loads(result.stdout)["results"]] == ["holds", "violated"]


def test_instances_cannot_be_combined_with_workers_and_scheduler(invoke, tmp_path):
    instances = tmp_path / "instances.csv"
    instances.write_text("a.onnx,b.vnnlib,1\n")
    result = invoke("verify", "--instances", instances, "--workers", 2, "--scheduler", "tcp://127.0.0.1:1")
    assert result.exit_code == 2 and "not both" in result.stderr


def test_instances_csv_errors(tmp_path):
    path = tmp_path / "instances.csv"
    with pytest.raises(DataError, match="no such file; pass the path of an instances CSV"):
        read_instances(path)
    path.write_text("network,property,timeout\n")  # a header alone
    with pytest.raises(DataError, match="no instances"):
        read_instances(path)
    path.write_text("a.onnx,b.vnnlib,1\nc.onnx,d.vnnlib,soon\n")
    with pytest.raises(DataError, match="line 2: the timeout 'soon' is not a number"):
        read_instances(path)
    path.write_text("a.onnx\n")
    with pytest.raises(DataError, match="line 1: expected `network,property,timeout`"):
        read_instances(path)
    path.write_text("a.onnx,b.vnnlib\n")
    with pytest.raises(DataError, match="no timeout"):
        read_instances(path)
    assert read_instances(path, default_timeout=7)[0].timeout == 7


def test_instances_paths_resolve_against_the_csv_folder(tmp_path):
    path = tmp_path / "bench" / "instances.csv"
    path.parent.mkdir()
    path.write_text("# comment\nnets/a.onnx,/abs/p.vnnlib,12.5\n\n")
    (instance,) = read_instances(path)
    assert instance.network_path == tmp_path / "bench" / "nets" / "a.onnx"
    assert str(instance.property_path) == "/abs/p.vnnlib"
    assert instance.timeout == 12.5 and instance.line == 2


@pytest.mark.data
def test_acasxu_instances_csv(invoke, data_dir, tmp_path):
    folder = data_dir / "acasxu"
    instances = tmp_path / "instances.csv"
    # One row by absolute path, one relative to the CSV's folder.
    relative = os.path.relpath(folder / "ACASXU_run2a_2_1_batch_2000.onnx", tmp_path)
    instances.write_text(
        f"{folder / 'ACASXU_run2a_1_1_batch_2000.onnx'},{folder / 'prop_1.vnnlib'},60\n"
        f"{relative},{folder / 'prop_2.vnnlib'},60\n"
    )
    out = tmp_path / "results.csv"
    result = invoke("verify", "--instances", instances, "--workers", 1, "--out", out)
    assert result.exit_code == 0, result.output
    assert [row["status"] for row in read_results(out)] == ["holds", "violated"]


def test_instances_on_a_dask_cluster(invoke, tiny, tmp_path):
    distributed = require("distributed")
    instances = tmp_path / "instances.csv"
    instances.write_text("tiny.onnx,holds.vnnlib,30\ntiny.onnx,violated.vnnlib,30\n")
    with distributed.LocalCluster(n_workers=1, threads_per_worker=1, processes=False, protocol="tcp",
                                  host="127.0.0.1", dashboard_address=None) as cluster:
        result = invoke("verify", "--instances", instances, "--scheduler", cluster.scheduler_address, "--json")
    assert result.exit_code == 0, result.output
    assert [row["status"] for row in json.loads(result.stdout)["results"]] == ["holds", "violated"]
