"""Walks over the engine's stages that analyses share: sensitivity bounds and linear regions.

* :func:`gradient_bounds` — a bound on |∂ row / ∂ ·| for every ReLU layer's output and for the
  input, over the domains given by pre-activation bounds (ReluVal's *smear* for input splitting,
  and preimage refinement's *sensitivity* score, use it; ReLU splitting ranks neurons by the
  bound's own coefficients instead, :func:`assay.bounds.relu_coefficients`).
* :func:`affine_forms` — each ReLU input and the output as affine functions of the input under
  one activation pattern (the network on one linear region).
* :func:`pattern_lower_bound` — a sound lower bound of ``C · f(x) + d`` over the points of a box
  that have one activation pattern, with given Lagrange multipliers on the sign constraints
  (β-CROWN's bound with fixed β and exact relaxations); rounding is bounded as in every CROWN bound.

They read the network through :func:`assay.bounds.plan.plan_for`, like every bound method, so an
analysis never walks the stages itself.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from assay.bounds.crown import backsubstitute, concretize
from assay.bounds.ibp import center_radius, interval_pass
from assay.bounds.plan import accumulate, plan_for, rounding_factor, unit_roundoff
from assay.bounds.relaxation import relax_relu
from assay.bounds.result import IntermediateBounds
from assay.nn.network import Network

__all__ = ["GradientBounds", "gradient_bounds", "lipschitz_bounds", "input_sensitivities", "affine_forms",
           "pattern_lower_bound"]


@dataclass(frozen=True, eq=False)
class GradientBounds:
    """Bounds on the magnitude of the gradient of one row per domain.

    ``relu_outputs[k]``: (B, *shape of ReLU layer k): |∂ row / ∂ relu_k(z)| ≤ this value;
    ``inputs``: (B, n_in) flat: |∂ row / ∂ x_j| ≤ this value, over the domain.
    """

    relu_outputs: tuple[torch.Tensor, ...]
    inputs: torch.Tensor


def gradient_bounds(network: Network, rows: torch.Tensor, intermediate: IntermediateBounds) -> GradientBounds:
    """Bound the gradient of ``rows · f(x)`` over each domain, backward through |W|.

    Args:
        rows: (B, n_out): one output row per domain (only its magnitudes matter).
        intermediate: the domains' pre-activation bounds; a neuron whose upper bound is ≤ 0 is
            off on the whole domain and passes no gradient; the others pass at most all of it.
    Returns:
        :class:`GradientBounds` (float64).
    """
    plan = plan_for(network, torch.float64)
    plan.require_no_maxpool("gradient_bounds")
    plan.require_relu_network("gradient_bounds", linear_operators=True)
    count = rows.shape[0]
    pending = {len(plan.stages): (rows.abs().to(torch.float64).reshape(count, 1, *network.output_shape),)}
    k = len(plan.relu_positions)
    per_layer: list[torch.Tensor] = [None] * k  # type: ignore[list-item]
    for position in range(len(plan.stages) - 1, -1, -1):
        stage = plan.stages[position]
        relu = stage.splits_at_zero
        if relu:
            k -= 1
        if position + 1 not in pending:
            if relu:  # no path from this layer to the output
                per_layer[k] = torch.zeros(count, *stage.shape, dtype=torch.float64)
            continue
        (g,) = pending.pop(position + 1)
        if relu:  # off where its input's upper bound is ≤ 0
            per_layer[k] = g.squeeze(1)
            g = g * (intermediate.upper[k] > 0).unsqueeze(1)
        # |L|ᵀ g to each source (a ReLU passes the rest whole)
        for source, part in zip(stage.sources, stage.backward_magnitude(g)):
            accumulate(pending, source, (part,))
    (g,) = pending.pop(0)
    return GradientBounds(tuple(per_layer), g.reshape(count, -1))


def lipschitz_bounds(network: Network, rows: torch.Tensor, norm: str = "inf") -> torch.Tensor:
    """Global Lipschitz constants of ``rows · f`` for a norm of the input: (S,) float64.

    For all inputs x, x': |r · f(x) − r · f(x')| ≤ L_r · ‖x − x'‖ (ReLUs are 1-Lipschitz).

    * ``norm="inf"``: L_r = 1ᵀ |W_1|ᵀ ⋯ |W_L|ᵀ |r| (the gradient bound with every ReLU passing
      at most all of its gradient; never above the product of the layers' ∞-operator norms
      times ‖r‖₁);
    * ``norm="2"``: L_r = ‖r W_L‖₂ · Π_{k<L} ‖W_k‖₂ (spectral norms; Linear layers only).

    Rounding of the float64 products is bounded and added, so the constants are sound.

    Args:
        rows: (S, n_out) output rows.
    """
    plan = plan_for(network, torch.float64)
    rows = torch.as_tensor(rows, dtype=torch.float64).reshape(-1, network.output_size)
    if norm == "2":
        return _spectral_lipschitz(plan, rows)
    if norm != "inf":
        raise ValueError(f"norm must be 'inf' or '2'; got {norm!r}")
    count = rows.shape[0]
    everything_passes = IntermediateBounds(
        tuple(torch.full((count, *plan.stages[p].shape), -torch.inf, dtype=torch.float64) for p in plan.relu_positions),
        tuple(torch.full((count, *plan.stages[p].shape), torch.inf, dtype=torch.float64) for p in plan.relu_positions),
    )
    sums = gradient_bounds(network, rows, everything_passes).inputs.sum(1)
    # Every term is non-negative: the computed sums are within a relative γ of the exact ones.
    return sums * (1 + 2 * rounding_factor(plan, network.input_size))


def input_sensitivities(network: Network) -> tuple[torch.Tensor, ...]:
    """Global sensitivity of every pre-activation to every input: one (N_k, n_in) tensor per ReLU layer.

    For all inputs x, x' and every neuron j of ReLU layer k:
    |z_kj(x) − z_kj(x')| ≤ Σ_i S_k[j, i] · |x_i − x'_i|, with S_1 = |W_1| and
    S_k = |W_k| S_{k−1} (every ReLU passing at most all of a change). Rounding of the float64
    products is bounded and added. Online verification widens a box's pre-activation bounds by
    S·(how far the box grew) to get valid bounds on the grown box without bounding it again.
    """
    plan = plan_for(network, torch.float64)
    plan.require_no_maxpool("input_sensitivities")
    plan.require_relu_network("input_sensitivities")
    n = network.input_size
    values = [torch.eye(n, dtype=torch.float64).reshape(n, *network.input_shape)]  # one column per input
    per_layer = []
    for stage in plan.stages:
        sensitivity = stage.forward_magnitude([values[s] for s in stage.sources])
        if stage.splits_at_zero:  # a change passes a ReLU at most whole
            per_layer.append(sensitivity.reshape(n, -1).T.contiguous())
        values.append(sensitivity)
    inflation = 1 + 2 * rounding_factor(plan, n)
    return tuple(layer * inflation for layer in per_layer)


def _spectral_lipschitz(plan, rows: torch.Tensor) -> torch.Tensor:
    # the product of the layers' norms holds for 1-Lipschitz activations (ReLU) only: an
    # operator such as exp would be skipped, and the constant not hold
    plan.require_no_maxpool("ℓ2 Lipschitz bounds")
    plan.require_relu_network("ℓ2 Lipschitz bounds")
    affine = [s for s in plan.stages if s.weighted]
    if any(s.kind != "linear" for s in affine) or not plan.is_chain:
        raise ValueError("ℓ2 Lipschitz bounds are computed for chains of Linear layers only; use norm='inf'")
    last, earlier = affine[-1], affine[:-1]
    constant = torch.linalg.vector_norm(rows @ last.weight, dim=1)
    for stage in earlier:
        constant = constant * torch.linalg.matrix_norm(stage.weight, ord=2)
    # An SVD's largest singular value is accurate to about n·u relative; be generous.
    size = max(max(s.weight.shape) for s in affine)
    return constant * (1 + 64 * size * len(affine) * unit_roundoff(torch.float64))


def affine_forms(network: Network, signs: Sequence[torch.Tensor]):
    """Each ReLU input and the output as affine functions of the flat input under one pattern.

    Args:
        signs: per ReLU layer, a tensor of the layer's shape: > 0 active, ≤ 0 inactive.
    Returns:
        ([(coef (N_k, n), offset (N_k,)) per ReLU layer], (coef (n_out, n), offset (n_out,))),
        in float64 and without rounding bounds: for oracles (LPs), never for a verdict.
    """
    plan = plan_for(network, torch.float64)
    plan.require_no_maxpool("affine_forms")
    plan.require_relu_network("affine_forms")
    n = network.input_size
    # (linear part with one row per input, offset) of every tensor
    values = [(torch.eye(n, dtype=torch.float64).reshape(n, *network.input_shape),
               torch.zeros(1, *network.input_shape, dtype=torch.float64))]
    forms, k = [], 0
    for stage in plan.stages:
        if not stage.splits_at_zero:
            values.append(stage.linear_form([values[s] for s in stage.sources]))
            continue
        coef, offset = values[stage.sources[0]]
        forms.append((coef.reshape(n, -1).T.contiguous(), offset.reshape(-1)))
        active = (signs[k] > 0).to(torch.float64)
        values.append((coef * active, offset * active))
        k += 1
    coef, offset = values[-1]
    return forms, (coef.reshape(n, -1).T.contiguous(), offset.reshape(-1))


def pattern_lower_bound(
    network: Network,
    lower: torch.Tensor,
    upper: torch.Tensor,
    C: torch.Tensor,
    d: torch.Tensor,
    signs: Sequence[torch.Tensor],
    multipliers: Sequence[torch.Tensor],
    pre_lower: Sequence[torch.Tensor],
    pre_upper: Sequence[torch.Tensor],
) -> float:
    """A sound lower bound of min over the box of ``C · f(x) + d − Σ_j ν_j σ_j z_j(x)``.

    Args:
        lower, upper: the input box (flat or input-shaped, one domain).
        C, d: one row, shapes (n_out,) or (1, n_out), and () or (1,).
        signs: per ReLU layer σ (+1 active, −1 inactive), every neuron's sign known.
        multipliers: per ReLU layer ν ≥ 0, same shapes as ``signs``.
        pre_lower, pre_upper: the pattern's pre-activation bounds per ReLU layer (each
            consistent with ``signs``), giving exact relaxations.
    Returns:
        The bound as a float. On the points of the box whose pattern is σ, σ_j z_j ≥ 0, so the
        bound is also a lower bound of ``C · f(x) + d`` there (a Lagrangian bound, valid for
        any ν ≥ 0). Rounding is included (outward), as in :func:`compute_bounds`.
    """
    plan = plan_for(network, torch.float64)
    rows = torch.as_tensor(C, dtype=torch.float64).reshape(1, 1, *network.output_shape)
    offsets = torch.as_tensor(d, dtype=torch.float64).reshape(1, 1)
    betas, relaxations = {}, {}
    for position, sign, nu, l, u in zip(plan.relu_positions, signs, multipliers, pre_lower, pre_upper):
        # g − ν σ z ≤ g on the pattern (σ z ≥ 0): in the engine's sign convention, −ν σ.
        betas[position] = (-torch.as_tensor(nu, dtype=torch.float64) * sign).unsqueeze(0).unsqueeze(0)
        relaxations[position] = relax_relu(l.unsqueeze(0), u.unsqueeze(0))
    shape = network.input_shape
    box = lower.reshape(1, *shape).to(torch.float64), upper.reshape(1, *shape).to(torch.float64)
    known = dict(zip(plan.relu_positions, zip(pre_lower, pre_upper)))

    def clamp(position, l, u):  # the pattern's bounds, for the rounding terms' magnitudes
        return torch.maximum(l, known[position][0].unsqueeze(0)), torch.minimum(u, known[position][1].unsqueeze(0))

    bounds = interval_pass(plan, *box, None, clamp)
    back = backsubstitute(plan, len(plan.stages), rows, offsets, bounds, None, None, betas, relaxations)
    center, radius = center_radius(*box)
    value, _ = concretize(plan, back, center, radius)
    return float(value.item())
