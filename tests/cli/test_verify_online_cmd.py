"""assay verify-online: steps files, model updates, JSON, exit codes and the errors a steps file can have.

The tiny network (tests/cli/models.py) computes y0 = relu(x0) + relu(x1); with the unsafe region
y0 ≥ 2.5 the property holds on [0, u]² exactly while 2u < 2.5, so the verdict of every step is known.
"""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper

from assay.nn import load
from tests.cli.models import write_tiny_onnx, write_vnnlib

STEP_KEYS = {"line", "step", "status", "coverage", "counterexample", "leaves", "active", "reused", "skipped",
             "recomputed", "resplit", "rebuilt", "domains", "seconds", "reason"}


def _scaled_onnx(path, scale: float, hidden: int = 2):
    """The tiny network's architecture with y0 = scale·(relu(x0) + relu(x1)) (``hidden`` > 2: extra zero units)."""
    w1 = np.zeros((hidden, 2), dtype=np.float32)
    w1[0, 0] = w1[1, 1] = 1
    w2 = np.zeros((2, hidden), dtype=np.float32)
    w2[0, :2], w2[1, :2] = scale, -scale
    initializers = [numpy_helper.from_array(w1, "w1"), numpy_helper.from_array(np.zeros(hidden, np.float32), "b1"),
                    numpy_helper.from_array(w2, "w2"), numpy_helper.from_array(np.zeros(2, np.float32), "b2")]
    nodes = [helper.make_node("Gemm", ["input", "w1", "b1"], ["h"], transB=1), helper.make_node("Relu", ["h"], ["r"]),
             helper.make_node("Gemm", ["r", "w2", "b2"], ["output"], transB=1)]
    graph = helper.make_graph(nodes, "scaled", [helper.make_tensor_value_info("input", TensorProto.FLOAT, [1, 2])],
                              [helper.make_tensor_value_info("output", TensorProto.FLOAT, [1, 2])], initializers)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]), str(path))
    return path


def _steps(path, *lines):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join((line if isinstance(line, str) else json.dumps(line)) + "\n" for line in lines))
    return path


def _box(upper: float) -> dict:
    return {"lower": [0.0, 0.0], "upper": [upper, upper]}


@pytest.fixture
def online(tmp_path):
    """The tiny model and the property "y0 < 2.5 on [0, 1]²" (holds: y0 ≤ 2 there)."""
    return {"model": write_tiny_onnx(tmp_path / "tiny.onnx"), "prop": write_vnnlib(tmp_path / "p.vnnlib", "(>= Y_0 2.5)")}


def test_the_command_is_registered_with_help(invoke):
    assert "verify-online" in invoke("--help").stdout
    result = invoke("verify-online", "--help")
    assert result.exit_code == 0
    text = " ".join(result.stdout.split())
    for option in ("--steps", "--accelerations", "--max-leaves", "--timeout", "--method", "--json", "--out"):
        assert option in text
    assert "10 some step is violated" in text


def test_a_growing_box_that_holds_exits_0(invoke, online, tmp_path):
    steps = _steps(tmp_path / "steps.jsonl", _box(1.05), "", _box(1.1), {}, _box(1.2))
    result = invoke("verify-online", online["model"], online["prop"], "--steps", steps)
    assert result.exit_code == 0, result.output
    rows = [line.split() for line in result.stdout.splitlines() if line.split()[:1] in (["0"], ["1"], ["2"], ["3"], ["4"])]
    assert [row[:3] for row in rows] == [[str(t), "holds", "100.0%"] for t in range(5)]
    assert "5 steps: 5 holds" in " ".join(result.stdout.split())
    # From scratch: the same verdicts, every later step rebuilt (marked *).
    scratch = invoke("verify-online", online["model"], online["prop"], "--steps", steps, "--accelerations", "none",
                     "--json")
    assert scratch.exit_code == 0, scratch.output
    payload = json.loads(scratch.stdout)
    assert payload["accelerations"] == [] and [s["status"] for s in payload["steps"]] == ["holds"] * 5
    # Every step from scratch, also line 4, which keeps the box and the network.
    assert [s["rebuilt"] for s in payload["steps"]] == [True] * 5 and all(s["reused"] == 0 for s in payload["steps"])


