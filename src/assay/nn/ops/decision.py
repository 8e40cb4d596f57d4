"""Operators that turn numbers into decisions, indices and casts: what detection graphs compute
after their last layer (is the predicted class the labelled one, where does the patch go).

* :class:`ArgMax` — the index of the largest entry along an axis (ONNX ``ArgMax``; the first
  one on ties, or the last with ``select_last_index``), as a float.
* :class:`Equal` — ``1.0`` where two tensors are equal, else ``0.0`` (ONNX ``Equal``, whose
  booleans assay carries as 0/1 floats).
* :class:`Cast` — ONNX ``Cast`` of a value that assay carries as a float: to a floating type it
  rounds to that type's precision, to an integer type it truncates towards zero, to ``bool`` it
  tests ``≠ 0``.
* :class:`IndexTable` — a part of the graph that reads the input only through integer casts of
  a few scalars (a patch's position, a slice's start): a table of constant tensors indexed by
  those integers, evaluated by onnxruntime on the sub-graph itself.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass, field

import numpy as np
import torch

from assay.errors import ModelLoadError, UnsupportedError
from assay.nn.ops.arith import aligned
from assay.nn.ops.base import Operator

__all__ = ["ArgMax", "Equal", "Cast", "IndexTable", "CAST_FLOATS", "CAST_INTEGERS"]

# ONNX TensorProto element types → the torch dtype a Cast to them rounds to
CAST_FLOATS = {1: torch.float32, 10: torch.float16, 11: torch.float64, 16: torch.bfloat16}
CAST_INTEGERS = frozenset((2, 3, 4, 5, 6, 7, 12, 13))  # UINT8, INT8, UINT16, INT16, INT32, INT64, UINT32, UINT64
CAST_BOOL = 9


@dataclass(frozen=True)
class ArgMax(Operator):
    """The index (as a float) of the largest entry along sample axis ``axis``; ``keepdims`` keeps
    that axis with size 1; ``last``: the last index on ties (ONNX ``select_last_index=1``)."""

    axis: int
    keepdims: bool = True
    last: bool = False

    def forward(self, x):
        axis = self.axis + 1
        if self.last:
            size = x.shape[axis]
            index = size - 1 - torch.argmax(torch.flip(x, (axis,)), dim=axis, keepdim=self.keepdims)
        else:
            index = torch.argmax(x, dim=axis, keepdim=self.keepdims)  # torch: the first maximum, as ONNX
        return index.to(x.dtype)


@dataclass(frozen=True)
class Equal(Operator):
    """``1.0`` where ``a == b`` (broadcast as ONNX does), else ``0.0``."""

    arity = 2

    def forward(self, a, b):
        a, b = aligned((a, b))
        return (a == b).to(a.dtype)


@dataclass(frozen=True)
class Cast(Operator):
    """ONNX ``Cast`` to element type ``to`` (a TensorProto code) of a value carried as a float:
    rounded to the precision of a floating ``to`` (a no-op for one at least as wide as the
    input's dtype), truncated towards zero for an integer ``to``, ``x ≠ 0`` for ``bool``."""

    to: int

    def __post_init__(self):
        if self.to not in CAST_FLOATS and self.to not in CAST_INTEGERS and self.to != CAST_BOOL:
            raise ModelLoadError(f"a Cast layer casts to a number or bool type; got ONNX element type {self.to}")

    @property
    def kind(self) -> str:
        """``"float"``, ``"integer"`` or ``"bool"``."""
        return "float" if self.to in CAST_FLOATS else ("integer" if self.to in CAST_INTEGERS else "bool")

    def output_shape(self, input_shape):
        return tuple(input_shape)

    def forward(self, x):
        if self.kind == "float":
            return x.to(CAST_FLOATS[self.to]).to(x.dtype)
        if self.kind == "integer":
            return torch.trunc(x)
        return (x != 0).to(x.dtype)


@dataclass(frozen=True, eq=False)
class IndexTable(Operator):
    """A sub-graph of an ONNX model whose only inputs from the network are ``keys`` scalars that
    it casts to integers: ``forward(*keys)`` is the sub-graph's output ``output`` at the keys
    truncated towards zero (as ONNX casts them), computed by onnxruntime on ``model`` (the
    serialised sub-graph, its inputs named ``keys``) and kept for the last ``cache`` key tuples.

    ``shape`` is one output sample's shape (the sub-graph's output keeps no batch dimension).
    """

    model: bytes
    keys: tuple[str, ...]
    output: str
    shape: tuple[int, ...]
    cache: int = 512
    _state: dict = field(default_factory=dict, repr=False, compare=False)

    arity = None  # one tensor per key

    def __getstate__(self):  # the onnxruntime session and the table stay behind (a copy makes its own)
        state = dict(self.__dict__)
        state["_state"] = {}
        return state

    def __setstate__(self, state):
        self.__dict__.update(state)

    def output_shape(self, *input_shapes):
        for shape in input_shapes:
            if int(np.prod(shape)) != 1:
                raise ModelLoadError(f"an IndexTable reads scalar keys; got a key of shape {tuple(shape)}")
        return tuple(self.shape)

    def value(self, key: tuple[int, ...]) -> np.ndarray:
        """The sub-graph's output (float64, of :attr:`shape`) at the integer keys ``key``."""
        state = self._state
        if "lock" not in state:
            state.setdefault("lock", threading.Lock())
        with state["lock"]:
            table = state.setdefault("table", OrderedDict())
            if key in table:
                table.move_to_end(key)
                return table[key]
            if "session" not in state:
                import onnxruntime

                options = onnxruntime.SessionOptions()
                options.intra_op_num_threads = 1
                state["session"] = onnxruntime.InferenceSession(self.model, options, providers=["CPUExecutionProvider"])
            session = state["session"]
            shapes = {i.name: tuple(d if isinstance(d, int) else 1 for d in i.shape) for i in session.get_inputs()}
            feeds = {name: np.full(shapes[name], k, dtype=np.float32) for name, k in zip(self.keys, key)}
            try:
                value = np.asarray(session.run([self.output], feeds)[0], dtype=np.float64).reshape(self.shape)
            except Exception as exc:  # onnxruntime raises many kinds of errors (an index out of range, ...)
                raise UnsupportedError(
                    f"the part of the network indexed by {list(self.keys)} cannot be computed at {list(key)} "
                    f"({type(exc).__name__}: {str(exc)[:200]}); keep those inputs within the range the model "
                    "accepts") from exc
            table[key] = value
            if len(table) > self.cache:
                table.popitem(last=False)
            return value

    def integer_keys(self, *keys: torch.Tensor) -> torch.Tensor:
        """(B, K) int64: each sample's keys truncated towards zero."""
        return torch.stack([torch.trunc(k.reshape(k.shape[0])) for k in keys], 1).to(torch.int64)

    def forward(self, *keys):
        ints = self.integer_keys(*keys)
        rows = [self.value(tuple(int(v) for v in row)) for row in ints.tolist()] if ints.shape[0] else []
        dtype, device = keys[0].dtype, keys[0].device
        if not rows:
            return torch.zeros((0, *self.shape), dtype=dtype, device=device)
        return torch.as_tensor(np.stack(rows), dtype=dtype, device=device)
