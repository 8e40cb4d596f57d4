"""Affine stages (Linear, Conv2d, AvgPool2d, Flatten/Reshape): their maps and their rules.

For an affine stage the engine needs four maps on batches: the map itself, the map with
absolute weights, the transposed map (backward substitution of linear bounds) and the
transposed map with absolute weights (rounding magnitudes); :class:`AffineStage` holds them,
and the rules of every walk: IBP's interval (with interval weights), CROWN's crossing (with its
rounding terms) and the forward linear functions' step.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from assay.bounds.linear_functions import LinearFunctions
from assay.bounds.rounding import capped_magnitude, center_radius, gamma, magnitude, unit_roundoff
from assay.bounds.stages.base import Stage
from assay.nn.layers import Conv2d
from assay.nn.sparse import csr_from, nonzeros, sparse_linear


@dataclass(frozen=True, eq=False)
class SparseWeights:
    """CSR forms of a large, mostly-zero dense layer's weight maps (see :mod:`assay.nn.sparse`):
    ``W``, ``|W|``, ``W⁺ = max(W, 0)``, ``W⁻ = min(W, 0)`` (out, in) and the transposes of ``W`` and
    ``|W|`` (in, out) for backward maps. Each holds exactly the dense matrix's values."""

    weight: torch.Tensor
    abs_weight: torch.Tensor
    positive: torch.Tensor
    negative: torch.Tensor
    weight_t: torch.Tensor
    abs_weight_t: torch.Tensor

    @classmethod
    def of(cls, weight: torch.Tensor) -> SparseWeights:
        rows, cols, values = nonzeros(weight)
        shape = tuple(weight.shape)
        order = torch.argsort(cols, stable=True)  # the transpose's row-major order
        rows_t, cols_t, values_t = cols[order], rows[order], values[order]
        return cls(csr_from(rows, cols, values, shape), csr_from(rows, cols, values.abs(), shape),
                   csr_from(rows, cols, values.clamp(min=0), shape), csr_from(rows, cols, values.clamp(max=0), shape),
                   csr_from(rows_t, cols_t, values_t, shape[::-1]), csr_from(rows_t, cols_t, values_t.abs(), shape[::-1]))


