"""assay info on a tiny ONNX file and on an ACAS Xu network."""

from __future__ import annotations

import json

import pytest


def test_info_table(invoke, tiny):
    result = invoke("info", tiny["model"])
    assert result.exit_code == 0, result.output
    out = result.stdout
    assert "input   input  shape (2,)" in out
    assert "output  output  shape (2,)" in out
    for layer in ("Linear", "ReLU"):
        assert layer in out
    assert "3 layers, 12 parameters, 2 ReLU neurons" in out


def test_info_json(invoke, tiny):
    result = invoke("info", tiny["model"], "--json")
    assert result.exit_code == 0, result.output
    facts = json.loads(result.stdout)
    assert facts["input"] == {"name": "input", "shape": [2]}
    assert facts["output"] == {"name": "output", "shape": [2]}
    assert facts["parameters"] == 12 and facts["relu_neurons"] == 2
    assert [row["layer"] for row in facts["layers"]] == ["Linear", "ReLU", "Linear"]
    assert facts["layers"][0] == {"index": 0, "layer": "Linear", "reads": [0], "input_shape": [2], "output_shape": [2], "parameters": 6}


def test_info_input_shape_option_is_checked(invoke, tiny):
    assert invoke("info", tiny["model"], "--input-shape", "2", "--json").exit_code == 0
    bad = invoke("info", tiny["model"], "--input-shape", "two")
    assert bad.exit_code == 2 and "--input-shape" in bad.stderr


@pytest.mark.data
def test_info_on_acasxu(invoke, acasxu):
    model, _ = acasxu("1_1", 1)
    facts = json.loads(invoke("info", model, "--json").stdout)
    assert facts["input"]["shape"] == [1, 1, 5] and facts["output"]["shape"] == [5]  # as the ONNX file declares
    assert facts["relu_neurons"] == 300
    assert facts["parameters"] == 5 * 50 + 50 + 5 * (50 * 50 + 50) + 50 * 5 + 5


def test_info_shows_maxpool_kept_whole(invoke, tmp_path):
    import numpy as np
    import onnx

    from tests.bounds.strategies import onnx_graph_model

    path = tmp_path / "pool.onnx"
    onnx.save(onnx_graph_model(np.random.default_rng(0), 1, 6, 2, 2, False, False), str(path))
    result = invoke("info", path)
    assert result.exit_code == 0, result.output
    assert "MaxPool is lowered to ReLUs above (exact); bounds also use it whole" in result.stdout
    facts = json.loads(invoke("info", path, "--json").stdout)
    assert "MaxPool2d" in [row["layer"] for row in facts["pooled_layers"]]
    assert "MaxPool2d" not in [row["layer"] for row in facts["layers"]]
