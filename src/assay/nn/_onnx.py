"""Read an ONNX model into a :class:`~assay.nn.Network`.

Contract:

* The graph has one graph input that is not an initializer and one graph output; nodes come in
  topological order (as ONNX requires). Every node reads one activation tensor plus constants
  (initializers or ``Constant`` nodes), except ``Add`` of two activations (a residual
  connection). Branches and skip connections are kept as a graph (:class:`Network` ``sources``).
* Supported operators (:data:`SUPPORTED_OPERATORS`): ``Gemm`` (``transA=0``, any ``alpha``,
  ``beta``, ``transB``), ``MatMul`` with a constant matrix (either side for a batch-less vector
  input, else on the right), ``Add``/``Sub``/``Mul``/``Div`` with a constant (a bias, or input
  normalisation; ``Div`` only by a constant), ``Add`` of two activations, ``Conv`` (2-D,
  symmetric ``pads``, ``auto_pad`` NOTSET or VALID, any ``strides``, ``dilations``, ``group``),
  ``Relu``, ``AveragePool`` (``count_include_pad=1`` or no padding), ``MaxPool`` (2-D, no
  padding, lowered exactly to convolutions, ReLUs and Adds), ``Pad`` (constant 0, symmetric over
  the image's rows and columns), ``Flatten`` (``axis=1``), ``Reshape`` when it is a flatten to
  ``(batch, -1)``, ``BatchNormalization`` (inference), ``Identity``, ``Dropout`` (inference:
  ignored), ``Constant``. Any other operator raises :class:`UnsupportedOperatorError` naming the
  operator, the node and the file.
* General graphs (issue 32): the operators of :data:`assay.nn._onnx_builders.BUILDERS`
  (sigmoid, tanh, sin, softmax, products, shape operators, ...) load as layers of
  :mod:`assay.nn.ops`, and the cases above that the ReLU-network path refuses (``Reshape`` to any
  shape, ``MatMul`` with a constant on either side or of two tensors, ``Add``/``Sub``/``Mul``/``Div``
  of two tensors or with a constant that broadcasts the tensor, N-d and asymmetrically padded
  ``Conv``, any constant ``Pad``) go there too. A graph with any operator outside the
  ReLU-network set is first folded (:mod:`assay.nn._onnx_fold`: shape subgraphs become
  constants). An operator that would act on the batch dimension raises a ``BatchAxisError``
  (an :class:`UnsupportedOperatorError` naming the node); when the graph's first input
  dimension is fixed, the graph is then read again as computing on one sample whose shape keeps
  that dimension (``(1, 22)``, ``(12, 8)``).
* Elementwise affine maps (``Sub``, ``Div``, ``Mul``, ``Add``, ``BatchNormalization``) are folded
  into the neighbouring ``Linear``/``Conv2d`` (see :mod:`assay.nn._build`); the result is exact in
  real arithmetic, computed in float64.
* Batch dimension: the first dimension of a graph input of rank >= 2 is the batch dimension
  (symbolic, 0/unknown or 1); a rank-1 input (e.g. ``X: [4]`` with ``MatMul(W, X)``) has none.
  ``Network.input_shape`` never includes it.
* Row-wise models: when the input has rank >= 3 and the graph only uses ``MatMul`` (constant on
  the right) and elementwise ``Add``/``Sub``/``Mul``/``Div``/``Relu`` (plus ``Identity``,
  ``Dropout``, ``Constant``), every dimension but the last passes through untouched, so all of
  them are treated as batch dimensions: ``model_auto_park*.onnx`` declares ``[batch_size, 2, 2]``
  and maps each row of 2 values to 4, so it loads as a 2 -> 20 -> 4 network with
  ``input_shape == (2,)``. Evaluate it on ``x.reshape(-1, 2)`` and reshape the output back.
* ``input_shape`` (optional) fills in symbolic non-batch dimensions, and otherwise must match
  the graph.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np

from assay.errors import AssayError, ModelLoadError, UnsupportedOperatorError
from assay.nn import _onnx_builders as general
from assay.nn._build import LayerBuilder
from assay.nn._files import gunzipped, is_gzipped
from assay.nn._onnx_builders import BUILDERS, BatchAxisError
from assay.nn._onnx_fold import RELU_NETWORK_OPERATORS, fold_constants, needs_folding
from assay.nn._onnx_tables import find_indexed, table_layer, tensor_types
from assay.nn.layers import Reshape
from assay.nn.network import Network
from assay.nn.ops import Affine, ConstMatMul, Reciprocal
from assay.nn.ops import Pad as PadLayer

__all__ = ["SUPPORTED_OPERATORS", "load_onnx", "operator_counts"]

SUPPORTED_OPERATORS = tuple(sorted(RELU_NETWORK_OPERATORS | set(BUILDERS)))
_ROW_WISE = {"MatMul", "Add", "Sub", "Mul", "Div", "Relu", "Identity", "Dropout", "Constant"}
_FLOAT_TYPES = {1, 10, 11, 16}  # FLOAT, FLOAT16, DOUBLE, BFLOAT16


def load_onnx(source, input_shape=None) -> Network:
    """Load ``source`` (a path or an ``onnx.ModelProto``); see the module docstring for the contract."""
    import onnx

    model, name = _read(source)
    try:
        onnx.checker.check_model(model)
    except Exception as exc:  # onnx raises ValidationError and, for odd protos, other errors
        raise ModelLoadError(f"{name} is not a valid ONNX model ({exc}); re-export it from its framework") from exc
    graph_input, dims = _graph_input(model, name) if needs_folding(model) else (None, None)
    if dims is not None:
        model = fold_constants(model, graph_input.name, dims, name)
    network = _run(model, name, input_shape, dims)
    if any(node.op_type == "MaxPool" for node in model.graph.node):
        # The same graph with each MaxPool kept whole: its bounds are far tighter (see Network.pooled).
        pooled = _run(model, name, input_shape, dims, lower_maxpool=False)
        network = replace(network, pooled=pooled)
    if not isinstance(source, onnx.ModelProto):
        # The file as it is: counterexamples are re-checked on it (Network.onnx_file).
        object.__setattr__(network, "onnx_file", name)
    return network


def _run(model, name: str, input_shape, dims_before_folding, lower_maxpool: bool = True) -> Network:
    """Convert with a leading batch dimension; a graph whose first input dimension is fixed (in
    the file, not by the folding) and that acts on it (``Transpose(perm=[1, 0])`` of a ``(1, n)``
    row, ``Reshape`` of a ``(12, 8)`` input to ``(1, 12, 8)``) computes on one sample whose shape
    keeps that dimension, and is converted again that way."""
    try:
        return _Converter(model, name).run(input_shape, lower_maxpool)
    except BatchAxisError:
        _, dims = _graph_input(model, name)
        dims = dims_before_folding or dims
        if len(dims) < 2 or dims[0] is None or input_shape is not None:
            raise
        return _Converter(model, name).run(None, lower_maxpool, batch_free=True)


def operator_counts(source) -> dict[str, int]:
    """``{op_type: count}`` of the nodes of an ONNX model (a path, gzipped or not, or a ModelProto)."""
    model, _ = _read(source)
    counts: dict[str, int] = {}
    for node in model.graph.node:
        counts[node.op_type] = counts.get(node.op_type, 0) + 1
    return dict(sorted(counts.items()))


def _graph_input(model, name: str):
    """The graph's one non-initializer input and its dims (None where symbolic or unknown)."""
    initializers = {i.name for i in model.graph.initializer}
    inputs = [i for i in model.graph.input if i.name not in initializers]
    if len(inputs) != 1:
        raise ModelLoadError(
            f"{name}: the graph has {len(inputs)} inputs that are not initializers "
            f"({[i.name for i in inputs]}); assay loads single-input networks — export the model with one input"
        )
    dims = [d.dim_value if d.HasField("dim_value") and d.dim_value > 0 else None
            for d in inputs[0].type.tensor_type.shape.dim]
    return inputs[0], dims


