"""Backward substitution of linear bounds (CROWN, Zhang et al., NeurIPS 2018).

Given spec rows ``C`` (B, S, *target_shape) and offsets ``d`` (B, S) on tensor ``target``
(the input of a ReLU stage, or the network output), :func:`backsubstitute` walks the stages
backwards and returns ``A`` (B, S, *input_shape) and ``b`` (B, S) such that for every x in
the domain

    C · h_target(x) + d  ≥  A · x + b

using, at each ReLU, the relaxation of :mod:`assay.bounds.relaxation` (optionally with per-row
optimised lower slopes α and split multipliers β, see β-CROWN, Wang et al., NeurIPS 2021).
Upper bounds are lower bounds of the negated rows. Over a graph, the coefficients that reach a
tensor from several consumers (a residual connection) are summed before that tensor's own
stage is crossed, so every stage is crossed once.

Rounding: next to ``A`` the walk carries ``A_abs`` ≥ |A| computed with absolute weights, and
``b_abs`` ≥ the magnitude of every term added into ``b``. :func:`concretize` subtracts
γ·(A_abs·|x| + b_abs), which bounds the floating-point error of the whole chain.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from assay.bounds.ibp import perturbation_radius
from assay.bounds.plan import AddStage, Plan, ReluStage, accumulate, rounding_factor
from assay.bounds.relaxation import ReluRelaxation, relax_relu


@dataclass(eq=False)
class Backward:
    """The linear lower bound of C·h + d as ``A·x + b`` plus rounding magnitudes."""

    A: torch.Tensor
    b: torch.Tensor
    A_abs: torch.Tensor
    b_abs: torch.Tensor


def _dot(A: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Σ over the trailing dims of A (B or 1, S, *shape) times v (B, *shape) → (B, S)."""
    flat_A = A.reshape(A.shape[0], A.shape[1], -1)
    return flat_A.matmul(v.reshape(v.shape[0], -1, 1)).squeeze(-1)


def backsubstitute(
    plan: Plan,
    target: int,
    C: torch.Tensor,
    d: torch.Tensor,
    bounds: list[tuple[torch.Tensor, torch.Tensor]],
    deltas: dict[int, float] | None = None,
    slopes: dict[int, torch.Tensor] | None = None,
    betas: dict[int, torch.Tensor] | None = None,
    relaxations: dict[int, ReluRelaxation] | None = None,
    relax=relax_relu,
    track_abs: bool = True,
    observe=None,
) -> Backward:
    """Lower linear bound of ``C · (input of stage target) + d`` in terms of the network input.

    Args:
        plan: stages in the working dtype.
        target: the tensor bounded: the input of ReLU stage ``target``, or ``len(plan.stages)``
            for the output.
        C: (B, S, *shape) rows; d: (B, S).
        bounds: ``bounds[t]`` = (lower, upper) of tensor t, for t < target; ReLU inputs must
            already include split clamping.
        deltas: weight-perturbation radius per stage position.
        slopes: per ReLU position, lower slopes (B, S, *shape) to use on unstable neurons
            (values in [0, 1]); absent: CROWN's adaptive choice.
        betas: per ReLU position, signed split multipliers (B, S, *shape): +β on neurons split
            inactive (z ≤ 0), −β on neurons split active (z ≥ 0), 0 elsewhere.
        relaxations: per ReLU position, the relaxation of ``bounds`` if already computed.
        relax: the ReLU relaxation for the others (default CROWN's, :func:`relax_relu`).
        track_abs: False skips the rounding magnitudes (``A_abs``, ``b_abs`` are None; half the
            work): the caller then bounds rounding with :func:`forward_magnitudes` instead.
            Only without ``deltas`` and ``betas``, which that bound does not cover.
        observe: optional ``observe(position, A)``, called at each ReLU stage the rows reach with
            the coefficients on its input just after crossing it (before split multipliers):
            how much each neuron's relaxation weighs in the bound (branching heuristics read it).
    """
    deltas = deltas or {}
    slopes = slopes or {}
    betas = betas or {}
    relaxations = relaxations or {}
    if not track_abs and (deltas or betas):
        raise ValueError("track_abs=False needs exact weights and no split multipliers (see forward_magnitudes)")
    b = d.clone()
    # |A| is bounded by |C| times the absolute weights (ReLU slopes lie in [0, 1]), the same for
    # every domain: track that bound once, with batch 1, unless split multipliers add to it.
    b_abs = d.abs() if track_abs else None
    # Coefficients waiting on each tensor: (A, A_abs), or (A,) without magnitudes. A chain keeps
    # exactly one entry.
    pending = {target: (C, C.abs().amax(0, keepdim=True)) if track_abs else (C,)}
    for position in range(target - 1, -1, -1):
        if position + 1 not in pending:
            continue  # the stage's output does not reach the target
        A, *rest = pending.pop(position + 1)
        A_abs = rest[0] if track_abs else None
        stage = plan.stages[position]
        if isinstance(stage, AddStage):
            for source in stage.sources:
                accumulate(pending, source, (A, *rest))
            continue
        if isinstance(stage, ReluStage):
            relaxation = relaxations.get(position) or relax(*bounds[position])
            lower_slope = relaxation.lower_slope.unsqueeze(1)
            if position in slopes:
                lower_slope = torch.where(relaxation.unstable.unsqueeze(1), slopes[position], lower_slope)
            b = b + _dot(A.clamp(max=0), relaxation.upper_intercept)
            A = A * torch.where(A >= 0, lower_slope, relaxation.upper_slope.unsqueeze(1))
            if observe is not None:
                observe(position, A)
            if track_abs:
                b_abs = b_abs + _dot(A_abs, relaxation.upper_intercept.abs())
            if position in betas:
                A = A + betas[position]
                A_abs = A_abs + betas[position].abs()
        else:
            delta = deltas.get(position, 0.0)
            if delta > 0:
                noise = perturbation_radius(stage, *bounds[stage.sources[0]], delta)
                b = b - _dot(A.abs(), noise)
                b_abs = b_abs + _dot(A_abs, noise)
            if stage.bias is not None:
                b = b + stage.bias_term(A)
                if track_abs:
                    b_abs = b_abs + stage.bias_term(A_abs, stage.bias.abs())
            A = stage.backward(A)
            if track_abs:
                A_abs = stage.backward_abs(A_abs) if stage.abs_weight is not None else stage.backward(A_abs)
        accumulate(pending, stage.sources[0], (A, A_abs) if track_abs else (A,))
    A, *rest = pending.pop(0)
    return Backward(A, b, rest[0] if track_abs else None, b_abs)


