"""benchmarks/vnncomp.py's summary: rows from results files, and rows kept from the README's earlier table.

Results files are not part of the repository, so a summary written into the README from a fresh
checkout must keep the rows of the runs it has no file for, saying so, instead of turning them
into "not run".
"""

from __future__ import annotations

import importlib.util
import json
import sys
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


def _collection(tmp_path, names):
    collection = tmp_path / "vnncomp2024"
    for name in names:
        (collection / name).mkdir(parents=True)
        (collection / name / "instances.csv").write_text("a.onnx,b.vnnlib,10\n")
    return collection


def _results(module, name, solved):
    module.RESULTS.mkdir(parents=True, exist_ok=True)
    run = {"complete": True, "instances": 4, "total_instances": 40, "timeout_scale": 1.0, "errors": [],
           "assay": {"solved": solved, "holds": solved, "violated": 0, "error": 0},
           "best_published": {"tool": "alpha_beta_crown", "correct": 4},
           "second_published": {"tool": "pyrat", "correct": 2}, "disagreements": []}
    (module.RESULTS / f"vnncomp2024_{name}.json").write_text(json.dumps(run))


def test_a_benchmark_without_results_keeps_its_earlier_row_and_says_so(vnncomp, tmp_path):
    collection = _collection(tmp_path, ["fresh", "kept", "never"])
    _results(vnncomp, "fresh", 3)
    earlier = {
        "fresh": ["fresh", "4 / 40", "1 (1 h, 0 v)", "4 (alpha_beta_crown)", "2 (pyrat)", "0", "–"],
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
