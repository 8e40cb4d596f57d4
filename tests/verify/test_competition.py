"""VNN-COMP result files and one instance run the competition's way (assay.verify.competition).

Every sat file is read back and its X re-evaluated by onnxruntime (an independent forward pass):
the output must match the file's Y and violate the property. Late verdicts and expired timeouts
must read ``timeout``, never a verdict; unsupported operators ``error`` with the reason.
"""

from __future__ import annotations

import math
import time

import numpy as np
import onnx
import onnxruntime
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper
from typer.testing import CliRunner

from assay.cli.main import app
from assay.errors import DataError, OptionError
from assay.nn import load
from assay.verify import VerificationResult, VerificationStatus
from assay.verify.competition import (
    CompetitionResult,
    competition_result,
    format_result,
    parse_result,
    read_result_file,
    run_instance,
    write_result_file,
)
from tests.cli.models import holding_property, violated_property, write_tiny_onnx


def onnx_output(model, x: np.ndarray) -> np.ndarray:
    """onnxruntime's output for a flat input, shaped as the model's input says (float32, as the checker runs it).

    ``model``: a path or an open InferenceSession."""
    session = model if isinstance(model, onnxruntime.InferenceSession) else onnxruntime.InferenceSession(
        str(model), providers=["CPUExecutionProvider"])
    declared = session.get_inputs()[0]
    shape = [d if isinstance(d, int) and d > 0 else 1 for d in declared.shape]
    return session.run(None, {declared.name: x.astype(np.float32).reshape(shape)})[0].reshape(-1)


def write_round_onnx(path):
    """x (1, 2) → Gemm → Round → y: an operator assay cannot load (nor bound)."""
    graph = helper.make_graph(
        [helper.make_node("Gemm", ["input", "w", "b"], ["h"], name="hidden", transB=1),
         helper.make_node("Round", ["h"], ["output"], name="wave")],
        "sin", [helper.make_tensor_value_info("input", TensorProto.FLOAT, [1, 2])],
        [helper.make_tensor_value_info("output", TensorProto.FLOAT, [1, 2])],
        [numpy_helper.from_array(np.eye(2, dtype=np.float32), "w"), numpy_helper.from_array(np.zeros(2, np.float32), "b")],
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]), str(path))
    return path


# ------------------------------------------------------------------------------- the file format
def test_a_sat_file_reads_back_to_the_same_float64_values():
    x = np.array([0.1, -0.0, 1e-300, 1 / 3, -2.5e7])
    y = np.array([math.pi, -1e-17])
    text = format_result("sat", x, y)
    assert text.startswith("sat\n((X_0 0.1)\n (X_1 -0.0)") and text.endswith("(Y_1 -1e-17))\n")
    parsed = parse_result(text)
    assert parsed.word == "sat"
    assert parsed.input.tolist() == x.tolist() and parsed.output.tolist() == y.tolist()  # exact, not approximate
    # The published checker joins the counterexample's lines with spaces: one line reads the same.
    assert parse_result("sat\n" + text[4:].replace("\n", " ")).input.tolist() == x.tolist()


@pytest.mark.parametrize("word", ["unsat", "timeout", "unknown", "error"])
def test_other_words_are_one_line_without_a_counterexample(word):
    assert format_result(word) == word + "\n"
    assert parse_result(word + "\n").input is None
    with pytest.raises(OptionError, match="only a sat result"):
        format_result(word, [0.0], [0.0])


def test_bad_results_are_refused():
    with pytest.raises(OptionError, match="one of"):
        format_result("holds")
    with pytest.raises(OptionError, match="needs the counterexample"):
        format_result("sat")
    with pytest.raises(DataError, match="NaN"):
        format_result("sat", [float("nan")], [0.0])
    with pytest.raises(ValueError, match="sat result needs"):
        CompetitionResult("sat", VerificationStatus.VIOLATED, 1.0, 10.0)


@pytest.mark.parametrize("text, message", [
    ("violated\n((X_0 1) (Y_0 2))", "first line"),
    ("sat\n((X_1 1) (Y_0 2))", "X_1 is out of order"),
    ("sat\n((X_0 1) (X_0 2) (Y_0 2))", "X_0 is out of order"),
    ("sat\n((X_0 one) (Y_0 2))", "not a number"),
    ("sat\n((X_0 1) (Y_0 2)", "counterexample as"),
    ("sat\n((X_0 1) junk (Y_0 2))", "unexpected text"),
    ("sat\n((Y_0 2))", "needs X_0"),
    ("", "first line"),
])
def test_malformed_result_files_name_the_problem(text, message):
    with pytest.raises(DataError, match=message):
        parse_result(text, "out.txt")


def test_result_files_are_written_whole_and_read_back(tmp_path):
    result = CompetitionResult("sat", VerificationStatus.VIOLATED, 1.0, 10.0, np.array([0.5, 0.25]), np.array([2.0]))
    path = write_result_file(tmp_path / "deep" / "out.txt", result)
    assert read_result_file(path).input.tolist() == [0.5, 0.25]
    assert [p.name for p in path.parent.iterdir()] == ["out.txt"]  # no temporary file left behind
    write_result_file(path, CompetitionResult("unsat", VerificationStatus.HOLDS, 1.0, 10.0))
    assert path.read_text() == "unsat\n"
    with pytest.raises(DataError, match="cannot read"):
        read_result_file(tmp_path / "missing.txt")


