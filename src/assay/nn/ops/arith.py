"""Arithmetic between tensors, and element-wise maps with constant tensors.

* :class:`Binary` — ``Add``/``Sub``/``Mul``/``Div`` of two tensors with ONNX (numpy) broadcasting
  over the sample dimensions. (``Add`` of two tensors of one shape loads as
  :class:`assay.nn.layers.Add`, the residual connection the bound engine knows.)
* :class:`MinMax` — ``Min``/``Max`` of one or more tensors, and optionally a constant.
* :class:`MatMul` — ``MatMul`` of two tensors (batched over their leading sample dimensions).
* :class:`ConstMatMul` — ``MatMul`` of a tensor with a constant, on either side.
* :class:`Affine` — ``x * scale + shift`` with constants that broadcast (and may grow) ``x``:
  what is left of ``Add``/``Sub``/``Mul``/``Div`` by constants that the loader could not fold
  into a neighbouring dense or convolution layer.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from assay.errors import ModelLoadError
from assay.nn.ops.base import Operator, as_constant, cast_like

__all__ = ["Binary", "MinMax", "MatMul", "ConstMatMul", "Affine", "aligned"]


def aligned(inputs) -> list[torch.Tensor]:
    """Batch-first tensors of different sample ranks, with unit dimensions inserted after the
    batch so that numpy broadcasting of the samples (right-aligned) holds."""
    rank = max(x.ndim for x in inputs)
    return [x.reshape(x.shape[0], *(1,) * (rank - x.ndim), *x.shape[1:]) for x in inputs]


_BINARY = {"Add": torch.add, "Sub": torch.sub, "Mul": torch.mul, "Div": torch.div}


@dataclass(frozen=True)
class Binary(Operator):
    """``a ∘ b`` for ``kind`` ∘ in ``Add``, ``Sub``, ``Mul``, ``Div``, broadcasting as ONNX does."""

    kind: str
    arity = 2

    def __post_init__(self):
        if self.kind not in _BINARY:
            raise ModelLoadError(f"a Binary layer computes one of {sorted(_BINARY)}; got {self.kind!r}")

    def forward(self, a, b):
        a, b = aligned((a, b))
        return _BINARY[self.kind](a, b)


@dataclass(frozen=True, eq=False)
class MinMax(Operator):
    """The element-wise ``Min`` or ``Max`` (``kind``) of its inputs and, if given, a constant."""

    kind: str
    constant: torch.Tensor | None = None
    arity = None

    def __post_init__(self):
        if self.kind not in ("Min", "Max"):
            raise ModelLoadError(f"a MinMax layer computes Min or Max; got {self.kind!r}")
        if self.constant is not None:
            object.__setattr__(self, "constant", as_constant(self.constant, f"constant of a {self.kind} layer"))

    def forward(self, *inputs):
        inputs = aligned(inputs)
        pick = torch.minimum if self.kind == "Min" else torch.maximum
        result = inputs[0]
        for other in inputs[1:]:
            result = pick(result, other)
        if self.constant is not None:
            result = pick(result, cast_like(self.constant, result))
        return result


@dataclass(frozen=True)
class MatMul(Operator):
    """``a @ b`` of two tensors, each of at least two sample dimensions (numpy ``matmul``)."""

    arity = 2

    def forward(self, a, b):
        if a.ndim < 3 or b.ndim < 3:
            raise ModelLoadError("MatMul of two tensors needs matrices (two or more dimensions per sample)")
        a, b = aligned((a, b))
        return torch.matmul(a, b)


@dataclass(frozen=True, eq=False)
class ConstMatMul(Operator):
    """``x @ matrix`` (``constant_first=False``) or ``matrix @ x``, numpy ``matmul`` per sample.

    A one-dimensional sample ``x`` is a vector: ``matrix @ x`` is then ``x @ matrixᵀ``. A
    one-dimensional ``matrix`` is a vector too (numpy: the contracted axis disappears).
    """

    matrix: torch.Tensor
    constant_first: bool = False

    def __post_init__(self):
        matrix = as_constant(self.matrix, "matrix of a MatMul layer")
        if matrix.ndim < 1:
            raise ModelLoadError("a MatMul layer's constant must be a vector or a matrix; got a scalar")
        object.__setattr__(self, "matrix", matrix)
        object.__setattr__(self, "constant_first", bool(self.constant_first))

    @property
    def num_parameters(self) -> int:
        return self.matrix.numel()

    def forward(self, x):
        matrix = cast_like(self.matrix, x)
        if not self.constant_first:
            return torch.matmul(x, matrix)
        if x.ndim == 2:
            if matrix.ndim == 1:
                return torch.matmul(x, matrix)
            if matrix.ndim != 2:
                raise ModelLoadError("a stacked constant matrix times a vector is not supported")
            return torch.matmul(x, matrix.T)
        return torch.matmul(matrix, x)


@dataclass(frozen=True, eq=False)
class Affine(Operator):
    """``x * scale + shift`` element-wise, the constants broadcast against one sample (right-aligned)."""

    scale: torch.Tensor
    shift: torch.Tensor

    def __post_init__(self):
        object.__setattr__(self, "scale", as_constant(self.scale, "scale of an Affine layer"))
        object.__setattr__(self, "shift", as_constant(self.shift, "shift of an Affine layer"))

    @property
    def num_parameters(self) -> int:
        return self.scale.numel() + self.shift.numel()

    def forward(self, x):
        rank = max(x.ndim - 1, self.scale.ndim, self.shift.ndim)
        x = x.reshape(x.shape[0], *(1,) * (rank - x.ndim + 1), *x.shape[1:])
        return x * cast_like(self.scale, x) + cast_like(self.shift, x)
