"""The ONNX operators of general networks: one builder per ONNX op type (:data:`BUILDERS`).

A builder reads one node and emits layers of :mod:`assay.nn.ops` through the converter it is
given (``graph``, a :class:`assay.nn._onnx._Converter`), which offers:

* ``graph.constant(name)`` / ``graph.is_constant(name)`` — constants (initializers, folded nodes);
* ``graph.shape(name)`` — the shape of one sample of an activation (no batch dimension);
* ``graph.axis(axis, name, where)`` — an ONNX axis of activation ``name`` as a sample axis
  (a :class:`BatchAxisError` when it is the batch dimension);
* ``graph.emit(layer, inputs, output, where)`` — append ``layer`` reading the activations
  ``inputs`` and name its result ``output``;
* ``graph.opset`` — the model's ``ai.onnx`` opset version.

A new operator is a class in :mod:`assay.nn.ops` and one function here, registered with
``@builds("OpType")``. ReLU-network operators (Gemm, Conv, Relu, pooling, ...) are read by the
converter itself, which folds element-wise affine maps into dense and convolution layers.
"""

from __future__ import annotations

import numpy as np

from assay.errors import ModelLoadError, UnsupportedOperatorError
from assay.nn.layers import Reshape
from assay.nn.ops import (
    ArgMax,
    Binary,
    Cast,
    Clip,
    Concat,
    Conv,
    Equal,
    Gather,
    LeakyRelu,
    MatMul,
    MinMax,
    Pow,
    Reduce,
    Resize,
    Slice,
    Softmax,
    Transpose,
)
from assay.nn.ops.activation import ELEMENTWISE

__all__ = ["BUILDERS", "BatchAxisError", "builds"]

BUILDERS: dict = {}


class BatchAxisError(UnsupportedOperatorError):
    """A node acts on the batch dimension (the loader may retry without one, see _onnx)."""


def builds(*op_types: str):
    """Register the decorated function as the builder of ``op_types``."""
    def register(function):
        for op_type in op_types:
            BUILDERS[op_type] = function
        return function
    return register


def _text(value) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _activations(graph, node) -> list[str]:
    return [n for n in node.input if n and not graph.is_constant(n)]


def _ints(graph, node, position: int, attrs: dict, key: str):
    """An int list given as attribute ``key`` (older opsets) or as constant input ``position``."""
    if key in attrs:
        return [int(v) for v in attrs[key]]
    if len(node.input) > position and node.input[position]:
        return [int(v) for v in np.asarray(graph.constant(node.input[position])).reshape(-1)]
    return None


@builds(*ELEMENTWISE)
def _elementwise(graph, node, attrs, where):
    graph.emit(ELEMENTWISE[node.op_type](), [node.input[0]], node.output[0], where)


@builds("LeakyRelu")
def _leaky_relu(graph, node, attrs, where):
    graph.emit(LeakyRelu(attrs.get("alpha", 0.01)), [node.input[0]], node.output[0], where)


@builds("Pow")
def _pow(graph, node, attrs, where):
    if not graph.is_constant(node.input[1]) or graph.is_constant(node.input[0]):
        raise UnsupportedOperatorError(f"{where}: only Pow of a tensor by a constant exponent is supported")
    exponent = np.asarray(graph.constant(node.input[1]))
    if exponent.size != 1:
        raise UnsupportedOperatorError(f"{where}: only Pow with one (scalar) exponent is supported; got shape "
                                       f"{exponent.shape}")
    graph.emit(Pow(float(exponent.reshape(-1)[0])), [node.input[0]], node.output[0], where)


@builds("Clip")
def _clip(graph, node, attrs, where):
    bounds = []
    for position, key in ((1, "min"), (2, "max")):
        if key in attrs:
            bounds.append(float(attrs[key]))
        elif len(node.input) > position and node.input[position]:
            bounds.append(float(np.asarray(graph.constant(node.input[position])).reshape(-1)[0]))
        else:
            bounds.append(None)
    graph.emit(Clip(*bounds), [node.input[0]], node.output[0], where)


@builds("Softmax")
def _softmax(graph, node, attrs, where):
    name = node.input[0]
    rank = len(graph.shape(name)) + graph.lead
    axis = attrs.get("axis", -1 if graph.opset >= 13 else 1)
    axis = axis + rank if axis < 0 else axis
    if graph.opset < 13 and axis != rank - 1:
        raise UnsupportedOperatorError(f"{where}: Softmax before opset 13 over axis {axis} of a rank-{rank} tensor "
                                       "flattens the trailing axes; only the last axis is supported")
    graph.emit(Softmax(graph.axis(axis, name, where)), [name], node.output[0], where)


