"""General operators (:mod:`assay.nn.ops`): a stage whose rules are its operator's registered
bound rule (:mod:`assay.bounds.rules`)."""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import ClassVar

import torch

from assay.bounds import forward_products
from assay.bounds.linear_functions import LinearFunctions, constant_functions
from assay.bounds.rounding import gamma, unit_roundoff
from assay.bounds.stages.base import Stage


@dataclass(frozen=True, eq=False)
class OperatorStage(Stage):
    """A layer whose bounds pass through its operator's registered rule (:mod:`assay.bounds.rules`):
    the general operators of :mod:`assay.nn.ops`. It reads the tensors ``sources`` (in order) and
    produces tensor ``index + 1``; ``rule.linear`` says whether it is affine in them."""

    index: int
    layer: object
    rule: object
    in_shapes: tuple[tuple[int, ...], ...]
    out_shape: tuple[int, ...]
    sources: tuple[int, ...] = ()

    general: ClassVar[bool] = True

    @property
    def nonlinear(self) -> bool:
        return not self.rule.linear

    @property
    def relaxes(self) -> bool:
        return self.nonlinear

    @property
    def parameters(self) -> int:
        return self.rule.parameters

    @property
    def clamped(self) -> tuple[int, ...]:
        return self.sources if self.nonlinear else ()

    def interval(self, bounds, delta: float = 0.0) -> tuple[torch.Tensor, torch.Tensor]:
        """Bounds of the output from ``bounds[t]`` of the tensors it reads."""
        return self.rule.forward_interval(self.layer, [bounds[s] for s in self.sources])

    def crown_step(self, walk, position: int, A: torch.Tensor) -> None:
        _cross_operator(walk, position, self, A)

    def split_point(self, lower: torch.Tensor, upper: torch.Tensor) -> torch.Tensor:
        """Where its rule says to split (:meth:`~assay.bounds.rules.base.LayerRule.split_point`)."""
        return self.rule.split_point(self.layer, lower, upper)

    def relaxation_lines(self, lower: torch.Tensor, upper: torch.Tensor):
        """An element-wise rule's relaxation (its default choice)."""
        relax = getattr(self.rule, "relax", None)  # element-wise rules relax; multi-input rules cross whole
        if relax is None:
            return None
        r = relax(self.layer, lower, upper)
        return r.lower_slope, r.lower_intercept, r.upper_slope, r.upper_intercept

    def forward_step(self, state, position: int):
        """The rule says how its operator is crossed: an affine one maps both functions, an
        element-wise one relaxes them per element, any other starts from its output's interval."""
        if not self.nonlinear:
            return _linear_operator(self, [state.functions[s] for s in self.sources], state.input_magnitude)
        if self.rule.elementwise:
            return _elementwise(self, state.functions[self.sources[0]], *state.concrete(self.sources[0]),
                                state.input_magnitude)
        # a product one of whose factors the boxes fix scales the other's functions
        scaled = forward_products.scaled_product(self, [state.functions[s] for s in self.sources],
                                                 [state.concrete(s) for s in self.sources], state.input_magnitude)
        if scaled is not None:
            return scaled
        # products, softmax, …: the output's interval
        return constant_functions(*self.interval({s: state.concrete(s) for s in self.sources}), state.n)

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


def _cross_operator(walk, position: int, stage: OperatorStage, A: torch.Tensor) -> None:
    """A general operator: its rule crosses it (coefficients per source, an offset, its rounding)."""
    walk.require_ungrouped(stage)
    if walk.observe_outputs is not None and stage.nonlinear:
        walk.observe_outputs(position, A)
    alpha = walk.operator_alphas.get(position)
    if getattr(stage.rule, "walks", False) and walk.reaches_input:
        # a rule that reads its sources' linear bounds in the input (their own walks)
        crossing = stage.rule.backward_walk(stage, A, walk, alpha)
    else:
        crossing = stage.cross(A, walk.bounds, alpha)
    if crossing.on_input is not None:
        walk.send(0, crossing.on_input.reshape(A.shape[0], A.shape[1], *walk.bounds[0][0].shape[1:]))
    if walk.rounding:
        walk.error = (walk.settle(position + 1, A, None) + crossing.rounding
                      + walk.gamma_b * crossing.offset.detach().abs())
    walk.b = walk.b + crossing.offset
    for source, coefficients in zip(stage.sources, crossing.coefficients):
        walk.send(source, coefficients)


# ---------------------------------------------------------------- forward linear bounds

