"""assay preimage: boxes, image patches, patch grids, plots, JSON and clear errors."""

from __future__ import annotations

import json

import numpy as np
import onnx
import torch
from onnx import TensorProto, helper, numpy_helper

from assay.nn import load


def _image_model(path, seed: int = 0, inputs: int = 16):
    """An ``inputs`` (default a 4×4 image, flattened) → 6 → 2 ReLU classifier."""
    rng = np.random.default_rng(seed)
    initializers = [numpy_helper.from_array(rng.normal(0, 0.5, (6, inputs)).astype(np.float32), "w1"),
                    numpy_helper.from_array(rng.normal(0, 0.1, 6).astype(np.float32), "b1"),
                    numpy_helper.from_array(rng.normal(0, 0.5, (2, 6)).astype(np.float32), "w2"),
                    numpy_helper.from_array(np.zeros(2, dtype=np.float32), "b2")]
    nodes = [helper.make_node("Gemm", ["input", "w1", "b1"], ["h"], transB=1), helper.make_node("Relu", ["h"], ["r"]),
             helper.make_node("Gemm", ["r", "w2", "b2"], ["output"], transB=1)]
    graph = helper.make_graph(nodes, "image", [helper.make_tensor_value_info("input", TensorProto.FLOAT, [1, inputs])],
                              [helper.make_tensor_value_info("output", TensorProto.FLOAT, [1, 2])], initializers)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]), str(path))
    return path


def test_box_under_and_over_json(invoke, tmp_path):
    model = _image_model(tmp_path / "two.onnx", seed=2, inputs=2)
    network = load(model)
    x = np.random.default_rng(2).uniform(-1, 1, (200_000, 2))
    share = float((network.forward(torch.as_tensor(x)).argmax(1) == 1).double().mean())
    assert 0.1 < share < 0.9
    for flag, check in (("--under", lambda r: r <= 1), ("--over", lambda r: r >= 1)):
        result = invoke("preimage", model, "--box", "-1,-1;1,1", "--argmax", 1, flag, "--json", "--time-limit", 20)
        assert result.exit_code == 0, result.output
        payload = json.loads(result.stdout)
        assert payload["status"] == "reached" and check(payload["ratio"])
        estimate = payload["preimage_volume"]  # the region's volume is 4
        assert estimate["low"] - 0.02 <= 4 * share <= estimate["high"] + 0.02
        assert payload["argmax"] == 1 and payload["pieces"]
        for piece in payload["pieces"]:
            assert set(piece) >= {"box", "splits", "A", "b", "preimage_volume", "approximation_volume"}


def test_box_text_and_plot(invoke, tmp_path):
    picture = tmp_path / "pieces.png"
    model = _image_model(tmp_path / "two.onnx", seed=2, inputs=2)
    result = invoke("preimage", model, "--box", "-1,-1;1,1", "--argmax", 1, "--plot", picture, "--time-limit", 20)
    assert result.exit_code == 0, result.output
    text = " ".join(result.stdout.split())
    assert "under-approximation" in text and "ratio" in text and "reached" in text and str(picture) in text
    assert picture.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_image_patch_and_grid(invoke, tmp_path):
    model = _image_model(tmp_path / "image.onnx")
    image = np.random.default_rng(1).random((4, 4))
    np.save(tmp_path / "image.npy", image)
    result = invoke("preimage", model, "--image", tmp_path / "image.npy", "--patch", "1,2,2,2", "--json",
                    "--time-limit", 20)
    assert result.exit_code in (0, 20), result.output
    payload = json.loads(result.stdout)
    assert payload["free_inputs"] == [9, 10, 13, 14]  # rows 2–3, columns 1–2 of the 4×4 image
    network = load(model)
    label = int(network.forward(torch.as_tensor(image.reshape(16))).argmax())
    assert payload["argmax"] == label
    for piece in payload["pieces"]:  # fixed pixels keep their value in every piece's box
        lower, upper = np.array(piece["box"]["lower"]), np.array(piece["box"]["upper"])
        fixed = np.setdiff1d(np.arange(16), payload["free_inputs"])
        assert np.array_equal(lower[fixed], image.reshape(16)[fixed]) and np.array_equal(upper[fixed], lower[fixed])
    heat = tmp_path / "heat.png"
    grid = invoke("preimage", model, "--image", tmp_path / "image.npy", "--grid", 2, "--stride", 2, "--time-limit", 5,
                  "--plot", heat, "--json")
    assert grid.exit_code == 0, grid.output
    cells = json.loads(grid.stdout)
    assert cells["tops"] == [0, 2] and cells["lefts"] == [0, 2]
    assert all(0 <= share <= 1 for row in cells["covered"] for share in row)
    assert heat.read_bytes()[:4] == b"\x89PNG"


def test_bad_input_is_one_line(invoke, tiny, tmp_path):
    model = _image_model(tmp_path / "image.onnx")
    np.save(tmp_path / "image.npy", np.random.default_rng(1).random((4, 4)))
    np.save(tmp_path / "nan.npy", np.full((4, 4), np.nan))
    np.save(tmp_path / "small.npy", np.zeros((3, 3)))
    cases = [
        (("preimage", tiny["model"], "--argmax", 0), "exactly one of --box or --image"),
        (("preimage", tiny["model"], "--box", "0,0;1", "--argmax", 0), "2 inputs"),
        (("preimage", tiny["model"], "--box", "1,1;0,0", "--argmax", 0), "above upper"),
        (("preimage", tiny["model"], "--box", "0,nan;1,1", "--argmax", 0), "NaN"),
        (("preimage", tiny["model"], "--box", "0,0;1,1", "--argmax", 2), "not a class"),
        (("preimage", tiny["model"], "--box", "0,0;1,1"), "--argmax K is needed"),
        (("preimage", model, "--image", tmp_path / "image.npy", "--patch", "3,3,2,2"), "leaves the 4×4 image"),
        (("preimage", model, "--image", tmp_path / "image.npy", "--patch", "1,2"), "x,y,w,h"),
        (("preimage", model, "--image", tmp_path / "nan.npy", "--patch", "0,0,2,2"), "[0, 1]"),
        (("preimage", model, "--image", tmp_path / "small.npy", "--patch", "0,0,2,2"), "16 inputs"),
        (("preimage", model, "--image", tmp_path / "image.npy"), "--patch x,y,w,h or --grid"),
        (("preimage", tiny["model"], "--box", "0,0;1,1", "--argmax", 0, "--method", "exact"), "--method"),
    ]
    for args, fragment in cases:
        result = invoke(*args)
        assert result.exit_code == 2, (args, result.output)
        assert fragment in result.stderr and result.stderr.startswith("error:") and result.stderr.count("\n") == 1, \
            (args, result.stderr)
