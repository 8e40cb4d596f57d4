"""The CLI on a network with an operator the bound engine has no rule for (issue 32)."""

from __future__ import annotations

import json

import pytest

from assay.nn.ops import Sigmoid
from tests.nn.test_general_networks import sigmoid_network_file


@pytest.mark.parametrize("command", ["bounds", "verify"])
def test_cli_refuses_an_operator_without_a_bound_rule_in_one_line(invoke, rng, tmp_path, command, without_bound_rule):
    without_bound_rule(Sigmoid)
    path = sigmoid_network_file(rng, tmp_path)
    spec = tmp_path / "prop.vnnlib"
    spec.write_text("".join(f"(declare-const X_{i} Real)\n(assert (>= X_{i} 0))\n(assert (<= X_{i} 1))\n"
                            for i in range(3)) + "(declare-const Y_0 Real)\n(declare-const Y_1 Real)\n"
                    "(assert (>= Y_0 Y_1))\n")
    result = invoke(command, path, spec)
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Sigmoid" in lines[0], result.stderr


def test_info_lists_the_onnx_operators_and_those_without_bound_rules(invoke, rng, tmp_path, without_bound_rule):
    path = sigmoid_network_file(rng, tmp_path)
    facts = json.loads(invoke("info", path, "--json").stdout)
    assert facts["onnx_operators"] == {"Gemm": 2, "Sigmoid": 1}
    assert facts["layers_without_bound_rules"] == []
    without_bound_rule(Sigmoid)
    assert json.loads(invoke("info", path, "--json").stdout)["layers_without_bound_rules"] == ["Sigmoid"]




@pytest.mark.parametrize("strategy", ["operator", "input"])
def test_verify_strategy_option_reaches_the_search_and_bad_values_are_refused(invoke, rng, tmp_path, strategy):
    path = sigmoid_network_file(rng, tmp_path)
    spec = tmp_path / "prop.vnnlib"
    # y0 − y1 over [0, 1]³ never reaches 1e6: decided at the root whatever the strategy
    spec.write_text("".join(f"(declare-const X_{i} Real)\n(assert (>= X_{i} 0))\n(assert (<= X_{i} 1))\n"
                            for i in range(3)) + "(declare-const Y_0 Real)\n(declare-const Y_1 Real)\n"
                    "(assert (>= Y_0 (+ Y_1 1000000)))\n")
    result = invoke("verify", path, spec, "--strategy", strategy, "--json", "--timeout", "60")
    payload = json.loads(result.stdout)
    assert payload["status"] == "holds" and payload["strategy"] == strategy
    assert payload["stats"]["strategy"] == strategy
    refused = invoke("verify", path, spec, "--strategy", "neurons")
    assert refused.exit_code == 2 and "--strategy must be one of" in refused.stderr