@builds("Min", "Max")
def _min_max(graph, node, attrs, where):
    names = _activations(graph, node)
    constants = [np.asarray(graph.constant(n), dtype=np.float64) for n in node.input if n and graph.is_constant(n)]
    constant = None
    if constants:
        constant = constants[0]
        for other in constants[1:]:
            constant = np.minimum(constant, other) if node.op_type == "Min" else np.maximum(constant, other)
        constant = graph.sample_constant(constant, where)
    if len(names) == 1 and constant is not None and constant.size == 1:  # max(x, c) is a clip
        bound = float(constant.reshape(-1)[0])
        layer = Clip(lower=bound) if node.op_type == "Max" else Clip(upper=bound)
    else:
        layer = MinMax(node.op_type, constant)
    graph.emit(layer, names, node.output[0], where)


@builds("Slice")
def _slice(graph, node, attrs, where):
    name = node.input[0]
    shape = graph.shape(name)
    starts = _ints(graph, node, 1, attrs, "starts")
    ends = _ints(graph, node, 2, attrs, "ends")
    axes = _ints(graph, node, 3, attrs, "axes") or list(range(len(starts)))
    steps = _ints(graph, node, 4, {}, "steps") or [1] * len(starts)
    rank = len(shape) + graph.lead
    our_axes, our_starts, our_stops = [], [], []
    for axis, start, end, step in zip(axes, starts, ends, steps):
        axis = graph.axis(axis + rank if axis < 0 else axis, name, where)
        size = shape[axis]
        if step < 1:
            raise UnsupportedOperatorError(f"{where}: Slice with step {step} is not supported (only steps ≥ 1)")
        start = min(max(start + size if start < 0 else start, 0), size)
        end = min(max(end + size if end < 0 else end, 0), size)
        our_axes.append(axis)
        our_starts.append(start)
        our_stops.append(max(end, start))
    graph.emit(Slice(our_axes, our_starts, our_stops, steps), [name], node.output[0], where)


