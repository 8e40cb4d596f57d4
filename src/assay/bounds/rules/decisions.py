"""Bound rules of the decision operators ``ArgMax``, ``Equal`` and ``IndexTable`` (see
:mod:`assay.nn.ops.decision`).

Their outputs are indices, booleans and table entries: piecewise constant in the inputs, with
jumps wherever the decision changes, so no line through them is tighter than a constant one.
Each rule gives an exact interval of the outputs (no arithmetic: indices, 0/1 and table values
are floats as they are), and its linear bounds are that interval as constant lines
(:func:`constant_crossing`):

* ``ArgMax`` — entry ``i`` can be the (first) maximum only if its upper bound exceeds the lower
  bound of every entry before it and reaches that of every entry after it (ties go to the first
  index; to the last with ``select_last_index``); the output lies between the smallest and the
  largest such index (exact when one is left: at a point, ties included).
* ``Equal`` — 1 where both inputs are the same point, 0 where their intervals are disjoint,
  else ``[0, 1]``.
* ``IndexTable`` — the elementwise hull of the table over every integer key tuple the keys'
  intervals reach (truncated towards zero, as ONNX casts); exact when one tuple is left; the
  whole line when more than :data:`MAX_TABLE_KEYS` tuples would have to be evaluated.
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import torch

from assay.bounds.ibp import cast_outward
from assay.bounds.rules import register
from assay.bounds.rules.base import MultiInputRule
from assay.bounds.rules.multi import aligned_bounds, gamma, settled, underflow
from assay.nn.ops.decision import ArgMax, Equal, IndexTable

__all__ = ["ArgMaxRule", "EqualRule", "IndexTableRule", "constant_crossing", "MAX_TABLE_KEYS"]

# Key tuples an IndexTable's interval evaluates at most (per sample); beyond, the output is unbounded.
MAX_TABLE_KEYS = 8192


def constant_crossing(A: torch.Tensor, lo: torch.Tensor, hi: torch.Tensor, inputs):
    """The crossing of an operator bounded by the constants ``lo ≤ y ≤ hi`` (B, *out): no
    coefficient on any input, offset ``Σ A⁺·lo + A⁻·hi``, charged ``γ_{n+1}`` of its terms."""
    batch, rows = A.shape[0], A.shape[1]
    positive, negative = A.clamp(min=0), A.clamp(max=0)
    low, high = lo.unsqueeze(1), hi.unsqueeze(1)
    # 0·(±inf) is NaN: an unbounded end only counts where its side is used
    terms = torch.where(positive > 0, positive * low, torch.zeros_like(positive)) \
        + torch.where(negative < 0, negative * high, torch.zeros_like(negative))
    offset = terms.reshape(batch, rows, -1).sum(-1)
    with torch.no_grad():
        n = max(1, lo[0].numel())
        magnitude = terms.detach().abs().nan_to_num(posinf=0.0).reshape(batch, rows, -1).sum(-1)
        rounding = gamma(n + 1, A.dtype) * magnitude + n * underflow(A.dtype)
    coefficients = tuple(A.new_zeros(batch, rows, *lower.shape[1:]) for lower, _ in inputs)
    return settled(coefficients, offset, rounding)


class _ConstantLines(MultiInputRule):
    """An operator whose linear bounds are its interval (constant lines)."""

    def backward(self, layer, A, inputs, alpha=None):
        lo, hi = self.interval(layer, inputs)
        return constant_crossing(A, lo.to(A.dtype), hi.to(A.dtype), inputs)


@register(ArgMax)
class ArgMaxRule(_ConstantLines):
    """``ArgMax`` along one axis: between the smallest and the largest candidate index."""

    def interval(self, layer, inputs):
        (lower, upper), = inputs
        axis = layer.axis + 1
        n = lower.shape[axis]
        u = upper.movedim(axis, -1).unsqueeze(-1)  # (..., i, 1)
        low = lower.movedim(axis, -1).unsqueeze(-2)  # (..., 1, j)
        order = torch.arange(n, device=lower.device)
        before = order.unsqueeze(1) > order.unsqueeze(0)  # j < i
        if layer.last:
            before = ~before & (order.unsqueeze(1) != order.unsqueeze(0))  # j > i wins ties instead
        beats = torch.where(before, u > low, u >= low) | (order.unsqueeze(1) == order.unsqueeze(0))
        candidate = beats.all(-1).movedim(-1, axis)
        shape = [1] * lower.dim()
        shape[axis] = lower.shape[axis]
        index = torch.arange(lower.shape[axis], device=lower.device, dtype=lower.dtype).reshape(shape)
        lo = torch.where(candidate, index, torch.full_like(lower, math.inf)).amin(axis, keepdim=layer.keepdims)
        hi = torch.where(candidate, index, torch.full_like(lower, -math.inf)).amax(axis, keepdim=layer.keepdims)
        # NaN bounds (no candidate): every index is possible
        last = float(lower.shape[axis] - 1)
        return lo.clamp(0.0, last).nan_to_num(0.0, 0.0, 0.0), hi.clamp(0.0, last).nan_to_num(last, last, last)


@register(Equal)
class EqualRule(_ConstantLines):
    """``a == b`` as 0/1: 1 for one shared point, 0 for disjoint intervals, else ``[0, 1]``."""

    def interval(self, layer, inputs):
        (la, ua), (lb, ub) = aligned_bounds(list(inputs))
        shape = torch.broadcast_shapes(la.shape, lb.shape)
        same = (la == ua) & (lb == ub) & (la == lb)
        apart = (ua < lb) | (ub < la)
        lo = torch.where(same, 1.0, 0.0).to(la.dtype).expand(shape)
        hi = torch.where(apart, 0.0, 1.0).to(la.dtype).expand(shape)
        return lo.contiguous(), hi.contiguous()


@register(IndexTable)
class IndexTableRule(_ConstantLines):
    """The hull of an ``IndexTable`` over the integer keys its inputs' intervals reach."""

    def interval(self, layer, inputs):
        lower = layer.integer_keys(*(torch.nan_to_num(lo, nan=-math.inf).clamp(-2.0 ** 62, 2.0 ** 62) for lo, _ in inputs))
        upper = layer.integer_keys(*(torch.nan_to_num(hi, nan=math.inf).clamp(-2.0 ** 62, 2.0 ** 62) for _, hi in inputs))
        dtype, device = inputs[0][0].dtype, inputs[0][0].device
        low_rows, high_rows = [], []
        for first, last in zip(lower.tolist(), upper.tolist()):
            count = math.prod(b - a + 1 for a, b in zip(first, last))
            if count > MAX_TABLE_KEYS:
                low_rows.append(np.full(layer.shape, -np.inf))
                high_rows.append(np.full(layer.shape, np.inf))
                continue
            values = iter(layer.value(key) for key in itertools.product(*(range(a, b + 1) for a, b in zip(first, last))))
            low = high = next(values)
            for value in values:
                low, high = np.minimum(low, value), np.maximum(high, value)
            low_rows.append(low)
            high_rows.append(high)
        lo = torch.as_tensor(np.stack(low_rows), dtype=torch.float64, device=device)
        hi = torch.as_tensor(np.stack(high_rows), dtype=torch.float64, device=device)
        return cast_outward(lo, hi, dtype)
