"""Tiny models and properties written into a test's tmp_path, with facts known by hand."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


def write_tiny_onnx(path: Path) -> Path:
    """x (1, 2) → Gemm(identity) → Relu → Gemm → y (1, 2) with y0 = relu(x0) + relu(x1), y1 = −y0.

    Over x ∈ [0, 1]² every ReLU is active, so y0 ranges exactly over [0, 2].
    """
    initializers = [
        numpy_helper.from_array(np.eye(2, dtype=np.float32), "w1"),
        numpy_helper.from_array(np.zeros(2, dtype=np.float32), "b1"),
        numpy_helper.from_array(np.array([[1, 1], [-1, -1]], dtype=np.float32), "w2"),
        numpy_helper.from_array(np.zeros(2, dtype=np.float32), "b2"),
    ]
    nodes = [
        helper.make_node("Gemm", ["input", "w1", "b1"], ["h"], name="hidden", transB=1),
        helper.make_node("Relu", ["h"], ["r"], name="relu"),
        helper.make_node("Gemm", ["r", "w2", "b2"], ["output"], name="out", transB=1),
    ]
    graph = helper.make_graph(
        nodes, "tiny", [helper.make_tensor_value_info("input", TensorProto.FLOAT, [1, 2])],
        [helper.make_tensor_value_info("output", TensorProto.FLOAT, [1, 2])], initializers,
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]), str(path))
    return path


def write_vnnlib(path: Path, unsafe: str) -> Path:
    """x ∈ [0, 1]² and the unsafe output condition ``unsafe`` (an SMT-LIB assertion body)."""
    path.write_text(
        "(declare-const X_0 Real)\n(declare-const X_1 Real)\n(declare-const Y_0 Real)\n(declare-const Y_1 Real)\n"
        "(assert (>= X_0 0.0))\n(assert (<= X_0 1.0))\n(assert (>= X_1 0.0))\n(assert (<= X_1 1.0))\n"
        f"(assert {unsafe})\n"
    )
    return path


def holding_property(path: Path) -> Path:
    """Unsafe: y0 ≤ −0.5, impossible since y0 ≥ 0 (CROWN bounds alone prove it)."""
    return write_vnnlib(path, "(<= Y_0 -0.5)")


def violated_property(path: Path) -> Path:
    """Unsafe: y0 ≥ 1.5, reached e.g. at x = (1, 1) where y0 = 2."""
    return write_vnnlib(path, "(>= Y_0 1.5)")


def write_logit_onnx(path: Path) -> Path:
    """x (1, 2) → Gemm → one logit y = x0 + x1 − 1: inputs of [0, 1]² with x0 + x1 < 1 are class 0, and
    every one has a counterfactual (raise the sum to 1)."""
    initializers = [numpy_helper.from_array(np.array([[1.0, 1.0]]), "w"), numpy_helper.from_array(np.array([-1.0]), "b")]
    graph = helper.make_graph(
        [helper.make_node("Gemm", ["input", "w", "b"], ["output"], name="logit", transB=1)], "logit",
        [helper.make_tensor_value_info("input", TensorProto.DOUBLE, [1, 2])],
        [helper.make_tensor_value_info("output", TensorProto.DOUBLE, [1, 1])], initializers,
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]), str(path))
    return path
