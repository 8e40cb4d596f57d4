"""Rules of the operators that are affine in their inputs: shape operators, reductions, constant
scalings, constant matrix products, general convolutions, sums and differences of tensors.

One rule serves them all, because an affine map ``y = L(x_1, …, x_k) + c`` needs only:

* its forward pass (the layer's own ``forward``) for the interval's centre;
* ``|L|`` (the map with absolute coefficients and no constant) for the interval's radius and for
  the rounding charges: :meth:`LinearRule.absolute`;
* its transpose for CROWN's backward step, which torch's vector-Jacobian product gives exactly
  (the Jacobian of an affine map is ``L`` wherever it is taken): no hand-written transposes;
* ``fan``: how many products one output (forward) or one coefficient (backward) sums, to price
  rounding (Higham's γ_n, as for the dense layers).

Soundness: the interval is ``f(c) ± |L| r`` widened by γ_{fan+4}·(|L|(|c| + r) + |c_out|); the
backward coefficients ``P = Lᵀ A`` (computed) differ from the exact ones by at most
γ_{fan+2}·|L|ᵀ|A| (the constants' cast into the working dtype included), charged as
γ·|A|·(|L| m) with m the inputs' magnitudes; the offset ``A · c`` is a sum of n products.
Operators that only move, copy or pad values (:attr:`LinearRule.moves_only`) round nothing
forwards: their interval is ``(f(lower), f(upper))`` exactly, save a constant part that the
dtype cannot hold (a Concat part or Pad value of 0.1 in float32), whose ends move out by one
float (:meth:`LinearRule.cast_error`); backwards they owe rounding only where copies'
coefficients are summed (``fan`` > 1).
"""

from __future__ import annotations

import dataclasses
import math
import weakref
from typing import ClassVar

import torch
import torch.nn.functional as F

from assay.bounds.ibp import cast_outward, center_radius
from assay.bounds.plan import gamma
from assay.bounds.rules import register
from assay.bounds.rules.base import Crossing, LayerRule, dot
from assay.nn.ops import Affine, Binary, Concat, ConstMatMul, Conv, Gather, Neg, Pad, Reduce, Resize, Slice, Transpose

__all__ = ["LinearRule"]