# ------------------------------------------------------------------------------- the competition's clock
@pytest.mark.parametrize("status, seconds, word", [
    (VerificationStatus.HOLDS, 10.0 - 1e-6, "unsat"),
    (VerificationStatus.HOLDS, 10.0, "unsat"),  # at the timeout: still in time
    (VerificationStatus.HOLDS, 10.0 + 1e-6, "timeout"),  # a hair late: not credited
    (VerificationStatus.UNKNOWN, 3.0, "unknown"),
    (VerificationStatus.TIMEOUT, 10.0, "timeout"),
])
def test_a_verdict_after_the_timeout_counts_as_timeout(status, seconds, word):
    answer = competition_result(VerificationResult(status), seconds, timeout=10.0)
    assert answer.word == word
    assert (answer.reason is None) == (word == "unsat")
    assert answer.text() == word + "\n"


def test_time_spent_before_the_verifier_counts(tmp_path):
    # The process started 5 s ago with a 4 s timeout: loading already used it all up.
    answer = run_instance(write_tiny_onnx(tmp_path / "tiny.onnx"), violated_property(tmp_path / "v.vnnlib"), 4.0,
                          started=time.monotonic() - 5.0)
    assert answer.word == "timeout" and answer.status is VerificationStatus.TIMEOUT and answer.input is None


# ------------------------------------------------------------------------------- one instance
def test_sat_carries_the_rechecked_counterexample_and_onnxruntime_agrees(tmp_path):
    model = write_tiny_onnx(tmp_path / "tiny.onnx")
    answer = run_instance(model, violated_property(tmp_path / "v.vnnlib"), 30.0)
    assert answer.word == "sat" and answer.status is VerificationStatus.VIOLATED
    counterexample = answer.verification.counterexample
    assert answer.input.tolist() == counterexample.input.reshape(-1).tolist()  # the verifier's re-checked point
    assert np.abs(answer.output - counterexample.output.reshape(-1).numpy()).max() <= 1e-6  # its output (float32 pass)
    parsed = read_result_file(write_result_file(tmp_path / "out.txt", answer))
    x, y = parsed.input, parsed.output
    assert ((0.0 <= x) & (x <= 1.0)).all()
    assert np.abs(onnx_output(model, x) - y).max() <= 1e-5
    assert y[0] >= 1.5  # the unsafe condition of the property


def write_wide_sum_onnx(path, inputs: int = 64):
    """y0 = w·x with 64 weights in [50, 150] (float32): outputs near 6,000; y1 = 0."""
    weights = np.random.default_rng(5).uniform(50, 150, (2, inputs)).astype(np.float32)
    weights[1] = 0.0
    graph = helper.make_graph(
        [helper.make_node("Gemm", ["input", "w", "b"], ["output"], name="sum", transB=1)], "wide",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, [1, inputs])],
        [helper.make_tensor_value_info("output", TensorProto.FLOAT, [1, 2])],
        [numpy_helper.from_array(weights, "w"), numpy_helper.from_array(np.zeros(2, np.float32), "b")])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]), str(path))
    return path, weights[0].astype(np.float64)


def test_y_is_what_the_checker_recomputes(tmp_path):
    model, weights = write_wide_sum_onnx(tmp_path / "wide.onnx")
    declarations = "".join(f"(declare-const X_{i} Real)\n" for i in range(64)) + "(declare-const Y_0 Real)\n(declare-const Y_1 Real)\n"
    box = "".join(f"(assert (>= X_{i} 0.1))\n(assert (<= X_{i} 0.9))\n" for i in range(64))
    threshold = float(0.85 * weights.sum())  # reached near the upper corner
    prop = tmp_path / "wide.vnnlib"
    prop.write_text(declarations + box + f"(assert (>= Y_0 {threshold!r}))\n")
    answer = run_instance(model, prop, 60.0)
    assert answer.word == "sat"
    x = answer.input
    float64_output = float(weights @ x)
    # Y is the float32 forward pass of X cast to float32 (what the checker recomputes), not float64's.
    float32_output = load(model).forward(torch.as_tensor(x.astype(np.float32)).reshape(1, 64), dtype="float32")
    assert answer.output.tolist() == float32_output.reshape(-1).double().tolist()
    assert np.abs(onnx_output(model, x) - answer.output).max() < 1e-4  # the published checker's tolerance
    assert answer.output[0] >= threshold and float64_output >= threshold and ((0.1 <= x) & (x <= 0.9)).all()


