"""Per-layer rules of the bound engine: one table, used by every bound method.

The engine sees a network as a list of *stages* in topological order: affine stages (Linear,
Conv2d, AvgPool2d as a depthwise convolution, Flatten/Reshape), ReLU stages and Add stages
(residual sums). Stage ``p`` produces tensor ``p + 1`` from the tensors in ``stage.sources``
(tensor 0 is the input); a ReLU stage always reads tensor ``p``, so "the input of ReLU stage
p" and "tensor p" are the same thing. Bound methods walk the stages forwards (intervals,
forward linear bounds) or backwards (backward substitution, summing the contributions that
reach a tensor from all its consumers, as auto_LiRPA does over a graph).

For an affine stage the engine needs four maps on batches: the map itself, the map with
absolute weights, the transposed map (backward substitution of linear bounds) and the
transposed map with absolute weights (rounding magnitudes). :class:`Plan` prepares them once
per (network, dtype) and caches them.
"""

from __future__ import annotations

import math
import weakref
from dataclasses import dataclass
from typing import ClassVar

import torch
import torch.nn.functional as F

from assay.bounds.rules import registered_layers, rule_for
from assay.errors import UnsupportedOperatorError
from assay.nn.layers import Add, AvgPool2d, Conv2d, Flatten, Linear, MaxPool2d, ReLU, Reshape
from assay.nn.network import Network
from assay.nn.sparse import csr_from, is_sparse_weight, nonzeros, sparse_linear