def _linear_operator(stage: OperatorStage, sources: list[LinearFunctions], input_magnitude) -> LinearFunctions:
    """Both functions through an affine general operator ``y = L(z_1, …) + c`` (its rule's map).

    With ``m``/``w`` the midpoint and half-difference of a source's two functions, ``L m − |L| w``
    equals ``L⁺ lower + L⁻ upper`` exactly: the lower function of y (and ``L m + |L| w`` the
    upper). Operators that only move values (:attr:`LinearRule.moves_only`) map each function as
    it is and round nothing (a constant part the dtype cannot hold owes its cast's error,
    :meth:`LinearRule.cast_error`). Rounding otherwise: every entry is a sum of at most ``fan``
    products, and subtracting the constant ``c`` (``L`` is ``forward − forward(0)``) rounds by
    u·|c| in each of the n coefficients, so the budgets grow by γ·(|L| magnitudes + |c|·(2 + Σ|x|)).
    """
    layer, rule = stage.layer, stage.rule
    batch, n = sources[0].a_lo.shape[:2]
    dtype = sources[0].c_lo.dtype
    constant = layer.forward(*[torch.zeros(1, *shape, dtype=dtype) for shape in stage.in_shapes])
    flat = lambda t: t.reshape(batch * n, *t.shape[2:])  # noqa: E731
    lead = lambda t: t.reshape(batch, n, *t.shape[1:])  # noqa: E731

    def coefficients(*tensors):  # L applied to coefficient tensors (B, n, *shape_k): no constant
        return lead(layer.forward(*[flat(t) for t in tensors]) - constant)

    if rule.moves_only:  # every output is one input or a constant: exact in floats
        a_lo = coefficients(*[f.a_lo for f in sources])
        # save constants the dtype cannot hold: their budgets (0 there) become the cast's error
        cast = rule.cast_error(layer, [f.c_lo for f in sources])
        cast = 0.0 if cast is None else cast
        return LinearFunctions(
            a_lo, layer.forward(*[f.c_lo for f in sources]),
            layer.forward(*[f.e_lo for f in sources]) - constant + cast,
            a_lo if all(f.shared for f in sources) else coefficients(*[f.a_hi for f in sources]),
            layer.forward(*[f.c_hi for f in sources]),
            layer.forward(*[f.e_hi for f in sources]) - constant + cast)
    absolute = rule.absolute_map(layer)
    if all(f.shared for f in sources):  # m = a exactly and w = 0: both functions are L a
        a_mid = coefficients(*[f.a_lo for f in sources])
        a_half = None
    else:
        a_mid = coefficients(*[(f.a_lo + f.a_hi) / 2 for f in sources])
        a_half = lead(absolute(*[flat((f.a_hi - f.a_lo) / 2) for f in sources]))
    c_mid = layer.forward(*[(f.c_lo + f.c_hi) / 2 for f in sources])
    c_half = absolute(*[(f.c_hi - f.c_lo) / 2 for f in sources])
    fan = rule.fan(layer, list(stage.in_shapes), tuple(stage.out_shape))
    g = gamma(2 * fan + 8, dtype)
    inputs_sum = input_magnitude.sum(1).reshape(batch, *([1] * (constant.dim() - 1)))
    rounding = g * (absolute(*[f.magnitude(input_magnitude) for f in sources]) + constant.abs() * (2 + inputs_sum))
    # the inherited budgets through |L| (the larger side of each source: they are rounding budgets)
    budget = absolute(*[torch.maximum(f.e_lo, f.e_hi) for f in sources]) * (1 + g) + rounding
    if a_half is None:
        return LinearFunctions(a_mid, c_mid - c_half, budget, a_mid, c_mid + c_half, budget)
    return LinearFunctions(a_mid - a_half, c_mid - c_half, budget, a_mid + a_half, c_mid + c_half, budget)


def _elementwise(stage: OperatorStage, f: LinearFunctions, lower, upper, input_magnitude) -> LinearFunctions:
    """Both functions through an element-wise operator: its rule's relaxation on ``[lower, upper]``
    (the input's concrete bounds), each side taking the input's function its slope's sign asks
    for. Where a side of the relaxation is unbounded, that side is the output's interval."""
    relaxation = stage.rule.relax(stage.layer, lower, upper)
    out_lower, out_upper = stage.rule.forward_interval(stage.layer, [(lower, upper)])
    u = unit_roundoff(lower.dtype)
    magnitude = f.magnitude(input_magnitude)

    def side(slope, intercept, same, other, fallback):
        slope, intercept = slope.expand_as(lower), intercept.expand_as(lower)
        usable = torch.isfinite(intercept) & torch.isfinite(slope)
        slope = torch.where(usable, slope, torch.zeros_like(slope))
        intercept = torch.where(usable, intercept, torch.zeros_like(intercept))
        rising = slope >= 0
        a = torch.where(rising.unsqueeze(1), same[0], other[0]) * slope.unsqueeze(1)
        c = torch.where(usable, torch.where(rising, same[1], other[1]) * slope + intercept, fallback)
        e = torch.where(usable, torch.where(rising, same[2], other[2]) * slope.abs() * (1 + 2 * u)
                        + 4 * u * (slope.abs() * magnitude + intercept.abs()), torch.zeros_like(slope))
        return a, c, e

    low_side = (f.a_lo, f.c_lo, f.e_lo)
    high_side = (f.a_hi, f.c_hi, f.e_hi)
    a_lo, c_lo, e_lo = side(relaxation.lower_slope, relaxation.lower_intercept, low_side, high_side, out_lower)
    a_hi, c_hi, e_hi = side(relaxation.upper_slope, relaxation.upper_intercept, high_side, low_side, out_upper)
    return LinearFunctions(a_lo, c_lo, e_lo, a_hi, c_hi, e_hi)
