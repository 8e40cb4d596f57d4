"""Fold an ONNX graph's shape subgraphs to constants before it is read.

Exporters compute reshape targets, broadcast shapes and index ranges inside the graph
(``Shape`` → ``Gather`` → ``Unsqueeze`` → ``Concat`` → ``Reshape``; ``ConstantOfShape``,
``Expand``, ``Range``, ``Equal``/``Where`` on constants, ``Cast``, ``Squeeze``). Once the input's
shape is fixed these are constants. The folding is onnxsim's (constant folding with
onnxruntime and onnx's shape inference), without its graph optimisations
(``perform_optimization=False``: no operator fusion, so every remaining node is one the
exporter wrote). A symbolic batch dimension is fixed to 1 for the folding; the loader treats the
folded batch entry of a reshape target as the batch dimension.

Graphs that use only the operators of ReLU networks (:data:`RELU_NETWORK_OPERATORS`) are read
as they are, so they load into exactly the layers they always did.
"""

from __future__ import annotations

from assay.errors import ModelLoadError

__all__ = ["needs_folding", "fold_constants"]

RELU_NETWORK_OPERATORS = frozenset((
    "Add", "AveragePool", "BatchNormalization", "Constant", "Conv", "Div", "Dropout", "Flatten",
    "Gemm", "Identity", "MatMul", "MaxPool", "Mul", "Pad", "Relu", "Reshape", "Sub",
))


def needs_folding(model) -> bool:
    """Whether ``model`` has an operator outside :data:`RELU_NETWORK_OPERATORS` (it is folded then)."""
    return any(node.op_type not in RELU_NETWORK_OPERATORS for node in model.graph.node)


def fold_constants(model, input_name: str, dims: list, name: str):
    """``model`` with every node computable from constants (given the input ``dims``, ``None``
    for a symbolic one, fixed to 1) replaced by its value.

    Raises:
        ModelLoadError: onnxsim is missing or cannot fold the graph.
    """
    try:
        import onnxsim
    except ImportError as exc:  # a declared dependency; say how to get it rather than fail deep inside
        raise ModelLoadError(f"{name}: folding this graph's shape computations needs the onnxsim package; "
                             "pip install onnxsim") from exc
    shape = [1 if d is None else int(d) for d in dims]
    try:
        folded, _ = onnxsim.simplify(model, perform_optimization=False, overwrite_input_shapes={input_name: shape},
                                     check_n=0)
    except Exception as exc:  # onnxsim and onnxruntime raise many kinds of errors on graphs they cannot run
        raise ModelLoadError(f"{name}: its shape computations could not be folded to constants "
                             f"({type(exc).__name__}: {str(exc)[:300]}); re-export it with a fixed input shape") from exc
    return folded
