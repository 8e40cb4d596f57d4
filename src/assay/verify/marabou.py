"""An independent check of verdicts with Marabou (``maraboupy``), for tests and benchmarks.

maraboupy is not a dependency of assay: install ``maraboupy==2.0.0`` to use this module. It
answers the same unsafe queries as :mod:`assay.verify` ("is there an x in the box with every
row of C·f(x) + d ≥ 0?") on an ONNX file, so verdicts of the two tools can be compared.
"""

from __future__ import annotations

import os
import tempfile
import time
import warnings
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch

from assay.errors import UnsupportedError
from assay.nn.layers import Flatten, Linear, ReLU
from assay.nn.network import Network


def _marabou():
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            from maraboupy import Marabou
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise UnsupportedError("the Marabou cross-check needs maraboupy: pip install maraboupy==2.0.0") from exc
    return Marabou


def solve_query(onnx_path, lower, upper, C, d, timeout: float) -> tuple[str, float, np.ndarray | None]:
    """Ask Marabou whether some x in [lower, upper] has every row of C·f(x) + d ≥ 0.

    Returns ("sat" | "unsat" | "timeout" | other exit code, seconds, the input found for sat).
    """
    Marabou = _marabou()
    network = Marabou.read_onnx(str(onnx_path))
    inputs = np.asarray(network.inputVars[0]).reshape(-1)
    outputs = np.asarray(network.outputVars[0]).reshape(-1)
    lower, upper = np.asarray(lower, dtype=float).reshape(-1), np.asarray(upper, dtype=float).reshape(-1)
    for var, lo, hi in zip(inputs, lower, upper):
        network.setLowerBound(int(var), float(lo))
        network.setUpperBound(int(var), float(hi))
    C, d = np.asarray(C, dtype=float), np.asarray(d, dtype=float)
    for row, offset in zip(C, d):
        # C_i·y + d_i ≥ 0  ⇔  −C_i·y ≤ d_i
        used = np.nonzero(row)[0]
        network.addInequality([int(outputs[j]) for j in used], [float(-row[j]) for j in used], float(offset))
    options = Marabou.createOptions(timeoutInSeconds=max(1, int(np.ceil(timeout))), verbosity=0)
    started = time.perf_counter()
    exit_code, values, _ = network.solve(verbose=False, options=options)
    seconds = time.perf_counter() - started
    point = None
    if exit_code == "sat":
        point = np.array([values[int(v)] for v in inputs])
    return exit_code.lower() if isinstance(exit_code, str) else str(exit_code), seconds, point


def export_onnx(network: Network, path) -> Path:
    """Write a Linear/ReLU/Flatten network as an ONNX file (Gemm + Relu) for Marabou."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    if not network.is_chain:
        raise UnsupportedError("export_onnx writes chains of layers; this network has branches")
    nodes, initializers = [], []
    current = "input"
    for index, layer in enumerate(network.layers):
        out = f"h{index}"
        if isinstance(layer, Linear):
            initializers += [numpy_helper.from_array(layer.weight.numpy().astype(np.float32), f"W{index}"),
                             numpy_helper.from_array(layer.bias.numpy().astype(np.float32), f"b{index}")]
            nodes.append(helper.make_node("Gemm", [current, f"W{index}", f"b{index}"], [out], transB=1))
        elif isinstance(layer, ReLU):
            nodes.append(helper.make_node("Relu", [current], [out]))
        elif isinstance(layer, Flatten):
            nodes.append(helper.make_node("Flatten", [current], [out], axis=1))
        else:
            raise UnsupportedError(f"export_onnx supports Linear, ReLU and Flatten layers; layer {index} is {type(layer).__name__}")
        current = out
    graph = helper.make_graph(
        nodes, "assay", [helper.make_tensor_value_info("input", TensorProto.FLOAT, [1, *network.input_shape])],
        [helper.make_tensor_value_info(current, TensorProto.FLOAT, [1, network.output_size])], initializers,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    onnx.save(model, str(path))
    return Path(path)


def solve_network(network: Network, lower, upper, C, d, timeout: float):
    """:func:`solve_query` for an in-memory Linear/ReLU network (exported to a temporary ONNX file).

    The export stores float32 weights: compare verdicts with assay run on the same float32-rounded
    weights (see :func:`float32_rounded`).
    """
    with tempfile.TemporaryDirectory() as folder:
        path = export_onnx(network, os.path.join(folder, "network.onnx"))
        return solve_query(path, lower, upper, C, d, timeout)


def float32_rounded(network: Network) -> Network:
    """The same network with every parameter rounded to float32 (what an ONNX export stores)."""
    layers = []
    for layer in network.layers:
        if isinstance(layer, Linear):
            layer = Linear(layer.weight.to(torch.float32), layer.bias.to(torch.float32))
        layers.append(layer)
    return replace(network, layers=tuple(layers))
