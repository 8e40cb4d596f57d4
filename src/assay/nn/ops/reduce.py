"""Reductions over sample axes: ``ReduceSum`` and ``ReduceMean`` (linear in the input)."""

from __future__ import annotations

from dataclasses import dataclass

from assay.errors import ModelLoadError
from assay.nn.ops.base import Operator

__all__ = ["Reduce"]


@dataclass(frozen=True)
class Reduce(Operator):
    """The sum or mean (``kind``) over ``axes`` of one sample, keeping them as size 1 if ``keepdims``."""

    kind: str
    axes: tuple[int, ...]
    keepdims: bool = True

    def __post_init__(self):
        if self.kind not in ("sum", "mean"):
            raise ModelLoadError(f"a Reduce layer computes 'sum' or 'mean'; got {self.kind!r}")
        axes = tuple(sorted(int(a) for a in self.axes))
        if not axes or axes[0] < 0:
            raise ModelLoadError(f"a Reduce layer needs one or more axes ≥ 0; got {self.axes}")
        object.__setattr__(self, "axes", axes)
        object.__setattr__(self, "keepdims", bool(self.keepdims))

    def forward(self, x):
        dims = tuple(a + 1 for a in self.axes)
        if self.kind == "sum":
            return x.sum(dim=dims, keepdim=self.keepdims)
        return x.mean(dim=dims, keepdim=self.keepdims)
