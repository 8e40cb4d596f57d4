"""CROWN bounds of a domain's ReLU-split children, many at once (branching heuristics).

Filtered smart branching (De Palma et al., ICLR 2021) chooses the neuron to split by bounding
both children of each shortlisted neuron. A child differs from its parent in one neuron only:
its pre-activation bounds are the parent's with that neuron made stable. So the children of a
domain need no bounds, slopes or relaxations of their own: one :func:`backsubstitute` walk over
the parent's relaxations bounds them all, each child a row of the walk whose split neuron is
crossed as stable (the ``fixed`` rows of :func:`backsubstitute`).

It is a heuristic's input, not a bound: no rounding margins, no split multipliers β. In exact
arithmetic each value is the CROWN bound (with the parent's α) of the child, which is what
:func:`assay.bounds.compute_bounds` with ``method="beta"``, no iterations and the child's split
computes — the tests pin the two together.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from assay.bounds.crown import backsubstitute, concretize
from assay.bounds.ibp import center_radius
from assay.bounds.plan import plan_for
from assay.bounds.relaxation import relax_relu
from assay.bounds.result import IntermediateBounds
from assay.nn.network import Network

__all__ = ["split_child_bounds"]


def split_child_bounds(
    network: Network,
    lower: torch.Tensor,
    upper: torch.Tensor,
    intermediate: IntermediateBounds,
    C: torch.Tensor,
    d: torch.Tensor,
    candidates: torch.Tensor,
    *,
    alphas: Sequence[torch.Tensor | None] | None = None,
    dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    """Lower bounds of the rows ``C f(x) + d`` on both children of each candidate split.

    Args:
        network: the network f (without MaxPool: ReLU splitting lowers it).
        lower, upper: (B, n_in) the domains' input boxes.
        intermediate: the domains' pre-activation bounds (split neurons already clamped).
        C: (S, n_out) rows; d: (S,).
        candidates: (B, k) neurons to split, as flat indices over the ReLU layers in order (layer
            0's neurons first); each should be unstable in its domain (a stable one's children
            are its parent and an empty set, and get the parent's bound).
        alphas: lower slopes of unstable neurons, one (B, S, *layer shape) tensor or None per
            ReLU layer (a search's optimised slopes); None: CROWN's adaptive choice.
        dtype: the walk's dtype (float32: these values only rank candidates).

    Returns:
        (B, k, 2, S): per domain, candidate and child (z ≥ 0, then z ≤ 0), the rows' lower bounds.
    """
    plan = plan_for(network, dtype)
    plan.require_no_maxpool("split_child_bounds")  # the walk holds the bounds of ReLU inputs only
    batch, k = candidates.shape
    rows = C.shape[0]
    children = 2 * k * rows  # the walk's rows, ordered (candidate, child, spec row)
    C_rows = C.to(dtype).reshape(1, 1, rows, -1).expand(batch, 2 * k, rows, -1)
    C_rows = C_rows.reshape(batch, children, *network.output_shape)
    d_rows = d.to(dtype).reshape(1, 1, rows).expand(batch, 2 * k, rows).reshape(batch, children)
    bounds: list = [None] * (len(plan.stages) + 1)
    relaxations, slopes, fixed = {}, {}, {}
    start = 0
    # each row's child: the slope its split neuron is fixed to (1: z ≥ 0, 0: z ≤ 0)
    child_slope = torch.tensor([1.0, 0.0], dtype=dtype).reshape(1, 1, 2, 1).expand(batch, k, 2, rows)
    for layer, position in enumerate(plan.relu_positions):
        layer_lower, layer_upper = intermediate.lower[layer].to(dtype), intermediate.upper[layer].to(dtype)
        bounds[position] = (layer_lower, layer_upper)
        relaxations[position] = relax_relu(layer_lower, layer_upper)
        size = layer_lower[0].numel()
        inside = (candidates >= start) & (candidates < start + size)
        if inside.any():
            index = torch.where(inside, candidates - start, -1).reshape(batch, k, 1, 1).expand(batch, k, 2, rows)
            fixed[position] = (index.reshape(batch, children), child_slope.reshape(batch, children))
        if alphas is not None and alphas[layer] is not None:
            slopes[position] = _rows_of_children(alphas[layer].to(dtype).clamp(0, 1), k)
        start += size
    back = backsubstitute(plan, len(plan.stages), C_rows, d_rows, bounds, slopes=slopes, relaxations=relaxations,
                         rounding=False, fixed=fixed)
    center, radius = center_radius(lower.to(dtype), upper.to(dtype))
    value, _ = concretize(plan, back, center, radius)
    return value.reshape(batch, k, 2, rows)


def _rows_of_children(alpha: torch.Tensor, k: int) -> torch.Tensor:
    """Slopes (B, S, *shape) repeated for the 2k children of each row: (B, 2k·S, *shape)."""
    batch, rows = alpha.shape[:2]
    if rows == 1:  # a view: the children share their parent's slopes
        return alpha.expand(batch, 2 * k, *alpha.shape[2:])
    return alpha.unsqueeze(1).expand(batch, 2 * k, *alpha.shape[1:]).reshape(batch, 2 * k * rows, *alpha.shape[2:])
