"""Bound rule of the element-wise ``Min`` and ``Max`` of one or more tensors (and a constant).

``Min`` is ``−Max`` of the negated inputs, so everything below is about ``y = max_i x_i`` with
``x_i ∈ [l_i, u_i]`` (a constant is an input with ``l = u``).

* **Interval**: ``[max_i l_i, max_i u_i]`` (exact: no arithmetic).
* **Lower side** (rows with ``A ≥ 0``): ``y ≥ α·x_a + (1 − α)·x_b``, a convex combination of two
  inputs, each of which ``y`` dominates. ``a`` is the input with the largest centre ``(l + u)/2``
  (it is the one that is the maximum wherever one input dominates the rest; for ``max(x, 0)``
  this is CROWN's adaptive ReLU slope), ``b`` the runner-up; α = 1 (default) takes ``a`` alone,
  α-CROWN tunes α per output (``parameters = 1``), as for max pooling (DeepPoly, α-CROWN).
* **Upper side** (rows with ``A < 0``): the plane ``y ≤ s·x_a + (1 − s)·x_b + c`` over the two
  inputs with the largest upper bounds, with ``s = du/(du − dl)`` for ``d = x_a − x_b ∈ [dl, du]``
  (``max(x_a, x_b) = x_b + relu(d)`` and the ReLU's chord: 1 where ``x_a`` dominates, 0 where
  ``x_b`` does). Since ``max`` is convex, the smallest valid ``c`` for any slopes is the largest
  value of ``y − s·x`` at a vertex of the box, which separates per input; it is computed with
  the other inputs (slope 0) included, so the plane is sound for the float slopes as stored and
  touches ``y`` at the box's corners ``(u_a, l_b)`` and ``(l_a, u_b)``.

Rounding: the weights ``α·A``, ``A − α·A`` and ``A·s`` are products, a coefficient sums the
``b`` outputs its input is broadcast to, the offset sums ``A·c`` over all outputs: with ``M`` the
largest input magnitude of an output, all of it is within
``(γ_{b+3} + γ_{outputs+4} + γ_2)·Σ_out |A|·(2·M + |c|)``.
"""

from __future__ import annotations

from typing import ClassVar

import torch

from assay.bounds.rules import register
from assay.bounds.rules.base import MultiInputRule, ulp_margin
from assay.bounds.rules.multi import aligned_bounds, gamma, parameter, settled, sum_to, underflow
from assay.nn.ops.arith import MinMax

__all__ = ["Extremum"]


def _stacked(layer, inputs, negate: bool):
    """All inputs (and the constant) broadcast to the output: ``(L, U)`` of shape (B, n, *out),
    negated (and swapped) for ``Min``; plus each tensor input's aligned and own sample shape."""
    pairs = [((-u, -l) if negate else (l, u)) for l, u in inputs]
    shapes = [tuple(l.shape[1:]) for l, _ in inputs]
    if layer.constant is not None:
        c = layer.constant.to(device=inputs[0][0].device, dtype=inputs[0][0].dtype)
        c = (-c if negate else c).unsqueeze(0)
        pairs.append((c, c))
    aligned = aligned_bounds(pairs)
    out = torch.broadcast_shapes(*(l.shape[1:] for l, _ in aligned))
    batch = inputs[0][0].shape[0]
    L = torch.stack([l.expand(batch, *out) for l, _ in aligned], 1)
    U = torch.stack([u.expand(batch, *out) for _, u in aligned], 1)
    return L, U, [tuple(l.shape[1:]) for l, _ in aligned[:len(inputs)]], shapes


def _top_two(score: torch.Tensor):
    """Indices (B, 1, *out) of the largest and second largest ``score`` over dim 1."""
    first = score.argmax(1, keepdim=True)
    masked = score.scatter(1, first, -torch.inf)
    return first, masked.argmax(1, keepdim=True)