def test_a_step_with_a_new_model_file(invoke, online, tmp_path):
    folder = tmp_path / "updates"  # relative model paths are resolved against the steps file's folder
    folder.mkdir()
    _scaled_onnx(folder / "net_1.onnx", 1.2)  # y0 ≤ 2.4 on [0, 1]²: holds
    _scaled_onnx(folder / "net_2.onnx", 1.5)  # y0 = 3 at (1, 1): violated
    steps = _steps(folder / "steps.jsonl", {"model": "net_1.onnx"}, _box(1.0) | {"model": "net_1.onnx"},
                   {"model": str(folder / "net_2.onnx")})
    result = invoke("verify-online", online["model"], online["prop"], "--steps", steps, "--json")
    assert result.exit_code == 10, result.output
    payload = json.loads(result.stdout)
    assert [s["status"] for s in payload["steps"]] == ["holds", "holds", "holds", "violated"]
    x = torch.tensor(payload["steps"][3]["counterexample"]["input"], dtype=torch.float64)
    assert ((x >= 0) & (x <= 1)).all()
    assert load(folder / "net_2.onnx").forward(x.reshape(1, 2))[0, 0] >= 2.5
    text = invoke("verify-online", online["model"], online["prop"], "--steps", steps)
    assert text.exit_code == 10
    assert "step 3 (line 3) violated" in text.stdout and "input  [" in text.stdout and "output [" in text.stdout


def test_json_output_shape_and_out_file(invoke, online, tmp_path):
    steps = _steps(tmp_path / "steps.jsonl", _box(1.1), _box(1.3))
    out = tmp_path / "steps.out.jsonl"
    result = invoke("verify-online", online["model"], online["prop"], "--steps", steps, "--json", "--out", out,
                    "--max-leaves", 64, "--timeout", 30, "--accelerations", "bmi,lb,rsr", "--method", "crown")
    assert result.exit_code == 10, result.output
    payload = json.loads(result.stdout)
    assert {"network", "property", "steps_file", "accelerations", "max_leaves", "timeout", "method", "summary",
            "steps"} <= set(payload)
    assert payload["accelerations"] == ["bmi", "lb", "rsr"] and payload["max_leaves"] == 64
    assert payload["timeout"] == 30 and payload["method"] == "crown"
    assert [set(step) for step in payload["steps"]] == [STEP_KEYS] * 3
    assert [step["line"] for step in payload["steps"]] == [None, 1, 2]
    assert [step["step"] for step in payload["steps"]] == [0, 1, 2]
    summary = payload["summary"]
    assert summary["status"] == "violated" and summary["first_violated"] == 2
    assert summary["counts"] == {"holds": 2, "violated": 1, "unknown": 0, "timeout": 0}
    assert summary["steps"] == summary["planned"] == 3 and summary["interrupted"] is False
    assert summary["seconds"] == pytest.approx(sum(step["seconds"] for step in payload["steps"]))
    written = [json.loads(line) for line in out.read_text().splitlines()]
    assert [row["status"] for row in written] == ["holds", "holds", "violated"]


@pytest.mark.parametrize("status", ["unknown", "timeout"])
def test_undecided_steps_exit_20(invoke, online, tmp_path, monkeypatch, status):
    import assay.verify.online as online_module
    from assay.verify import VerificationStatus

    real = online_module.OnlineVerifier

    class Undecided(real):
        def update(self, *args, **kwargs):
            step = super().update(*args, **kwargs)
            fake = dataclasses.replace(step, status=VerificationStatus(status), coverage=0.5)
            self.steps[-1] = fake
            return fake

    monkeypatch.setattr(online_module, "OnlineVerifier", Undecided)
    result = invoke("verify-online", online["model"], online["prop"], "--steps", _steps(tmp_path / "s.jsonl", {}))
    assert result.exit_code == 20, result.output
    assert status in result.stdout and ("--max-leaves" if status == "unknown" else "--timeout") in result.stdout


def test_ctrl_c_exits_130_and_keeps_the_finished_steps(invoke, online, tmp_path, monkeypatch):
    import assay.verify.online as online_module

    class Interrupted(online_module.OnlineVerifier):
        def update(self, *args, **kwargs):
            if len(self.steps) == 2:
                raise KeyboardInterrupt
            return super().update(*args, **kwargs)

    monkeypatch.setattr(online_module, "OnlineVerifier", Interrupted)
    out = tmp_path / "out.jsonl"
    steps = _steps(tmp_path / "s.jsonl", _box(1.1), _box(1.2), _box(1.3))
    result = invoke("verify-online", online["model"], online["prop"], "--steps", steps, "--out", out)
    assert result.exit_code == 130, result.output
    assert "interrupted after 2 of 4 steps" in " ".join(result.stdout.split())
    assert len(out.read_text().splitlines()) == 2


