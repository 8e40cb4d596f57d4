"""The max-pooling stage and its rules (IBP exact; CROWN window by window)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

import torch
import torch.nn.functional as F

from assay.bounds.relaxation import MaxPoolRelaxation, relax_maxpool
from assay.bounds.rounding import capped_magnitude
from assay.bounds.stages.base import Stage


@dataclass(frozen=True, eq=False)
class MaxPoolStage(Stage):
    """``y = max`` over each window of one earlier tensor (no padding); relaxed window by window
    (:func:`assay.bounds.relaxation.relax_maxpool`)."""

    index: int
    in_shape: tuple[int, ...]
    out_shape: tuple[int, ...]
    kernel: tuple[int, int]
    stride: tuple[int, int]
    sources: tuple[int, ...] = ()

    relaxes: ClassVar[bool] = True
    nonlinear: ClassVar[bool] = True
    max_pooling: ClassVar[bool] = True

    def interval(self, bounds, delta: float = 0.0):
        """Exact: max is monotone and rounds nothing."""
        return tuple(F.max_pool2d(t, self.kernel, self.stride) for t in bounds[self.sources[0]])

    def crown_step(self, walk, position: int, A: torch.Tensor) -> None:
        _cross_maxpool(walk, position, self, A)

    @property
    def overlap(self) -> int:
        """The most windows one input element belongs to (1 when the windows do not overlap)."""
        return math.prod(-(-k // s) for k, s in zip(self.kernel, self.stride))


def _cross_maxpool(walk, position: int, stage: MaxPoolStage, A: torch.Tensor) -> None:
    walk.require_ungrouped(stage)
    bounds, u = walk.bounds, walk.u
    relaxation = relax_maxpool(*bounds[stage.sources[0]], stage.kernel, stage.stride)
    if walk.rounding:  # the window maxima's terms added into b
        walk.error = walk.settle(position + 1, A, walk.gamma_b * relaxation.upper.abs())
    A, constant = _maxpool_backward(stage, A, relaxation)
    walk.b = walk.b + constant
    if walk.rounding and stage.overlap > 1:  # overlapping windows sum coefficients per element
        walk.charge(stage.sources[0], 2 * (stage.overlap - 1) * u * capped_magnitude(*bounds[stage.sources[0]]))
    walk.send(stage.sources[0], A)


def _maxpool_backward(stage: MaxPoolStage, A: torch.Tensor, relaxation: MaxPoolRelaxation):
    """Cross a max-pooling stage: coefficients (B, S, C, out_h, out_w) on its output become
    coefficients (B, S, *in_shape) on its input, plus a constant (B, S) for b.

    A window with coefficient a ≥ 0 needs a lower bound of its max: a·y ≥ a·x_i. One with a < 0
    needs an upper bound: a·y = a·x_i where i dominates, else a·y ≥ a·max_j u_j (a constant).
    """
    batch, rows = A.shape[:2]
    through = (A >= 0) | relaxation.dominant.unsqueeze(1)
    constant = torch.where(through, torch.zeros_like(A), A * relaxation.upper.unsqueeze(1))
    channels, height, width = stage.in_shape
    index = relaxation.index.unsqueeze(1).expand(batch, rows, *relaxation.index.shape[1:])
    coefficients = torch.where(through, A, torch.zeros_like(A)).reshape(batch, rows, channels, -1)
    moved = A.new_zeros(batch, rows, channels, height * width).scatter_add(3, index.reshape(batch, rows, channels, -1),
                                                                          coefficients)
    return moved.reshape(batch, rows, *stage.in_shape), constant.flatten(2).sum(2)
