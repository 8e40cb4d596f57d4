"""benchmarks/vnncomp.py's summary: rows from results files, and rows kept from the README's earlier table.

Results files are not part of the repository, so a summary written into the README from a fresh
checkout must keep the rows of the runs it has no file for, saying so, instead of turning them
into "not run".
"""

from __future__ import annotations

import importlib.util
import json
import sys
import time
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "vnncomp.py"


@pytest.fixture
def vnncomp(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(SCRIPT.parent))
    spec = importlib.util.spec_from_file_location("vnncomp_script", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    monkeypatch.setattr(module, "RESULTS", tmp_path / "results")
    yield module
    sys.modules.pop("vnncomp_script", None)


# Four instances, all "holds" by consensus; alpha_beta_crown solved rows 0-3, pyrat rows 0 and 1.
PUBLISHED = {"alpha_beta_crown": ["holds"] * 4, "pyrat": ["holds", "holds", "unknown", "unknown"]}


def _collection(tmp_path, names, collection_name="vnncomp2024"):
    collection = tmp_path / collection_name
    for name in names:
        folder = collection / name
        (folder / "published_results").mkdir(parents=True)
        (folder / "instances.csv").write_text("".join(f"net.onnx,p{i}.vnnlib,10\n" for i in range(4)))
        columns = "".join(f",{tool}_result,{tool}_time_s" for tool in PUBLISHED)
        (folder / "published_results" / "per_instance_wide.csv").write_text(
            f"idx,onnx,vnnlib,timeout_s,consensus{columns}\n" + "".join(
                f"{i},net.onnx,p{i}.vnnlib,10,holds" + "".join(f",{PUBLISHED[t][i]},1.0" for t in PUBLISHED) + "\n"
                for i in range(4)))
    return collection


def _results(module, name, verdicts, file_name=None, scale=1.0, complete=True, benchmark=None):
    """A results file of ``name`` with assay's verdict per instance index (``{0: "holds", 2: "timeout"}``)."""
    module.RESULTS.mkdir(parents=True, exist_ok=True)
    records = [{"index": i, "network": "net.onnx", "property": f"p{i}.vnnlib", "timeout": 10 * scale,
                "consensus": "holds", "consensus_cell": "holds", "assay": verdict, "seconds": 1.0, "error": None,
                "disagrees": False, "minority": False} for i, verdict in verdicts.items()]
    run = {"benchmark": benchmark or name, "complete": complete, "timeout_scale": scale, "total_instances": 4,
           "records": records}
    (module.RESULTS / f"{file_name or 'vnncomp2024_' + name}.json").write_text(json.dumps(run))


def test_a_benchmark_without_results_keeps_its_earlier_row_and_says_so(vnncomp, tmp_path):
    collection = _collection(tmp_path, ["fresh", "kept", "never"])
    _results(vnncomp, "fresh", {0: "holds", 1: "holds", 2: "holds", 3: "timeout"})
    earlier = {
        "fresh": ["fresh", "4 / 4", "1 (1 h, 0 v)", "4 (alpha_beta_crown)", "2 (pyrat)", "0", "–"],
        "kept": ["kept", "6 / 19", "3 (0 h, 3 v)", "6 (alpha_beta_crown)", "6 (neuralsat)", "0", "timeouts × 0.1"],
        "never": ["never", "not run", "–", "–", "–", "–", "–"],
    }
    table, payload = vnncomp.summary(collection, earlier)
    lines = {line.split("|")[1].strip(): line for line in table.splitlines() if line.startswith("| ")}
    assert "3 (3 h, 0 v)" in lines["fresh"] and "1 (1 h" not in lines["fresh"]  # the results file wins
    assert "3 (0 h, 3 v)" in lines["kept"] and vnncomp.EARLIER_RUN in lines["kept"]
    assert "timeouts × 0.1" in lines["kept"]
    assert "not run" in lines["never"]
    assert set(payload["benchmarks"]) == {"fresh"}  # kept rows are not results of this run

    # Writing the table again keeps the row as it is (the note is not prefixed twice).
    again = {name: cells for name, cells in ((line.split("|")[1].strip(),
             [c.strip() for c in line.strip().strip("|").split("|")]) for line in lines.values())}
    second, _ = vnncomp.summary(collection, again)
    assert second == table


def test_without_earlier_rows_a_benchmark_without_results_is_not_run(vnncomp, tmp_path):
    collection = _collection(tmp_path, ["kept"])
    table, _ = vnncomp.summary(collection)
    assert "| kept | not run |" in table


def test_runs_of_one_benchmark_merge_with_the_latest_verdict_per_instance(vnncomp, tmp_path):
    collection = _collection(tmp_path, ["yolo"])
    _results(vnncomp, "yolo", {0: "holds", 1: "timeout"}, file_name="first", scale=0.5)
    time.sleep(0.01)
    _results(vnncomp, "yolo", {1: "holds", 2: "timeout"}, file_name="second")
    table, payload = vnncomp.summary(collection)
    row = next(line for line in table.splitlines() if line.startswith("| yolo "))
    cells = [cell.strip() for cell in row.strip().strip("|").split("|")]
    # rows 0 (first run), 1 (second run replaces its timeout) and 2: two solved of three run
    assert cells[1:5] == ["3 / 4", "2 (2 h, 0 v)", "3 (alpha_beta_crown)", "2 (pyrat)"]
    assert "2 runs merged" in cells[-1] and "timeouts × 0.5 / 1" in cells[-1]
    assert payload["benchmarks"]["yolo"]["runs"] == ["first.json", "second.json"]

    # A later run that replaces every record of the first leaves the first out.
    time.sleep(0.01)
    _results(vnncomp, "yolo", {0: "timeout"}, file_name="third")
    _, payload = vnncomp.summary(collection)
    merged = payload["benchmarks"]["yolo"]
    assert merged["runs"] == ["second.json", "third.json"] and merged["assay"]["solved"] == 1
    assert merged["timeout_scales"] == [1.0]


def test_a_file_of_another_benchmark_or_instance_list_is_not_merged(vnncomp, tmp_path):
    collection = _collection(tmp_path, ["yolo", "other"])
    _results(vnncomp, "yolo", {0: "holds"}, file_name="mine")
    _results(vnncomp, "other", {1: "holds", 2: "holds"}, file_name="theirs")  # another benchmark
    _results(vnncomp, "yolo", {3: "holds"}, file_name="stale")
    stale = vnncomp.RESULTS / "stale.json"
    payload = json.loads(stale.read_text())
    payload["records"][0]["property"] = "renamed.vnnlib"  # an older instances.csv
    stale.write_text(json.dumps(payload))
    (vnncomp.RESULTS / "broken.json").write_text("{not json")
    _, payload = vnncomp.summary(collection)
    assert payload["benchmarks"]["yolo"]["runs"] == ["mine.json"]
    assert payload["benchmarks"]["yolo"]["instances"] == 1
    assert payload["benchmarks"]["other"]["assay"]["solved"] == 2