def _pullback(function, zeros: list[torch.Tensor], G: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """``Jᵀ G`` per input of ``function`` at the points ``zeros`` (its Jacobian there: ``L`` for an
    affine map), differentiable in ``G`` where G requires a gradient (α-CROWN differentiates the
    walk). Plain ``torch.autograd.grad``: ``torch.func.vjp`` imports torch._dynamo on its first
    use, about 4 s of every process that bounds such a network. An input the output does not
    read gets zeros."""
    with torch.enable_grad():
        points = [z.requires_grad_(True) for z in zeros]
        out = function(*points)
        grads = torch.autograd.grad(out, points, G, create_graph=G.requires_grad, allow_unused=True)
    return tuple(torch.zeros_like(z) if g is None else g for z, g in zip(zeros, grads))

_CONV = {1: F.conv1d, 2: F.conv2d, 3: F.conv3d}
_CONV_T = {1: F.conv_transpose1d, 2: F.conv_transpose2d, 3: F.conv_transpose3d}


class LinearRule(LayerRule):
    """The rule of an operator affine in its inputs (see the module docstring)."""

    linear: ClassVar[bool] = True
    parameters: ClassVar[int] = 0
    moves_only: ClassVar[bool] = False  # only moves, copies or pads values: exact in floats
    attack_gradient: ClassVar[str] = "exact"  # see ElementwiseRule
    keeps_order: ClassVar[bool] = False

    # ------------------------------------------------------------------ what subclasses vary
    def absolute(self, layer):
        """A callable computing ``|L|(x_1, …)`` (absolute coefficients, no constant)."""
        return layer.forward

    def fan(self, layer, in_shapes, out_shape) -> int:
        """The most products summed into one output or into one backward coefficient."""
        return 1

    def alpha_tensors(self) -> int:
        return 0

    def absolute_map(self, layer):
        """:meth:`absolute` of ``layer``, built once per layer (building one copies and checks the
        layer's constants: on nn4sys' pensieve that was a fifth of a CROWN pass)."""
        cache = self.__dict__.setdefault("_absolute_maps", weakref.WeakKeyDictionary())
        if layer not in cache:
            cache[layer] = self.absolute(layer)
        return cache[layer]

    def transpose(self, layer, G: torch.Tensor, in_shapes) -> tuple[torch.Tensor, ...]:
        """``Lᵀ G`` per input for G (N, *out_shape): torch's vector-Jacobian product, exact for
        any affine map (subclasses may give a direct transpose, e.g. a convolution's adjoint)."""
        direct = self.direct_transpose(layer, G, in_shapes)
        if direct is not None and all(tuple(t.shape) == (G.shape[0], *shape) for t, shape in zip(direct, in_shapes)):
            return direct
        return self.vjp_transpose(layer, G, in_shapes)

    def vjp_transpose(self, layer, G: torch.Tensor, in_shapes) -> tuple[torch.Tensor, ...]:
        """``Lᵀ G`` by torch's vector-Jacobian product (the Jacobian of an affine map is ``L``)."""
        zeros = [torch.zeros(G.shape[0], *shape, dtype=G.dtype) for shape in in_shapes]
        return _pullback(layer.forward, zeros, G)

    def direct_transpose(self, layer, G: torch.Tensor, in_shapes) -> tuple[torch.Tensor, ...] | None:
        """``Lᵀ G`` computed directly (one product, no autograd), or None where this rule has no
        direct form for the layer; :meth:`transpose` falls back to the vector-Jacobian product
        then, and also when the result's shapes are not the inputs' shapes."""
        return None

    # ------------------------------------------------------------------ the uniform interface
    def forward_interval(self, layer, inputs):
        lowers, uppers = [l for l, _ in inputs], [u for _, u in inputs]
        if self.moves_only:
            low, high = layer.forward(*lowers), layer.forward(*uppers)
            error = self.cast_error(layer, lowers)
            if error is not None:  # a constant the dtype cannot hold: the exact one is the next float at most
                moved = error > 0
                low = torch.where(moved, torch.nextafter(low, low.new_tensor(-torch.inf)), low)
                high = torch.where(moved, torch.nextafter(high, high.new_tensor(torch.inf)), high)
            return low, high
        dtype = lowers[0].dtype
        centers, radii = zip(*(center_radius(l, u) for l, u in inputs))
        absolute = self.absolute_map(layer)
        out_center = layer.forward(*centers)
        out_radius = absolute(*radii)
        constant = self._constant(layer, lowers)
        in_shapes = [tuple(t.shape[1:]) for t in lowers]
        relative = gamma(self.fan(layer, in_shapes, tuple(out_center.shape[1:])) + 4, dtype)
        scale = absolute(*[c.abs() + r for c, r in zip(centers, radii)]) + constant.abs()
        margin = relative * scale
        return out_center - out_radius - margin, out_center + out_radius + margin

    def backward(self, layer, A: torch.Tensor, inputs, alpha=None) -> Crossing:
        batch, rows = A.shape[:2]
        lowers = [l for l, _ in inputs]
        pulled = self.transpose(layer, A.reshape(batch * rows, *A.shape[2:]), [tuple(l.shape[1:]) for l in lowers])
        coefficients = tuple(p.reshape(batch, rows, *p.shape[1:]) for p in pulled)
        constant = self._constant(layer, lowers)  # (1, *out)
        offset = dot(A, constant) if bool((constant != 0).any()) else A.new_zeros(batch, rows)
        with torch.no_grad():
            rounding = A.new_zeros(batch, rows)
            n = max(1, constant[0].numel())
            if bool((constant != 0).any()):
                rounding = rounding + gamma(n + 2, A.dtype) * dot(A.detach().abs(), constant.abs())
            in_shapes = [tuple(l.shape[1:]) for l in lowers]
            fan = self.fan(layer, in_shapes, tuple(A.shape[2:]))
            if not (self.moves_only and fan == 1):  # moving values backwards rounds nothing
                big = torch.finfo(A.dtype).max
                magnitudes = [torch.maximum(l.abs(), u.abs()).amax(0, keepdim=True).nan_to_num(nan=big, posinf=big)
                              for l, u in inputs]
                scaled = self.absolute_map(layer)(*magnitudes).nan_to_num(nan=big, posinf=big)
                rounding = rounding + gamma(fan + 2, A.dtype) * dot(A.detach().abs(), scaled)
        return Crossing(coefficients, offset, rounding)

    def backward_magnitude(self, layer, G: torch.Tensor, in_shapes) -> tuple[torch.Tensor, ...]:
        """``|L|ᵀ G`` per input, for G (B, S, *out_shape) ≥ 0: how much a change of each input can
        move the rows at most (the gradient walks of :mod:`assay.bounds.walks`). Not rounded outwards:
        a branching score, never a bound."""
        batch, rows = G.shape[:2]
        zeros = [torch.zeros(batch * rows, *shape, dtype=G.dtype) for shape in in_shapes]
        pulled = _pullback(self.absolute_map(layer), zeros, G.reshape(batch * rows, *G.shape[2:]))
        return tuple(p.reshape(batch, rows, *p.shape[1:]) for p in pulled)

    def cast_error(self, layer, like: list[torch.Tensor]) -> torch.Tensor | None:
        """(1, *out_shape) in ``like``'s dtype: at least ``|c − c̃|`` per output, with ``c`` the
        layer's constant part (float64, the network's own) and ``c̃`` the one its forward pass
        uses in that dtype (a Concat part or Pad value of 0.1 is rounded in float32); None where
        the dtype holds every constant exactly (computed once per layer, dtype and shapes)."""
        if like[0].dtype == torch.float64:
            return None
        cache = self.__dict__.setdefault("_cast_errors", weakref.WeakKeyDictionary())
        key = (like[0].dtype, tuple(tuple(t.shape[1:]) for t in like))
        per_layer = cache.setdefault(layer, {})
        if key not in per_layer:
            exact = self._constant(layer, [torch.zeros(1, *t.shape[1:], dtype=torch.float64) for t in like])
            error = (exact - self._constant(layer, like).to(torch.float64)).abs()
            # rounded up into the dtype (a float32 error of 0 stays 0)
            per_layer[key] = cast_outward(error, error, like[0].dtype)[1] if bool((error > 0).any()) else None
        return per_layer[key]

    def _constant(self, layer, like: list[torch.Tensor]) -> torch.Tensor:
        """``f(0, …, 0)`` (1, *out_shape): the constant part of the map (computed once per layer,
        dtype and input shapes)."""
        cache = self.__dict__.setdefault("_constants", weakref.WeakKeyDictionary())
        key = (like[0].dtype, tuple(tuple(t.shape[1:]) for t in like))
        per_layer = cache.setdefault(layer, {})
        if key not in per_layer:
            with torch.no_grad():
                per_layer[key] = layer.forward(*[torch.zeros(1, *shape, dtype=key[0]) for shape in key[1]])
        return per_layer[key]


def _unbroadcast(G: torch.Tensor, shape: tuple[int, ...]) -> torch.Tensor | None:
    """``G`` (N, *out) summed over the dimensions along which an input of shape (N, *shape) was
    broadcast (right-aligned, as torch broadcasts) to the output: (N, *shape), or None where
    ``shape`` has more dimensions than the output."""
    out = tuple(G.shape[1:])
    if len(shape) > len(out):
        return None
    aligned = (1,) * (len(out) - len(shape)) + tuple(shape)
    dims = [1 + i for i, (a, o) in enumerate(zip(aligned, out)) if a == 1 and o != 1]
    summed = G.sum(dim=dims, keepdim=True) if dims else G
    return summed.reshape(G.shape[0], *shape)


class MoveRule(LinearRule):
    """Operators whose every output is one input (or a constant): Slice, Transpose, Concat (with
    constant parts), Gather, Resize.

    Backwards, Slice, Concat and Transpose each have their own rule with a direct transpose that
    only moves coefficients (exact, like the vector-Jacobian product it replaces, without
    autograd's cost per walk: the graphs of small control networks are mostly such stages).
    """

    moves_only = True


@register(Slice)
class SliceRule(MoveRule):
    def direct_transpose(self, layer, G, in_shapes):
        # the coefficients back where the slice took them, zeros elsewhere
        (in_shape,) = in_shapes
        pulled = G.new_zeros(G.shape[0], *in_shape)
        index = [slice(None)] * pulled.ndim
        for axis, start, stop, step in zip(layer.axes, layer.starts, layer.stops, layer.steps):
            index[axis + 1] = slice(start, stop, step)
        pulled[tuple(index)] = G
        return (pulled,)


@register(Concat)
class ConcatRule(MoveRule):
    def direct_transpose(self, layer, G, in_shapes):
        # each input tensor's part of the coefficients (constants dropped)
        shapes, sizes, pieces = iter(in_shapes), [], []
        for part in layer.parts:
            sizes.append(next(shapes)[layer.axis] if part is None else part.shape[layer.axis])
        for part, piece in zip(layer.parts, torch.split(G, sizes, dim=layer.axis + 1)):
            if part is None:
                pieces.append(piece)
        return tuple(pieces)


@register(Transpose)
class TransposeRule(MoveRule):
    def direct_transpose(self, layer, G, in_shapes):
        # the inverse permutation
        inverse = [0] * len(layer.perm)
        for position, axis in enumerate(layer.perm):
            inverse[axis] = position
        return (G.permute(0, *(p + 1 for p in inverse)),)


@register(Gather)
class GatherRule(MoveRule):
    """Gather with constant indices: backwards, an input picked k times sums k coefficients."""

    def fan(self, layer, in_shapes, out_shape) -> int:
        return max(1, layer.indices.numel())


@register(Resize)
class ResizeRule(MoveRule):
    """Nearest upsampling: backwards, each input sums the coefficients of its copies."""

    def fan(self, layer, in_shapes, out_shape) -> int:
        return max(1, math.prod(layer.scales))


@register(Pad)
class PadRule(LinearRule):
    """Constant padding: the pad value is the map's constant; ``|L|`` pads with zeros."""

    moves_only = True

    def absolute(self, layer):
        return dataclasses.replace(layer, value=0.0).forward


@register(Reduce)
class ReduceRule(LinearRule):
    """ReduceSum / ReduceMean: positive coefficients (1 or 1/n), no constant."""

    def fan(self, layer, in_shapes, out_shape) -> int:
        return max(1, math.prod(in_shapes[0]) // max(1, math.prod(out_shape))) + 1

    def direct_transpose(self, layer, G, in_shapes):
        if layer.kind != "sum":  # a mean's 1/n: the vector-Jacobian product's own rounding
            return None
        (in_shape,) = in_shapes
        if not layer.keepdims:
            for axis in layer.axes:
                G = G.unsqueeze(axis + 1)
        return (G.expand(G.shape[0], *in_shape),)  # every summed input gets its output's coefficient


@register(Neg)
class NegRule(LinearRule):
    """``−x``: exact in floats; ``|L|`` is the identity."""

    def absolute(self, layer):
        return lambda x: x

    def direct_transpose(self, layer, G, in_shapes):
        return (-G,)


@register(Binary, when=lambda layer: layer.kind in ("Add", "Sub"))
class SumRule(LinearRule):
    """``a ± b`` of two tensors with broadcasting: ``|L|`` is the sum; one rounding per output, and
    backwards a broadcast input's coefficients are summed over the broadcast dimensions."""

    def absolute(self, layer):
        return dataclasses.replace(layer, kind="Add").forward

    def fan(self, layer, in_shapes, out_shape) -> int:
        return 2 + max(math.prod(out_shape) // max(1, math.prod(s)) for s in in_shapes)

    def direct_transpose(self, layer, G, in_shapes):
        sign = 1.0 if layer.kind == "Add" else -1.0
        return _unbroadcast(G, in_shapes[0]), _unbroadcast(G * sign, in_shapes[1])


@register(Affine)
class AffineRule(LinearRule):
    """``x · scale + shift`` with broadcast constants."""

    def vector_map(self, layer, n: int):
        if layer.scale.numel() not in (1, n) or layer.shift.numel() not in (1, n):
            return None
        scale = layer.scale.to(torch.float64).reshape(-1).expand(n)
        shift = layer.shift.to(torch.float64).reshape(-1).expand(n)
        return torch.diag(scale), shift.clone()

    def absolute(self, layer):
        return dataclasses.replace(layer, scale=layer.scale.abs(), shift=torch.zeros(())).forward

    def fan(self, layer, in_shapes, out_shape) -> int:
        return 2 + math.prod(out_shape) // max(1, math.prod(in_shapes[0]))

    def direct_transpose(self, layer, G, in_shapes):
        return (_unbroadcast(G * layer.scale.to(G.dtype), in_shapes[0]),)


@register(ConstMatMul)
class ConstMatMulRule(LinearRule):
    """``x @ M`` or ``M @ x`` with a constant ``M``."""

    def absolute(self, layer):
        return dataclasses.replace(layer, matrix=layer.matrix.abs()).forward

    def fan(self, layer, in_shapes, out_shape) -> int:
        return max(layer.matrix.shape) + 2

    def direct_transpose(self, layer, G, in_shapes):
        matrix = layer.matrix.to(G.dtype)
        (in_shape,) = in_shapes
        if matrix.ndim != 2 or len(in_shape) < 1:
            return None
        if not layer.constant_first:  # y = x M: x̄ = ȳ Mᵀ
            return (torch.matmul(G, matrix.T),) if G.ndim >= 2 else None
        if len(in_shape) == 1:  # y = x Mᵀ (a vector per sample): x̄ = ȳ M
            return (torch.matmul(G, matrix),)
        return (torch.matmul(matrix.T, G),)  # y = M x: x̄ = Mᵀ ȳ


@register(Conv)
class ConvRule(LinearRule):
    """N-d convolutions and transposed convolutions with constant kernels.

    Backwards, each is the other's adjoint: a convolution's transpose is a transposed convolution
    (then the padding cropped away), a transposed convolution's is a convolution (of the
    coefficients padded back to the uncropped output) — one call where a vector-Jacobian
    product runs the forward map too, and one level of autograd for α-CROWN instead of two.
    """

    def transpose(self, layer, G, in_shapes):
        dims = layer.weight.ndim - 2
        weight = layer.weight.to(G.dtype)
        (in_shape,) = in_shapes
        spatial = in_shape[len(in_shape) - dims:]
        G = G.reshape(-1, *G.shape[G.ndim - dims - 1:])  # leading dimensions of a sample join the batch
        if layer.transposed:  # y = crop(conv_transpose(x)): x̄ = conv(pad(ȳ))
            widths = []
            for before, after in zip(reversed(layer.begin), reversed(layer.end)):
                widths += [before, after]
            full = F.pad(G, widths) if any(widths) else G
            back = _CONV[dims](full, weight, None, layer.stride, 0, layer.dilation, layer.groups)
            # output padding can add positions no input reaches: their adjoint entries are dropped
            back = back[(slice(None), slice(None), *(slice(0, n) for n in spatial))]
        else:  # y = conv(pad(x)): x̄ = crop(conv_transpose(ȳ))
            padded = [n + b + e for n, b, e in zip(spatial, layer.begin, layer.end)]
            produced = [(o - 1) * s + d * (k - 1) + 1 for o, s, d, k in
                        zip(G.shape[2:], layer.stride, layer.dilation, weight.shape[2:])]
            extra = tuple(p - q for p, q in zip(padded, produced))
            back = _CONV_T[dims](G, weight, None, layer.stride, 0, extra, layer.groups, layer.dilation)
            index = [slice(None), slice(None)] + [slice(b, b + n) for b, n in zip(layer.begin, spatial)]
            back = back[tuple(index)]
        return (back.reshape(-1, *in_shape),)

    def absolute(self, layer):
        return dataclasses.replace(layer, weight=layer.weight.abs(), bias=torch.zeros_like(layer.bias)).forward

    def fan(self, layer, in_shapes, out_shape) -> int:
        weight = layer.weight
        kernel = math.prod(weight.shape[2:])
        return max(weight.shape[0], weight.shape[1]) * kernel * max(1, layer.groups) + 2
