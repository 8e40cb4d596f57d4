"""assay bounds and assay verify on one property: output, JSON, exit codes, counterexamples."""

from __future__ import annotations

import json

import pytest
import torch

from assay.nn import load


def test_bounds_json_on_a_network_with_known_range(invoke, tiny):
    result = invoke("bounds", tiny["model"], tiny["holds"], "--method", "crown", "--json")
    assert result.exit_code == 0, result.output
    payload = json.loads(result.stdout)
    (query,) = payload["queries"]
    # Every ReLU is active over [0, 1]², so y0 ∈ [0, 2] exactly (up to outward rounding).
    assert query["lower"][0] == pytest.approx(0.0, abs=1e-9) and query["lower"][0] <= 0.0
    assert query["upper"][0] == pytest.approx(2.0, abs=1e-9) and query["upper"][0] >= 2.0
    assert query["unsafe_unreachable"] is True and payload["holds"] is True
    assert payload["method"] == "crown" and payload["dtype"] == "float64" and payload["seconds"] >= 0


@pytest.mark.parametrize("method", ["ibp", "crown", "alpha", "beta"])
def test_bounds_table_says_whether_the_unsafe_region_is_excluded(invoke, tiny, method):
    holds = invoke("bounds", tiny["model"], tiny["holds"], "--method", method)
    assert holds.exit_code == 0, holds.output
    assert "unsafe region unreachable (property holds for this query)" in holds.stdout
    assert "Y_0" in holds.stdout
    violated = invoke("bounds", tiny["model"], tiny["violated"], "--method", method)
    assert violated.exit_code == 0, violated.output
    assert "unsafe region not excluded" in violated.stdout


def test_bounds_rejects_an_unknown_method(invoke, tiny):
    result = invoke("bounds", tiny["model"], tiny["holds"], "--method", "magic")
    assert result.exit_code == 2 and "error:" in result.stderr and "magic" in result.stderr


def test_bounds_missing_property_file(invoke, tiny, tmp_path):
    result = invoke("bounds", tiny["model"], tmp_path / "missing.vnnlib")
    assert result.exit_code == 2
    assert result.stderr.startswith("error: ") and "missing.vnnlib" in result.stderr


def test_verify_holds_exits_0(invoke, tiny):
    result = invoke("verify", tiny["model"], tiny["holds"], "--timeout", 30)
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith("holds")


def test_verify_threads_option_runs_and_leaves_the_caller_s_setting_alone(invoke, tiny):
    before = torch.get_num_threads()
    result = invoke("verify", tiny["model"], tiny["holds"], "--timeout", 30, "--threads", 1)
    assert result.exit_code == 0, result.output
    assert torch.get_num_threads() == before


def test_verify_violated_exits_10_with_a_rechecked_counterexample(invoke, tiny):
    result = invoke("verify", tiny["model"], tiny["violated"], "--timeout", 30, "--json")
    assert result.exit_code == 10, result.output
    payload = json.loads(result.stdout)
    assert payload["status"] == "violated"
    x = torch.tensor(payload["counterexample"]["input"], dtype=torch.float64)
    assert ((x >= 0) & (x <= 1)).all()
    y = load(tiny["model"]).forward(x.reshape(1, 2))[0]
    assert y[0] >= 1.5
    text = invoke("verify", tiny["model"], tiny["violated"], "--timeout", 30)
    assert text.exit_code == 10
    assert text.stdout.startswith("violated") and "counterexample" in text.stdout


@pytest.mark.parametrize("status, code", [("unknown", 20), ("timeout", 20)])
def test_verify_undecided_exits_20(invoke, tiny, monkeypatch, status, code):
    import assay.verify
    from assay.verify import VerificationResult, VerificationStatus

    monkeypatch.setattr(assay.verify, "verify_vnnlib",
                        lambda network, prop, **options: VerificationResult(VerificationStatus(status), None))
    result = invoke("verify", tiny["model"], tiny["holds"])
    assert result.exit_code == code
    assert result.stdout.startswith(status)


