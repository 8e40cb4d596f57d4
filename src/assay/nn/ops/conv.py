"""Convolutions beyond :class:`assay.nn.layers.Conv2d`: any number of spatial dimensions
(1-D, 2-D, 3-D), asymmetric padding, and transposed convolutions (ONNX ``ConvTranspose``).

A sample is ``(*lead, C, *spatial)``: leading dimensions (an ONNX graph without a batch
dimension keeps its own ``N`` there) are folded into the batch.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch.nn.functional as F

from assay.errors import ModelLoadError
from assay.nn.ops.base import Operator, as_constant, cast_like

__all__ = ["Conv"]

_CONV = {1: F.conv1d, 2: F.conv2d, 3: F.conv3d}
_CONV_T = {1: F.conv_transpose1d, 2: F.conv_transpose2d, 3: F.conv_transpose3d}


@dataclass(frozen=True, eq=False)
class Conv(Operator):
    """An N-d convolution (``transposed=False``: ONNX ``Conv``) or transposed convolution.

    ``weight`` is ``(C_out, C_in / groups, *kernel)`` for a convolution and ``(C_in, C_out /
    groups, *kernel)`` for a transposed one (ONNX's layouts); ``begin``/``end`` are the pads
    before and after each spatial axis (for a transposed convolution, what is cropped from its
    full output); ``output_padding`` adds entries at the end of a transposed output.
    """

    weight: object
    bias: object
    stride: tuple[int, ...]
    begin: tuple[int, ...]
    end: tuple[int, ...]
    dilation: tuple[int, ...]
    groups: int = 1
    transposed: bool = False
    output_padding: tuple[int, ...] = ()

    def __post_init__(self):
        weight = as_constant(self.weight, "weight of a Conv layer")
        bias = as_constant(self.bias, "bias of a Conv layer")
        dims = weight.ndim - 2
        if dims not in _CONV:
            raise ModelLoadError(f"a Conv layer supports 1-, 2- and 3-D kernels; got weight {tuple(weight.shape)}")
        object.__setattr__(self, "weight", weight)
        object.__setattr__(self, "bias", bias)
        for name in ("stride", "begin", "end", "dilation"):
            value = tuple(int(v) for v in getattr(self, name))
            if len(value) != dims:
                raise ModelLoadError(f"a {dims}-D Conv layer needs {dims} {name} values; got {value}")
            object.__setattr__(self, name, value)
        padding = tuple(int(v) for v in self.output_padding) or (0,) * dims
        object.__setattr__(self, "output_padding", padding)
        object.__setattr__(self, "groups", int(self.groups))
        object.__setattr__(self, "transposed", bool(self.transposed))

    @property
    def num_parameters(self) -> int:
        return self.weight.numel() + self.bias.numel()

    def forward(self, x):
        dims = self.weight.ndim - 2
        sample = x.shape[x.ndim - dims - 1:]
        flat = x.reshape(-1, *sample)
        weight, bias = cast_like(self.weight, x), cast_like(self.bias, x)
        if self.transposed:
            y = _CONV_T[dims](flat, weight, bias, self.stride, 0, self.output_padding, self.groups, self.dilation)
            index = [slice(None), slice(None)] + [slice(b, y.shape[2 + i] - e) for i, (b, e) in
                                                  enumerate(zip(self.begin, self.end))]
            y = y[tuple(index)]
        else:
            if self.begin == self.end:
                y = _CONV[dims](flat, weight, bias, self.stride, self.begin, self.dilation, self.groups)
            else:
                widths = []
                for before, after in zip(reversed(self.begin), reversed(self.end)):
                    widths += [before, after]
                y = _CONV[dims](F.pad(flat, widths), weight, bias, self.stride, 0, self.dilation, self.groups)
        return y.reshape(*x.shape[: x.ndim - dims - 1], *y.shape[1:])
