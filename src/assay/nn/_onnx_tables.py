"""Find the parts of an ONNX graph that read the input only through integer casts of scalars,
and turn each into an :class:`~assay.nn.ops.IndexTable`.

Detection graphs place a patch at a position given by two inputs (``Cast`` to int64, then
``Slice`` starts, ``Range``, ``ScatterND`` indices, shapes that depend on them): once those
integers are known every such node computes a constant, but no layer can carry a tensor whose
shape or indices move with the input. So, on the folded graph:

* a **seed** is a ``Cast`` to an integer type of a float activation with one element;
* a node is **indexed** when it is a seed, or when every activation it reads is the output of an
  indexed node;
* an indexed node's output that a node outside the set (or the graph's output) reads is a
  **table**: the function of the seeds' float inputs (the *keys*) computed by the indexed nodes
  it depends on.

The converter skips indexed nodes, and at the node that produces a table emits one
``IndexTable`` layer reading the keys (:func:`table_layer`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from assay.errors import ModelLoadError
from assay.nn.ops.decision import CAST_INTEGERS, IndexTable

__all__ = ["IndexedPart", "find_indexed", "table_layer", "tensor_types"]

_FLOATS = {1, 10, 11, 16}


@dataclass(frozen=True)
class IndexedPart:
    """The indexed nodes of a graph (by position) and, for each table's producing node, its output
    name, the keys it depends on and the positions of the nodes that compute it."""

    nodes: frozenset[int]
    tables: dict  # node position → (output name, keys, node positions)


def tensor_types(model) -> dict[str, tuple[int, tuple | None]]:
    """Tensor name → (element type, dims or None where unknown)."""
    out = {}
    for info in (*model.graph.input, *model.graph.value_info, *model.graph.output):
        t = info.type.tensor_type
        dims = tuple(d.dim_value if d.HasField("dim_value") else None for d in t.shape.dim) if t.HasField("shape") else None
        out[info.name] = (t.elem_type, None if dims is None or None in dims else dims)
    return out


def find_indexed(model, input_name: str) -> IndexedPart:
    """The indexed part of ``model``'s graph (empty when it has no seed)."""
    from onnx import helper

    types = tensor_types(model)
    activations, indexed_tensors = {input_name}, set()
    nodes, producer = set(), {}
    for position, node in enumerate(model.graph.node):
        reads = [n for n in node.input if n in activations]
        if not reads:
            continue
        activations.update(o for o in node.output if o)
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        source_type, source_dims = types.get(node.input[0], (1, None))
        seed = (node.op_type == "Cast" and attrs.get("to") in CAST_INTEGERS and source_type in _FLOATS
                and source_dims is not None and int(np.prod(source_dims)) == 1)
        if seed or all(n in indexed_tensors for n in reads):
            nodes.add(position)
            for o in node.output:
                if o:
                    indexed_tensors.add(o)
                    producer[o] = position
    if not nodes:
        return IndexedPart(frozenset(), {})
    read_outside = {model.graph.output[0].name}
    for position, node in enumerate(model.graph.node):
        if position not in nodes:
            read_outside.update(n for n in node.input if n in indexed_tensors)
    tables = {}
    for name in sorted(read_outside & indexed_tensors, key=lambda n: producer[n]):
        needed, keys, stack = set(), [], [producer[name]]
        while stack:
            position = stack.pop()
            if position in needed:
                continue
            needed.add(position)
            node = model.graph.node[position]
            for n in node.input:
                if n in producer:
                    stack.append(producer[n])
                elif n in activations and n not in keys and node.op_type == "Cast":
                    keys.append(n)
        tables[producer[name]] = (name, tuple(sorted(keys)), tuple(sorted(needed)))
    return IndexedPart(frozenset(nodes), tables)


def table_layer(model, plan: tuple, constants: dict, lead: int, where: str) -> IndexTable:
    """The :class:`IndexTable` of one table (``plan`` as :attr:`IndexedPart.tables` holds it),
    its constants taken from ``constants`` (the converter's initializers and Constant values)."""
    from onnx import TensorProto, helper, numpy_helper

    output, keys, positions = plan
    node_list = [model.graph.node[p] for p in positions]
    produced = {o for node in node_list for o in node.output}
    types = tensor_types(model)
    initializers, inputs = [], []
    for key in keys:
        inputs.append(helper.make_tensor_value_info(key, TensorProto.FLOAT, types.get(key, (1, ()))[1] or ()))
    seen = set(keys)
    for node in node_list:
        for n in node.input:
            if n and n not in produced and n not in seen:
                seen.add(n)
                if n not in constants:
                    raise ModelLoadError(f"{where}: the sub-graph indexed by {list(keys)} reads '{n}', which is "
                                         "computed from the input by other means; assay cannot tabulate it")
                initializers.append(numpy_helper.from_array(np.asarray(constants[n]), n))
    elem = types.get(output, (1, None))[0]
    graph = helper.make_graph(node_list, "index_table", inputs, [helper.make_tensor_value_info(output, elem, None)],
                              initializers)
    sub = helper.make_model(graph, opset_imports=list(model.opset_import), ir_version=model.ir_version)
    data = sub.SerializeToString()
    dims = types.get(output, (1, None))[1]
    if dims is None:  # the output's shape where the keys are 0
        try:
            import onnxruntime

            session = onnxruntime.InferenceSession(data, providers=["CPUExecutionProvider"])
            dims = session.run([output], {k: np.zeros((), dtype=np.float32) for k in keys})[0].shape
        except Exception as exc:  # onnxruntime raises many kinds of errors
            raise ModelLoadError(f"{where}: the sub-graph indexed by {list(keys)} could not be evaluated "
                                 f"({type(exc).__name__}: {str(exc)[:200]})") from exc
    dims = tuple(int(d) for d in dims)
    if lead and (not dims or dims[0] != 1):
        raise ModelLoadError(f"{where}: the sub-graph indexed by {list(keys)} has an output of shape {dims} "
                             "that varies along the batch dimension")
    return IndexTable(data, keys, output, dims[lead:])