def _read(source):
    import onnx

    if isinstance(source, onnx.ModelProto):
        return source, "<onnx.ModelProto>"
    path = Path(source)
    if not path.is_file():
        raise ModelLoadError(f"{path}: no such file; check the path (the current directory is {Path.cwd()})")
    if is_gzipped(path):
        data = gunzipped(path)
        try:
            return onnx.load_model_from_string(data), str(path)
        except Exception as exc:
            raise ModelLoadError(f"{path} could not be parsed as a gzipped ONNX model ({type(exc).__name__}: {exc}); "
                                 "is it really an .onnx.gz file, and complete?") from exc
    try:
        return onnx.load(str(path)), str(path)
    except Exception as exc:
        raise ModelLoadError(f"{path} could not be parsed as an ONNX model ({type(exc).__name__}: {exc}); "
                             "is it really an .onnx file, and complete?") from exc


def _attributes(node) -> dict:
    from onnx import helper

    return {a.name: helper.get_attribute_value(a) for a in node.attribute}


class _Converter:
    """One pass over a checked model's graph."""

    def __init__(self, model, name: str):
        from onnx import numpy_helper

        self.model, self.graph, self.name = model, model.graph, name
        self.opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 13)
        try:
            # to_array views the protobuf's bytes (read-only); torch warns on, and must not share, such arrays.
            self.constants = {i.name: np.array(numpy_helper.to_array(i)) for i in self.graph.initializer}
        except Exception as exc:
            raise ModelLoadError(f"{name}: an initializer could not be read ({exc})") from exc

    # ------------------------------------------------------------------ graph interface
    def run(self, input_shape, lower_maxpool: bool = True, batch_free: bool = False) -> Network:
        """The Network; ``batch_free``: the graph has no batch dimension (its input shape is one sample's)."""
        graph = self.graph
        inputs = [i for i in graph.input if i.name not in self.constants]
        if len(inputs) != 1:
            raise ModelLoadError(
                f"{self.name}: the graph has {len(inputs)} inputs that are not initializers "
                f"({[i.name for i in inputs]}); assay loads single-input networks — export the model with one input"
            )
        if len(graph.output) != 1:
            raise ModelLoadError(
                f"{self.name}: the graph has {len(graph.output)} outputs ({[o.name for o in graph.output]}); "
                "assay loads single-output networks — export only the output to analyse"
            )
        graph_input = inputs[0]
        tensor_type = graph_input.type.tensor_type
        if tensor_type.elem_type not in _FLOAT_TYPES:
            raise ModelLoadError(f"{self.name}: input '{graph_input.name}' is not a floating-point tensor")
        dims = [d.dim_value if d.HasField("dim_value") and d.dim_value > 0 else None for d in tensor_type.shape.dim]
        self.batch_dim = None
        if not dims:
            raise ModelLoadError(f"{self.name}: input '{graph_input.name}' has no shape; re-export it with a shape")
        if len(dims) == 1 or batch_free:
            self.lead, shape = 0, dims
        elif len(dims) >= 3 and self._row_wise():
            self.lead, shape = len(dims) - 1, dims[-1:]
        else:
            self.lead, shape, self.batch_dim = 1, dims[1:], dims[0]
        shape = self._resolve_shape(graph_input.name, shape, input_shape)

        self.builder = LayerBuilder(shape, lower_maxpool, affine_layers=needs_folding(self.model))
        self.current = graph_input.name
        self.tensors = {graph_input.name: 0}  # activation names other nodes may read → tensor index
        output_name = graph.output[0].name
        self.readers: dict[str, int] = {output_name: 1}
        for node in graph.node:
            for name in node.input:
                self.readers[name] = self.readers.get(name, 0) + 1
        self.producers = {o: node for node in graph.node for o in node.output if o}
        self.types = tensor_types(self.model)  # name → (ONNX element type, dims), where the graph says
        self.indexed = find_indexed(self.model, graph_input.name)
        for _, keys, _ in self.indexed.tables.values():
            for key in keys:  # an IndexTable reads its keys after the nodes that produced them: keep them
                self.readers[key] = self.readers.get(key, 0) + 1
        for index, node in enumerate(graph.node):
            self._node(index, node)
        where = f"{self.name}: end of the graph"
        if self.current != output_name:
            if output_name not in self.tensors:
                raise ModelLoadError(f"{where}: no node produces the graph output '{output_name}' from the input")
            self._use(output_name, where)
        layers = self.builder.finish(where)
        return Network(tuple(layers), shape, graph_input.name, output_name, self.name, sources=tuple(self.builder.sources),
                       origins=tuple(self.builder.origins))

    def _row_wise(self) -> bool:
        ops = {node.op_type for node in self.graph.node}
        if "MatMul" not in ops or not ops <= _ROW_WISE:
            return False
        # the activation must be the left operand of every MatMul (x @ W contracts the last axis only)
        return all(node.input[1] in self.constants or self._is_constant_node(node.input[1])
                   for node in self.graph.node if node.op_type == "MatMul")

    def _is_constant_node(self, tensor: str) -> bool:
        return any(n.op_type == "Constant" and tensor in n.output for n in self.graph.node)

    def _resolve_shape(self, input_name: str, shape: list, input_shape) -> tuple[int, ...]:
        if input_shape is not None:
            given = tuple(int(d) for d in input_shape)
            if len(given) != len(shape) or any(d is not None and d != g for d, g in zip(shape, given)):
                shown = tuple("?" if d is None else d for d in shape)
                raise ModelLoadError(
                    f"{self.name}: input_shape={given} does not match the graph's input '{input_name}' of shape "
                    f"{shown} (without the batch dimension); pass a matching input_shape or none"
                )
            return given
        if any(d is None for d in shape):
            shown = tuple("?" if d is None else d for d in shape)
            raise ModelLoadError(
                f"{self.name}: input '{input_name}' has unknown dimensions {shown} besides the batch dimension; "
                "pass input_shape=(...) to load()"
            )
        return tuple(shape)

    # ------------------------------------------------------------------ nodes
    def _node(self, index: int, node) -> None:
        op = node.op_type
        label = node.name or f"#{index}"
        where = f"{self.name}: node '{label}' ({op})"
        if index in self.indexed.nodes:  # reads the input only through integer casts (see _onnx_tables)
            if index in self.indexed.tables:
                output, keys, _ = plan = self.indexed.tables[index]
                self.emit(table_layer(self.model, plan, self.constants, self.lead, where), list(keys), output, where)
            return
        if node.domain not in ("", "ai.onnx") or op not in SUPPORTED_OPERATORS:
            raise UnsupportedOperatorError(
                f"{self.name}: node '{label}' uses operator {op!r}"
                + (f" of domain '{node.domain}'" if node.domain not in ("", "ai.onnx") else "")
                + f", which assay's Network cannot represent; supported operators: {', '.join(SUPPORTED_OPERATORS)}"
            )
        if op == "Constant":
            self.constants[node.output[0]] = self._constant_value(node, where)
            return
        names = [n for n in node.input if n]
        activations = [n for n in names if n not in self.constants]
        unknown = [n for n in activations if n != self.current and n not in self.tensors]
        if unknown:
            raise ModelLoadError(
                f"{where} reads tensor '{unknown[0]}', which is neither a constant nor produced by an earlier node "
                "from the input; check that the model's nodes are in topological order"
            )
        if not activations:
            self._constant_node(op, node, where)
            return
        try:
            if op not in RELU_NETWORK_OPERATORS:
                BUILDERS[op](self, node, _attributes(node), where)
                return
            if len(activations) > 1:
                self._two_activations(node, activations, where)
                return
            self._use(activations[0], where)
            getattr(self, f"_op_{op}")(node, _attributes(node), where)
        except AssayError as exc:
            if where in str(exc):
                raise
            raise type(exc)(f"{where}: {exc}") from exc
        except (ValueError, IndexError, KeyError, TypeError) as exc:
            raise ModelLoadError(f"{where}: inconsistent operands ({exc}); check the model's shapes") from exc
        self.current = node.output[0]
        if self.readers.get(self.current, 0) > 1:  # several nodes read it: give it a tensor of its own
            self.tensors[self.current] = self.builder.materialize(where)

    # ------------------------------------------------------------------ for the builders of general operators
    def is_constant(self, name: str) -> bool:
        return name in self.constants

    def constant(self, name: str) -> np.ndarray:
        if name not in self.constants:
            raise UnsupportedOperatorError(f"{self.name}: tensor '{name}' must be a constant here but is computed "
                                           "from the network's input")
        return self.constants[name]

    def shape(self, name: str) -> tuple[int, ...]:
        """The shape of one sample of activation ``name``."""
        if name == self.current:
            return self.builder.shape
        if name not in self.tensors:
            raise ModelLoadError(f"{self.name}: tensor '{name}' is not produced by an earlier node from the input")
        return self.builder.shapes[self.tensors[name]]

    def axis(self, axis: int, name: str, where: str) -> int:
        """ONNX axis ``axis`` (non-negative) of activation ``name`` as an axis of one sample."""
        rank = len(self.shape(name)) + self.lead
        if not 0 <= axis < rank:
            raise ModelLoadError(f"{where}: axis {axis} is outside a tensor of rank {rank}")
        if axis < self.lead:
            raise BatchAxisError(f"{where}: acts on axis {axis}, the batch dimension; assay's layers act on each "
                                 "input of a batch separately")
        return axis - self.lead

    def sample_constant(self, value: np.ndarray, where: str, rank: int | None = None) -> np.ndarray:
        """A constant operand without its batch dimension (``rank``: of one sample, for a Concat part)."""
        value = np.asarray(value, dtype=np.float64)
        if rank is None:
            return self._bias_constant(value, where)
        if value.ndim == rank + self.lead:
            if self.lead and value.shape[0] != 1:
                raise BatchAxisError(f"{where}: a constant of shape {value.shape} varies along the batch dimension")
            return value.reshape(value.shape[self.lead:])
        raise ModelLoadError(f"{where}: a constant of shape {value.shape} does not have the tensor's rank")

    def emit(self, layer, inputs: list[str], output: str, where: str) -> None:
        """Append ``layer`` reading the activations ``inputs``; its result is activation ``output``."""
        self.tensors[self.current] = self.builder.materialize(where)
        sources = []
        for name in inputs:
            if name not in self.tensors:
                raise ModelLoadError(f"{where}: tensor '{name}' was not kept for a second reader")
            sources.append(self.tensors[name])
        self.builder.append(layer, tuple(sources), where)
        self.current = output
        if self.readers.get(output, 0) > 1:
            self.tensors[output] = self.builder.materialize(where)

    def _two_activations(self, node, activations: list[str], where: str) -> None:
        op = node.op_type
        if op not in ("Add", "Sub", "Mul", "Div", "MatMul"):
            raise UnsupportedOperatorError(f"{where} combines {len(activations)} activation tensors, which assay "
                                           f"supports for Add, Sub, Mul, Div and MatMul")
        if len(activations) == 2 and activations[0] == activations[1] and op in ("Add", "Sub"):
            self._use(activations[0], where)  # x + x = 2x, x − x = 0: affine
            self.builder.affine(2.0 if op == "Add" else 0.0, 0.0, where)
            self.current = node.output[0]
            self._keep_if_read_again(where)
            return
        first, second = activations
        if op == "Add" and first != second and self.shape(first) == self.shape(second):
            self._residual_add(activations, where)  # the residual connection the bound engine knows
            self.current = node.output[0]
            self._keep_if_read_again(where)
            return
        general.two_tensor_op(self, node, [first, second], where)

    def alias(self, name: str, output: str, where: str) -> None:
        """Activation ``output`` is activation ``name`` (a node that changes nothing)."""
        self._use(name, where)
        self.current = output
        self._keep_if_read_again(where)

    def _keep_if_read_again(self, where: str) -> None:
        if self.readers.get(self.current, 0) > 1:
            self.tensors[self.current] = self.builder.materialize(where)

    def _use(self, name: str, where: str) -> None:
        """Make activation ``name`` the builder's current tensor (leaving the current one readable)."""
        if name == self.current:
            return
        self.tensors[self.current] = self.builder.materialize(where)
        self.builder.switch_to(self.tensors[name], where)
        self.current = name

    def _residual_add(self, activations: list[str], where: str) -> None:
        first, second = activations
        if second == self.current:  # continue from the current tensor where possible
            first, second = second, first
        self._use(first, where)
        if second not in self.tensors:
            raise ModelLoadError(f"{where}: tensor '{second}' was not kept for a second reader")
        self.builder.add(self.tensors[second], where)

    def _constant_value(self, node, where: str) -> np.ndarray:
        from onnx import numpy_helper

        attrs = _attributes(node)
        if "value" in attrs:
            return np.array(numpy_helper.to_array(attrs["value"]))  # a writable copy, as the initializers
        for key in ("value_float", "value_floats", "value_int", "value_ints"):
            if key in attrs:
                return np.asarray(attrs[key])
        raise UnsupportedOperatorError(f"{where}: only tensor and numeric Constant nodes are supported; got {sorted(attrs)}")

    def _constant_node(self, op: str, node, where: str) -> None:
        """A node that computes only from constants: evaluate the few cheap ones."""
        values = [self.constants[n] for n in node.input if n]
        rules = {"Identity": lambda a: a, "Dropout": lambda a, *_: a, "Add": np.add, "Sub": np.subtract,
                 "Mul": np.multiply, "Div": np.divide}
        if op not in rules:
            raise UnsupportedOperatorError(f"{where} computes from constants only, which assay supports for "
                                           f"{', '.join(rules)}; fold the constants before exporting")
        self.constants[node.output[0]] = np.asarray(rules[op](*values))

    def _operands(self, node):
        """(position of the activation, the other operand as a constant or None)."""
        position = list(node.input).index(self.current)
        others = [self.constants[n] for i, n in enumerate(node.input) if n and i != position]
        return position, others

    def _bias_constant(self, value: np.ndarray, where: str) -> np.ndarray:
        """Strip the leading (batch) dimensions of an elementwise constant."""
        value = np.asarray(value, dtype=np.float64)
        rank = len(self.builder.shape)
        while value.ndim > rank:
            if value.shape[0] != 1 or value.ndim - rank > self.lead:
                raise ModelLoadError(
                    f"{where}: a constant of shape {value.shape} varies along a batch dimension of the tensor "
                    f"(shape {self.builder.shape} without the batch dimensions); it must broadcast per input"
                )
            value = value[0]
        return value

    def _elementwise(self, node, where, kind: str) -> None:
        position, (other,) = self._operands(node)
        c = self._bias_constant(other, where)
        if np.broadcast_shapes(c.shape, self.builder.shape) != self.builder.shape:
            self._growing_elementwise(node, kind, position, c, where)
            return
        if kind == "Add":
            self.builder.affine(1.0, c, where)
        elif kind == "Sub":
            self.builder.affine(1.0, -c, where) if position == 0 else self.builder.affine(-1.0, c, where)
        elif kind == "Mul":
            self.builder.affine(c, 0.0, where)
        elif position == 0:
            if np.any(c == 0):
                raise ModelLoadError(f"{where}: division by a constant that contains zeros")
            self.builder.affine(1.0 / c, 0.0, where)
        else:  # c / x
            self.emit(Reciprocal(), [self.current], node.output[0], where)
            self.builder.affine(c, 0.0, where)

    def _growing_elementwise(self, node, kind: str, position: int, c: np.ndarray, where: str) -> None:
        """``x ∘ c`` where the constant ``c`` broadcasts ``x`` to a larger shape: an Affine layer."""
        if kind == "Div" and position == 1:
            self.emit(Reciprocal(), [self.current], node.output[0], where)
            kind = "Mul"
        ones, zeros = np.ones_like(c), np.zeros_like(c)
        with np.errstate(divide="ignore"):  # 1/c is only used for Div (a zero there is refused below)
            scale, shift = {"Add": (ones, c), "Mul": (c, zeros), "Div": (1.0 / c, zeros),
                            "Sub": (ones, -c) if position == 0 else (-ones, c)}[kind]
        if not np.all(np.isfinite(scale)):
            raise ModelLoadError(f"{where}: division by a constant that contains zeros")
        self.emit(Affine(scale, shift), [self.current], node.output[0], where)

    def _op_Add(self, node, attrs, where):
        self._elementwise(node, where, "Add")

    def _op_Sub(self, node, attrs, where):
        self._elementwise(node, where, "Sub")

    def _op_Mul(self, node, attrs, where):
        self._elementwise(node, where, "Mul")

    def _op_Div(self, node, attrs, where):
        self._elementwise(node, where, "Div")

    def _op_Identity(self, node, attrs, where):
        pass

    def _op_Dropout(self, node, attrs, where):
        if len(node.input) > 2 and node.input[2] and bool(np.asarray(self.constants[node.input[2]]).any()):
            raise UnsupportedOperatorError(f"{where}: Dropout in training mode is random; export the model in eval mode")

    def _op_Relu(self, node, attrs, where):
        self.builder.relu(where)

    def _op_Gemm(self, node, attrs, where):
        if list(node.input).index(self.current) != 0 or attrs.get("transA", 0) != 0:
            raise UnsupportedOperatorError(f"{where}: only Gemm(activation, constant) with transA=0 is supported")
        matrix = np.asarray(self.constant(node.input[1]), dtype=np.float64)
        weight = attrs.get("alpha", 1.0) * (matrix if attrs.get("transB", 0) else matrix.T)
        if self.lead != 1:  # a (rows, in) matrix per sample: Y = X Wᵀ + C
            self.emit(ConstMatMul(weight.T), [self.current], node.output[0], where)
            if len(node.input) > 2 and node.input[2]:
                self.builder.affine(1.0, attrs.get("beta", 1.0) * np.asarray(self.constant(node.input[2]),
                                                                             dtype=np.float64), where)
            return
        bias = np.zeros(weight.shape[0])
        if len(node.input) > 2 and node.input[2]:
            bias = bias + attrs.get("beta", 1.0) * np.broadcast_to(
                np.asarray(self.constants[node.input[2]], dtype=np.float64).reshape(-1), (weight.shape[0],))
        self.builder.linear(weight, bias, where)

    def _op_MatMul(self, node, attrs, where):
        position, (matrix,) = self._operands(node)
        matrix = np.asarray(matrix, dtype=np.float64)
        if matrix.ndim != 2 or len(self.builder.shape) != 1:
            if matrix.ndim < 1:
                raise UnsupportedOperatorError(f"{where}: MatMul with a scalar constant is not defined")
            if self.lead and (len(self.builder.shape) < 2 or matrix.ndim > len(self.builder.shape) + 1):
                raise BatchAxisError(f"{where}: MatMul of a tensor of shape {self.builder.shape} with a constant of "
                                     f"shape {matrix.shape} would mix the batch dimension")
            self.emit(ConstMatMul(matrix, constant_first=position == 1), [self.current], node.output[0], where)
            return
        if position == 0:
            weight = matrix.T
        elif self.lead == 0:  # W @ x with a batch-less vector x
            weight = matrix
        else:
            raise UnsupportedOperatorError(f"{where}: MatMul(constant, activation) would mix the batch dimension")
        self.builder.linear(weight, np.zeros(weight.shape[0]), where)

    def _op_Flatten(self, node, attrs, where):
        axis = attrs.get("axis", 1)
        rank = len(self.builder.shape) + self.lead
        axis = axis if axis >= 0 else axis + rank
        if self.lead == 1 and axis == 1:
            self.builder.flatten(where)
            return
        shape = self.builder.shape
        if self.lead:  # (batch · Π shape[:axis−1], Π shape[axis−1:]) keeps the batch only if the first factor is 1
            if axis == 0 or int(np.prod(shape[: axis - 1])) != 1:
                raise BatchAxisError(f"{where}: Flatten(axis={axis}) merges the batch dimension into the others")
            self.builder.flatten(where)
            return
        self.emit(Reshape((int(np.prod(shape[:axis])), int(np.prod(shape[axis:])))), [self.current], node.output[0],
                  where)

    def _op_Reshape(self, node, attrs, where):
        target = [int(v) for v in np.asarray(self.constants[node.input[1]]).reshape(-1)]
        shape, copy = self.builder.shape, not attrs.get("allowzero", 0)
        size = int(np.prod(shape))

        def is_batch(v):
            return v == -1 or (v == 0 and copy) or (self.batch_dim is not None and v == self.batch_dim)

        if self.lead == 1 and target and is_batch(target[0]):
            rest = target[1:]
            if len(rest) == len(shape) and all(t == s or (t == 0 and copy) for t, s in zip(rest, shape)):
                return  # reshapes to the shape it already has
            if len(rest) == 1 and (rest[0] == size or (rest[0] == -1 and target[0] != -1)):
                self.builder.flatten(where)
                return
        self.emit(Reshape(self._reshape_target(target, copy, where)), [self.current], node.output[0], where)

    def _reshape_target(self, target: list[int], copy: bool, where: str) -> tuple[int, ...]:
        """The shape of one sample after an ONNX ``Reshape`` to ``target`` (whose first entry is the
        batch dimension when the graph has one: −1, 0, or the folded batch size 1)."""
        shape, size = self.builder.shape, int(np.prod(self.builder.shape))
        full = (1,) * self.lead + tuple(shape)  # the ONNX shape with a batch of one
        resolved = [full[i] if (v == 0 and copy) else v for i, v in enumerate(target)]
        if resolved.count(-1) > 1:
            raise ModelLoadError(f"{where}: Reshape target {target} has more than one -1")
        # with a batch dimension, a size mismatch means the target merges or splits the batch
        mismatch = BatchAxisError if self.lead else ModelLoadError
        if -1 in resolved:
            known = int(np.prod([v for v in resolved if v != -1]))
            if known == 0 or size % known:
                raise mismatch(f"{where}: cannot reshape a tensor of shape {full} to {target}")
            resolved[resolved.index(-1)] = size // known
        if int(np.prod(resolved)) != size:
            raise mismatch(f"{where}: cannot reshape a tensor of shape {full} to {target}")
        if self.lead:
            if not resolved or resolved[0] != 1:
                raise BatchAxisError(f"{where}: Reshape to {target} moves entries across the batch dimension")
            resolved = resolved[1:]
        return tuple(int(v) for v in resolved)

    def _op_Conv(self, node, attrs, where):
        if list(node.input).index(self.current) != 0:
            raise UnsupportedOperatorError(f"{where}: the convolution kernel must be a constant")
        weight = np.asarray(self.constant(node.input[1]), dtype=np.float64)
        pads = attrs.get("pads", (0, 0, 0, 0))
        if self.lead != 1 or weight.ndim != 4 or len(pads) != 4 or tuple(pads[:2]) != tuple(pads[2:]):
            general.general_conv(self, node, attrs, where)  # 1-D/3-D, asymmetric pads, no batch dimension
            return
        bias = np.zeros(weight.shape[0])
        if len(node.input) > 2 and node.input[2]:
            bias = np.asarray(self.constants[node.input[2]], dtype=np.float64)
        if "kernel_shape" in attrs and tuple(attrs["kernel_shape"]) != weight.shape[2:]:
            raise ModelLoadError(f"{where}: kernel_shape {attrs['kernel_shape']} differs from the weight {weight.shape}")
        padding = self._padding(attrs, where)
        self.builder.conv(weight, bias, tuple(attrs.get("strides", (1, 1))), padding,
                          tuple(attrs.get("dilations", (1, 1))), int(attrs.get("group", 1)), where)

    def _op_AveragePool(self, node, attrs, where):
        self._require_batch(where, "AveragePool")
        kernel = tuple(attrs["kernel_shape"])
        stride = tuple(attrs.get("strides", (1,) * len(kernel)))
        padding = self._padding(attrs, where)
        if len(kernel) != 2:
            raise UnsupportedOperatorError(f"{where}: only 2-D average pooling is supported; kernel_shape={kernel}")
        if any(d != 1 for d in attrs.get("dilations", (1, 1))):
            raise UnsupportedOperatorError(f"{where}: dilated average pooling is not supported")
        if any(padding) and not attrs.get("count_include_pad", 0):
            raise UnsupportedOperatorError(
                f"{where}: count_include_pad=0 with padding divides border windows by fewer elements, which is not "
                "a fixed linear map per window in assay's AvgPool2d; export with count_include_pad=1 or no padding"
            )
        if attrs.get("ceil_mode", 0) and len(self.builder.shape) == 3 and any(
                (n + 2 * p - k) % s for n, p, k, s in zip(self.builder.shape[1:], padding, kernel, stride)):
            raise UnsupportedOperatorError(f"{where}: ceil_mode=1 adds partial windows; export with ceil_mode=0")
        self.builder.avgpool(kernel, stride, padding, where)

    def _op_MaxPool(self, node, attrs, where):
        shape = self.builder.shape
        one_image = self.lead == 0 and len(shape) == 4 and shape[0] == 1  # (1, C, H, W) without a batch dimension
        if not one_image:
            self._require_batch(where, "MaxPool")
        kernel = tuple(attrs["kernel_shape"])
        if len(kernel) != 2:
            raise UnsupportedOperatorError(f"{where}: only 2-D max pooling is supported; kernel_shape={kernel}")
        stride = tuple(attrs.get("strides", (1, 1)))
        padding = self._padding(attrs, where)
        if any(padding):
            producer = self.producers.get(node.input[0])
            # MaxPool pads with −inf; after a ReLU (values ≥ 0) padding with 0 is the same as long
            # as every window keeps one element of the image
            if producer is None or producer.op_type != "Relu" or any(p >= k for p, k in zip(padding, kernel)):
                raise UnsupportedOperatorError(
                    f"{where}: max pooling with padding is supported right after a Relu (its −∞ padding is then 0 "
                    "padding) with pads smaller than the kernel; export without pads")
        if one_image:
            self.emit(Reshape(shape[1:]), [self.current], node.output[0] + "#image", where)
        if any(padding):
            self.builder.pad(padding, where)
        if any(d != 1 for d in attrs.get("dilations", (1, 1))) or attrs.get("storage_order", 0):
            raise UnsupportedOperatorError(f"{where}: dilated max pooling and storage_order=1 are not supported")
        if len([o for o in node.output if o]) > 1:
            raise UnsupportedOperatorError(f"{where}: MaxPool's Indices output is not supported")
        if attrs.get("ceil_mode", 0) and len(self.builder.shape) == 3 and any(
                (n - k) % s for n, k, s in zip(self.builder.shape[1:], kernel, stride)):
            raise UnsupportedOperatorError(f"{where}: ceil_mode=1 adds partial windows; export with ceil_mode=0")
        self.builder.maxpool(kernel, stride, where)
        if one_image:
            self.emit(Reshape((1, *self.builder.shape)), [self.current], node.output[0], where)

    def _op_Pad(self, node, attrs, where):
        mode = attrs.get("mode", b"constant")
        mode = mode.decode() if isinstance(mode, bytes) else mode
        if "pads" in attrs:
            pads = [int(p) for p in attrs["pads"]]
            value = float(attrs.get("value", 0.0))
        else:
            pads = [int(p) for p in np.asarray(self.constants[node.input[1]]).reshape(-1)]
            value = float(np.asarray(self.constants[node.input[2]]).reshape(-1)[0]) if len(node.input) > 2 and \
                node.input[2] else 0.0
        if len(node.input) > 3 and node.input[3]:
            raise UnsupportedOperatorError(f"{where}: Pad with an axes input is not supported")
        if not any(pads):
            return  # pads nothing
        rank = len(pads) // 2
        begin, end = pads[:rank], pads[rank:]
        if mode != "constant":
            raise UnsupportedOperatorError(f"{where}: only constant padding is supported; got mode={mode!r}")
        if any(p < 0 for p in pads):
            raise UnsupportedOperatorError(f"{where}: negative pads (cropping) are not supported; use Slice")
        if self.lead == 1 and rank == 4 and value == 0.0 and not any(begin[:2]) and not any(end[:2]) \
                and begin[2:] == end[2:]:
            self.builder.pad(tuple(begin[2:]), where)  # zero padding of an image: a fixed convolution
            return
        if any(begin[: self.lead]) or any(end[: self.lead]):
            raise BatchAxisError(f"{where}: pads={pads} pad the batch dimension")
        self.emit(PadLayer(begin[self.lead:], end[self.lead:], value), [self.current], node.output[0], where)

    def _op_BatchNormalization(self, node, attrs, where):
        if attrs.get("training_mode", 0) or attrs.get("spatial", 1) != 1 or len([o for o in node.output if o]) > 1:
            raise UnsupportedOperatorError(f"{where}: only inference-mode BatchNormalization is supported")
        if list(node.input).index(self.current) != 0:
            raise ModelLoadError(f"{where}: the statistics of BatchNormalization must be constants")
        if self.lead == 0 and len(self.builder.shape) < 2:
            raise UnsupportedOperatorError(f"{where}: BatchNormalization needs (N, C, ...) inputs")
        gamma, beta, mean, var = (np.asarray(self.constants[n], dtype=np.float64).reshape(-1) for n in node.input[1:5])
        scale = gamma / np.sqrt(var + attrs.get("epsilon", 1e-5))
        shift = beta - mean * scale
        trailing = (1,) * (len(self.builder.shape) - 1 - (1 - self.lead))  # the channel axis is ONNX axis 1
        self.builder.affine(scale.reshape(-1, *trailing), shift.reshape(-1, *trailing), where)

    # ------------------------------------------------------------------ helpers
    def _require_batch(self, where: str, op: str) -> None:
        if self.lead != 1:
            raise UnsupportedOperatorError(f"{where}: {op} needs an input with one leading batch dimension")

    @staticmethod
    def _padding(attrs, where: str) -> tuple[int, int]:
        auto_pad = attrs.get("auto_pad", b"NOTSET")
        auto_pad = auto_pad.decode() if isinstance(auto_pad, bytes) else auto_pad
        if auto_pad == "VALID":
            return (0, 0)
        if auto_pad != "NOTSET":
            raise UnsupportedOperatorError(f"{where}: auto_pad={auto_pad} is not supported; export with explicit pads")
        pads = tuple(attrs.get("pads", (0, 0, 0, 0)))
        if len(pads) != 4 or pads[:2] != pads[2:]:
            raise UnsupportedOperatorError(
                f"{where}: pads={list(pads)} are not symmetric (top=bottom, left=right); assay's layers pad symmetrically"
            )
        return pads[:2]