@builds("Split")
def _split(graph, node, attrs, where):
    name = node.input[0]
    shape = graph.shape(name)
    rank = len(shape) + graph.lead
    axis = attrs.get("axis", 0)
    axis = graph.axis(axis + rank if axis < 0 else axis, name, where)
    outputs = [o for o in node.output if o]
    sizes = _ints(graph, node, 1, attrs, "split")
    if sizes is None:
        parts = attrs.get("num_outputs", len(outputs))
        chunk = -(-shape[axis] // parts)
        sizes = [min(chunk, shape[axis] - i * chunk) for i in range(parts)]
    if sum(sizes) != shape[axis] or len(sizes) != len(outputs):
        raise ModelLoadError(f"{where}: split sizes {sizes} do not cover axis of size {shape[axis]} in "
                             f"{len(outputs)} outputs")
    start = 0
    for size, output in zip(sizes, outputs):
        graph.emit(Slice([axis], [start], [start + size], [1]), [name], output, where)
        start += size


@builds("Gather")
def _gather(graph, node, attrs, where):
    name, index_name = node.input[0], node.input[1]
    if graph.is_constant(name) or not graph.is_constant(index_name):
        raise UnsupportedOperatorError(f"{where}: only Gather from a tensor with constant indices is supported")
    shape = graph.shape(name)
    rank = len(shape) + graph.lead
    axis = attrs.get("axis", 0)
    axis = graph.axis(axis + rank if axis < 0 else axis, name, where)
    indices = np.asarray(graph.constant(index_name)).astype(np.int64)
    size = shape[axis]
    if np.any(indices < -size) or np.any(indices >= size):
        raise ModelLoadError(f"{where}: Gather indices outside [-{size}, {size}) on an axis of size {size}")
    graph.emit(Gather(axis, np.where(indices < 0, indices + size, indices)), [name], node.output[0], where)


@builds("Concat")
def _concat(graph, node, attrs, where):
    names = [n for n in node.input if n]
    tensors = [n for n in names if not graph.is_constant(n)]
    rank = len(graph.shape(tensors[0])) + graph.lead
    axis = attrs["axis"]
    axis = graph.axis(axis + rank if axis < 0 else axis, tensors[0], where)
    parts = [None if n in tensors else graph.sample_constant(np.asarray(graph.constant(n), dtype=np.float64), where,
                                                             rank=rank - graph.lead)
             for n in names]
    graph.emit(Concat(axis, parts), tensors, node.output[0], where)


@builds("Transpose")
def _transpose(graph, node, attrs, where):
    name = node.input[0]
    rank = len(graph.shape(name)) + graph.lead
    perm = [int(p) for p in attrs.get("perm", list(reversed(range(rank))))]
    if graph.lead and perm[0] != 0:
        raise BatchAxisError(f"{where}: Transpose with perm={perm} moves the batch dimension")
    perm = [p - graph.lead for p in perm[graph.lead:]]
    graph.emit(Transpose(perm), [name], node.output[0], where)


@builds("ReduceSum", "ReduceMean")
def _reduce(graph, node, attrs, where):
    name = node.input[0]
    rank = len(graph.shape(name)) + graph.lead
    axes = _ints(graph, node, 1, attrs, "axes")
    if not axes:
        if attrs.get("noop_with_empty_axes", 0):
            graph.emit(Reshape(graph.shape(name)), [name], node.output[0], where)  # reduces nothing
            return
        raise BatchAxisError(f"{where}: {node.op_type} over every axis reduces the batch dimension")
    axes = [graph.axis(a + rank if a < 0 else a, name, where) for a in axes]
    kind = "sum" if node.op_type == "ReduceSum" else "mean"
    graph.emit(Reduce(kind, axes, bool(attrs.get("keepdims", 1))), [name], node.output[0], where)


@builds("Resize", "Upsample")
def _resize(graph, node, attrs, where):
    name = node.input[0]
    shape = graph.shape(name)
    mode = _text(attrs.get("mode", "nearest"))
    if mode != "nearest":
        raise UnsupportedOperatorError(f"{where}: only nearest-neighbour {node.op_type} is supported; got mode={mode!r}")
    if node.op_type == "Upsample":
        transform, rounding = "asymmetric", "floor"
        scales = _float_list(graph, node, 1, attrs, "scales")
    else:
        transform = _text(attrs.get("coordinate_transformation_mode", "half_pixel"))
        rounding = _text(attrs.get("nearest_mode", "round_prefer_floor"))
        scales = _float_list(graph, node, 2, attrs, "scales") if graph.opset >= 11 else \
            _float_list(graph, node, 1, attrs, "scales")
        sizes = _float_list(graph, node, 3, attrs, "sizes") if graph.opset >= 11 else None
        if not scales and sizes:
            full = [1] * graph.lead + list(shape)
            scales = [s / d for s, d in zip(sizes, full)]
    if not scales:
        raise UnsupportedOperatorError(f"{where}: {node.op_type} needs constant scales or sizes")
    integer = all(float(s).is_integer() and s >= 1 for s in scales)
    exact_repeat = (transform in ("half_pixel", "pytorch_half_pixel") and rounding.startswith("round_prefer")) or \
        (transform == "asymmetric" and rounding == "floor")
    if not integer or not exact_repeat:
        raise UnsupportedOperatorError(
            f"{where}: only nearest {node.op_type} by integer scales with coordinate_transformation_mode half_pixel "
            f"(round) or asymmetric (floor) is supported; got scales {scales}, {transform}, {rounding}")
    if graph.lead and scales[0] != 1:
        raise BatchAxisError(f"{where}: {node.op_type} scales the batch dimension")
    graph.emit(Resize([int(s) for s in scales[graph.lead:]]), [name], node.output[0], where)


def _float_list(graph, node, position, attrs, key):
    if key in attrs:
        return [float(v) for v in attrs[key]]
    if len(node.input) > position and node.input[position]:
        values = np.asarray(graph.constant(node.input[position])).reshape(-1)
        return [float(v) for v in values] if values.size else None
    return None


@builds("ConvTranspose")
def _conv_transpose(graph, node, attrs, where):
    name = node.input[0]
    if graph.is_constant(node.input[0]) or not graph.is_constant(node.input[1]):
        raise UnsupportedOperatorError(f"{where}: the transposed convolution's kernel must be a constant")
    weight = np.asarray(graph.constant(node.input[1]), dtype=np.float64)
    groups = int(attrs.get("group", 1))
    dims = weight.ndim - 2
    bias = np.zeros(weight.shape[1] * groups)
    if len(node.input) > 2 and node.input[2]:
        bias = np.asarray(graph.constant(node.input[2]), dtype=np.float64)
    if _text(attrs.get("auto_pad", "NOTSET")) not in ("NOTSET", "VALID") or "output_shape" in attrs:
        raise UnsupportedOperatorError(f"{where}: ConvTranspose with auto_pad or output_shape is not supported; "
                                       "export with explicit pads")
    pads = list(attrs.get("pads", [0] * 2 * dims))
    layer = Conv(weight, bias, attrs.get("strides", [1] * dims), pads[:dims], pads[dims:],
                 attrs.get("dilations", [1] * dims), groups, transposed=True,
                 output_padding=attrs.get("output_padding", [0] * dims))
    graph.emit(layer, [name], node.output[0], where)


def general_conv(graph, node, attrs, where):
    """A ``Conv`` node the ReLU-network path cannot take (1-D/3-D, asymmetric pads, no batch dimension)."""
    weight = np.asarray(graph.constant(node.input[1]), dtype=np.float64)
    dims = weight.ndim - 2
    bias = np.zeros(weight.shape[0])
    if len(node.input) > 2 and node.input[2]:
        bias = np.asarray(graph.constant(node.input[2]), dtype=np.float64)
    auto_pad = _text(attrs.get("auto_pad", "NOTSET"))
    if auto_pad not in ("NOTSET", "VALID"):
        raise UnsupportedOperatorError(f"{where}: auto_pad={auto_pad} is not supported; export with explicit pads")
    pads = [0] * 2 * dims if auto_pad == "VALID" else list(attrs.get("pads", [0] * 2 * dims))
    layer = Conv(weight, bias, attrs.get("strides", [1] * dims), pads[:dims], pads[dims:],
                 attrs.get("dilations", [1] * dims), int(attrs.get("group", 1)))
    graph.emit(layer, [node.input[0]], node.output[0], where)


def two_tensor_op(graph, node, names, where):
    """``Add``/``Sub``/``Mul``/``Div``/``MatMul`` of two activations (``names``, in node order)."""
    if node.op_type == "MatMul":
        layer = MatMul()
    else:
        ranks = {len(graph.shape(n)) for n in names}
        if graph.lead and len(ranks) > 1:
            raise BatchAxisError(f"{where}: {node.op_type} of tensors of ranks {sorted(ranks)} would broadcast "
                                 "across the batch dimension")
        layer = Binary(node.op_type)
    graph.emit(layer, names, node.output[0], where)


@builds("Unsqueeze", "Squeeze")
def _unsqueeze(graph, node, attrs, where):
    """Insert or drop unit dimensions: a Reshape of one sample."""
    name = node.input[0]
    full = [1] * graph.lead + list(graph.shape(name))
    axes = _ints(graph, node, 1, attrs, "axes")
    if node.op_type == "Unsqueeze":
        rank = len(full) + len(axes)
        axes = sorted(a + rank if a < 0 else a for a in axes)
        for axis in axes:
            full.insert(axis, 1)
    else:
        rank = len(full)
        axes = [a + rank if a < 0 else a for a in axes] if axes else \
            [i for i, d in enumerate(full) if d == 1 and i >= graph.lead]
        if any(full[a] != 1 for a in axes):
            raise ModelLoadError(f"{where}: Squeeze of axes {axes} whose size is not 1 (shape {full})")
        full = [d for i, d in enumerate(full) if i not in axes]
    if graph.lead and 0 in axes:
        raise BatchAxisError(f"{where}: {node.op_type} of axis 0 moves the batch dimension")
    graph.emit(Reshape(tuple(full[graph.lead:])), [name], node.output[0], where)


@builds("ArgMax")
def _argmax(graph, node, attrs, where):
    name = node.input[0]
    rank = len(graph.shape(name)) + graph.lead
    axis = attrs.get("axis", 0)
    axis = graph.axis(axis + rank if axis < 0 else axis, name, where)
    graph.emit(ArgMax(axis, bool(attrs.get("keepdims", 1)), bool(attrs.get("select_last_index", 0))), [name],
               node.output[0], where)


@builds("Equal")
def _equal(graph, node, attrs, where):
    names = _activations(graph, node)
    if len(names) != 2:
        raise UnsupportedOperatorError(f"{where}: only Equal of two tensors computed from the input is supported")
    ranks = {len(graph.shape(n)) for n in names}
    if graph.lead and len(ranks) > 1:
        raise BatchAxisError(f"{where}: Equal of tensors of ranks {sorted(ranks)} would broadcast across the batch "
                             "dimension")
    graph.emit(Equal(), names, node.output[0], where)


@builds("Cast")
def _cast(graph, node, attrs, where):
    """A cast to the type the tensor already has changes nothing; any other is a Cast layer."""
    name, to = node.input[0], int(attrs["to"])
    source = graph.types.get(name, (1, None))[0]
    if source == to:
        graph.alias(name, node.output[0], where)
        return
    graph.emit(Cast(to), [name], node.output[0], where)
