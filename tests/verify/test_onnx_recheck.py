"""Counterexamples re-checked by onnxruntime on the original ONNX file (assay.verify.onnx_recheck).

A VIOLATED verdict stands only when onnxruntime on the file agrees with assay's forward pass
(relative 1e-3) and its output meets the unsafe condition (within 1e-4), as VNN-COMP's scoring
checks. The disagreeing cases are made by shifting the reference runner's output.
"""

from __future__ import annotations

import os
from dataclasses import replace

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

import assay.nn.reference as reference
from assay.cli.main import app
from assay.nn import load
from assay.run.vnncomp import Instance, verify_instance
from assay.sets import read_vnnlib
from assay.verify import VerificationStatus, verify_vnnlib
from assay.verify.competition import run_instance
from assay.verify.online import OnlineVerifier
from assay.verify.onnx_recheck import ABSOLUTE_TOLERANCE, RELATIVE_TOLERANCE, onnxruntime_objection
from assay.verify.problem import from_unsafe
from tests.cli.models import violated_property, write_tiny_onnx


@pytest.fixture
def tiny(tmp_path):
    """(model path, violated property path): y0 = x0 + x1 on [0, 1]², unsafe y0 ≥ 1.5."""
    return write_tiny_onnx(tmp_path / "tiny.onnx"), violated_property(tmp_path / "v.vnnlib")


def shifted_runner(monkeypatch, change):
    """onnxruntime's outputs on the file, changed by ``change`` (outputs → outputs); returns the call log."""
    calls = []
    original = reference.file_outputs

    def runner(path, x, input_shape):
        calls.append(path)
        return change(original(path, x, input_shape))

    monkeypatch.setattr(reference, "file_outputs", runner)
    return calls


def test_violated_stands_when_onnxruntime_agrees(tiny, monkeypatch):
    model, prop = tiny
    calls = shifted_runner(monkeypatch, lambda y: y)
    network = load(model)
    assert network.onnx_file == str(model)
    result = verify_vnnlib(network, read_vnnlib(prop), timeout=30)
    assert result.status is VerificationStatus.VIOLATED and result.reason is None
    assert calls == [str(model)]  # the file was run, once


@pytest.mark.parametrize("change, says", [
    (lambda y: y - 10.0, "does not violate the property"),  # onnxruntime's y0 ≤ −8: safe
    (lambda y: y * (1 + 20 * RELATIVE_TOLERANCE), "differs from assay's forward pass"),  # still unsafe, but not y
])
def test_not_violated_when_onnxruntime_disagrees(tiny, monkeypatch, change, says):
    model, prop = tiny
    shifted_runner(monkeypatch, change)
    result = verify_vnnlib(load(model), read_vnnlib(prop), timeout=30)
    assert result.status is VerificationStatus.UNKNOWN and result.counterexample is None
    assert says in result.reason and str(model) in result.reason


def test_the_unsafe_condition_allows_the_competition_tolerance(tiny, monkeypatch):
    # x = (0.75, 0.75) gives y0 = 1.5 exactly, on the border of y0 ≥ 1.5: an onnxruntime output
    # short of it by less than 1e-4 still counts (the scoring's COUNTEREXAMPLE_ATOL), by more not.
    model, prop = tiny
    network = load(model)
    vnnlib = read_vnnlib(prop).queries[0]
    query = from_unsafe(network, vnnlib.input_set, vnnlib.unsafe_outputs)[0]
    x = torch.tensor([0.75, 0.75], dtype=torch.float64)
    y = network.forward(x.reshape(1, 2)).reshape(-1)
    assert y.tolist() == [1.5, -1.5]
    shifted_runner(monkeypatch, lambda out: out - 0.9 * ABSOLUTE_TOLERANCE)
    assert onnxruntime_objection(network, query, x, y) is None
    shifted_runner(monkeypatch, lambda out: out - 2 * ABSOLUTE_TOLERANCE)
    assert "does not violate" in onnxruntime_objection(network, query, x, y)


def test_a_network_rebuilt_from_the_loaded_one_is_not_checked_against_the_file(tiny, monkeypatch):
    model, prop = tiny
    calls = shifted_runner(monkeypatch, lambda y: y - 10.0)
    rebuilt = replace(load(model), layers=load(model).layers)  # e.g. new weights: no longer the file's network
    assert rebuilt.onnx_file is None
    assert verify_vnnlib(rebuilt, read_vnnlib(prop), timeout=30).status is VerificationStatus.VIOLATED
    assert calls == []


def test_the_reason_reaches_the_competition_answer_and_the_instances_row(tiny, monkeypatch):
    model, prop = tiny
    shifted_runner(monkeypatch, lambda y: y - 10.0)
    answer = run_instance(model, prop, 30.0)
    assert answer.word == "unknown" and "onnxruntime" in answer.reason
    row = verify_instance(Instance(str(model), str(prop), 30.0, model, prop, 1))
    assert row["status"] == "unknown" and "onnxruntime" in row["reason"]


def test_the_command_line_says_why(tiny, monkeypatch):
    model, prop = tiny
    shifted_runner(monkeypatch, lambda y: y - 10.0)
    result = CliRunner().invoke(app, ["verify", str(model), str(prop), "--timeout", "30"])
    assert result.exit_code == 20 and "unknown" in result.output
    assert "does not violate the property" in " ".join(result.output.split())


def test_an_online_step_is_not_violated_when_onnxruntime_disagrees(tiny, monkeypatch):
    model, prop = tiny
    query = read_vnnlib(prop).queries[0]
    shifted_runner(monkeypatch, lambda y: y - 10.0)
    step = OnlineVerifier(load(model), query.input_set, unsafe=query.unsafe_outputs, timeout=30).steps[0]
    assert step.status is VerificationStatus.UNKNOWN and step.counterexample is None and step.coverage == 0.0
    assert "onnxruntime" in step.reason


def test_one_session_per_file_until_the_file_changes(tmp_path):
    model = write_tiny_onnx(tmp_path / "tiny.onnx")
    x = np.array([[1.0, 1.0]])
    reference._file_session.cache_clear()
    assert reference.file_outputs(model, x, (2,)).tolist() == [[2.0, -2.0]]
    reference.file_outputs(model, x, (2,))
    assert reference._file_session.cache_info().misses == 1
    stat = os.stat(model)
    os.utime(model, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000_000))  # rewritten: read again
    reference.file_outputs(model, x, (2,))
    assert reference._file_session.cache_info().misses == 2
