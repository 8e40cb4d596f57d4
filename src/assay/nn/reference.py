"""onnxruntime as the reference forward pass of a loaded ONNX model.

Used to check that a :class:`~assay.nn.Network` computes what its ONNX file computes (the
loader's tests and ``benchmarks/vnncomp2024_loading.py``), and to re-check a counterexample on
the original file (:func:`file_outputs`, for :mod:`assay.verify.onnx_recheck`).
"""

from __future__ import annotations

import functools
import os
from pathlib import Path

import numpy as np

from assay.errors import ModelLoadError

__all__ = ["as_double", "onnxruntime_outputs", "file_outputs"]


def as_double(model):
    """The same ONNX graph computing in float64 (float32 initializers, Constant nodes, inputs,
    outputs and value infos converted). onnxruntime lacks double kernels for some operators
    (Conv on CPU): running such a copy raises onnxruntime's ``NotImplemented``."""
    import onnx
    from onnx import TensorProto, numpy_helper

    model = onnx.ModelProto.FromString(model.SerializeToString())
    graph = model.graph
    for index, init in enumerate(graph.initializer):
        array = numpy_helper.to_array(init)
        if array.dtype == np.float32:
            graph.initializer[index].CopyFrom(numpy_helper.from_array(array.astype(np.float64), init.name))
    for node in graph.node:
        for attribute in node.attribute:
            if attribute.type == onnx.AttributeProto.TENSOR and attribute.t.data_type == TensorProto.FLOAT:
                attribute.t.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(attribute.t).astype(np.float64),
                                                             attribute.t.name))
        if node.op_type == "Cast":
            for attribute in node.attribute:
                if attribute.name == "to" and attribute.i == TensorProto.FLOAT:
                    attribute.i = TensorProto.DOUBLE
    for value in (*graph.input, *graph.output, *graph.value_info):
        if value.type.tensor_type.elem_type == TensorProto.FLOAT:
            value.type.tensor_type.elem_type = TensorProto.DOUBLE
    return model


def onnxruntime_outputs(model, x: np.ndarray, input_shape: tuple[int, ...]) -> np.ndarray:
    """onnxruntime's outputs, shape ``(n, -1)``, for ``n`` inputs ``x`` of shape ``(n, *input_shape)``
    (a network's ``input_shape``), fed in the graph's declared input shape.

    A graph with a symbolic first dimension runs the batch at once; any other graph (a fixed
    batch of 1, or no batch dimension) runs one input at a time. ``x`` is fed in the dtype of the
    graph's input (float32, or float64 for an :func:`as_double` copy).
    """
    return _outputs(_session(model), _graph_input(model), x, input_shape)


def file_outputs(path, x: np.ndarray, input_shape: tuple[int, ...]) -> np.ndarray:
    """:func:`onnxruntime_outputs` of the ONNX file ``path`` as it is (gzipped or not, float32 as
    stored). One onnxruntime session per file, kept while the file's modification time and size
    stay the same (a few files at most), so that re-checking many counterexamples of one model
    reads and compiles it once.

    Raises:
        ModelLoadError: the file is missing or is not an ONNX model onnxruntime can run.
    """
    path = Path(path).resolve()
    try:
        stat = os.stat(path)
    except OSError as exc:
        raise ModelLoadError(f"{path}: cannot read the ONNX file to run it with onnxruntime ({exc})") from exc
    session, graph_input = _file_session(str(path), stat.st_mtime_ns, stat.st_size)
    return _outputs(session, graph_input, x, input_shape)


@functools.lru_cache(maxsize=4)
def _file_session(path: str, mtime_ns: int, size: int):
    """(session, graph input) of a file, without the model itself (large networks: the session holds
    the weights once); the modification time and size are part of the cache key only."""
    from assay.nn._onnx import _read

    model, _ = _read(path)
    try:
        return _session(model), _graph_input(model)
    except Exception as exc:  # onnxruntime raises its own exception types for graphs it cannot run
        raise ModelLoadError(f"{path}: onnxruntime cannot run the model ({type(exc).__name__}: {exc})") from exc


def _session(model):
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.log_severity_level = 3
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])


def _graph_input(model) -> tuple[str, type, list[int | None]]:
    """The name, numpy dtype and dims (None where symbolic) of the model's one graph input."""
    from onnx import TensorProto

    constants = {init.name for init in model.graph.initializer}
    inputs = [i for i in model.graph.input if i.name not in constants]
    if len(inputs) != 1:
        raise ModelLoadError(f"the model has {len(inputs)} graph inputs; onnxruntime_outputs feeds one")
    tensor_type = inputs[0].type.tensor_type
    dtype = np.float64 if tensor_type.elem_type == TensorProto.DOUBLE else np.float32
    dims = [d.dim_value if d.HasField("dim_value") and d.dim_value > 0 else None for d in tensor_type.shape.dim]
    return inputs[0].name, dtype, dims


def _outputs(session, graph_input, x: np.ndarray, input_shape: tuple[int, ...]) -> np.ndarray:
    """:func:`onnxruntime_outputs` with the session made and the graph input (:func:`_graph_input`) read."""
    name, dtype, dims = graph_input
    x = np.asarray(x, dtype=dtype).reshape(len(x), *input_shape)
    size = int(np.prod(input_shape))
    if len(dims) >= 2 and dims[0] is None and int(np.prod([d or 1 for d in dims[1:]])) in (size, 1):
        rest = [d if d is not None else s for d, s in zip(dims[1:], input_shape)] if len(dims) - 1 == len(input_shape) \
            else list(input_shape)
        return np.asarray(session.run(None, {name: x.reshape(len(x), *rest)})[0]).reshape(len(x), -1)
    shape = [1 if d is None else d for d in dims]
    if int(np.prod(shape)) != size:
        raise ModelLoadError(f"a network input of shape {input_shape} does not fit the graph's input {dims}")
    return np.stack([np.asarray(session.run(None, {name: row.reshape(shape)})[0]).reshape(-1) for row in x])


def deviation_from_onnxruntime(network, model, x: np.ndarray) -> dict:
    """How far ``network``'s float64 forward pass is from onnxruntime on the inputs ``x``.

    The reference is onnxruntime on a float64 copy of ``model`` (:func:`as_double`) where it has
    double kernels for every operator; otherwise onnxruntime on the model as it is (float32),
    whose own rounding then dominates the deviation. Returns ``{"reference": "float64" |
    "float32", "max_abs": ..., "scale": max(1, max |reference output|), "relative": max_abs / scale}``.
    """
    import onnxruntime as ort

    x = np.asarray(x, dtype=np.float64)
    got = network.forward(x, "float64").numpy().reshape(len(x), -1)
    try:
        expected, reference = onnxruntime_outputs(as_double(model), x, network.input_shape), "float64"
    except (ort.capi.onnxruntime_pybind11_state.NotImplemented, ort.capi.onnxruntime_pybind11_state.Fail,
            ort.capi.onnxruntime_pybind11_state.InvalidGraph):
        expected, reference = onnxruntime_outputs(model, x.astype(np.float32), network.input_shape), "float32"
    max_abs = float(np.abs(got - expected).max())
    scale = max(1.0, float(np.abs(expected).max()))
    return {"reference": reference, "max_abs": max_abs, "scale": scale, "relative": max_abs / scale}
