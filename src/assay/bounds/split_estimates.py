"""CROWN bounds of a domain's ReLU-split children, many at once (branching heuristics).

Filtered smart branching (De Palma et al., ICLR 2021) chooses the neuron to split by bounding
both children of each shortlisted neuron. A child differs from its parent in one neuron only:
its pre-activation bounds are the parent's with that neuron made stable. So the children of a
domain need no bounds, slopes or relaxations of their own: one :func:`backsubstitute` walk over
the parent's relaxations bounds them all, each child a row of the walk whose split neuron is
crossed as stable. A child joins the walk only at its split's layer (the ``forks`` of
:func:`backsubstitute`): above it, it is its parent's row.

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
    plan.require_relu_network("split_child_bounds")
    batch, k = candidates.shape
    rows = C.shape[0]
    C_rows = C.to(dtype).reshape(1, rows, *network.output_shape).expand(batch, rows, *network.output_shape)
    d_rows = d.to(dtype).reshape(1, rows).expand(batch, rows)
    sizes = [intermediate.lower[layer][0].numel() for layer in range(len(plan.relu_positions))]
    starts = torch.tensor([0] + sizes[:-1]).cumsum(0)
    layer_of = torch.bucketize(candidates, starts[1:], right=True)  # (B, k)
    bounds: list = [None] * (len(plan.stages) + 1)
    relaxations, forks, first_row = {}, {}, {}
    walk_rows = rows  # the walk's rows below each stage: the spec rows, then each fork's children
    for layer in reversed(range(len(plan.relu_positions))):  # the order the walk crosses them
        position = plan.relu_positions[layer]
        layer_lower, layer_upper = intermediate.lower[layer].to(dtype), intermediate.upper[layer].to(dtype)
        bounds[position] = (layer_lower, layer_upper)
        relaxations[position] = relax_relu(layer_lower, layer_upper)
        inside = layer_of == layer
        if inside.any():
            # this layer's candidates of each domain, packed to the left (−1 pads the shorter lists)
            rank = inside.cumsum(1) - 1
            width = int(inside.sum(1).max())
            packed = torch.full((batch, width + 1), -1, dtype=candidates.dtype)
            packed.scatter_(1, torch.where(inside, rank, width), torch.where(inside, candidates - starts[layer], -1))
            packed = packed[:, :width]
            slopes_of_children = torch.cat([torch.ones(batch, width), torch.zeros(batch, width)], 1).to(dtype)
            forks[position] = (torch.cat([packed, packed], 1), slopes_of_children)  # z ≥ 0 children, then z ≤ 0
            first_row[layer] = (walk_rows, width, rank)
            walk_rows += 2 * width * rows
    slopes = {}
    if alphas is not None:
        for layer, position in enumerate(plan.relu_positions):
            if alphas[layer] is not None:
                present = rows + sum(2 * width * rows for other, (_, width, _) in first_row.items() if other >= layer)
                slopes[position] = _rows_of_walk(alphas[layer].to(dtype).clamp(0, 1), present)
    back = backsubstitute(plan, len(plan.stages), C_rows, d_rows, bounds, slopes=slopes, relaxations=relaxations,
                          rounding=False, forks=forks)
    center, radius = center_radius(lower.to(dtype), upper.to(dtype))
    value, _ = concretize(plan, back, center, radius)
    # each candidate's two children: the rows its layer's fork gave them
    start = torch.zeros(batch, k, 2, dtype=torch.long)
    for layer, (first, width, rank) in first_row.items():
        inside = (layer_of == layer).unsqueeze(-1)
        child = first + (rank.unsqueeze(-1) + torch.tensor([0, 1]) * width) * rows  # (B, k, 2)
        start = torch.where(inside, child, start)
    gather = (start.unsqueeze(-1) + torch.arange(rows)).reshape(batch, -1)
    return value.gather(1, gather).reshape(batch, k, 2, rows)


def _rows_of_walk(alpha: torch.Tensor, count: int) -> torch.Tensor:
    """Slopes (B, S, *shape) for a walk of ``count`` rows, S spec rows repeated: (B, count, *shape)."""
    batch, rows = alpha.shape[:2]
    if rows == 1:  # a view: the children share their parent's slopes
        return alpha.expand(batch, count, *alpha.shape[2:])
    return alpha.repeat(1, count // rows, *[1] * (alpha.dim() - 2))