def test_unsat_is_not_falsified_by_sampling(tmp_path, rng):
    model = write_tiny_onnx(tmp_path / "tiny.onnx")
    answer = run_instance(model, holding_property(tmp_path / "h.vnnlib"), 30.0)
    assert answer.word == "unsat" and answer.input is None
    session = onnxruntime.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    corners = np.array([[0.0, 0.0], [0.0, 1.0], [1.0, 0.0], [1.0, 1.0]])
    samples = np.concatenate([corners, rng.uniform(0.0, 1.0, size=(1_000, 2))])
    outputs = np.stack([onnx_output(session, sample) for sample in samples])
    assert (outputs[:, 0] > -0.5).all()  # no sample reaches the unsafe region y0 ≤ −0.5


def test_an_operator_assay_cannot_bound_gives_error_with_the_reason(tmp_path):
    answer = run_instance(write_round_onnx(tmp_path / "round.onnx"), violated_property(tmp_path / "v.vnnlib"), 30.0)
    assert answer.word == "error" and answer.status is VerificationStatus.ERROR and answer.verification is None
    assert "'Round'" in answer.reason and "wave" in answer.reason and "\n" not in answer.reason
    assert answer.text() == "error\n"


def test_a_missing_property_file_gives_error(tmp_path):
    answer = run_instance(write_tiny_onnx(tmp_path / "tiny.onnx"), tmp_path / "missing.vnnlib", 30.0)
    assert answer.word == "error" and "missing.vnnlib" in answer.reason


def test_bad_timeouts_are_refused(tmp_path):
    for timeout in (0, -1.0, float("nan"), float("inf")):
        with pytest.raises(OptionError, match="positive number"):
            run_instance(tmp_path / "a.onnx", tmp_path / "b.vnnlib", timeout)


# ------------------------------------------------------------------------------- assay verify --result-file
def test_verify_result_file_option(tmp_path):
    runner = CliRunner()
    model = write_tiny_onnx(tmp_path / "tiny.onnx")
    out = tmp_path / "out.txt"
    result = runner.invoke(app, ["verify", str(model), str(violated_property(tmp_path / "v.vnnlib")), "--result-file", str(out)])
    assert result.exit_code == 10, result.output
    assert read_result_file(out).word == "sat" and "written to" in result.stdout

    result = runner.invoke(app, ["verify", str(model), str(holding_property(tmp_path / "h.vnnlib")), "--result-file",
                                 str(out), "--json"])
    assert result.exit_code == 0, result.output
    assert out.read_text() == "unsat\n" and '"result": "unsat"' in result.stdout

    result = runner.invoke(app, ["verify", str(write_round_onnx(tmp_path / "round.onnx")), str(tmp_path / "v.vnnlib"),
                                 "--result-file", str(out)])
    assert result.exit_code == 2
    assert out.read_text() == "error\n"
    assert [line for line in result.stderr.splitlines() if line.startswith("error:")] == [result.stderr.strip()]
    assert "'Round'" in result.stderr

    result = runner.invoke(app, ["verify", "--instances", str(tmp_path / "i.csv"), "--result-file", str(out)])
    assert result.exit_code == 2 and "--result-file is for one instance" in result.stderr


# ------------------------------------------------------------------------------- real instances
@pytest.mark.data
def test_real_unsat_instance(data_dir):
    folder = data_dir / "vnncomp" / "reach_prob_density"
    answer = run_instance(folder / "onnx" / "vdp.onnx", folder / "vnnlib" / "vdp_0.vnnlib", 600.0)
    assert answer.word == "unsat"  # the published consensus: holds


@pytest.mark.data
@pytest.mark.timeout(120)
def test_a_tiny_timeout_on_a_hard_instance_gives_timeout(data_dir):
    # mnist_fc 256x6, prop 2, ε = 0.05: the published consensus is holds, α,β-CROWN timed out at 300 s.
    folder = data_dir / "vnncomp" / "mnist_fc"
    answer = run_instance(folder / "onnx" / "mnist-net_256x6.onnx", folder / "vnnlib" / "prop_2_0.05.vnnlib", 3.0)
    assert answer.word == "timeout" and answer.status is VerificationStatus.TIMEOUT
    assert answer.verification is not None and answer.verification.status is VerificationStatus.TIMEOUT


def test_running_out_of_memory_gives_error_and_other_failures_stay_loud(tmp_path, monkeypatch):
    import assay.verify

    model, prop = write_tiny_onnx(tmp_path / "tiny.onnx"), violated_property(tmp_path / "v.vnnlib")

    def out_of_memory(*args, **kwargs):
        raise RuntimeError("[enforce fail at alloc_cpu.cpp:127] DefaultCPUAllocator: can't allocate memory: you tried "
                           "to allocate 3993380352 bytes")

    monkeypatch.setattr(assay.verify, "verify_vnnlib", out_of_memory)
    answer = run_instance(model, prop, 30.0)
    assert answer.word == "error" and "out of memory" in answer.reason

    def bug(*args, **kwargs):
        raise RuntimeError("shape mismatch")

    monkeypatch.setattr(assay.verify, "verify_vnnlib", bug)
    with pytest.raises(RuntimeError, match="shape mismatch"):  # a bug is not dressed up as a verdict
        run_instance(model, prop, 30.0)
