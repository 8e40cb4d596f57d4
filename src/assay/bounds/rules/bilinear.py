"""Bound rules of products of two tensors: ``Mul``, ``Div`` (as ``a · (1/b)``) and ``MatMul``.

**McCormick planes.** For ``x ∈ [xl, xu]`` and ``z ∈ [zl, zu]``, ``(x − xl)(z − zl) ≥ 0`` and its
three siblings give two planes under ``x·z`` and two over it::

    x·z ≥ zl·x + xl·z − xl·zl   (anchored at xl, zl)      x·z ≤ zu·x + xl·z − xl·zu   (xl, zu)
    x·z ≥ zu·x + xu·z − xu·zu   (xu, zu)                  x·z ≤ zl·x + xu·z − xu·zl   (xu, zl)

Each plane equals ``x·z`` on the two edges through its anchor. A row's coefficient ``A ≥ 0``
on an output takes ``α·(first lower plane) + (1 − α)·(second)``, an ``A < 0`` takes
``α·(first upper plane) + (1 − α)·(second)``: α = 1 (the default, as auto_LiRPA's) anchors both
sides at ``xl``; α-CROWN tunes α ∈ [0, 1] per output (``parameters = 1``). ``MatMul`` relaxes
every product ``x_ik·z_kj`` of output ``(i, j)`` with that output's α, which makes each
coefficient a sum of two matrix products.

**Floating point.** The planes' slopes are the input bounds themselves (exact); the weights
``p = A·α`` and ``q = A − p`` are rounded, so ``A·x·z`` is split exactly into ``p·x·z + q·x·z``
plus a remainder ``|A − p − q|·|x·z| ≤ u·|A|·|x|·|z|``. Every other rounding is that of a sum
of products whose magnitudes add up to at most ``R = Σ_out |A|·(|x|max · |z|max)`` once weighted
by the inputs: a coefficient on x sums the ``c_x`` outputs it reaches (``c_x = 2·m·``broadcast
for ``MatMul``), one on z ``c_z``, the offset sums ``k``-term products over all outputs. So
``rounding = (γ_{c_x+3} + γ_{c_z+3} + γ_{k+outputs+6} + γ_2)·R`` plus an underflow allowance
(the γ of :func:`~assay.bounds.rules.multi.gamma` is twice the textbook one, which also covers
the rounding of ``R`` itself).

**Products whose factors are related** (float64 plans; :meth:`Product.stage` decides per layer):
``s ⊙ (W s + c)`` — one factor an affine image of the other — is crossed as its quadratic form
(:class:`QuadraticProduct`, :mod:`assay.bounds.rules.quadratic`), and a product of two vectors in
a network of few inputs, with only affine layers after it, through its factors' linear bounds in
the input (:class:`LinearizedProduct`, :mod:`assay.bounds.rules.linearized`); both keep
McCormick's planes for the rows where their own crossing does not apply or does worse.

**Div.** ``a / b = a · r`` with ``r = 1/b ∈ [1/bu, 1/bl]`` (widened) where ``b``'s interval
excludes 0: McCormick on ``(a, r)``, then ``r``'s coefficients cross the relaxation of ``1/b``
of the rule registered for ``Reciprocal`` (convex for ``b > 0``: tangent below at
``t = bl + α₂·(bu − bl)``, default the midpoint, and the chord above; mirrored for ``b < 0``). Where ``b``'s interval contains 0 the quotient is
unbounded: its interval is ``[−inf, inf]`` and every row with a non-zero coefficient on such an
output gets the trivial bound (offset ``−inf``), never a finite one.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import ClassVar

import torch

from assay.bounds.rules import register, rule_for
from assay.bounds.rules.base import Crossing, ElementwiseRule, MultiInputRule, widen
from assay.bounds.rules.linearized import factor_intervals, linearizable, linearized_crossing
from assay.bounds.rules.multi import aligned_bounds, gamma, interval_sum, parameter, product_corners, settled, sum_to, underflow
from assay.bounds.rules.quadratic import quadratic_partner, tangent_crossing
from assay.nn.ops.activation import Reciprocal
from assay.nn.ops.arith import Binary, MatMul

__all__ = ["Product", "QuadraticProduct", "LinearizedProduct", "Quotient", "MatrixProduct"]

_RECIPROCAL = Reciprocal()


def _weights(A: torch.Tensor, alpha: torch.Tensor):
    """The weights of each output's four McCormick planes, named by their anchors:
    ``(ll, uu, lu, ul)``, ``ll + uu = A`` where ``A ≥ 0`` and ``lu + ul = A`` where ``A < 0``
    (each up to one rounding), and 0 elsewhere."""
    positive, negative = A.clamp(min=0), A.clamp(max=0)
    ll = positive * alpha
    uu = positive - ll
    lu = negative * alpha
    ul = negative - lu
    return ll, uu, lu, ul


def _magnitude(lower: torch.Tensor, upper: torch.Tensor) -> torch.Tensor:
    return torch.maximum(lower.abs(), upper.abs())


def _product_crossing(A, x, z, alpha):
    """The McCormick crossing of ``y = x·z`` (element-wise, broadcast) for the rows ``A``
    (B, S, *out). ``x``, ``z``: ``(lower, upper)`` pairs of their own shapes. Returns the
    coefficients on x and z (their shapes), the offset and the rounding, not yet settled."""
    shapes = [tuple(x[0].shape[1:]), tuple(z[0].shape[1:])]
    (xl, xu), (zl, zu) = aligned_bounds([x, z])
    xl, xu, zl, zu = (t.unsqueeze(1) for t in (xl, xu, zl, zu))  # (B, 1, *aligned)
    ll, uu, lu, ul = _weights(A, parameter(alpha, 0, A, 1.0))
    on_x = (ll + ul) * zl + (uu + lu) * zu
    on_z = (ll + lu) * xl + (uu + ul) * xu
    # a weight of 0 times an infinite bound is 0, not NaN: only used planes count
    terms = _used(ll, xl * zl) + _used(uu, xu * zu) + _used(lu, xl * zu) + _used(ul, xu * zl)
    offset = -terms.reshape(A.shape[0], A.shape[1], -1).sum(-1)
    with torch.no_grad():
        outputs = A[0, 0].numel()
        mx, mz = _magnitude(xl, xu), _magnitude(zl, zu)
        R = (A.abs() * mx * mz).reshape(A.shape[0], A.shape[1], -1).sum(-1)
        spill = ((1 + mx + mz) * torch.ones_like(A)).reshape(A.shape[0], A.shape[1], -1).sum(-1)
        reach_x, reach_z = outputs // max(1, xl[0, 0].numel()), outputs // max(1, zl[0, 0].numel())
        share = gamma(reach_x + 3, A.dtype) + gamma(reach_z + 3, A.dtype) + gamma(outputs + 7, A.dtype) + gamma(2, A.dtype)
        rounding = share * R + 16 * underflow(A.dtype) * spill
    coefficients = (sum_to(on_x, xl.shape[2:], shapes[0]), sum_to(on_z, zl.shape[2:], shapes[1]))
    return coefficients, offset, rounding


def _used(weight, value):
    return torch.where(weight != 0, weight * value, torch.zeros_like(weight))


def _product_interval(x, z):
    (xl, xu), (zl, zu) = aligned_bounds([x, z])
    lo, hi = product_corners(xl, xu, zl, zu)
    return interval_sum(lo, hi, None)


@register(Binary, when=lambda layer: layer.kind == "Mul")
class Product(MultiInputRule):
    """``a · b`` of two tensors (ONNX broadcasting): McCormick planes, see the module docstring."""

    parameters: ClassVar[int] = 1
    starts: ClassVar[tuple[float, ...]] = (1.0,)
    fixed_factor_product: ClassVar[str | None] = "Mul"

    def interval(self, layer, inputs):
        x, z = inputs
        return _product_interval(x, z)

    def backward(self, layer, A, inputs, alpha=None):
        x, z = inputs
        return settled(*_product_crossing(A, x, z, alpha))

    def stage(self, network, index, layer, dtype):
        """A product of a vector with an affine image of itself (``s ⊙ (W s + c)``, ``s ⊙ s``) in a
        float64 plan is crossed as its quadratic form (:class:`QuadraticProduct`)."""
        stage = super().stage(network, index, layer, dtype)
        if dtype != torch.float64:
            return stage
        partner = quadratic_partner(network, index)
        if partner is not None:
            return replace(stage, rule=QuadraticProduct(*partner))
        if linearizable(network, index):
            return replace(stage, rule=LinearizedProduct())
        return stage


class LinearizedProduct(Product):
    """``a ⊙ b`` of two vectors of a small-input network, crossed through the factors' linear bounds
    in the input where that beats McCormick's planes (:mod:`assay.bounds.rules.linearized`); a walk
    that does not reach the input (a cut, grouped rows, forks) takes McCormick's. One per stage,
    built by :meth:`Product.stage`."""

    walks: ClassVar[bool] = True

    def backward_walk(self, stage, A, walk, alpha=None):
        x, z = factor_intervals(stage, walk)
        mccormick = _product_crossing(A, x, z, alpha)
        flat = A.expand(x[0].shape[0], *A.shape[1:]).reshape(x[0].shape[0], A.shape[1], -1)
        coefficients, offset, rounding, on_input = linearized_crossing(flat, stage, walk, mccormick)
        return Crossing(coefficients, offset, rounding, on_input)


class QuadraticProduct(Product):
    """``y = s ⊙ (W s + c)`` (one factor an affine image of the other, ``order``: which factor is
    ``s``): rows whose quadratic form is convex take its tangent plane at the form's minimiser over
    the box, the others McCormick's planes (:mod:`assay.bounds.rules.quadratic`). One per stage,
    built by :meth:`Product.stage`."""

    def __init__(self, order: int, W: torch.Tensor, c: torch.Tensor):
        self.order, self.W, self.c = order, W, c

    def backward(self, layer, A, inputs, alpha=None):
        x, z = inputs
        coefficients, offset, rounding = _product_crossing(A, x, z, alpha)
        lower, upper = inputs[self.order]
        flat = A.expand(lower.shape[0], *A.shape[1:]).reshape(lower.shape[0], A.shape[1], -1)
        on_s, on_image = coefficients if self.order == 0 else coefficients[::-1]
        crossing = tangent_crossing(flat, self.W, self.c, lower, upper, ((on_s, on_image), offset, rounding))
        on_s, on_image = crossing.coefficients
        return Crossing((on_s, on_image) if self.order == 0 else (on_image, on_s), crossing.offset, crossing.rounding)


def _reciprocal_interval(lower, upper):
    """``[1/upper, 1/lower]`` widened for the division's rounding (1/b is decreasing on each side
    of 0); only meaningful where the interval excludes 0."""
    return widen(1.0 / upper, 1.0 / lower, ulps=2)


def _reaching_zero(lower, upper):
    return (lower <= 0) & (upper >= 0) | torch.isnan(lower) | torch.isnan(upper)


@register(Binary, when=lambda layer: layer.kind == "Div")
class Quotient(MultiInputRule):
    """``a / b`` of two tensors (ONNX broadcasting) as ``a · (1/b)``, see the module docstring.
    ``parameters = 2``: the McCormick α of each output, and the tangent point of ``1/b`` (the
    mean of the second α over the outputs each element of ``b`` reaches)."""

    parameters: ClassVar[int] = 2
    fixed_factor_product: ClassVar[str | None] = "Div"
    # Both start inside [0, 1], not at CROWN's McCormick choice 1.0 for the first: from that end
    # of the range the search's few α steps (input splitting's 5) stay at CROWN's bound on
    # nn4sys' pensieve_big_parallel (its two divisions): row 36 then needs 140 boxes and times out
    # at 60 s, where from 0.5 it holds after 65 boxes (11 s of CPU).
    starts: ClassVar[tuple[float, ...]] = (0.5, 0.5)

    def interval(self, layer, inputs):
        a, (bl, bu) = inputs
        zero = _reaching_zero(bl, bu)
        one = torch.ones_like(bl)
        rl, ru = _reciprocal_interval(torch.where(zero, one, bl), torch.where(zero, one, bu))
        lo, hi = _product_interval(a, (rl, ru))
        (zero_out, _), _ = aligned_bounds([(zero, zero), (lo, lo)])
        zero_out = zero_out.expand_as(lo)
        return (torch.where(zero_out, torch.full_like(lo, -math.inf), lo),
                torch.where(zero_out, torch.full_like(hi, math.inf), hi))

    def backward(self, layer, A, inputs, alpha=None):
        a, (bl, bu) = inputs
        zero = _reaching_zero(bl, bu)
        one = torch.ones_like(bl)
        bl, bu = torch.where(zero, one, bl), torch.where(zero, one, bu)
        r = _reciprocal_interval(bl, bu)
        # the rows that touch an output whose divisor can be 0 are unbounded below
        (zero_aligned, _), _ = aligned_bounds([(zero, zero), (a[0], a[0])])
        dead_outputs = zero_aligned.unsqueeze(1) & torch.ones_like(A, dtype=torch.bool)
        dead_rows = (dead_outputs & (A != 0)).reshape(A.shape[0], A.shape[1], -1).any(-1)
        A = torch.where(dead_outputs, torch.zeros_like(A), A)
        (on_a, on_r), offset, rounding = _product_crossing(A, a, r, alpha)
        point, per_row = self._tangent_alpha(alpha, A, bl)
        if per_row:  # a tangent per row: every side per row
            ends = bl.unsqueeze(1).expand_as(point), bu.unsqueeze(1).expand_as(point)
        else:
            ends = bl, bu
        share = point.expand_as(ends[0])  # the tangent point's α (the chord side ignores it)
        relaxation = rule_for(_RECIPROCAL).relax(_RECIPROCAL, *ends, (share, share))
        crossed = ElementwiseRule().cross(relaxation, on_r, bl, bu)
        total = offset + crossed.offset
        with torch.no_grad():
            rounding = rounding + crossed.rounding + 2 * gamma(2, A.dtype) * (offset.abs() + crossed.offset.abs()) \
                + underflow(A.dtype)
        total = torch.where(dead_rows, torch.full_like(total, -math.inf), total)
        return settled((on_a, crossed.coefficients[0]), total, rounding)

    @staticmethod
    def _tangent_alpha(alpha, A, bl):
        """The tangent point's α per element of ``b``: (B, *b), or (B, S, *b) when α is per row
        (and whether it is); the mean of α over the outputs an element of ``b`` reaches (any
        value in [0, 1] is sound)."""
        a = parameter(alpha, 1, A, 0.5)
        per_row = a.shape[1] != 1
        a = a.expand(A.shape[0], a.shape[1], *A.shape[2:])
        b_shape = tuple(bl.shape[1:])
        aligned = (1,) * (A.dim() - 2 - len(b_shape)) + b_shape
        dims = [d + 2 for d, (size, out) in enumerate(zip(aligned, A.shape[2:])) if size == 1 and out != 1]
        if dims:
            a = a.mean(dim=dims, keepdim=True)
        a = a.reshape(a.shape[0], a.shape[1], *b_shape)
        return (a, True) if per_row else (a.squeeze(1), False)


@register(MatMul)
class MatrixProduct(MultiInputRule):
    """``x @ z`` of two tensors (numpy ``matmul``, batched over leading sample dimensions): every
    product ``x_ik·z_kj`` relaxed by McCormick with output ``(i, j)``'s α; the coefficients are
    four matrix products (see the module docstring)."""

    parameters: ClassVar[int] = 1
    starts: ClassVar[tuple[float, ...]] = (1.0,)

    def interval(self, layer, inputs):
        (xl, xu), (zl, zu) = aligned_bounds(inputs)
        lo, hi = product_corners(xl.unsqueeze(-1), xu.unsqueeze(-1), zl.unsqueeze(-3), zu.unsqueeze(-3))
        return interval_sum(lo, hi, -2)

    def backward(self, layer, A, inputs, alpha=None):
        x, z = inputs
        shapes = [tuple(x[0].shape[1:]), tuple(z[0].shape[1:])]
        (xl, xu), (zl, zu) = aligned_bounds(inputs)
        xl, xu, zl, zu = (t.unsqueeze(1) for t in (xl, xu, zl, zu))  # (B, 1, *batch, rows, cols)
        ll, uu, lu, ul = _weights(A, parameter(alpha, 0, A, 1.0))

        def T(t):
            return t.transpose(-1, -2)

        on_x = (ll + ul).matmul(T(zl)) + (uu + lu).matmul(T(zu))
        on_z = T(xl).matmul(ll + lu) + T(xu).matmul(uu + ul)
        terms = _used(ll, xl.matmul(zl)) + _used(uu, xu.matmul(zu)) + _used(lu, xl.matmul(zu)) + _used(ul, xu.matmul(zl))
        offset = -terms.reshape(A.shape[0], A.shape[1], -1).sum(-1)
        with torch.no_grad():
            outputs, inner = A[0, 0].numel(), xl.shape[-1]
            mx, mz = _magnitude(xl, xu), _magnitude(zl, zu)
            R = (A.abs() * mx.matmul(mz)).reshape(A.shape[0], A.shape[1], -1).sum(-1)
            spill = ((1 + inner * (1 + mx.amax(-1, keepdim=True) + mz.amax(-2, keepdim=True))) * torch.ones_like(A))
            spill = spill.reshape(A.shape[0], A.shape[1], -1).sum(-1)
            rows_x, cols_z = xl.shape[-2], zl.shape[-1]
            reach_x = 2 * cols_z * (outputs // max(1, cols_z * xl[0, 0].numel() // inner))  # 2·m·broadcast
            reach_z = 2 * rows_x * (outputs // max(1, rows_x * zl[0, 0].numel() // inner))
            share = gamma(reach_x + 3, A.dtype) + gamma(reach_z + 3, A.dtype) + gamma(inner + outputs + 6, A.dtype) \
                + gamma(2, A.dtype)
            rounding = share * R + 16 * underflow(A.dtype) * spill
        coefficients = (sum_to(on_x, xl.shape[2:], shapes[0]), sum_to(on_z, zl.shape[2:], shapes[1]))
        return settled(coefficients, offset, rounding)