@pytest.mark.parametrize("lines, line, message", [
    ([_box(1.1), '{"lower": [0, 0], "upper": [1, 1]'], 2, "not valid JSON"),
    (['{"lower": [0], "upper": [1]}'], 1, '"lower" has 1 number, but'),
    ([_box(1.1), {}, {"model": "missing.onnx"}], 3, "missing.onnx not found"),
    ([{"upper": [1, 1], "lower": [0, 0], "weights": [1]}], 1, "unknown key(s) 'weights'"),
    (["[0, 1]"], 1, "expected a JSON object"),
    (['{"lower": [0, 0]}'], 1, '"lower" without "upper"'),
    (['{"lower": [0, NaN], "upper": [1, 1]}'], 1, "lower[1] is nan"),
    (['{"lower": [0, "a"], "upper": [1, 1]}'], 1, 'lower[1] is "a", not a number'),
    ([{"lower": [0, 0.6], "upper": [1, 0.5]}], 1, "lower[1] = 0.6 > upper[1] = 0.5"),
])
def test_steps_file_errors_name_the_line(invoke, online, tmp_path, lines, line, message):
    steps = _steps(tmp_path / "steps.jsonl", *lines)
    result = invoke("verify-online", online["model"], online["prop"], "--steps", steps)
    assert result.exit_code == 2, result.output
    assert result.stderr.startswith("error: ") and len(result.stderr.strip().splitlines()) == 1
    assert f"{steps}, line {line}: " in result.stderr and message in result.stderr
    assert "Traceback" not in result.output


def test_a_model_with_another_architecture_is_an_error_naming_the_line(invoke, online, tmp_path):
    _scaled_onnx(tmp_path / "wide.onnx", 1.0, hidden=3)
    steps = _steps(tmp_path / "steps.jsonl", {}, {"model": "wide.onnx"})
    result = invoke("verify-online", online["model"], online["prop"], "--steps", steps)
    assert result.exit_code == 2, result.output
    assert f"{steps}, line 2: " in result.stderr and "same layers and shapes" in result.stderr


@pytest.mark.parametrize("args, message", [
    (("--accelerations", "bmi,fast"), "--accelerations: unknown acceleration(s) ['fast']"),
    (("--max-leaves", "0"), "--max-leaves must be ≥ 1"),
    (("--timeout", "0"), "--timeout must be a positive"),
    (("--method", "beta"), "--method must be one of"),
])
def test_option_errors(invoke, online, tmp_path, args, message):
    result = invoke("verify-online", online["model"], online["prop"], "--steps", _steps(tmp_path / "s.jsonl", {}), *args)
    assert result.exit_code == 2 and result.stderr.startswith("error: ") and message in result.stderr


def test_file_errors(invoke, online, tmp_path):
    missing = invoke("verify-online", online["model"], online["prop"], "--steps", tmp_path / "nope.jsonl")
    assert missing.exit_code == 2 and "steps file" in missing.stderr and "nope.jsonl not found" in missing.stderr
    empty = invoke("verify-online", online["model"], online["prop"], "--steps", _steps(tmp_path / "e.jsonl", ""))
    assert empty.exit_code == 2 and "has no steps" in empty.stderr
    two = tmp_path / "two.vnnlib"
    two.write_text(
        "(declare-const X_0 Real)\n(declare-const X_1 Real)\n(declare-const Y_0 Real)\n(declare-const Y_1 Real)\n"
        "(assert (or (and (>= X_0 0.0) (<= X_0 0.5) (>= X_1 0.0) (<= X_1 1.0))"
        " (and (>= X_0 0.5) (<= X_0 1.0) (>= X_1 0.0) (<= X_1 1.0))))\n(assert (>= Y_0 2.5))\n")
    several = invoke("verify-online", online["model"], two, "--steps", _steps(tmp_path / "s.jsonl", {}))
    assert several.exit_code == 2 and "has 2 queries" in several.stderr and "one property file per query" in several.stderr
