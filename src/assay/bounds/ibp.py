"""Interval bound propagation (IBP), with optional interval weights and outward rounding.

Soundness: for every x with lower ≤ x ≤ upper (and every weight within ±δ of its nominal
value when δ is given), each returned interval contains the exact value of that layer's
input/output. Each affine step is widened by the floating-point error bound of its sums, so
rounding never makes an interval optimistic.
"""

from __future__ import annotations

import torch

from assay.bounds.plan import Plan
from assay.bounds.rounding import center_radius, magnitude
from assay.bounds.stages.add import add_interval
from assay.bounds.stages.affine import perturbation_radius

# re-exported: IBP's interval arithmetic, whose homes are the rounding module and the stage kinds
__all__ = ["interval_pass", "cast_outward", "center_radius", "magnitude", "perturbation_radius", "add_interval"]


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


def interval_pass(
    plan: Plan,
    lower: torch.Tensor,
    upper: torch.Tensor,
    deltas: dict[int, float] | None = None,
    clamp=None,
    given: dict[int, tuple[torch.Tensor, torch.Tensor]] | None = None,
    until: int | None = None,
    complete=(),
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
        complete: tensors of ``given`` whose bounds were computed from their sources' bounds
            after ``clamp`` already (a forward pass's constants): taken as given even where
            their stage clamps its sources (the sources are still clamped; other given tensors
            of such a stage are computed again).
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
            if clamp is not None and any(until in s.clamped for s in plan.stages):
                bounds[until] = clamp(until, *bounds[until])
            break
        clamped = stage.clamped
        if position + 1 in given and not clamped:
            bounds.append(given[position + 1])
            continue
        if clamp is not None:
            for source in clamped:
                bounds[source] = clamp(source, *bounds[source])
        if position + 1 in complete:
            bounds.append(given[position + 1])
            continue
        bounds.append(stage.interval(bounds, deltas.get(position, 0.0)))
    return bounds

