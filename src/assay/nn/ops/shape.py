"""Operators that move, select or copy entries: ``Slice``, ``Gather``, ``Concat``, ``Transpose``,
``Pad`` and ``Resize`` (nearest, integer scales). (``Reshape`` and ``Flatten`` are
:class:`assay.nn.layers.Reshape` and :class:`assay.nn.layers.Flatten`; ``Split`` loads as one
``Slice`` per output.) Each is exact: every output entry is one input entry or a constant.
Axes count the dimensions of one sample (see :mod:`assay.nn.ops.base`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from assay.errors import ModelLoadError
from assay.nn.ops.base import Operator, as_constant, cast_like

__all__ = ["Slice", "Gather", "Concat", "Transpose", "Pad", "Resize"]


@dataclass(frozen=True)
class Slice(Operator):
    """``x[start:stop:step]`` along each of ``axes`` (non-negative, clamped bounds; ``step ≥ 1``)."""

    axes: tuple[int, ...]
    starts: tuple[int, ...]
    stops: tuple[int, ...]
    steps: tuple[int, ...]

    def __post_init__(self):
        for name in ("axes", "starts", "stops", "steps"):
            object.__setattr__(self, name, tuple(int(v) for v in getattr(self, name)))
        if not len(self.axes) == len(self.starts) == len(self.stops) == len(self.steps):
            raise ModelLoadError("a Slice layer needs one start, stop and step per axis")
        if any(a < 0 for a in self.axes) or any(s < 1 for s in self.steps) or any(s < 0 for s in self.starts):
            raise ModelLoadError(f"a Slice layer needs axes ≥ 0, starts ≥ 0 and steps ≥ 1; got {self}")

    def forward(self, x):
        index = [slice(None)] * x.ndim
        for axis, start, stop, step in zip(self.axes, self.starts, self.stops, self.steps):
            index[axis + 1] = slice(start, stop, step)
        return x[tuple(index)]


@dataclass(frozen=True, eq=False)
class Gather(Operator):
    """``numpy.take(x, indices, axis)`` per sample with constant non-negative ``indices`` (any shape)."""

    axis: int
    indices: torch.Tensor

    def __post_init__(self):
        indices = torch.as_tensor(self.indices).to(torch.int64)
        if (indices < 0).any():
            raise ModelLoadError("a Gather layer needs non-negative indices (the loader resolves negative ones)")
        object.__setattr__(self, "axis", int(self.axis))
        object.__setattr__(self, "indices", indices)

    def forward(self, x):
        axis = self.axis + 1
        picked = x.index_select(axis, self.indices.reshape(-1).to(x.device))
        return picked.reshape(*x.shape[:axis], *self.indices.shape, *x.shape[axis + 1:])


@dataclass(frozen=True, eq=False)
class Concat(Operator):
    """Concatenation along ``axis`` of ``parts``: ``None`` for the next input tensor, or a constant
    (one sample's worth, repeated over the batch)."""

    axis: int
    parts: tuple = (None, None)
    arity = None

    def __post_init__(self):
        parts = tuple(None if p is None else as_constant(p, "constant part of a Concat layer") for p in self.parts)
        if not any(p is None for p in parts):
            raise ModelLoadError("a Concat layer needs at least one input tensor")
        object.__setattr__(self, "axis", int(self.axis))
        object.__setattr__(self, "parts", parts)

    @property
    def tensor_count(self) -> int:
        return sum(p is None for p in self.parts)

    def output_shape(self, *input_shapes):
        if len(input_shapes) != self.tensor_count:
            raise ModelLoadError(f"a Concat layer of {self.tensor_count} tensors received {len(input_shapes)}")
        return super().output_shape(*input_shapes)

    def forward(self, *inputs):
        batch, pieces, remaining = inputs[0].shape[0], [], iter(inputs)
        for part in self.parts:
            if part is None:
                pieces.append(next(remaining))
            else:
                constant = cast_like(part, inputs[0])
                pieces.append(constant.expand(batch, *constant.shape))
        return torch.cat(pieces, dim=self.axis + 1)


@dataclass(frozen=True)
class Transpose(Operator):
    """Permutes one sample's dimensions: output axis ``i`` is input axis ``perm[i]``."""

    perm: tuple[int, ...]

    def __post_init__(self):
        perm = tuple(int(p) for p in self.perm)
        if sorted(perm) != list(range(len(perm))):
            raise ModelLoadError(f"a Transpose layer needs a permutation of 0..{len(perm) - 1}; got {perm}")
        object.__setattr__(self, "perm", perm)

    def forward(self, x):
        return x.permute(0, *(p + 1 for p in self.perm))


@dataclass(frozen=True)
class Pad(Operator):
    """Constant padding: ``begin[i]`` entries before and ``end[i]`` after axis ``i`` (non-negative)."""

    begin: tuple[int, ...]
    end: tuple[int, ...]
    value: float = 0.0

    def __post_init__(self):
        begin, end = tuple(int(p) for p in self.begin), tuple(int(p) for p in self.end)
        if len(begin) != len(end) or any(p < 0 for p in begin + end):
            raise ModelLoadError(f"a Pad layer needs non-negative begin/end pads per axis; got {begin}, {end}")
        object.__setattr__(self, "begin", begin)
        object.__setattr__(self, "end", end)
        object.__setattr__(self, "value", float(self.value))

    def forward(self, x):
        widths = []
        for before, after in zip(reversed(self.begin), reversed(self.end)):  # F.pad lists the last axis first
            widths += [before, after]
        return F.pad(x, widths, value=self.value)


@dataclass(frozen=True)
class Resize(Operator):
    """Nearest-neighbour upsampling by integer ``scales`` per axis: every entry is repeated
    ``scales[i]`` times along axis ``i`` (ONNX ``Resize``/``Upsample`` in the modes that mean this)."""

    scales: tuple[int, ...]

    def __post_init__(self):
        scales = tuple(int(s) for s in self.scales)
        if any(s < 1 for s in scales):
            raise ModelLoadError(f"a Resize layer needs integer scales ≥ 1; got {self.scales}")
        object.__setattr__(self, "scales", scales)

    def forward(self, x):
        for axis, scale in enumerate(self.scales):
            if scale != 1:
                x = torch.repeat_interleave(x, scale, dim=axis + 1)
        return x

