"""``Softmax`` along one sample axis: ``exp(x_i) / Σ_j exp(x_j)``."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from assay.errors import ModelLoadError
from assay.nn.ops.base import Operator

__all__ = ["Softmax"]


@dataclass(frozen=True)
class Softmax(Operator):
    """Softmax over ``axis`` of one sample (torch's numerically stable kernel)."""

    axis: int

    def __post_init__(self):
        if int(self.axis) < 0:
            raise ModelLoadError(f"a Softmax layer needs an axis ≥ 0; got {self.axis}")
        object.__setattr__(self, "axis", int(self.axis))

    def output_shape(self, input_shape):
        if self.axis >= len(input_shape):
            raise ModelLoadError(f"a Softmax over axis {self.axis} received shape {input_shape}")
        return tuple(input_shape)

    def forward(self, x):
        return torch.softmax(x, dim=self.axis + 1)
