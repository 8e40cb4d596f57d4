"""onnxruntime as the reference forward pass of the loader tests."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort

from assay.nn.reference import as_double


def ort_outputs(model: onnx.ModelProto, x: np.ndarray) -> np.ndarray:
    """onnxruntime's outputs for the batch ``x`` of shape (n, *declared non-batch shape).

    A graph with a fixed batch dimension (or none) is run one sample at a time. (onnx's own
    ``ReferenceEvaluator`` is no substitute: in onnx 1.23 its BatchNormalization disagrees with
    the operator's definition.)
    """
    options = ort.SessionOptions()
    options.log_severity_level = 3
    run = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"]).run
    constants = {init.name for init in model.graph.initializer}
    (graph_input,) = [i for i in model.graph.input if i.name not in constants]
    shape = graph_input.type.tensor_type.shape.dim
    if len(shape) == 1:
        return np.stack([run(None, {graph_input.name: row})[0] for row in x])
    if shape[0].HasField("dim_value") and shape[0].dim_value > 0:
        return np.concatenate([run(None, {graph_input.name: x[i : i + 1]})[0] for i in range(len(x))])
    return run(None, {graph_input.name: x})[0]


def assert_matches_ort(network, model: onnx.ModelProto, x: np.ndarray, label: str = "", network_input=None) -> None:
    """Network (float64 and float32) vs float32 onnxruntime, and float64 vs the graph run in double.

    ``x`` is fed to onnxruntime and ``network_input`` (default ``x``) to the Network; outputs are
    compared row by row after flattening both to ``(len(network_input), -1)``.

    The float32 comparison allows 1e-5 relative plus 1e-5 absolute per unit of the largest output
    magnitude (float32 rounding on outputs of size 100 that cancel near 0 exceeds a plain 1e-5);
    the float64 comparison is tight, and skipped where onnxruntime has no double kernel (Conv).
    """
    x = np.asarray(x, dtype=np.float32)
    mine = x if network_input is None else np.asarray(network_input, dtype=np.float32)
    expected = ort_outputs(model, x).reshape(len(mine), -1)
    scale = max(1.0, float(np.abs(expected).max()))
    for dtype in ("float64", "float32"):
        got = network.forward(mine, dtype).numpy().reshape(len(mine), -1)
        np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5 * scale, err_msg=f"{label} in {dtype}")
    try:
        exact = ort_outputs(as_double(model), x.astype(np.float64)).reshape(len(mine), -1)
    except ort.capi.onnxruntime_pybind11_state.NotImplemented:  # no double kernel (Conv on CPU)
        return
    got = network.forward(mine, "float64").numpy().reshape(len(mine), -1)
    np.testing.assert_allclose(got, exact, rtol=1e-10, atol=1e-10 * scale, err_msg=f"{label}: float64 onnxruntime")