def forward_magnitudes(plan: Plan, target: int, bounds, center, radius, relax=relax_relu) -> torch.Tensor:
    """Per element of tensor ``target``, a bound M (B, *shape) on the rounding magnitudes of
    :func:`backsubstitute` without weight perturbation or β: for rows C and offsets d,
    ``A_abs·(|c| + r) + b_abs ≤ |C|·M + |d|``.

    By induction from the target backwards: an affine stage turns ``A_abs_out`` into
    ``A_abs_out |W|`` and adds ``A_abs_out·|b|``, so M_out = |W| M_in + |b| keeps the sum; a
    ReLU keeps A_abs (slopes lie in [0, 1]) and adds ``A_abs·|intercept|``, so M_out = M_in +
    |intercept|; an Add sends A_abs to both inputs, so M_out = M_a + M_b. One forward pass per
    domain replaces tracking A_abs for every row (the costly part of intermediate CROWN). The
    result is doubled to cover this pass's own rounding.
    """
    values = [center.abs() + radius]
    for position in range(target):
        stage = plan.stages[position]
        if isinstance(stage, ReluStage):
            magnitude = values[position] + relax(*bounds[position]).upper_intercept.abs()
        elif isinstance(stage, AddStage):
            magnitude = values[stage.sources[0]] + values[stage.sources[1]]
        elif stage.abs_weight is None:
            magnitude = stage.forward(values[stage.sources[0]])
        else:
            magnitude = stage.forward(values[stage.sources[0]], stage.abs_weight, stage.bias.abs())
        values.append(magnitude)
    return 2 * values[target]


def concretize(plan: Plan, back: Backward, center: torch.Tensor, radius: torch.Tensor,
               row_magnitude: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Lowest value of ``A·x + b`` over the box [center ± radius], never above the exact one.

    ``row_magnitude`` (B, S): for a Backward computed with ``track_abs=False``, the rows'
    ``|C|·M + |d|`` from :func:`forward_magnitudes`.

    Returns the lower bound (B, S) and the rounding margin (B, S) already subtracted from it
    (the margin also makes ``b - margin`` a sound offset for the linear bound itself).
    """
    flat = lambda t: t.reshape(t.shape[0], t.shape[1], -1)  # noqa: E731
    c = center.reshape(center.shape[0], 1, -1)
    r = radius.reshape(radius.shape[0], 1, -1)
    A = flat(back.A)
    value = (A * c).sum(-1) - (A.abs() * r).sum(-1) + back.b
    gamma = rounding_factor(plan, extra_terms=c.shape[-1])
    if row_magnitude is None:
        margin = gamma * (flat(back.A_abs).matmul((c.abs() + r).transpose(1, 2)).squeeze(-1) + back.b_abs)
    else:
        margin = gamma * row_magnitude
    return value - margin, margin
