"""Spatially grouped input columns for forward linear bounds of convolutional networks.

Forward linear bounds (:mod:`assay.bounds.forward`) carry one coefficient column per input
element: (B, n_in, *shape) per tensor, so an image of 8,112 inputs costs the network run on a
batch of 8,112 images, most of whose entries are zero: through convolutions, pooling, ReLUs and
residual additions, element (c, i, j) of a tensor depends only on the input pixels in a window
``[S·i + lo, S·i + hi] × [S·j + lo', S·j + hi']`` (:func:`tensor_windows`).

Two input elements of one channel whose pixels are at least a window's width apart (per axis)
never reach a common element, so their columns can share one tensor: the input elements of
channel ``ci`` whose row is ``≡ oh (mod s_h)`` and column ``≡ ow (mod s_w)`` form the group
``(ci, oh, ow)``, and the group's column is the sum of its members' columns. Every step of the
forward pass is linear in the coefficients once its relaxation is fixed (the signed weights mix
the lower and upper sides linearly, a ReLU scales them element by element), so the sum is carried
exactly as the members' columns would be; and since at most one member's window contains a given
element, the group's entry there *is* that member's coefficient (the others contribute exact
zeros, in any summation order). :meth:`ColumnMap.contract` reads it back against an input vector
by spreading the vector's value at that member over the element (the ``member`` tables).

When a tensor's window grows wider than the spacing (the receptive field grows layer by layer),
:func:`regroup` splits each group's column into the finer groups of a wider spacing, reading
each element's entry from the group of its (unique) member. At spacing ``H × W`` every group is
one input element: the columns are the usual identity ones (:meth:`Grouping.dense`).

Soundness rests on the windows being supersets of the true receptive fields (they are computed
from each convolution's stride, padding, dilation and kernel and the union at additions); the
tests compare the grouped bounds with the dense ones and with sampled outputs.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from assay.bounds.plan import Plan


@dataclass(frozen=True)
class AxisWindow:
    """Along one spatial axis, element ``i`` of a tensor reads input pixels within
    ``[stride·i + lo, stride·i + hi]`` (before clipping to the image)."""

    stride: int
    lo: int
    hi: int

    def width(self, size: int, input_size: int) -> int:
        """The widest clipped window over the ``size`` elements of this axis."""
        widest = 0
        for i in range(size):
            first, last = max(0, self.stride * i + self.lo), min(input_size - 1, self.stride * i + self.hi)
            widest = max(widest, last - first + 1)
        return widest

    def members(self, size: int, input_size: int, spacing: int) -> torch.Tensor:
        """(spacing, size) long tensor: for group offset ``o`` and element ``i``, the input pixel
        ``≡ o (mod spacing)`` inside the element's window, or −1 (none). Needs
        :meth:`width` ≤ ``spacing`` (at most one such pixel)."""
        table = torch.full((spacing, size), -1, dtype=torch.long)
        for i in range(size):
            first, last = max(0, self.stride * i + self.lo), min(input_size - 1, self.stride * i + self.hi)
            for pixel in range(first, last + 1):
                table[pixel % spacing, i] = pixel
        return table


Window = tuple[AxisWindow, AxisWindow]


def tensor_windows(plan: Plan, origin: int = 0) -> list[Window | None | tuple]:
    """For every tensor of the plan, its :class:`AxisWindow` pair relative to tensor ``origin``
    (0: the input): element ``(c, i, j)`` reads only elements of ``origin`` within
    ``[S·i + lo, S·i + hi] × [S'·j + lo', S'·j + hi']``. None where unknown (a tensor that is not
    an image whose elements read a window of the origin: after a flatten, a dense layer, a general
    operator, or where the origin is not (C, H, W)); ``()`` for a tensor that reads no element of
    the origin (the tensors before it, and branches that bypass it).

    A convolution with stride ``t``, padding ``p``, dilation ``d`` and kernel ``k`` reads input
    rows ``t·i − p … t·i − p + d(k−1)`` (AvgPool2d is lowered to one); a ReLU keeps its input's
    windows; an addition takes the union (same strides, else None).
    """
    shapes = plan.network.shapes
    windows: list = [()] * (len(plan.stages) + 1)
    windows[origin] = (AxisWindow(1, 0, 0), AxisWindow(1, 0, 0)) if len(shapes[origin]) == 3 else None
    for position, stage in enumerate(plan.stages):
        if position + 1 <= origin:
            continue
        sources = [windows[s] for s in stage.sources if windows[s] != ()]
        out = None
        if not sources:
            out = ()
        elif len(shapes[position + 1]) == 3 and all(w is not None for w in sources):
            out = stage.window(sources)
        windows[position + 1] = out
    return windows


def spacing_for(window: Window | None, tensor_shape: tuple[int, ...], input_shape: tuple[int, ...]) -> tuple[int, int]:
    """The least spacing (rows, columns) whose groups share columns soundly on this tensor: its
    widest clipped window per axis (the whole image where ``window`` is None)."""
    if window is None:
        return input_shape[1], input_shape[2]
    return tuple(max(1, w.width(tensor_shape[1 + axis], input_shape[1 + axis])) for axis, w in enumerate(window))


@dataclass(frozen=True)
class Grouping:
    """Groups ``(ci, oh, ow)`` of the input elements of channel ``ci`` whose row is ``≡ oh`` (mod
    ``spacing[0]``) and column ``≡ ow`` (mod ``spacing[1]``); column index
    ``(ci·s_h + oh)·s_w + ow``."""

    input_shape: tuple[int, int, int]
    spacing: tuple[int, int]

    @property
    def count(self) -> int:
        return self.input_shape[0] * self.spacing[0] * self.spacing[1]

    @property
    def dense(self) -> bool:
        """Whether every group is one input element (the identity columns, in the input's order)."""
        return tuple(self.spacing) == tuple(self.input_shape[1:])

    def initial(self, batch: int, dtype: torch.dtype) -> torch.Tensor:
        """The input's own columns: (B, G, C, H, W), 1 where the element belongs to the group."""
        channels, height, width = self.input_shape
        sh, sw = self.spacing
        rows = torch.arange(height) % sh
        cols = torch.arange(width) % sw
        eye = torch.eye(channels, dtype=dtype)
        hit_rows = (rows.unsqueeze(0) == torch.arange(sh).unsqueeze(1)).to(dtype)  # (sh, H)
        hit_cols = (cols.unsqueeze(0) == torch.arange(sw).unsqueeze(1)).to(dtype)  # (sw, W)
        one = torch.einsum("ac,oh,pw->aopchw", eye, hit_rows, hit_cols).reshape(self.count, channels, height, width)
        return one.expand(batch, *one.shape).contiguous()


class ColumnMap:
    """The grouped columns of one tensor: a :class:`Grouping` and the tensor's window."""

    def __init__(self, grouping: Grouping, window: Window, tensor_shape: tuple[int, ...]):
        self.grouping = grouping
        self.tensor_shape = tuple(tensor_shape)
        _, height, width = grouping.input_shape
        self.rows = window[0].members(tensor_shape[1], height, grouping.spacing[0])  # (sh, Hz)
        self.cols = window[1].members(tensor_shape[2], width, grouping.spacing[1])  # (sw, Wz)

    def spread(self, v: torch.Tensor) -> torch.Tensor:
        """(B, n_in) input values → (B, G, Hz, Wz): each group's member's value at each element
        (0 where the group has no member in the element's window: its coefficients are 0 there)."""
        batch = v.shape[0]
        channels, height, width = self.grouping.input_shape
        image = v.reshape(batch, channels, height * width)
        rows, cols = self.rows, self.cols
        valid = (rows >= 0).unsqueeze(1).unsqueeze(3) & (cols >= 0).unsqueeze(0).unsqueeze(2)  # (sh, sw, Hz, Wz)
        index = rows.clamp(min=0).unsqueeze(1).unsqueeze(3) * width + cols.clamp(min=0).unsqueeze(0).unsqueeze(2)
        picked = image[:, :, index.reshape(-1)].reshape(batch, channels, *index.shape)
        picked = torch.where(valid, picked, torch.zeros((), dtype=v.dtype))
        return picked.reshape(batch, self.grouping.count, *index.shape[2:])

    def contract(self, a: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """``Σ_j a_j v_j`` for grouped coefficients ``a`` (B, G, *tensor shape) and an input
        vector ``v`` (B, n_in): (B, *tensor shape). Each entry sums the same nonzero products as
        the dense columns' contraction (the other members' terms are absent, not rounded)."""
        spread = self.spread(v).unsqueeze(2)  # (B, G, 1, Hz, Wz)
        return (a * spread).sum(1)


def regroup(a: torch.Tensor, window: Window, tensor_shape: tuple[int, ...], old: Grouping, new: Grouping) -> torch.Tensor:
    """Coefficients (B, G_old, *tensor shape) in ``old`` groups → (B, G_new, *tensor shape) in
    ``new`` ones (a spacing at least the tensor's window width, per axis): the entry of new group
    g at an element is the old entry of the group of g's member there (0 where g has none)."""
    batch = a.shape[0]
    channels = old.input_shape[0]
    _, height, width = old.input_shape
    rows = window[0].members(tensor_shape[1], height, new.spacing[0])  # (sh', Hz)
    cols = window[1].members(tensor_shape[2], width, new.spacing[1])  # (sw', Wz)
    grid = a.reshape(batch, channels, old.spacing[0], old.spacing[1], *tensor_shape)
    # rows: new offset o' → old offset (member mod old spacing), per element row
    out_rows = []
    for offsets in rows:  # (Hz,)
        index = (offsets.clamp(min=0) % old.spacing[0]).view(1, 1, 1, 1, 1, -1, 1)
        index = index.expand(batch, channels, 1, old.spacing[1], tensor_shape[0], tensor_shape[1], tensor_shape[2])
        picked = torch.gather(grid, 2, index)
        out_rows.append(torch.where((offsets >= 0).view(-1, 1), picked, torch.zeros((), dtype=a.dtype)))
    grid = torch.cat(out_rows, dim=2)  # (B, C, sh', sw_old, Cz, Hz, Wz)
    out_cols = []
    for offsets in cols:  # (Wz,)
        index = (offsets.clamp(min=0) % old.spacing[1]).view(1, 1, 1, 1, 1, 1, -1)
        index = index.expand(batch, channels, new.spacing[0], 1, *tensor_shape)
        picked = torch.gather(grid, 3, index)
        out_cols.append(torch.where(offsets >= 0, picked, torch.zeros((), dtype=a.dtype)))
    grid = torch.cat(out_cols, dim=3)
    return grid.reshape(batch, new.count, *tensor_shape)
