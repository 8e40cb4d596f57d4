"""A fast counterfactual search by projected gradient descent (for networks too large for the MILP).

Minimises ``‖x′ − x‖₁ (weighted by the spec's cost; or ∞) + λ · Σ_s max(0, margin − (C f(x′))_s)`` with Adam over the mutable
variables, clipped into their bounds after every step (one-hot and thermometer groups are relaxed to
[0, 1] and rounded onto their code at the end). λ doubles until the rounded point is valid. The point
is only a candidate: :func:`assay.cfx.counterfactual` re-checks it with a forward pass, and claims no
optimality for it.
"""

from __future__ import annotations

import numpy as np
import torch

from assay.cfx.features import FeatureTypes

__all__ = ["gradient_counterfactual"]


def gradient_counterfactual(network, x: np.ndarray, C: np.ndarray, features: FeatureTypes, required: float,
                            distance: str, rng: np.random.Generator, steps: int = 200, rounds: int = 6,
                            lr: float = 0.05) -> np.ndarray | None:
    """A valid point near ``x`` or None (see the module docstring)."""
    model = network.to_torch()
    for parameter in model.parameters():
        parameter.requires_grad_(False)
    frozen = np.zeros(features.size, dtype=bool)
    frozen[features.frozen_variables()] = True
    x0 = torch.as_tensor(x)
    lower, upper = torch.tensor(features.lower), torch.tensor(features.upper)
    free = torch.as_tensor(~frozen)
    rows = torch.as_tensor(C)
    cost_weights = torch.as_tensor(features.cost)
    weight = 1.0
    start = x0 + torch.as_tensor(rng.normal(0.0, 1e-3, size=x.shape)) * free
    for _ in range(rounds):
        point = start.clone().clamp(lower, upper).requires_grad_(True)
        # Adam written out: the first torch.optim optimiser of a process imports torch._dynamo (~2 s).
        first, second = torch.zeros_like(point), torch.zeros_like(point)
        for step in range(1, steps + 1):
            change = (point - x0) * free
            cost = (cost_weights * change.abs()).sum() if distance == "l1" else change.abs().max()
            hinge = torch.relu(required - model(point.unsqueeze(0))[0] @ rows.T).sum()
            (gradient,) = torch.autograd.grad(cost + weight * hinge, point)
            with torch.no_grad():
                first.mul_(0.9).add_(0.1 * gradient)
                second.mul_(0.999).add_(0.001 * gradient * gradient)
                update = (first / (1 - 0.9 ** step)) / ((second / (1 - 0.999 ** step)).sqrt() + 1e-8)
                point -= lr * update
                point.copy_(torch.where(free, point.clamp(lower, upper), x0))
        candidate = features.snap(point.detach().numpy())
        candidate[frozen] = x[frozen]
        y = network.forward(torch.as_tensor(candidate).unsqueeze(0), dtype="float64")[0].numpy()
        if (C @ y).min() > 0:
            return candidate
        weight *= 2.0
        start = point.detach()
    return None
