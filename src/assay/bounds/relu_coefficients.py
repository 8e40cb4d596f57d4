"""The weight of every ReLU input in CROWN's linear lower bound of the spec rows.

Backward substitution (:func:`assay.bounds.backsubstitute`) turns ``C · f(x) + d`` into
``A · x + b`` by crossing the stages from the output back to the input; on its way it holds,
at the input ``z`` of each ReLU layer, a coefficient tensor ``Λ`` such that

    C · f(x) + d  ≥  Λ · z(x) + (terms of the earlier layers and the relaxations' intercepts).

``Λ[i, s, j]`` says how much neuron j's relaxation is worth to row s of domain i: branching
heuristics weigh a neuron's looseness by it (BaBSR; PREMAP2's *area*, *under* and *extra* scores,
which read auto_LiRPA's ``lA`` of the ReLU's input node, the same quantity). It is one :func:`backsubstitute` walk
that records every layer's ``Λ`` on the way, returned with the final ``A`` and ``b``.

It is a heuristic's input, not a bound: there are no rounding margins, no split multipliers β
and no weight perturbation. Its final ``A`` equals :func:`assay.bounds.compute_bounds`'s
``linear.lower_A`` for ``method="crown"`` (or for given α slopes) on the same intermediate
bounds, which is what the tests pin.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from assay.bounds.crown import backsubstitute
from assay.bounds.plan import plan_for
from assay.bounds.result import IntermediateBounds
from assay.nn.network import Network

__all__ = ["ReluCoefficients", "relu_coefficients"]


@dataclass(frozen=True, eq=False)
class ReluCoefficients:
    """``layers[k]``: Λ of ReLU layer k, (B, S, *layer shape); ``A`` (B, S, *input shape) and
    ``b`` (B, S): the linear lower bound the walk ends with (without rounding margins)."""

    layers: tuple[torch.Tensor, ...]
    A: torch.Tensor
    b: torch.Tensor


def batched_rows(C, d, batch: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows ``C`` (S, n_out) or (B, S, n_out) and offsets ``d`` (None, (S,) or (B, S)) as float64
    tensors (B, S, n_out) and (B, S) for ``batch`` domains."""
    C = torch.as_tensor(C, dtype=torch.float64)
    if C.dim() == 2:
        C = C.unsqueeze(0).expand(batch, *C.shape)
    rows = C.shape[1]
    d = torch.zeros(batch, rows, dtype=torch.float64) if d is None else torch.as_tensor(d, dtype=torch.float64)
    if d.dim() == 1:
        d = d.unsqueeze(0).expand(batch, rows)
    return C, d


def relu_coefficients(
    network: Network,
    intermediate: IntermediateBounds,
    C: torch.Tensor,
    d: torch.Tensor | None = None,
    *,
    alphas: Sequence[torch.Tensor | None] | None = None,
) -> ReluCoefficients:
    """Λ of every ReLU layer for the rows ``C f(x) + d`` over domains with the given pre-activation bounds.

    Args:
        network: the network f.
        intermediate: pre-activation bounds of the B domains (e.g. ``BoundsResult.intermediate``;
            with ReLU splits already applied, as :func:`compute_bounds` returns them).
        C: rows (S, n_out) shared by all domains or (B, S, n_out); d: (S,) or (B, S), default 0.
        alphas: lower slopes of unstable neurons, one (B, S, *layer shape) tensor or None per
            ReLU layer (e.g. the first S rows of ``BoundsResult.alphas``); None: CROWN's
            adaptive choice (slope 1 where u > −l, else 0).

    Returns:
        :class:`ReluCoefficients` in float64. At a ReLU, a row's coefficient on the ReLU's output
        is multiplied by the relaxation's lower slope where it is ≥ 0 and by the upper (chord)
        slope where it is < 0 (the side a lower bound needs): that product is Λ.
    """
    plan = plan_for(network, torch.float64)
    plan.require_no_maxpool("relu_coefficients")  # it holds the bounds of ReLU inputs only
    plan.require_relu_network("relu_coefficients")
    batch = intermediate.batch_size
    C, d = batched_rows(C, d, batch)
    rows = C.shape[1]
    if len(intermediate.lower) != len(plan.relu_positions):
        raise ValueError(f"intermediate bounds cover {len(intermediate.lower)} ReLU layers; the network has "
                         f"{len(plan.relu_positions)}")
    layer_of = {position: k for k, position in enumerate(plan.relu_positions)}
    # backsubstitute reads the bounds of the ReLU inputs only (other tensors' bounds serve weight
    # perturbation, which this walk does not take).
    bounds: list = [None] * (len(plan.stages) + 1)
    for k, position in enumerate(plan.relu_positions):
        bounds[position] = (intermediate.lower[k].to(torch.float64), intermediate.upper[k].to(torch.float64))
    slopes = {position: alphas[k].to(torch.float64).clamp(0, 1) for k, position in enumerate(plan.relu_positions)
              if alphas is not None and alphas[k] is not None}
    layers = [torch.zeros(batch, rows, *plan.stages[p].shape, dtype=torch.float64) for p in plan.relu_positions]

    def observe(position, A):
        layers[layer_of[position]] = A

    back = backsubstitute(plan, len(plan.stages), C.reshape(batch, rows, *network.output_shape), d, bounds,
                          slopes=slopes, observe=observe, rounding=False)
    return ReluCoefficients(tuple(layers), back.A, back.b)


