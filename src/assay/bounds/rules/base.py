"""The contract of an operator's bound rule, and the crossing every element-wise rule shares.

A *bound rule* is one object per operator family that knows how bounds pass through that
operator. The engine's walks (IBP forwards, CROWN backwards, α-CROWN's optimisation) call only
two methods of every rule — ``forward_interval(layer, inputs)`` and ``backward(layer, A, inputs,
alpha)`` (the :class:`MultiInputRule` contract) — and read ``linear`` (an affine operator: its
inputs' bounds need no refinement) and ``parameters``; they never name an operator.
:mod:`assay.bounds.rules` maps layer classes to rules.

**Element-wise rules** (:class:`ElementwiseRule`: sigmoid, tanh, exp, sin, …) describe
``y = f(z)`` for ``z`` in ``[lower, upper]`` (tensors of shape ``(B, *shape)``) by

* :meth:`ElementwiseRule.interval` — ``(lo, hi)`` with ``lo ≤ f(z) ≤ hi`` for every z in the
  interval;
* :meth:`ElementwiseRule.relax` — a :class:`Relaxation`: per element,
  ``lower_slope·z + lower_intercept ≤ f(z) ≤ upper_slope·z + upper_intercept`` for every z in
  the interval. ``alpha`` (optional, a pair of tensors in [0, 1] — the lower side's and the upper
  side's — that broadcast against ``lower``) chooses the free parameters (e.g. a tangent point:
  ``t = lower + alpha · (upper − lower)``); α-CROWN tunes them, calling ``relax`` with bounds of
  shape ``(B, 1, *shape)`` and alphas of shape ``(B, S, *shape)``. Any alpha is sound.

**Soundness (both methods).** The inequalities hold *exactly*, in real arithmetic, for the exact
mathematical ``f`` and the coefficients as stored (floats), whatever the dtype: the rule charges
its own rounding and the error of the math library (:data:`LIBM_ULPS`). Interval ends may be
±inf only where ``f`` is unbounded on the interval (the reciprocal across 0); coefficients are
always finite (an unbounded side is slope 0, intercept ±inf).

:meth:`ElementwiseRule.cross` (shared, not overridden) carries CROWN's coefficients backwards
through a relaxation and returns the rounding it owes, so an element-wise operator is one
:meth:`relax` and one :meth:`interval` and nothing else.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from assay.bounds.rounding import gamma
from assay.bounds.stages import OperatorStage
from assay.bounds.stages.base import kink_or_middle

__all__ = ["LayerRule", "Relaxation", "Crossing", "ElementwiseRule", "LIBM_ULPS", "ulp_margin", "widen", "dot"]

# Bound on the error of torch's math functions (exp, log, sin, tanh, sigmoid, …) in units of the
# dtype's unit roundoff, relative to the result's magnitude. The libraries torch uses (glibc,
# SLEEF's 1-ulp variants) stay within 1–4 ulps; composites like sigmoid = 1/(1 + exp(−x)) add one
# rounding per step. 16 leaves room for all of them.
LIBM_ULPS = 16


@dataclass(frozen=True, eq=False)
class Relaxation:
    """Per element: ``lower_slope·z + lower_intercept ≤ f(z) ≤ upper_slope·z + upper_intercept``
    for z in the interval it was built for (exactly, see the module docstring). Tensors of one
    shape (or broadcastable to one)."""

    lower_slope: torch.Tensor
    lower_intercept: torch.Tensor
    upper_slope: torch.Tensor
    upper_intercept: torch.Tensor


@dataclass(frozen=True, eq=False)
class Crossing:
    """What crossing one stage backwards produced.

    ``coefficients[k]`` (B, S, *shape of source k): the rows' coefficients on the stage's k-th
    input; ``offset`` (B, S): the constant the relaxation added to the bound (already summed);
    ``rounding`` (B, S): a bound on how far the floating-point crossing can have moved the bound
    (the coefficients' rounding times the inputs' magnitudes, and the offset's own sum).
    """

    coefficients: tuple[torch.Tensor, ...]
    offset: torch.Tensor
    rounding: torch.Tensor
    # (B, S, *input shape): coefficients on the network's input (tensor 0) besides the sources'
    # (a product crossed through its factors' linear bounds, assay.bounds.rules.linearized)
    on_input: torch.Tensor | None = None


def dot(A: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Σ over the trailing dims of A (B, S, *shape) times v ((B or 1), *shape) or (B, S, *shape) → (B, S)."""
    if v.dim() == A.dim():
        return (A * v).reshape(A.shape[0], A.shape[1], -1).sum(-1)
    flat_A = A.reshape(A.shape[0], A.shape[1], -1)
    return flat_A.matmul(v.reshape(v.shape[0], -1, 1)).squeeze(-1)


def ulp_margin(magnitude: torch.Tensor, ulps: float = LIBM_ULPS) -> torch.Tensor:
    """``ulps`` unit roundoffs of ``magnitude`` (≥ 0), plus the smallest normal number (so that a
    margin on a value near 0 is never 0)."""
    finfo = torch.finfo(magnitude.dtype)
    return ulps * (finfo.eps / 2) * magnitude + finfo.tiny


def widen(lower: torch.Tensor, upper: torch.Tensor, ulps: float = LIBM_ULPS) -> tuple[torch.Tensor, torch.Tensor]:
    """``[lower, upper]`` widened by :func:`ulp_margin` of each end: an interval of computed
    function values that then holds the exact ones."""
    return lower - ulp_margin(lower.abs(), ulps), upper + ulp_margin(upper.abs(), ulps)


class LayerRule:
    """Base of every rule the registry holds (:mod:`assay.bounds.rules`): how a
    :class:`~assay.bounds.plan.Plan` lowers a layer of its operator to a stage (:meth:`stage`),
    and what analyses other than bounds read of the operator (the attack, the Softmax shortcut).

    A general operator's rule (element-wise, multi-input or affine) lowers to an
    :class:`~assay.bounds.stages.OperatorStage`, whose rules call back into it; the ReLU network's
    own layers lower to the engine's own stage kinds (:mod:`assay.bounds.rules.relu_network`).
    """

    # For the attack (assay.verify.attack_model): "surrogate" when the operator's gradient is zero
    # almost everywhere and PGD must differentiate a smooth stand-in; "exact" otherwise.
    attack_gradient: ClassVar[str] = "exact"
    # True when the operator keeps the order of its inputs along its axis (y_i ≥ y_j iff
    # x_i ≥ x_j), so that a comparison of two outputs can be read before it.
    keeps_order: ClassVar[bool] = False
    # True when the operator is affine in its inputs (its rows through it stay the rows of its
    # output: no relaxation, no optimisable parameter).
    linear: ClassVar[bool] = False

    def vector_map(self, layer, n: int) -> tuple[torch.Tensor, torch.Tensor] | None:
        """``(W (n, n), c (n,))`` in float64 when ``layer`` maps a vector of ``n`` elements to
        ``W x + c`` of the same size (the quadratic-form products read it,
        :mod:`assay.bounds.rules.quadratic`); None otherwise."""
        return None

    def stage(self, network, index: int, layer, dtype: torch.dtype):
        """The stage of layer ``index`` of ``network`` (which is ``layer``) in ``dtype``: a general
        operator's stage, bounded through this rule."""
        reads = network.sources[index]
        return OperatorStage(index, layer, self, tuple(network.shapes[r] for r in reads), network.shapes[index + 1],
                             reads)

    def split_point(self, layer, lower: torch.Tensor, upper: torch.Tensor) -> torch.Tensor:
        """Where the general split (:mod:`assay.verify.operator_split`) cuts the intervals
        ``[lower, upper]`` of the operator's input elements: at its kink 0 where the interval
        straddles it, else the middle (:func:`~assay.bounds.stages.base.kink_or_middle`). An
        operator whose shape changes elsewhere may say so here."""
        return kink_or_middle(lower, upper)


class ElementwiseRule(LayerRule):
    """Base of the rules of element-wise operators ``y = f(z)``; subclasses define
    :meth:`interval` and :meth:`relax` (see the module docstring for the contract).

    ``parameters``: how many optimisable parameters each side of :meth:`relax` reads (0: the
    relaxation has no free choice, ``alpha`` is ignored).
    """

    parameters: ClassVar[int] = 0
    linear: ClassVar[bool] = False
    # y = f(z) element by element (forward linear bounds relax it per element; see
    # MultiInputRule, whose operators they cross by the output's interval)
    elementwise: ClassVar[bool] = True
    # For the attack (assay.verify.attack_model): "surrogate" when the operator's gradient is zero
    # almost everywhere and PGD must differentiate a smooth stand-in; "exact" otherwise.
    attack_gradient: ClassVar[str] = "exact"
    # True when the operator keeps the order of its inputs along its axis (y_i ≥ y_j iff
    # x_i ≥ x_j), so that a comparison of two outputs can be read before it.
    keeps_order: ClassVar[bool] = False

    def interval(self, layer, lower: torch.Tensor, upper: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        raise NotImplementedError

    def alpha_tensors(self) -> int:
        """How many tensors α-CROWN passes as ``alpha``: a pair (lower side's, upper side's)
        when the relaxation has free parameters."""
        return 2 if self.parameters else 0

    def alpha_start(self, k: int) -> float:
        """The value α-CROWN starts the ``k``-th parameter tensor from (any in [0, 1] is sound)."""
        return 0.5

    # the uniform interface the walks call (every rule has these two)
    def forward_interval(self, layer, inputs) -> tuple[torch.Tensor, torch.Tensor]:
        (lower, upper), = inputs
        return self.interval(layer, lower, upper)

    def backward(self, layer, A: torch.Tensor, inputs, alpha=None) -> Crossing:
        (lower, upper), = inputs
        if alpha is None:
            return self.cross(self.relax(layer, lower, upper), A, lower, upper)
        # α-CROWN's parameters are per row, (B, S, *shape): the bounds get the rows' axis
        relaxation = self.relax(layer, lower.unsqueeze(1), upper.unsqueeze(1), alpha)
        return self.cross(relaxation, A, lower, upper)

    def relax(self, layer, lower: torch.Tensor, upper: torch.Tensor, alpha=None) -> Relaxation:
        raise NotImplementedError

    def cross(self, relaxation: Relaxation, A: torch.Tensor, lower: torch.Tensor, upper: torch.Tensor) -> Crossing:
        """CROWN's step through ``y = f(z)`` for the lower bound of ``A · y``: a positive
        coefficient takes the lower side, a negative one the upper side.

        ``A`` (B, S, *shape); ``lower``/``upper`` (B, *shape), the bounds of z the relaxation was
        built for (their magnitude prices the rounding). Returns coefficients on z and the offset.
        Rounding: each new coefficient is one product (relative error ≤ u, so ≤ 2u·|new| after
        the fact) times |z| ≤ m; the offset is a sum of n products (γ_n of their magnitudes).
        """
        positive, negative = A.clamp(min=0), A.clamp(max=0)
        slopes = relaxation.lower_slope, relaxation.upper_slope
        intercepts = relaxation.lower_intercept, relaxation.upper_intercept
        if slopes[0].dim() < A.dim():  # shared by every row: (B, *shape) → (B, 1, *shape)
            slopes = tuple(s.unsqueeze(1) for s in slopes)
            intercepts = tuple(i.unsqueeze(1) for i in intercepts)
        new = positive * slopes[0] + negative * slopes[1]
        # 0·(±inf) is NaN: an unbounded intercept only counts where its side is used
        low_terms = torch.where(positive > 0, positive * intercepts[0], torch.zeros_like(positive))
        high_terms = torch.where(negative < 0, negative * intercepts[1], torch.zeros_like(negative))
        terms = low_terms + high_terms
        offset = terms.reshape(A.shape[0], A.shape[1], -1).sum(-1)
        with torch.no_grad():
            big = torch.finfo(lower.dtype).max
            m = torch.maximum(lower.abs(), upper.abs()).nan_to_num(nan=big, posinf=big)
            u = float(torch.finfo(lower.dtype).eps) / 2
            n = max(1, lower[0].numel())
            rounding = 2 * u * dot(new.detach().abs(), m.unsqueeze(1).expand_as(new)) \
                + gamma(n + 2, lower.dtype) * terms.detach().abs().reshape(A.shape[0], A.shape[1], -1).sum(-1)
        return Crossing((new,), offset, rounding)


class MultiInputRule(LayerRule):
    """Base of the rules of non-linear operators of one or more tensors (products ``a·b``,
    ``MatMul`` of two tensors, ``Min``/``Max``, ``Softmax``).

    * :meth:`interval` — ``inputs`` is a list of ``(lower, upper)`` pairs, one per tensor the
      layer reads, each ``(B, *shape_k)``; returns ``(lo, hi)`` of the output, sound for every
      choice of inputs within their intervals.
    * :meth:`backward` — ``A`` (B, S, *output shape): returns a :class:`Crossing` whose
      ``coefficients[k]`` (B, S, *shape_k) and ``offset`` (B, S) satisfy, for every choice of
      inputs within their intervals, ``A · y ≥ Σ_k coefficients[k] · x_k + offset − rounding``
      exactly (the lower bound of ``A · y``; CROWN gets upper bounds from negated rows).
      ``alpha``: None for the default choice, or a tuple of ``parameters`` tensors in [0, 1] of
      shape (B, S, *output shape) (α-CROWN's, one per row): any value must be sound.
    """

    parameters: ClassVar[int] = 0
    linear: ClassVar[bool] = False
    elementwise: ClassVar[bool] = False
    # CROWN's value of each parameter (the default of its `parameter(alpha, k, A, default)`)
    starts: ClassVar[tuple[float, ...]] = ()
    # For the attack (assay.verify.attack_model): "surrogate" when the operator's gradient is zero
    # almost everywhere and PGD must differentiate a smooth stand-in; "exact" otherwise.
    attack_gradient: ClassVar[str] = "exact"
    # True when the operator keeps the order of its inputs along its axis (y_i ≥ y_j iff
    # x_i ≥ x_j), so that a comparison of two outputs can be read before it.
    keeps_order: ClassVar[bool] = False
    # "Mul" or "Div" for a product of two tensors: where the boxes fix one factor, forward linear
    # bounds scale the other factor's functions by it (assay.bounds.forward_products); None otherwise.
    fixed_factor_product: ClassVar[str | None] = None

    def interval(self, layer, inputs) -> tuple[torch.Tensor, torch.Tensor]:
        raise NotImplementedError

    def forward_interval(self, layer, inputs) -> tuple[torch.Tensor, torch.Tensor]:
        return self.interval(layer, inputs)

    def alpha_tensors(self) -> int:
        """How many tensors α-CROWN passes as ``alpha``: ``parameters``."""
        return self.parameters

    def alpha_start(self, k: int) -> float:
        """The value α-CROWN starts the ``k``-th parameter from: ``starts[k]``, the value CROWN
        uses without α (so that α-CROWN's first iterate is CROWN's bound), 0.5 where unset."""
        return self.starts[k] if k < len(self.starts) else 0.5

    def backward(self, layer, A: torch.Tensor, inputs, alpha=None) -> Crossing:
        raise NotImplementedError
