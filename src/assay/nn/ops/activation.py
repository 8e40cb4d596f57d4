"""Element-wise non-linear operators: one input, output of the same shape.

``Sigmoid``, ``Tanh``, ``Exp``, ``Log``, ``Reciprocal``, ``Sqrt``, ``Sin``, ``Cos``, ``Abs``,
``Sign`` (ONNX: ``sign(0) = 0``; binarised networks build their quantised convolutions from it),
``Floor`` (angle wraps ``x − 2π·floor(x/2π)`` before a periodic function),
``Neg``, ``Pow`` with a constant scalar exponent, ``LeakyRelu`` and ``Clip`` (a constant
interval). Each is exact in the dtype of its input (torch's kernels).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from assay.errors import ModelLoadError
from assay.nn.ops.base import Operator

__all__ = ["Sigmoid", "Tanh", "Exp", "Log", "Reciprocal", "Sqrt", "Sin", "Cos", "Abs", "Sign", "Floor", "Neg", "Pow",
           "LeakyRelu", "Clip", "ELEMENTWISE"]


class _Elementwise(Operator):
    def output_shape(self, input_shape: tuple[int, ...]) -> tuple[int, ...]:
        return tuple(input_shape)


@dataclass(frozen=True)
class Sigmoid(_Elementwise):
    """``1 / (1 + exp(−x))``."""

    def forward(self, x):
        return torch.sigmoid(x)


@dataclass(frozen=True)
class Tanh(_Elementwise):
    """``tanh(x)``."""

    def forward(self, x):
        return torch.tanh(x)


@dataclass(frozen=True)
class Exp(_Elementwise):
    """``exp(x)``."""

    def forward(self, x):
        return torch.exp(x)


@dataclass(frozen=True)
class Log(_Elementwise):
    """Natural logarithm (NaN below 0, −inf at 0, as ONNX)."""

    def forward(self, x):
        return torch.log(x)


@dataclass(frozen=True)
class Reciprocal(_Elementwise):
    """``1 / x``."""

    def forward(self, x):
        return torch.reciprocal(x)


@dataclass(frozen=True)
class Sqrt(_Elementwise):
    """``√x`` (NaN below 0, as ONNX)."""

    def forward(self, x):
        return torch.sqrt(x)


@dataclass(frozen=True)
class Sin(_Elementwise):
    """``sin(x)``."""

    def forward(self, x):
        return torch.sin(x)


@dataclass(frozen=True)
class Cos(_Elementwise):
    """``cos(x)``."""

    def forward(self, x):
        return torch.cos(x)


@dataclass(frozen=True)
class Abs(_Elementwise):
    """``|x|``."""

    def forward(self, x):
        return torch.abs(x)


@dataclass(frozen=True)
class Sign(_Elementwise):
    """``−1, 0, 1`` for ``x < 0, x = 0, x > 0``."""

    def forward(self, x):
        return torch.sign(x)


@dataclass(frozen=True)
class Floor(_Elementwise):
    """The largest integer ≤ x (exact in every float dtype)."""

    def forward(self, x):
        return torch.floor(x)


@dataclass(frozen=True)
class Neg(_Elementwise):
    """``−x``."""

    def forward(self, x):
        return torch.neg(x)


@dataclass(frozen=True)
class Pow(_Elementwise):
    """``x ** exponent`` for a constant scalar ``exponent`` (ONNX ``Pow`` with a constant exponent)."""

    exponent: float

    def __post_init__(self):
        exponent = float(self.exponent)
        if exponent != exponent or exponent in (float("inf"), float("-inf")):
            raise ModelLoadError(f"a Pow layer needs a finite exponent; got {self.exponent}")
        object.__setattr__(self, "exponent", exponent)

    def forward(self, x):
        if self.exponent.is_integer():  # x**2 of a negative x is defined; torch.pow agrees with ONNX here
            return torch.pow(x, int(self.exponent))
        return torch.pow(x, self.exponent)


@dataclass(frozen=True)
class LeakyRelu(_Elementwise):
    """``x`` for ``x ≥ 0``, ``alpha · x`` below (ONNX default ``alpha = 0.01``)."""

    alpha: float = 0.01

    def __post_init__(self):
        object.__setattr__(self, "alpha", float(self.alpha))

    def forward(self, x):
        return F.leaky_relu(x, self.alpha)


@dataclass(frozen=True)
class Clip(_Elementwise):
    """``min(max(x, lower), upper)``; a missing end is ``None`` (unbounded)."""

    lower: float | None = None
    upper: float | None = None

    def __post_init__(self):
        lower = None if self.lower is None else float(self.lower)
        upper = None if self.upper is None else float(self.upper)
        if lower is not None and upper is not None and lower > upper:
            raise ModelLoadError(f"a Clip layer needs lower ≤ upper; got [{lower}, {upper}]")
        object.__setattr__(self, "lower", lower)
        object.__setattr__(self, "upper", upper)

    def forward(self, x):
        if self.lower is None and self.upper is None:  # ONNX: the identity (torch.clamp refuses two Nones)
            return x.clone()
        return torch.clamp(x, self.lower, self.upper)


# ONNX op type → the parameterless element-wise operator it maps to
ELEMENTWISE = {"Sigmoid": Sigmoid, "Tanh": Tanh, "Exp": Exp, "Log": Log, "Reciprocal": Reciprocal, "Sqrt": Sqrt,
               "Sin": Sin, "Cos": Cos, "Abs": Abs, "Sign": Sign, "Floor": Floor,
               "Neg": Neg}