def _pick(t: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    return t.gather(1, index).squeeze(1)


def _upper_plane(L, U):
    """``(a, b, s_a, s_b, c)``: ``max_i x_i ≤ s_a·x_a + s_b·x_b + c`` on the box (see the module
    docstring); indices (B, 1, *out), the rest (B, *out)."""
    a, b = _top_two(U)
    la, ua, lb, ub = _pick(L, a), _pick(U, a), _pick(L, b), _pick(U, b)
    du, dl = ua - lb, la - ub
    ratio = du / torch.where(dl < 0, du - dl, torch.ones_like(du))
    s_a = torch.where(dl >= 0, torch.ones_like(du), ratio.clamp(0.0, 1.0))
    s_b = 1.0 - s_a
    others = U.scatter(1, a, -torch.inf).scatter(1, b, -torch.inf).amax(1) if L.shape[1] > 2 else torch.full_like(ua, -torch.inf)
    # the largest y − s·x over the box's vertices: input a, input b, or any other input is the max
    candidates = torch.stack([ua - s_a * ua - s_b * lb, ub - s_b * ub - s_a * la, others - s_a * la - s_b * lb])
    c = candidates.amax(0)
    finite_others = torch.where(torch.isfinite(others), others.abs(), torch.zeros_like(others))
    c = c + ulp_margin(ua.abs() + la.abs() + ub.abs() + lb.abs() + finite_others, 16)
    return a, b, s_a, s_b, c


@register(MinMax)
class Extremum(MultiInputRule):
    """``Min``/``Max`` of one or more tensors and an optional constant (module docstring)."""

    parameters: ClassVar[int] = 1
    starts: ClassVar[tuple[float, ...]] = (1.0,)

    def interval(self, layer, inputs):
        negate = layer.kind == "Min"
        L, U, _, _ = _stacked(layer, inputs, negate)
        lo, hi = L.amax(1), U.amax(1)
        return (-hi, -lo) if negate else (lo, hi)

    def backward(self, layer, A, inputs, alpha=None):
        negate = layer.kind == "Min"
        L, U, aligned, shapes = _stacked(layer, inputs, negate)
        rows = -A if negate else A  # A·min(x) = (−A)·max(−x)
        count = L.shape[1]
        n_rows, batch = A.shape[1], A.shape[0]
        if count == 1:  # y = x: exact
            coefficient = sum_to(rows, aligned[0], shapes[0])
            zero = A.new_zeros(batch, n_rows)
            return settled((-coefficient if negate else coefficient,), zero, zero)
        share = parameter(alpha, 0, A, 1.0)
        first, second = _top_two((L + U) / 2)
        a, b, s_a, s_b, c = _upper_plane(L, U)
        positive, negative = rows.clamp(min=0), rows.clamp(max=0)
        p = positive * share
        q = positive - p
        index = torch.arange(count, device=A.device).reshape(1, 1, count, *(1,) * (A.dim() - 2))

        def at(i):  # one-hot (B, 1, n, *out) of an index (B, 1, *out)
            return (i.unsqueeze(1) == index).to(A.dtype)

        W = p.unsqueeze(2) * at(first) + q.unsqueeze(2) * at(second) \
            + (negative * s_a.unsqueeze(1)).unsqueeze(2) * at(a) + (negative * s_b.unsqueeze(1)).unsqueeze(2) * at(b)
        plane = torch.where(negative < 0, negative * c.unsqueeze(1), torch.zeros_like(negative))
        offset_terms = plane
        if layer.constant is not None:  # the constant is the last input: its terms are constants
            offset_terms = offset_terms + W[:, :, -1] * L[:, -1].unsqueeze(1)
        offset = offset_terms.reshape(batch, n_rows, -1).sum(-1)
        coefficients = tuple(sum_to(W[:, :, k], aligned[k], shapes[k]) for k in range(len(inputs)))
        with torch.no_grad():
            M = torch.maximum(L.abs(), U.abs()).amax(1).unsqueeze(1)
            used = rows != 0
            scale = torch.where(used, rows.abs() * (2 * M + c.abs().unsqueeze(1)), torch.zeros_like(rows))
            spill = torch.where(used, 1 + M, torch.zeros_like(rows))
            outputs = A[0, 0].numel()
            reach = outputs // max(1, min(int(torch.Size(shape).numel()) for shape in aligned))
            share = gamma(reach + 3, A.dtype) + gamma(outputs + 4, A.dtype) + gamma(2, A.dtype)
            rounding = share * scale.reshape(batch, n_rows, -1).sum(-1) \
                + 16 * underflow(A.dtype) * spill.reshape(batch, n_rows, -1).sum(-1)
        if negate:
            coefficients = tuple(-coefficient for coefficient in coefficients)
        return settled(coefficients, offset, rounding)