# the ReLU-network layers the engine lowers to its own stages; any other layer (assay.nn.ops) is
# bounded through its registered rule (assay.bounds.rules), and one without a rule ends a bound
# method in one UnsupportedOperatorError naming it
BOUND_RULE_LAYERS = (Linear, Conv2d, ReLU, AvgPool2d, MaxPool2d, Flatten, Reshape, Add)
SUPPORTED = ", ".join(layer.__name__ for layer in BOUND_RULE_LAYERS)


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
class AffineStage:
    """``y = W x + b`` for one layer; shapes exclude the batch dimension."""

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

    relaxes: ClassVar[bool] = False  # its bounds need no relaxation (see ReluStage.relaxes)

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

    def bias_term(self, A: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        """``A · b`` summed over the stage's output: shape (B, S)."""
        bias = self.bias if bias is None else bias
        if bias is None:
            return A.new_zeros(A.shape[:2])
        if self.kind == "linear":
            return A.matmul(bias)
        return A.sum(dim=(-2, -1)).matmul(bias)


@dataclass(frozen=True, eq=False)
class ReluStage:
    index: int
    shape: tuple[int, ...]
    sources: tuple[int, ...] = ()  # always (its position,): the tensor just before it

    # whether a backward walk crossing it chooses a relaxation per row (walks that cross only
    # stages without one reproduce forward bounds exactly)
    relaxes: ClassVar[bool] = True
    windowed: ClassVar[bool] = True

    def window(self, sources):
        """Element-wise: each output reads what its input reads."""
        return sources[0]


@dataclass(frozen=True, eq=False)
class AddStage:
    """``y = a + b`` for two earlier tensors of one shape (a residual connection)."""

    index: int
    shape: tuple[int, ...]
    sources: tuple[int, ...] = ()

    relaxes: ClassVar[bool] = False
    windowed: ClassVar[bool] = True

    def window(self, sources):
        """The union of both summands' windows (None where their strides differ)."""
        out = sources[0]
        for other in sources[1:]:
            if any(x.stride != y.stride for x, y in zip(out, other)):
                return None
            out = tuple(type(x)(x.stride, min(x.lo, y.lo), max(x.hi, y.hi)) for x, y in zip(out, other))
        return out


@dataclass(frozen=True, eq=False)
class MaxPoolStage:
    """``y = max`` over each window of one earlier tensor (no padding); relaxed window by window
    (:func:`assay.bounds.relaxation.relax_maxpool`)."""

    index: int
    in_shape: tuple[int, ...]
    out_shape: tuple[int, ...]
    kernel: tuple[int, int]
    stride: tuple[int, int]
    sources: tuple[int, ...] = ()

    relaxes: ClassVar[bool] = True
    windowed: ClassVar[bool] = False

    def window(self, sources):
        return None

    @property
    def overlap(self) -> int:
        """The most windows one input element belongs to (1 when the windows do not overlap)."""
        return math.prod(-(-k // s) for k, s in zip(self.kernel, self.stride))


@dataclass(frozen=True, eq=False)
class OperatorStage:
    """A layer whose bounds pass through its operator's registered rule (:mod:`assay.bounds.rules`):
    the general operators of :mod:`assay.nn.ops`. It reads the tensors ``sources`` (in order) and
    produces tensor ``index + 1``; ``rule.linear`` says whether it is affine in them."""

    index: int
    layer: object
    rule: object
    in_shapes: tuple[tuple[int, ...], ...]
    out_shape: tuple[int, ...]
    sources: tuple[int, ...] = ()

    windowed: ClassVar[bool] = False

    @property
    def nonlinear(self) -> bool:
        return not self.rule.linear

    @property
    def relaxes(self) -> bool:
        return self.nonlinear

    def window(self, sources):
        return None

    def interval(self, bounds) -> tuple[torch.Tensor, torch.Tensor]:
        """Bounds of the output from ``bounds[t]`` of the tensors it reads."""
        return self.rule.forward_interval(self.layer, [bounds[s] for s in self.sources])

    def backward_magnitude(self, G: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """``|L|ᵀ G`` per source for a linear operator (see :meth:`LinearRule.backward_magnitude`)."""
        return self.rule.backward_magnitude(self.layer, G, self.in_shapes)

    def cross(self, A: torch.Tensor, bounds, alpha=None):
        """CROWN's backward step: a :class:`~assay.bounds.rules.base.Crossing` (coefficients per source).

        An element-wise rule's default relaxation (``alpha`` None) depends only on its input's
        bounds, which stay the same for every walk of one bound computation that crosses this
        stage (each refined tensor's walk and the output's): it is built once per bounds and
        reused while the same tensors, unmodified, are given (:meth:`_default_relaxation`).
        """
        inputs = [bounds[s] for s in self.sources]
        if alpha is None and _memoised(self.rule) and not (inputs[0][0].requires_grad or inputs[0][1].requires_grad):
            (lower, upper), = inputs
            return self.rule.cross(self._default_relaxation(lower, upper), A, lower, upper)
        return self.rule.backward(self.layer, A, inputs, alpha)

    def _default_relaxation(self, lower: torch.Tensor, upper: torch.Tensor):
        """``rule.relax(layer, lower, upper)``, kept for the last bounds seen: reused when the
        very same tensor objects come again at the same version (no in-place change since), so
        the relaxation returned is always the one of the bounds given."""
        key = (lower._version, upper._version)
        kept = _RELAXATIONS.get(self)
        if kept is not None and kept[0] is lower and kept[1] is upper and kept[2] == key:
            return kept[3]
        relaxation = self.rule.relax(self.layer, lower, upper)
        _RELAXATIONS[self] = (lower, upper, key, relaxation)
        return relaxation


# Per OperatorStage (weakly held): the last bounds its element-wise rule was relaxed for and the
# relaxation (see OperatorStage._default_relaxation).
_RELAXATIONS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _memoised(rule) -> bool:
    """Whether a rule's default relaxation can be kept between walks: a non-linear element-wise
    rule that crosses by the base class's ``relax`` + ``cross`` (no backward of its own)."""
    kind = type(rule)
    if kind not in _MEMOISED:
        from assay.bounds.rules.base import ElementwiseRule

        _MEMOISED[kind] = (issubclass(kind, ElementwiseRule) and not rule.linear
                           and kind.backward is ElementwiseRule.backward)
    return _MEMOISED[kind]


_MEMOISED: dict[type, bool] = {}


class Plan:
    """The stages of a network in one dtype. Obtain with :func:`plan_for`."""

    def __init__(self, network: Network, dtype: torch.dtype):
        self.network = network
        self.dtype = dtype
        self.stages: list[AffineStage | ReluStage | AddStage | MaxPoolStage] = []
        for index, layer in enumerate(network.layers):
            lower = _LOWERINGS.get(type(layer), _operator_stage)
            self.stages.append(lower(network, index, layer, dtype))
        self.relu_positions = [i for i, s in enumerate(self.stages) if isinstance(s, ReluStage)]
        # The tensors whose bounds a non-linear general operator reads: CROWN refines them before
        # they are relaxed, as it refines the ReLU inputs.
        self.operator_inputs = sorted({source for s in self.stages if isinstance(s, OperatorStage) and s.nonlinear
                                       for source in s.sources})
        # Those whose bounds IntermediateBounds carries (the input's are the domain itself).
        self.operator_tensors = [t for t in self.operator_inputs if t > 0]
        self.is_general = any(isinstance(s, OperatorStage) for s in self.stages)
        # general operators whose relaxation has free parameters (α-CROWN tunes them)
        self.parametrised_operators = [i for i, s in enumerate(self.stages)
                                       if isinstance(s, OperatorStage) and s.rule.parameters]
        self.is_chain = network.is_chain
        self.has_maxpool = any(isinstance(s, MaxPoolStage) for s in self.stages)
        # The rounding factor: every backward or forward product sums at most `fan` terms per
        # entry; adding the layers' fans bounds the relative error of the whole chain. In a graph
        # a coefficient reaching a tensor along several paths is summed once per extra consumer:
        # one more rounding each, covered by the 3 terms every stage adds.
        self.total_fan = (sum(s.fan + 3 for s in self.stages if isinstance(s, AffineStage))
                          + 3 * sum(1 for s in self.stages if not isinstance(s, AffineStage)))
        # The most terms summed into a walk's offset b: one dot product over a tensor (a bias,
        # a relaxation's intercepts) plus the additions of every stage's term.
        self.sum_terms = max(math.prod(shape) for shape in network.shapes) + 2 * len(self.stages) + 3
        self.affine_positions = [i for i, s in enumerate(self.stages) if isinstance(s, AffineStage) and s.perturbable]
        # The last stage that reads each tensor (forward walks free a tensor after it).
        self.last_use = {0: 0}
        for position, stage in enumerate(self.stages):
            for source in stage.sources:
                self.last_use[source] = position


    @property
    def has_nonlinear_operators(self) -> bool:
        """Whether a general operator that is not affine (sigmoid, products, …) is present."""
        return any(isinstance(s, OperatorStage) and s.nonlinear for s in self.stages)

    def require_relu_network(self, what: str, linear_operators: bool = False) -> None:
        """Raise a clear error where ``what`` handles ReLU networks only (a general operator is
        present; with ``linear_operators``, only a non-affine one)."""
        general = [s for s in self.stages if isinstance(s, OperatorStage) and (s.nonlinear or not linear_operators)]
        if general:
            names = sorted({type(s.layer).__name__ for s in general})
            raise UnsupportedOperatorError(
                f"{what} supports networks of dense, convolution, ReLU, pooling and residual layers; "
                f"{self.network.source} also has {', '.join(names)}"
            )

    def require_no_maxpool(self, what: str) -> None:
        """Raise a clear error where ``what`` walks ReLU networks only (a MaxPool2d stage is not one)."""
        if self.has_maxpool:
            raise UnsupportedOperatorError(
                f"{what} does not support MaxPool2d layers ({self.network.source}); use the network as loaded "
                "(MaxPool lowered to ReLUs), not its `pooled` twin"
            )


def _relu_stage(network: Network, index: int, layer, dtype) -> ReluStage:
    reads = network.sources[index]
    return ReluStage(index, network.shapes[reads[0]], reads)


def _add_stage(network: Network, index: int, layer, dtype) -> AddStage:
    return AddStage(index, network.shapes[index + 1], network.sources[index])


def _maxpool_stage(network: Network, index: int, layer, dtype) -> MaxPoolStage:
    reads = network.sources[index]
    return MaxPoolStage(index, network.shapes[reads[0]], network.shapes[index + 1], layer.kernel_size, layer.stride,
                        reads)


def _linear_stage(network: Network, index: int, layer, dtype) -> AffineStage:
    reads = network.sources[index]
    weight, bias = network.parameters_as(index, dtype)
    sparse = SparseWeights.of(weight) if is_sparse_weight(weight) else None
    return AffineStage(index, "linear", network.shapes[reads[0]], network.shapes[index + 1], weight, bias, weight.abs(),
                       None, max(weight.shape), True, reads, sparse=sparse)


def _conv_stage(network: Network, index: int, layer, dtype) -> AffineStage:
    """Conv2d, and AvgPool2d as the depthwise convolution it is."""
    reads = network.sources[index]
    in_shape = network.shapes[reads[0]]
    conv = layer.as_conv(in_shape[0]) if isinstance(layer, AvgPool2d) else layer
    weight, bias = conv.weight.to(dtype), conv.bias.to(dtype)
    fan = max(weight.shape[1] * weight.shape[2] * weight.shape[3], weight.shape[0] * weight.shape[2] * weight.shape[3])
    return AffineStage(index, "conv", in_shape, network.shapes[index + 1], weight, bias, weight.abs(), conv, fan,
                       not conv.fixed, reads, _shared_groups(conv, weight))


def _reshape_stage(network: Network, index: int, layer, dtype) -> AffineStage:
    """Flatten and Reshape: a pure reshape (the output shape says which)."""
    reads = network.sources[index]
    return AffineStage(index, "flatten", network.shapes[reads[0]], network.shapes[index + 1], None, None, None, None, 1,
                       False, reads)


def _operator_stage(network: Network, index: int, layer, dtype) -> OperatorStage:
    """A general operator (assay.nn.ops): bounded through its registered rule."""
    rule = rule_for(layer)
    if rule is None:
        require_bound_rules(network)
    reads = network.sources[index]
    return OperatorStage(index, layer, rule, tuple(network.shapes[r] for r in reads), network.shapes[index + 1], reads)


# How each ReLU-network layer is lowered to the engine's own stages; every other layer is an
# OperatorStage bounded by its registered rule.
_LOWERINGS = {ReLU: _relu_stage, Add: _add_stage, MaxPool2d: _maxpool_stage, Linear: _linear_stage,
              Conv2d: _conv_stage, AvgPool2d: _conv_stage, Flatten: _reshape_stage, Reshape: _reshape_stage}


def require_bound_rules(network: Network) -> None:
    """Raise the engine's one-line :class:`UnsupportedOperatorError` now if ``network`` has a layer
    without a bound rule (what building its :class:`Plan` would raise), for analyses that would
    otherwise run an attack or a forward pass before their first bound."""
    for index, layer in enumerate(network.layers):
        if not has_bound_rule(layer):
            where = network.origins[index] if network.origins else network.source
            raise UnsupportedOperatorError(
                f"{where}: bound propagation has no rule for operator '{type(layer).__name__}' (layer {index}); "
                f"layers with bound rules: {SUPPORTED}, {', '.join(sorted(c.__name__ for c in registered_layers()))}"
            )


def has_bound_rule(layer) -> bool:
    """Whether the engine can bound ``layer`` (a ReLU-network layer, or an operator with a rule)."""
    return isinstance(layer, BOUND_RULE_LAYERS) or rule_for(layer) is not None


def _shared_groups(conv: Conv2d, weight: torch.Tensor) -> int:
    """The number of groups of a fixed grouped convolution whose groups all use one kernel, else 0."""
    groups = conv.groups
    if not conv.fixed or groups == 1:
        return 0
    tiled = weight.reshape(groups, weight.shape[0] // groups, *weight.shape[1:])
    return groups if bool((tiled == tiled[:1]).all()) else 0


def accumulate(pending: dict, tensor: int, values: tuple) -> None:
    """Add ``values`` (a tuple of tensors) to those already waiting on ``tensor`` in a backward walk.

    Backward walks over a graph keep, per tensor, the sum of what its consumers sent back; a
    chain only ever holds one entry.
    """
    if tensor in pending:
        pending[tensor] = tuple(old + new for old, new in zip(pending[tensor], values))
    else:
        pending[tensor] = values


_PLANS: "weakref.WeakKeyDictionary[Network, dict]" = weakref.WeakKeyDictionary()


def plan_for(network: Network, dtype: torch.dtype) -> Plan:
    """The cached :class:`Plan` of ``network`` in ``dtype``."""
    per_network = _PLANS.setdefault(network, {})
    if dtype not in per_network:
        per_network[dtype] = Plan(network, dtype)
    return per_network[dtype]


def unit_roundoff(dtype: torch.dtype) -> float:
    return float(torch.finfo(dtype).eps) / 2.0


def gamma(terms: int, dtype: torch.dtype) -> float:
    """γ_n (doubled): |computed − exact| ≤ γ · Σ|products| for a sum of ``terms`` products in
    ``dtype``, in any summation order (Higham, Accuracy and Stability of Numerical Algorithms,
    §3.1: γ_n = n·u/(1 − n·u)); doubled to cover the second-order terms of chained steps."""
    u = unit_roundoff(dtype)
    return 2.0 * terms * u / max(1.0 - terms * u, 0.5)


def rounding_factor(plan: Plan, extra_terms: int = 0) -> float:
    """A relative factor γ with |computed - exact| ≤ γ · magnitude for a chain through ``plan``.

    Standard bound for floating-point dot products (Higham, Accuracy and Stability of
    Numerical Algorithms, §3.1): a sum of n products has error at most γ_n = n·u/(1 − n·u)
    times the sum of the absolute products. A chain of such sums accumulates at most the
    sum of the γ's (first order); we double it to cover second-order terms.
    """
    return gamma(plan.total_fan + extra_terms, plan.dtype)
