"""The layer types a :class:`~assay.nn.Network` is made of.

Each layer is a frozen value holding float64 parameters. Layers operate on a batch: an input
of shape ``(batch, *in_shape)`` gives an output of shape ``(batch, *out_shape)``. Convolution
and pooling use channel-first images ``(C, H, W)`` as in ONNX and torch. Every layer reads one
tensor except :class:`Add`, which sums two (residual connections); which tensors a layer reads
is the :class:`~assay.nn.Network`'s business (its ``sources``).

The general operators (sigmoid, products, softmax, shape operators, ...) live in
:mod:`assay.nn.ops`, one module per family; :func:`arity` says how many tensors any layer reads.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from assay.errors import ModelLoadError

__all__ = ["Layer", "Linear", "Conv2d", "ReLU", "AvgPool2d", "MaxPool2d", "Flatten", "Reshape", "Add", "AFFINE_LAYERS"]


def _as_float64(tensor, name: str) -> torch.Tensor:
    tensor = torch.as_tensor(tensor).detach().to(torch.float64).contiguous()
    if not torch.isfinite(tensor).all():
        raise ModelLoadError(f"the {name} contains NaN or infinite values; a network's parameters must be finite")
    return tensor


def _pair(value) -> tuple[int, int]:
    if isinstance(value, int):
        return (value, value)
    value = tuple(int(v) for v in value)
    if len(value) != 2:
        raise ModelLoadError(f"expected an int or a pair of ints; got {value!r}")
    return value


def _pooled_shape(kind: str, input_shape, kernel, stride, padding) -> tuple[int, int, int]:
    """The (C, out_h, out_w) of a 2-D pooling layer (windows that do not fit are dropped, as ONNX's floor mode)."""
    if len(input_shape) != 3:
        raise ModelLoadError(f"{kind} layer needs an image input (C, H, W); got shape {input_shape}")
    channels, height, width = input_shape
    out_h = (height + 2 * padding[0] - kernel[0]) // stride[0] + 1
    out_w = (width + 2 * padding[1] - kernel[1]) // stride[1] + 1
    if out_h < 1 or out_w < 1:
        raise ModelLoadError(f"{kind} with kernel {kernel} does not fit an input of shape {input_shape}")
    return (channels, out_h, out_w)


@dataclass(frozen=True, eq=False)
class Linear:
    """``y = W x + b`` with ``weight`` of shape ``(out, in)`` and ``bias`` of shape ``(out,)``."""

    weight: torch.Tensor
    bias: torch.Tensor

    def __post_init__(self):
        weight = _as_float64(self.weight, "weight of a Linear layer")
        bias = _as_float64(self.bias, "bias of a Linear layer")
        if weight.ndim != 2 or bias.shape != (weight.shape[0],):
            raise ModelLoadError(
                f"a Linear layer needs weight (out, in) and bias (out,); got {tuple(weight.shape)} and {tuple(bias.shape)}"
            )
        object.__setattr__(self, "weight", weight)
        object.__setattr__(self, "bias", bias)

    def output_shape(self, input_shape: tuple[int, ...]) -> tuple[int, ...]:
        if input_shape != (self.weight.shape[1],):
            raise ModelLoadError(
                f"a Linear layer with {self.weight.shape[1]} inputs received shape {input_shape}; add a Flatten before it"
            )
        return (self.weight.shape[0],)

    def apply(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        return F.linear(x, weight, bias)

    @property
    def num_parameters(self) -> int:
        return self.weight.numel() + self.bias.numel()


@dataclass(frozen=True, eq=False)
class Conv2d:
    """2-D cross-correlation with symmetric zero ``padding`` (rows, cols), ``stride`` and ``groups``.

    ``fixed=True`` marks a structural convolution that a loader built (zero padding, the
    selections of a lowered MaxPool): its weights are not model parameters, so analyses that
    perturb or fine-tune weights leave it alone.
    """

    weight: torch.Tensor
    bias: torch.Tensor
    stride: tuple[int, int] = (1, 1)
    padding: tuple[int, int] = (0, 0)
    dilation: tuple[int, int] = (1, 1)
    groups: int = 1
    fixed: bool = False

    def __post_init__(self):
        weight = _as_float64(self.weight, "weight of a Conv2d layer")
        bias = _as_float64(self.bias, "bias of a Conv2d layer")
        if weight.ndim != 4 or bias.shape != (weight.shape[0],):
            raise ModelLoadError(
                f"a Conv2d layer needs weight (C_out, C_in/groups, kh, kw) and bias (C_out,); "
                f"got {tuple(weight.shape)} and {tuple(bias.shape)}"
            )
        object.__setattr__(self, "weight", weight)
        object.__setattr__(self, "bias", bias)
        object.__setattr__(self, "stride", _pair(self.stride))
        object.__setattr__(self, "padding", _pair(self.padding))
        object.__setattr__(self, "dilation", _pair(self.dilation))
        object.__setattr__(self, "groups", int(self.groups))
        object.__setattr__(self, "fixed", bool(self.fixed))

    def output_shape(self, input_shape: tuple[int, ...]) -> tuple[int, ...]:
        if len(input_shape) != 3 or input_shape[0] != self.weight.shape[1] * self.groups:
            raise ModelLoadError(
                f"a Conv2d layer expecting {self.weight.shape[1] * self.groups} input channels (C, H, W) "
                f"received shape {input_shape}"
            )
        _, height, width = input_shape
        kh, kw = self.weight.shape[2:]
        out_h = (height + 2 * self.padding[0] - self.dilation[0] * (kh - 1) - 1) // self.stride[0] + 1
        out_w = (width + 2 * self.padding[1] - self.dilation[1] * (kw - 1) - 1) // self.stride[1] + 1
        if out_h < 1 or out_w < 1:
            raise ModelLoadError(f"a Conv2d layer with kernel {(kh, kw)} does not fit an input of shape {input_shape}")
        return (self.weight.shape[0], out_h, out_w)

    def apply(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        return F.conv2d(x, weight, bias, self.stride, self.padding, self.dilation, self.groups)

    @property
    def num_parameters(self) -> int:
        return 0 if self.fixed else self.weight.numel() + self.bias.numel()


@dataclass(frozen=True)
class ReLU:
    """``y = max(x, 0)`` elementwise."""

    def output_shape(self, input_shape: tuple[int, ...]) -> tuple[int, ...]:
        return input_shape

    num_parameters = 0


@dataclass(frozen=True)
class AvgPool2d:
    """Average pooling with zero padding counted in the divisor (ONNX ``count_include_pad=1``)."""

    kernel_size: tuple[int, int]
    stride: tuple[int, int]
    padding: tuple[int, int] = (0, 0)

    def __post_init__(self):
        object.__setattr__(self, "kernel_size", _pair(self.kernel_size))
        object.__setattr__(self, "stride", _pair(self.stride))
        object.__setattr__(self, "padding", _pair(self.padding))

    def output_shape(self, input_shape: tuple[int, ...]) -> tuple[int, ...]:
        return _pooled_shape("an AvgPool2d", input_shape, self.kernel_size, self.stride, self.padding)

    def as_conv(self, channels: int) -> Conv2d:
        """The same map as a depthwise convolution (used by bound propagation)."""
        kh, kw = self.kernel_size
        weight = torch.full((channels, 1, kh, kw), 1.0 / (kh * kw), dtype=torch.float64)
        return Conv2d(weight, torch.zeros(channels, dtype=torch.float64), self.stride, self.padding, (1, 1), channels,
                      fixed=True)

    num_parameters = 0


@dataclass(frozen=True)
class MaxPool2d:
    """Max pooling without padding (each output is the largest element of its window).

    Loaders keep it only in a network's :attr:`~assay.nn.Network.pooled` twin, whose bounds the
    engine relaxes window by window; the network itself carries MaxPool lowered to ReLUs
    (exact), the form that complete methods (ReLU splitting, leaf LPs) need.
    """

    kernel_size: tuple[int, int]
    stride: tuple[int, int]

    def __post_init__(self):
        object.__setattr__(self, "kernel_size", _pair(self.kernel_size))
        object.__setattr__(self, "stride", _pair(self.stride))

    def output_shape(self, input_shape: tuple[int, ...]) -> tuple[int, ...]:
        return _pooled_shape("a MaxPool2d", input_shape, self.kernel_size, self.stride, (0, 0))

    num_parameters = 0


@dataclass(frozen=True)
class Flatten:
    """Row-major flattening of everything but the batch dimension (ONNX ``Flatten(axis=1)``)."""

    def output_shape(self, input_shape: tuple[int, ...]) -> tuple[int, ...]:
        size = 1
        for dim in input_shape:
            size *= dim
        return (size,)

    num_parameters = 0


@dataclass(frozen=True)
class Reshape:
    """Row-major reshape of everything but the batch dimension to ``shape`` (same number of elements).

    Analyses build it (e.g. :mod:`assay.preimage` puts the image shape back after the affine map
    that places a patch's free pixels into an image); it is a pure reshape for the bound engine.
    """

    shape: tuple[int, ...]

    def __post_init__(self):
        object.__setattr__(self, "shape", tuple(int(d) for d in self.shape))

    def output_shape(self, input_shape: tuple[int, ...]) -> tuple[int, ...]:
        if int(np.prod(input_shape)) != int(np.prod(self.shape)):
            raise ModelLoadError(f"a Reshape to {self.shape} received shape {input_shape}, whose size differs")
        return self.shape

    num_parameters = 0


@dataclass(frozen=True)
class Add:
    """The elementwise sum of two tensors of the same shape (a residual connection)."""

    def output_shape(self, first: tuple[int, ...], second: tuple[int, ...] | None = None) -> tuple[int, ...]:
        if second is not None and first != second:
            raise ModelLoadError(f"an Add layer sums tensors of shapes {first} and {second}, which differ")
        return first

    num_parameters = 0


Layer = Linear | Conv2d | ReLU | AvgPool2d | Flatten | Reshape | Add
# How many tensors each layer type reads (every other layer reads one).
ARITY = {Add: 2}
AFFINE_LAYERS = (Linear, Conv2d)
RELU_NETWORK_LAYERS = (Linear, Conv2d, ReLU, AvgPool2d, MaxPool2d, Flatten, Reshape, Add)


def arity(layer) -> int | None:
    """How many tensors ``layer`` reads: an int, or None for "one or more" (Concat, Min/Max)."""
    if isinstance(layer, RELU_NETWORK_LAYERS):
        return ARITY.get(type(layer), 1)
    tensor_count = getattr(layer, "tensor_count", None)  # a Concat with constant parts
    return tensor_count if tensor_count is not None else layer.arity
