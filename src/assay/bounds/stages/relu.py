"""The ReLU stage and its rules: IBP's clamp, CROWN's relaxation (with per-row slopes α, split
multipliers β and forked split children), and forward linear bounds (per side, or with error
symbols)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from assay.bounds.linear_functions import LinearFunctions, contract
from assay.bounds.relaxation import ReluRelaxation, relax_relu
from assay.bounds.rounding import capped_magnitude, unit_roundoff
from assay.bounds.stages.base import Stage


@dataclass(frozen=True, eq=False)
class ReluStage(Stage):
    """``y = max(z, 0)`` element-wise on the tensor just before it."""

    index: int
    shape: tuple[int, ...]
    sources: tuple[int, ...] = ()  # always (its position,): the tensor just before it

    relaxes: ClassVar[bool] = True
    windowed: ClassVar[bool] = True
    splits_at_zero: ClassVar[bool] = True
    nonlinear: ClassVar[bool] = True

    def window(self, sources):
        """Element-wise: each output reads what its input reads."""
        return sources[0]

    @property
    def clamped(self) -> tuple[int, ...]:
        return self.sources

    def interval(self, bounds, delta: float = 0.0):
        return tuple(t.clamp(min=0) for t in bounds[self.sources[0]])

    def crown_step(self, walk, position: int, A: torch.Tensor) -> None:
        _cross_relu(walk, position, self, A)

    def forward_step(self, state, position: int):
        """CROWN's relaxation of each side, or (``state.symbols``, while the coefficients fit)
        one new error symbol per unstable neuron (:func:`_relu_symbols`)."""
        lower, upper = state.concrete(position)
        f = state.functions[position]
        added = state.symbol_room(position, lower, upper)
        if added:
            f = _relu_symbols(f, lower, upper, state.input_magnitude)
            state.add_symbols(position, added)
            return f
        return _relu(f, lower, upper, state.input_magnitude)

    def relaxation_lines(self, lower: torch.Tensor, upper: torch.Tensor):
        """CROWN's triangle."""
        r = relax_relu(lower, upper)
        return r.lower_slope, torch.zeros_like(lower), r.upper_slope, r.upper_intercept

    def backward_magnitude(self, G: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """All of the gradient passes (the walk masks off the neurons it knows inactive)."""
        return (G,)

    def forward_magnitude(self, values) -> torch.Tensor:
        """A change passes at most whole (ReLU is 1-Lipschitz)."""
        return values[0]


# ---------------------------------------------------------------- CROWN

def _cross_relu(walk, position: int, stage: ReluStage, A: torch.Tensor) -> None:
    bounds, u = walk.bounds, walk.u
    if walk.observe_outputs is not None:
        walk.observe_outputs(position, A)
    if position in walk.forks:
        A, walk.b, walk.error, fix = _fork(walk.pending, A, walk.b, walk.error, walk.spec_rows, *walk.forks[position])
        walk.fixed[position] = fix
    relaxation = walk.relaxations.get(position) or walk.relax(*bounds[position])
    if walk.rounding:  # the intercepts' terms added into b (charged on |A| ≥ |A⁻|)
        walk.error = walk.settle(position + 1, A, walk.gamma_exact * relaxation.upper_intercept.abs())
    lower_slope = relaxation.lower_slope.unsqueeze(1)
    if position in walk.slopes:
        lower_slope = torch.where(relaxation.unstable.unsqueeze(1), walk.slopes[position], lower_slope)
    walk.b = walk.b + walk.exact_dot(position + 1, A.clamp(max=0), relaxation.upper_intercept)
    crossed = A * torch.where(A >= 0, lower_slope, relaxation.upper_slope.unsqueeze(1))
    if position in walk.fixed:
        crossed, walk.b = _fix_neurons(A, crossed, walk.b, relaxation, *walk.fixed[position])
    A = crossed
    if walk.observe is not None:
        walk.observe(position, A)
    if walk.rounding:
        magnitude = capped_magnitude(*bounds[position])
        if position in walk.betas:  # the product rounds before β is added: charge it now
            walk.error = walk.error + 2 * u * walk.abs_dot(position, A, magnitude)
        walk.charge(position, 2 * u * magnitude)
    if position in walk.betas:
        A = A + walk.betas[position]
    walk.send(stage.sources[0], A)


def _fork(pending: dict, A, b, error, spec_rows: int, index: torch.Tensor, slope: torch.Tensor):
    """The walk with ``index.shape[1]`` copies of its first ``spec_rows`` rows appended (to A,
    b, error and every pending tensor's coefficients), and the ``fixed`` entry that makes copy c
    fix neuron ``index[:, c]`` (the walk's older rows fix none)."""
    copies = index.shape[1]

    def grow(t: torch.Tensor) -> torch.Tensor:
        repeat = [1] * t.dim()
        repeat[1] = copies
        return torch.cat([t, t[:, :spec_rows].repeat(*repeat)], 1)

    for tensor, values in list(pending.items()):
        pending[tensor] = tuple(grow(v) for v in values)
    older = A.shape[1]
    none = torch.full((index.shape[0], older), -1, dtype=index.dtype)
    fix_index = torch.cat([none, index.repeat_interleave(spec_rows, 1)], 1)
    fix_slope = torch.cat([torch.zeros(none.shape, dtype=slope.dtype), slope.repeat_interleave(spec_rows, 1)], 1)
    return grow(A), grow(b), grow(error), (fix_index, fix_slope)


def _fix_neurons(A, crossed, b, relaxation: ReluRelaxation, index: torch.Tensor, slope: torch.Tensor):
    """``crossed`` and ``b`` with each row's neuron ``index`` (B, S) (−1: none) crossed as a
    stable ReLU of ``slope`` (B, S) instead of by its relaxation: coefficient A·slope, and the
    intercept that the relaxation added into ``b`` taken out again."""
    batch, rows = A.shape[:2]
    present = index >= 0
    where = index.clamp(min=0).unsqueeze(-1)  # (B, S, 1)
    before = A.reshape(batch, rows, -1).gather(2, where).squeeze(-1)
    intercept = relaxation.upper_intercept.reshape(relaxation.upper_intercept.shape[0], -1)
    intercept = intercept.expand(batch, -1).gather(1, index.clamp(min=0))
    b = b - torch.where(present, before.clamp(max=0) * intercept, torch.zeros_like(b))
    flat = crossed.reshape(batch, rows, -1)
    kept = flat.gather(2, where).squeeze(-1)
    value = torch.where(present, before * slope.to(before.dtype), kept)
    return flat.scatter(2, where, value.unsqueeze(-1)).reshape(crossed.shape), b


# ---------------------------------------------------------------- forward linear bounds

def _relu(f: LinearFunctions, lower, upper, input_magnitude) -> LinearFunctions:
    relax = relax_relu(lower, upper)
    # Lower side: slope 0 or 1 (CROWN's adaptive choice), exact in floating point.
    keep = relax.lower_slope
    # Upper side: s·(upper function) + t with s ≥ 0; rounding of the products is budgeted.
    slope, intercept = relax.upper_slope, relax.upper_intercept
    u = unit_roundoff(lower.dtype)
    expand = lambda t: t.unsqueeze(1)  # noqa: E731
    a_hi = f.a_hi * expand(slope)
    c_hi = f.c_hi * slope + intercept
    coeff_mag = contract(f.a_hi.abs(), input_magnitude, f.columns)
    e_hi = f.e_hi * slope * (1 + 2 * u) + 4 * u * (slope * (coeff_mag + f.c_hi.abs()) + intercept.abs())
    return LinearFunctions(f.a_lo * expand(keep), f.c_lo * keep, f.e_lo * keep, a_hi, c_hi, e_hi)


def _relu_symbols(f: LinearFunctions, lower, upper, input_magnitude) -> LinearFunctions:
    """Both functions through a ReLU by a parallel relaxation with one new error symbol per
    unstable neuron (DeepZ's zonotope step), appended as columns after ``f``'s.

    With ``λ = u/(u − l)`` (0 or 1 where the neuron is stable) and ``m ≥ max(−λ l, (1 − λ) u)``,
    ``relu(z) − λ z`` lies in ``[0, m]`` for every ``z`` in ``[l, u]`` (it is piecewise linear
    with values ``−λ l``, 0 and ``(1 − λ) u`` at ``l``, 0 and ``u``, any ``λ`` in [0, 1]). So
    ``relu(z) = λ z + m/2 + (m/2) ε`` for ``ε = (relu(z) − λ z − m/2)/(m/2)`` in [−1, 1], a value
    fixed by the input: the new column carries ``m/2`` on its neuron and the symbol ε, a new
    input of centre 0 and radius 1, is shared by every later tensor. Each later bound then
    holds for every input ``x`` at the symbols' values for ``x``, so minimising over the box and
    over ``ε`` in [−1, 1]ᵏ is sound, and the symbols keep the correlation a per-neuron
    relaxation loses (an error of one neuron can cancel itself downstream). ``m`` is rounded
    upwards; the products ``λ·a`` are budgeted as in :func:`_relu`.

    Returns the functions (B, n + k, *shape), k the most unstable neurons of a domain (a domain
    with fewer has zero columns for the rest).
    """
    batch = lower.shape[0]
    u = unit_roundoff(lower.dtype)
    unstable = (lower < 0) & (upper > 0)
    slope = torch.where(upper <= 0, torch.zeros_like(lower), torch.ones_like(lower))
    slope = torch.where(unstable, upper / (upper - lower), slope).clamp(0.0, 1.0)
    gap = torch.maximum(-slope * lower, (1 - slope) * upper) * (1 + 4 * u)
    half = torch.where(unstable, gap / 2, torch.zeros_like(gap))
    expand = lambda t: t.unsqueeze(1)  # noqa: E731
    a_lo = f.a_lo * expand(slope)
    a_hi = a_lo if f.shared else f.a_hi * expand(slope)
    magnitude = f.magnitude(input_magnitude)
    budget = lambda e: e * slope * (1 + 2 * u) + 4 * u * (slope * magnitude + half)  # noqa: E731
    flat = unstable.reshape(batch, -1)
    k = int(flat.sum(1).max()) if batch else 0
    if k:
        order = torch.sort(flat.to(torch.int8), dim=1, descending=True, stable=True).indices[:, :k]
        valid = torch.gather(flat, 1, order)
        columns = lower.new_zeros(batch, k, flat.shape[1])
        values = torch.gather(half.reshape(batch, -1), 1, order) * valid
        columns.scatter_(2, order.unsqueeze(-1), values.unsqueeze(-1))
        columns = columns.reshape(batch, k, *lower.shape[1:])
        a_lo = torch.cat([a_lo, columns], 1)
        a_hi = a_lo if f.shared else torch.cat([a_hi, columns], 1)
    return LinearFunctions(a_lo, f.c_lo * slope + half, budget(f.e_lo), a_hi, f.c_hi * slope + half, budget(f.e_hi))
