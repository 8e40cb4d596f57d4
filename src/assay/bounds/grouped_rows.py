"""Grouped rows for CROWN's intermediate bounds of convolutional layers (backward superposition).

CROWN bounds each unstable neuron of a layer by one backward walk of a row whose coefficients,
on every tensor it crosses, cover the whole tensor, although they are nonzero only in the
neuron's receptive field: a 52×52 image's neuron three convolutions deep has a 7×7 field. Rows
of one channel whose neurons are ``s`` positions apart (per axis), with ``s`` larger than every
receptive field's width in row positions, never have a nonzero coefficient on a common element:
the walk of their sum is the sum of their walks. Each step is linear in the coefficients once
the step's relaxation is chosen, and CROWN's choice at an element (the lower or upper line of a
ReLU by the sign of the coefficient) is the one member's choice there, since the other members'
coefficients are exact zeros. So one walk bounds a whole group; what the walk sums over a
tensor's elements (the bias and intercept terms, the rounding owed, the final contraction with
the input box) is summed per member instead, each element going to the one member whose field
holds it (:meth:`GroupedRows.reduce`). The bounds are those of the separate walks (the same
products; only the order of the sums may differ, which the rounding terms cover in any order).

The fields are :func:`~assay.bounds.forward_columns.tensor_windows` taken from each earlier
tensor: a superset of every path's reach, from the convolutions' strides, paddings, dilations
and kernels and the union at additions. Where a tensor's field is unknown (a flatten, a dense
layer, a general operator), the layer's rows are not grouped.
"""

from __future__ import annotations

import math

import torch

from assay.bounds.forward_columns import tensor_windows
from assay.bounds.plan import Plan


def row_spacing(plan: Plan, target: int) -> tuple[tuple[int, int], dict] | None:
    """``(spacing, fields)`` for grouping the rows of tensor ``target`` (C, H, W): the least
    spacing per axis at which no two rows of a group share an element of any tensor their walk
    crosses, and ``fields[t]``: tensor ``target``'s windows over each such tensor t. None where
    some tensor's field is unknown, or the walk crosses a stage that grouped rows do not support
    (only convolutions, poolings, ReLUs and additions)."""
    if len(plan.network.shapes[target]) != 3:
        return None
    for stage in plan.stages[:target]:
        if not stage.windowed:
            return None
    spacing = [1, 1]
    fields = {}
    for t in range(target):
        window = tensor_windows(plan, t)[target]
        if window == ():
            continue  # the walk never reaches t
        if window is None:
            return None
        fields[t] = window
        for axis, w in enumerate(window):
            spacing[axis] = max(spacing[axis], (w.hi - w.lo) // w.stride + 1)
    fields[target] = tensor_windows(plan, target)[target]  # the rows' own tensor (a bias added there)
    shape = plan.network.shapes[target]
    return (min(spacing[0], shape[1]), min(spacing[1], shape[2])), fields


class GroupedRows:
    """Rows of ``kinds`` row channels over tensor ``target`` of spatial shape (H, W) (e.g. the
    lower rows of a layer's C channels, then its upper rows: 2C kinds), grouped by ``spacing``:
    group ``(k, oh, ow)`` holds the rows ``(k, i, j)`` with ``i ≡ oh``, ``j ≡ ow``; a walk carries
    the groups ``present`` ((G, 3) long: k, oh, ow), and its per-row sums have the real row index
    ``(k·H + i)·W + j``."""

    def __init__(self, plan: Plan, target: int, kinds: int, spacing: tuple[int, int], fields: dict,
                 present: torch.Tensor):
        self.plan = plan
        self.target = target
        self.kinds = kinds
        self.spacing = tuple(spacing)
        self.fields = fields
        self.present = present
        self.height, self.width = plan.network.shapes[target][1:]
        self._tables: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}

    @property
    def rows(self) -> int:
        return self.kinds * self.height * self.width

    def _table(self, tensor: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Per axis (present groups, size of ``tensor``): the row position of the group whose
        field holds the element, or the dump slot (the axis' row count) where none does."""
        if tensor not in self._tables:
            shape = self.plan.network.shapes[tensor]
            tables = []
            for axis, (w, rows, spacing) in enumerate(zip(self.fields[tensor], (self.height, self.width), self.spacing)):
                size = shape[1 + axis]
                table = torch.full((spacing, size), rows, dtype=torch.long)
                for r in range(rows):
                    for i in range(max(0, w.stride * r + w.lo), min(size - 1, w.stride * r + w.hi) + 1):
                        table[r % spacing, i] = r
                tables.append(table[self.present[:, 1 + axis]])
            self._tables[tensor] = tuple(tables)
        return self._tables[tensor]

    def reduce(self, tensor: int, products: torch.Tensor, dtype: torch.dtype | None = None) -> torch.Tensor:
        """Per-row sums of ``products`` (B, G, *shape of tensor): (B, R), each element summed into
        the row of its group whose field holds it (elements held by none are zero and dropped).
        ``dtype``: the sums' (products cast to it as they are summed; default theirs)."""
        batch, groups = products.shape[:2]
        if tensor not in self.fields:  # not reached: its coefficients are all zero
            return products.new_zeros(batch, self.rows, dtype=dtype)
        rows_table, cols_table = self._table(tensor)
        _, height, width = self.plan.network.shapes[tensor]
        grid = products.reshape(batch, groups, -1, height, width).sum(2, dtype=dtype)  # (B, G, H_t, W_t)
        index = cols_table.view(1, groups, 1, width).expand(batch, groups, height, width)
        grid = grid.new_zeros(batch, groups, height, self.width + 1).scatter_add_(3, index, grid)
        index = rows_table.view(1, groups, height, 1).expand(batch, groups, height, self.width + 1)
        grid = grid.new_zeros(batch, groups, self.height + 1, self.width + 1).scatter_add_(2, index, grid)
        out = grid.new_zeros(batch, self.kinds, self.height, self.width)
        out.index_add_(1, self.present[:, 0], grid[..., :self.height, :self.width])
        return out.reshape(batch, self.rows)

    def row_groups(self) -> torch.Tensor:
        """(R,) bool: the real rows that belong to a present group."""
        mark = torch.zeros(self.kinds, *self.spacing, dtype=torch.bool)
        mark[self.present[:, 0], self.present[:, 1], self.present[:, 2]] = True
        i = torch.arange(self.height) % self.spacing[0]
        j = torch.arange(self.width) % self.spacing[1]
        return mark[:, i][:, :, j].reshape(-1)


def grouped_saving(plan: Plan, target: int, unstable: int) -> float:
    """How many times fewer walks grouped rows take for ``unstable`` neurons of tensor
    ``target`` (both sides), or 0 where its rows cannot be grouped."""
    found = row_spacing(plan, target)
    if found is None:
        return 0.0
    spacing, _ = found
    groups = 2 * plan.network.shapes[target][0] * math.prod(spacing)
    return 2 * unstable / groups
