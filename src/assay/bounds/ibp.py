"""Interval bound propagation (IBP), with optional interval weights and outward rounding.

Soundness: for every x with lower ≤ x ≤ upper (and every weight within ±δ of its nominal
value when δ is given), each returned interval contains the exact value of that layer's
input/output. Each affine step is widened by the floating-point error bound of its sums, so
rounding never makes an interval optimistic.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from assay.bounds.plan import AddStage, AffineStage, MaxPoolStage, OperatorStage, Plan, ReluStage, unit_roundoff

# Elements of the (batch, out, in) product tensor built at once for exact interval weights.
_CORNER_CHUNK = 1 << 22


def cast_outward(lower, upper, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """``(lower, upper)`` in ``dtype``, rounded outwards: casting to a narrower float never
    shrinks the interval (round to nearest could move either end inwards by half an ulp)."""
    lower, upper = torch.as_tensor(lower), torch.as_tensor(upper)
    low, high = lower.to(dtype), upper.to(dtype)
    if not (lower.is_floating_point() and torch.finfo(lower.dtype).bits > torch.finfo(dtype).bits):
        return low, high
    wide = lower.dtype
    low = torch.where(low.to(wide) > lower, torch.nextafter(low, torch.full_like(low, -torch.inf)), low)
    high = torch.where(high.to(wide) < upper.to(wide), torch.nextafter(high, torch.full_like(high, torch.inf)), high)
    return low, high


def center_radius(lower: torch.Tensor, upper: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Center and a radius such that [center - radius, center + radius] ⊇ [lower, upper] in floats."""
    center = (lower + upper) / 2
    u = unit_roundoff(lower.dtype)
    radius = torch.maximum(upper - center, center - lower).clamp(min=0) * (1 + 4 * u)
    return center, radius + torch.finfo(lower.dtype).tiny


def magnitude(lower: torch.Tensor, upper: torch.Tensor) -> torch.Tensor:
    """max(|lower|, |upper|) elementwise: the largest absolute value in the interval."""
    return torch.maximum(lower.abs(), upper.abs())


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


def interval_pass(
    plan: Plan,
    lower: torch.Tensor,
    upper: torch.Tensor,
    deltas: dict[int, float] | None = None,
    clamp=None,
    given: dict[int, tuple[torch.Tensor, torch.Tensor]] | None = None,
    until: int | None = None,
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Bounds of the input of every stage and of the output, by IBP.

    Args:
        plan: the network's stages in the working dtype.
        lower, upper: input bounds of shape (B, *input_shape) in the plan's dtype.
        deltas: weight-perturbation radius per stage position (absent or 0: exact weights).
        clamp: optional callable ``clamp(tensor, lower, upper) -> (lower, upper)`` applied to
            the input bounds of each ReLU stage and non-linear general operator before
            propagating (tighter known bounds, splits).
        given: sound bounds of some tensors (by index), taken as they are instead of computed:
            e.g. a parent domain's pre-activation bounds, which IBP over the same box rarely
            tightens (on oval21 cifar_base the intervals of the affine stages were a sixth of a
            ReLU-splitting search's time).
        until: compute the tensors 0 … ``until`` only (None: all of them, the output included):
            a caller that is about to replace a later tensor's bounds (CROWN refinement) needs
            only those its backward walk reads, and extends the list afterwards.
    Returns:
        ``bounds[t]`` = (lower, upper) of tensor t (``bounds[p]`` is the input of ReLU stage p);
        ``bounds[-1]`` is the output (with ``until``: the list ends at tensor ``until``).
    """
    deltas = deltas or {}
    given = given or {}
    bounds = [(lower, upper)]
    for position, stage in enumerate(plan.stages):
        if until is not None and position >= until:
            # the last tensor gets the clamping its readers would give it (known bounds, splits)
            if clamp is not None and until in _clamped_sources(plan):
                bounds[until] = clamp(until, *bounds[until])
            break
        clamped = _CLAMPED[type(stage)](stage)
        if position + 1 in given and not clamped:
            bounds.append(given[position + 1])
            continue
        if clamp is not None:
            for source in clamped:
                bounds[source] = clamp(source, *bounds[source])
        bounds.append(_INTERVAL[type(stage)](stage, bounds, deltas.get(position, 0.0)))
    return bounds


# The interval rule of each kind of stage: (stage, bounds so far, weight radius) -> (lower, upper).
# MaxPool is exact (max is monotone and rounds nothing); a general operator asks its rule.
_INTERVAL = {
    AffineStage: lambda stage, bounds, delta: _affine_interval(stage, *bounds[stage.sources[0]], delta),
    ReluStage: lambda stage, bounds, delta: tuple(t.clamp(min=0) for t in bounds[stage.sources[0]]),
    AddStage: lambda stage, bounds, delta: add_interval(*bounds[stage.sources[0]], *bounds[stage.sources[1]]),
    MaxPoolStage: lambda stage, bounds, delta: tuple(F.max_pool2d(t, stage.kernel, stage.stride)
                                                     for t in bounds[stage.sources[0]]),
    OperatorStage: lambda stage, bounds, delta: stage.interval(bounds),
}
# The tensors a stage relaxes, whose bounds `clamp` tightens first (known bounds, split constraints).
_CLAMPED = {
    AffineStage: lambda stage: (),
    ReluStage: lambda stage: stage.sources,
    AddStage: lambda stage: (),
    MaxPoolStage: lambda stage: (),
    OperatorStage: lambda stage: stage.sources if stage.nonlinear else (),
}


def _clamped_sources(plan: Plan) -> set[int]:
    """The tensors some stage of ``plan`` clamps before relaxing them (see ``_CLAMPED``)."""
    return {source for stage in plan.stages for source in _CLAMPED[type(stage)](stage)}


def add_interval(lower_a, upper_a, lower_b, upper_b) -> tuple[torch.Tensor, torch.Tensor]:
    """[a] + [b], widened by the rounding of one addition (u · magnitude per element)."""
    lower, upper = lower_a + lower_b, upper_a + upper_b
    u = unit_roundoff(lower.dtype)
    return lower - 2 * u * lower.abs(), upper + 2 * u * upper.abs()