@dataclass(frozen=True, eq=False)
class AffineStage(Stage):
    """``y = W x + b`` for one layer (Linear, Conv2d, AvgPool2d as a depthwise convolution,
    Flatten/Reshape as ``kind`` "flatten"); shapes exclude the batch dimension."""

    index: int
    kind: str  # "linear" | "conv" | "flatten"
    in_shape: tuple[int, ...]
    out_shape: tuple[int, ...]
    weight: torch.Tensor | None
    bias: torch.Tensor | None
    abs_weight: torch.Tensor | None
    conv: Conv2d | None
    # number of products summed into one output or one transposed entry (for rounding bounds)
    fan: int
    perturbable: bool  # its weights are model parameters (not a pooling constant or a reshape)
    sources: tuple[int, ...] = ()  # the one tensor it reads
    # > 1: a fixed grouped convolution whose groups share one kernel (pooling, padding, a lowered
    # MaxPool). It runs as one ungrouped convolution over `shared_groups` times the batch, which
    # torch does far faster than a grouped one; every weight passed to it must be tiled alike.
    shared_groups: int = 0
    # CSR forms of a large sparse linear stage's weights (:func:`assay.nn.sparse.is_sparse_weight`):
    # the maps below use them unless given another weight; `weight`/`abs_weight` stay dense.
    sparse: SparseWeights | None = None


    @property
    def windowed(self) -> bool:
        """Whether :meth:`window` knows this stage's receptive field (a convolution)."""
        return self.kind == "conv"

    def window(self, sources):
        """The receptive field of an output element over the image (see
        :func:`assay.bounds.forward_columns.tensor_windows`), from its source's per-axis windows
        (stride, lo, hi): widened by the kernel, padding and dilation; None if not a convolution."""
        if self.kind != "conv":
            return None
        conv, kernel = self.conv, self.weight.shape[2:]
        return tuple(type(w)(w.stride * conv.stride[axis], w.lo - w.stride * conv.padding[axis],
                             w.hi + w.stride * (conv.dilation[axis] * (kernel[axis] - 1) - conv.padding[axis]))
                     for axis, w in enumerate(sources[0]))

    @property
    def weighted(self) -> bool:
        """Whether it has a weight tensor (not a reshape)."""
        return self.weight is not None

    @property
    def rounding_terms(self) -> int:
        return self.fan + 3

    # ---------------------------------------------------------------- the walks' rules
    def interval(self, bounds, delta: float = 0.0):
        return _affine_interval(self, *bounds[self.sources[0]], delta)

    def crown_step(self, walk, position: int, A: torch.Tensor) -> None:
        _cross_affine(walk, position, self, A)

    def rounding_scale(self, bounds) -> torch.Tensor:
        """CROWN's rounding scale of this stage for ``bounds`` (see :func:`_affine_scale`)."""
        return _affine_scale(self, bounds)

    def forward_step(self, state, position: int):
        return _affine(self, state.functions[self.sources[0]], state.input_magnitude)

    def backward_magnitude(self, G: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return (self.backward_abs(G) if self.abs_weight is not None else self.backward(G),)

    def forward_magnitude(self, values) -> torch.Tensor:
        return self.forward_abs(values[0]) if self.abs_weight is not None else self.forward(values[0])

    def linear_form(self, forms):
        coef, offset = forms[0]
        coef = self.forward(coef)  # no bias: the linear part
        offset = self.forward_bias(offset) if self.bias is not None else self.forward(offset)
        return coef, offset

    # ---------------------------------------------------------------- forward maps
    def forward(self, x: torch.Tensor, weight=None, bias=None) -> torch.Tensor:
        if self.kind == "linear":
            if weight is None and self.sparse is not None:
                weight = self.sparse.weight
            weight = self.weight if weight is None else weight
            if weight.layout == torch.sparse_csr:
                return sparse_linear(x, weight, bias)
            return F.linear(x, weight, bias)
        weight = self.weight if weight is None else weight
        if self.kind == "conv":
            c = self.conv
            if self.shared_groups:
                groups, count = self.shared_groups, x.shape[0]
                kernel = weight[: weight.shape[0] // groups]
                y = F.conv2d(x.reshape(count * groups, -1, *x.shape[2:]), kernel, None, c.stride, c.padding, c.dilation)
                y = y.reshape(count, *self.out_shape)
                return y if bias is None else y + bias.view(1, -1, 1, 1)
            return F.conv2d(x, weight, bias, c.stride, c.padding, c.dilation, c.groups)
        return x.reshape(x.shape[0], *self.out_shape)

    def forward_bias(self, x: torch.Tensor) -> torch.Tensor:
        return self.forward(x, None, self.bias)

    def forward_abs(self, x: torch.Tensor) -> torch.Tensor:
        """``|W| x`` (no bias)."""
        return self.forward(x, self.abs_weight if self.sparse is None else self.sparse.abs_weight, None)

    def signed_weights(self) -> tuple[torch.Tensor, torch.Tensor]:
        """``(W⁺, W⁻)``, the positive and negative parts of the weight, for :meth:`forward`
        (CSR for a sparse stage)."""
        if self.sparse is not None:
            return self.sparse.positive, self.sparse.negative
        return self.weight.clamp(min=0), self.weight.clamp(max=0)

    def forward_ones(self, x: torch.Tensor) -> torch.Tensor:
        """``1 x``: the sum of ``x`` over each output's receptive field (weight-perturbation radius)."""
        if self.kind == "linear":
            return x.sum(dim=1, keepdim=True).expand(x.shape[0], self.out_shape[0])
        if self.kind == "conv":
            return self.forward(x, torch.ones_like(self.weight), None)
        return self.forward(x)

    # ---------------------------------------------------------------- backward maps
    def backward(self, A: torch.Tensor, weight=None) -> torch.Tensor:
        """``A W``: A of shape (B, S, *out_shape) to (B, S, *in_shape)."""
        if weight is None and self.sparse is not None:
            return sparse_linear(A, self.sparse.weight_t)
        weight = self.weight if weight is None else weight
        batch, rows = A.shape[:2]
        if self.kind == "linear":
            return A.matmul(weight)
        if self.kind == "conv":
            c = self.conv
            flat = A.reshape(batch * rows, *self.out_shape)
            kh, kw = weight.shape[2:]
            out_pad = []
            for axis, k in ((0, kh), (1, kw)):
                produced = (self.out_shape[axis + 1] - 1) * c.stride[axis] - 2 * c.padding[axis] + c.dilation[axis] * (k - 1) + 1
                out_pad.append(self.in_shape[axis + 1] - produced)
            if self.shared_groups:
                groups = self.shared_groups
                kernel = weight[: weight.shape[0] // groups]
                flat = flat.reshape(batch * rows * groups, -1, *self.out_shape[1:])
                back = F.conv_transpose2d(flat, kernel, None, c.stride, c.padding, tuple(out_pad), 1, c.dilation)
            else:
                back = F.conv_transpose2d(flat, weight, None, c.stride, c.padding, tuple(out_pad), c.groups, c.dilation)
            return back.reshape(batch, rows, *self.in_shape)
        return A.reshape(batch, rows, *self.in_shape)

    def backward_abs(self, A: torch.Tensor) -> torch.Tensor:
        if self.sparse is not None:
            return sparse_linear(A, self.sparse.abs_weight_t)
        return self.backward(A, self.abs_weight)

    def bias_term(self, A: torch.Tensor, dtype: torch.dtype | None = None) -> torch.Tensor:
        """``A · b`` summed over the stage's output: shape (B, S), in ``dtype`` (default A's); a
        convolution's A is cast as it is summed over its positions, not copied."""
        dtype = A.dtype if dtype is None else dtype
        if self.bias is None:
            return A.new_zeros(A.shape[:2], dtype=dtype)
        bias = self.bias.to(dtype)
        if self.kind == "linear":  # small: the copy costs little
            return A.to(dtype).matmul(bias)
        return A.sum(dim=(-2, -1), dtype=dtype).matmul(bias)


# ---------------------------------------------------------------- IBP

# Elements of the (batch, out, in) product tensor built at once for exact interval weights.
_CORNER_CHUNK = 1 << 22


def perturbation_radius(stage: AffineStage, in_lower, in_upper, delta: float) -> torch.Tensor:
    """Bound on |ΔW x + Δb| over the input interval when every weight and bias moves by at most δ.

    |Σ_j ΔW_ij x_j + Δb_i| ≤ δ (Σ_j max|x_j| + 1), summed over each output's receptive field;
    sound for inputs of either sign.
    """
    return delta * (stage.forward_ones(magnitude(in_lower, in_upper)) + 1.0)


def _affine_interval(stage: AffineStage, lower, upper, delta: float) -> tuple[torch.Tensor, torch.Tensor]:
    if stage.kind == "flatten":
        return stage.forward(lower), stage.forward(upper)
    center, radius = center_radius(lower, upper)
    out_center = stage.forward_bias(center)
    out_radius = stage.forward_abs(radius)
    # Rounding: each output sums `fan` products; bound the error by γ·(|W|(|c|+r) + |b|).
    u = unit_roundoff(lower.dtype)
    gamma = 2.0 * (stage.fan + 4) * u
    scale = stage.forward_abs(center.abs() + radius) + _broadcast_bias(stage, stage.bias.abs(), out_center)
    if delta > 0:
        pert = perturbation_radius(stage, lower, upper, delta)
        scale = scale + pert
        out_lower = out_center - out_radius - pert
        out_upper = out_center + out_radius + pert
        if stage.kind == "linear":
            # The interval product of exact corner terms is tighter than center/radius + noise.
            exact_lower, exact_upper = _linear_interval_weights(stage, lower, upper, delta)
            out_lower = torch.maximum(out_lower, exact_lower)
            out_upper = torch.minimum(out_upper, exact_upper)
    else:
        out_lower = out_center - out_radius
        out_upper = out_center + out_radius
    margin = gamma * scale
    return out_lower - margin, out_upper + margin


def _broadcast_bias(stage: AffineStage, bias: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    if stage.kind == "linear":
        return bias.expand_as(like)
    return bias.view(1, -1, 1, 1).expand_as(like)


def _linear_interval_weights(stage: AffineStage, lower, upper, delta: float):
    """Exact interval arithmetic for x ∈ [l, u], W ∈ [W0 − δ, W0 + δ], b ∈ [b0 − δ, b0 + δ].

    Each product w·x over a box attains its extremes at corners, whatever the signs; summing
    the per-term extremes gives the tightest interval bound (e.g. x ∈ [1, 2], w ∈ [0.9, 1.1]
    gives [0.9, 2.2]).
    """
    w_lo = (stage.weight - delta).unsqueeze(0)
    w_hi = (stage.weight + delta).unsqueeze(0)
    batch = lower.shape[0]
    rows_per_chunk = max(1, _CORNER_CHUNK // max(1, stage.weight.numel()))
    lows, highs = [], []
    for start in range(0, batch, rows_per_chunk):
        l = lower[start:start + rows_per_chunk].unsqueeze(1)
        h = upper[start:start + rows_per_chunk].unsqueeze(1)
        corners = torch.stack([w_lo * l, w_lo * h, w_hi * l, w_hi * h])
        lows.append(corners.amin(0).sum(-1))
        highs.append(corners.amax(0).sum(-1))
    return torch.cat(lows) + (stage.bias - delta), torch.cat(highs) + (stage.bias + delta)


# ---------------------------------------------------------------- CROWN

def _affine_scale(stage, bounds) -> torch.Tensor:
    """(1, *out_shape): |W|·m_z for the stage's input z, with m_z the largest magnitude over the
    batch (one batch-1 pass instead of one per domain; a larger m only loosens the term)."""
    m = capped_magnitude(*bounds[stage.sources[0]]).amax(0, keepdim=True)
    big = torch.finfo(m.dtype).max
    return stage.forward_abs(m).nan_to_num(nan=big, posinf=big)


def _bias_magnitudes(stage) -> torch.Tensor:
    """(1, *out_shape): |bias| of each output element (a convolution's per channel, spread)."""
    bias = stage.bias.abs()
    shape = (1, bias.shape[0]) + (1,) * (len(stage.out_shape) - 1)
    return bias.reshape(shape).expand(1, *stage.out_shape)


def _cross_affine(walk, position: int, stage: AffineStage, A: torch.Tensor) -> None:
    plan = walk.plan
    delta = walk.deltas.get(position, 0.0)
    if delta > 0:
        # the radius is itself a rounded sum: widen it by that sum's relative error
        noise = perturbation_radius(stage, *walk.bounds[stage.sources[0]], delta) * (1 + gamma(stage.fan + 2, plan.dtype))
        term = walk.abs_dot(position + 1, A, noise)
        walk.b = walk.b - term
        walk.error = walk.error + walk.gamma_b * term
    if walk.rounding:
        # fan products per entry, plus the weights' own rounding into the working dtype;
        # the bias's terms added into b
        own = gamma(stage.fan + 2, plan.dtype) * walk.scales[position] if position in walk.scales else None
        if stage.bias is not None:
            # grouped rows sum it by exact_dot (products in the working dtype), others by
            # bias_term (A cast to float64)
            share = walk.gamma_exact if walk.reduce is not None else walk.gamma_b64
            bias = share * _bias_magnitudes(stage)
            own = bias if own is None else own + bias
        walk.error = walk.settle(position + 1, A, own)
    if stage.bias is not None and walk.reduce is not None:
        walk.b = walk.b + walk.exact_dot(position + 1, A, stage.bias.view(1, -1, *([1] * (len(stage.out_shape) - 1))))
    elif stage.bias is not None:
        walk.b = walk.b + stage.bias_term(A, dtype=torch.float64)
    walk.send(stage.sources[0], stage.backward(A))


# ---------------------------------------------------------------- forward linear bounds

def _apply(stage: AffineStage, tensor: torch.Tensor, weight, bias=None) -> torch.Tensor:
    """The stage's map on a tensor whose leading dims (B, k) are both batch dims."""
    lead = tensor.shape[:2]
    flat = tensor.reshape(lead[0] * lead[1], *stage.in_shape)
    return stage.forward(flat, weight, bias).reshape(*lead, *stage.out_shape)


def _affine(stage: AffineStage, f: LinearFunctions, input_magnitude) -> LinearFunctions:
    if stage.kind == "flatten":
        reshape = lambda t, lead: t.reshape(*t.shape[:lead], *stage.out_shape)  # noqa: E731
        a_lo = reshape(f.a_lo, 2)
        return LinearFunctions(a_lo, reshape(f.c_lo, 1), reshape(f.e_lo, 1),
                                a_lo if f.shared else reshape(f.a_hi, 2), reshape(f.c_hi, 1), reshape(f.e_hi, 1))
    positive, negative = stage.signed_weights()
    u = unit_roundoff(f.c_lo.dtype)
    gamma = 2.0 * (2 * stage.fan + 4) * u
    if f.shared:  # W⁺a + W⁻a = W a: one map (a sum of fan products, within the same rounding bound)
        a_lo = a_hi = _apply(stage, f.a_lo, None)
    else:
        a_lo = _apply(stage, f.a_lo, positive) + _apply(stage, f.a_hi, negative)
        a_hi = _apply(stage, f.a_hi, positive) + _apply(stage, f.a_lo, negative)
    c_lo = stage.forward(f.c_lo, positive, stage.bias) + stage.forward(f.c_hi, negative)
    c_hi = stage.forward(f.c_hi, positive, stage.bias) + stage.forward(f.c_lo, negative)
    # Errors: the inherited budgets through |W|, plus this step's rounding of coefficients and
    # constants (each entry is a sum of at most 2·fan products) over the domain.
    absolute = stage.abs_weight if stage.sparse is None else stage.sparse.abs_weight
    rounding = gamma * (stage.forward(f.magnitude(input_magnitude), absolute, stage.bias.abs()))
    e_lo = (stage.forward(f.e_lo, positive) - stage.forward(f.e_hi, negative)) * (1 + gamma) + rounding
    e_hi = (stage.forward(f.e_hi, positive) - stage.forward(f.e_lo, negative)) * (1 + gamma) + rounding
    return LinearFunctions(a_lo, c_lo, e_lo, a_hi, c_hi, e_hi)