@pytest.mark.parametrize(
    "args, message",
    [
        ((), "give MODEL and PROPERTY"),
        (("MODEL",), "give MODEL and PROPERTY"),
        (("MODEL", "PROPERTY", "--instances", "x.csv"), "not both"),
        (("MODEL", "PROPERTY", "--workers", "2"), "--workers is only used with --instances"),
        (("MODEL", "PROPERTY", "--timeout", "0"), "--timeout must be a positive"),
        (("MODEL", "PROPERTY", "--method", "beta"), "--method must be one of"),
        (("MODEL", "PROPERTY", "--threads", "0"), "--threads must be ≥ 1"),
        (("--instances", "x.csv", "--threads", "2"), "--threads is for one instance"),
    ],
)
def test_verify_argument_errors(invoke, tiny, args, message):
    names = {"MODEL": tiny["model"], "PROPERTY": tiny["holds"]}
    result = invoke("verify", *[names.get(a, a) for a in args])
    assert result.exit_code == 2
    assert result.stderr.startswith("error: ") and message in result.stderr


@pytest.mark.data
def test_acasxu_property_1_holds_on_net_1_1(invoke, acasxu):
    model, prop = acasxu("1_1", 1)
    bounds = invoke("bounds", model, prop, "--json")
    assert bounds.exit_code == 0, bounds.output
    (query,) = json.loads(bounds.stdout)["queries"]
    assert len(query["lower"]) == 5 and all(l <= u for l, u in zip(query["lower"], query["upper"]))
    result = invoke("verify", model, prop, "--timeout", 60)
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith("holds")


@pytest.mark.data
def test_acasxu_property_2_is_violated_on_net_2_1(invoke, acasxu):
    model, prop = acasxu("2_1", 2)
    result = invoke("verify", model, prop, "--timeout", 60, "--json")
    assert result.exit_code == 10, result.output
    payload = json.loads(result.stdout)
    x = torch.tensor(payload["counterexample"]["input"], dtype=torch.float64)
    network = load(model)
    y = network.forward(x.reshape(network.input_shape)).reshape(-1)
    # Property 2's unsafe region: Y_0 (clear of conflict) is the largest output.
    assert (y[0] >= y[1:]).all()


def test_bounds_in_float32_stay_sound(invoke, tiny):
    result = invoke("bounds", tiny["model"], tiny["holds"], "--dtype", "float32", "--json")
    assert result.exit_code == 0, result.output
    (query,) = json.loads(result.stdout)["queries"]
    assert query["lower"][0] <= 0.0 and query["upper"][0] >= 2.0
    assert json.loads(result.stdout)["dtype"] == "float32"


@pytest.mark.parametrize("unsafe, excluded", [
    ("(or (and (<= Y_0 -0.5)) (and (>= Y_0 2.5)))", True),    # both conjunctions out of y0's range [0, 2]
    ("(or (and (<= Y_0 -0.5)) (and (>= Y_0 1.5)))", False),   # the second is reachable
])
def test_bounds_exclude_a_disjunction_only_when_every_conjunction_is_excluded(invoke, tmp_path, tiny, unsafe, excluded):
    from tests.cli.models import write_vnnlib

    prop = write_vnnlib(tmp_path / "or.vnnlib", unsafe)
    result = invoke("bounds", tiny["model"], prop, "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["queries"][0]["unsafe_unreachable"] is excluded


def test_verify_timeout_counts_loading(invoke, tiny, monkeypatch):
    """--timeout covers the whole command: loading that uses it up leaves the verifier no time."""
    import time

    import assay.cli.verify_cmd as verify_cmd

    real = verify_cmd.load_network
    monkeypatch.setattr(verify_cmd, "load_network", lambda path: (time.sleep(0.4), real(path))[1])
    started = time.monotonic()
    result = invoke("verify", tiny["model"], tiny["holds"], "--timeout", "0.3", "--json")
    assert result.exit_code == 20, result.output
    assert json.loads(result.stdout)["status"] == "timeout"
    assert time.monotonic() - started < 5
    assert invoke("verify", tiny["model"], tiny["holds"], "--timeout", "30").exit_code == 0
