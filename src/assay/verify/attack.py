"""Counterexample search: projected gradient ascent with restarts, and random sampling.

Searches maximise the margin ``max_g min_{i in g} (C f(x) + d)_i`` over boxes; a point with margin ≥ 0 is
a candidate, reported only after :func:`confirm` re-checks it with a float64 forward pass.
"""

from __future__ import annotations

import numpy as np
import torch

from assay.nn.network import Network
from assay.verify.problem import UnsafeQuery


def margins(network: Network, x: torch.Tensor, query: UnsafeQuery) -> torch.Tensor:
    """The query's group margin of f(x) for a batch x (N, n_in flat): shape (N,), ≥ 0 when unsafe."""
    y = network.forward(x.reshape(x.shape[0], *network.input_shape)).reshape(x.shape[0], -1)
    return query.group_margin(y @ query.C.T + query.d)


def confirm(network: Network, query: UnsafeQuery, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
    """The first row of x (N, n_in) that lies in the query's box and truly violates, with its output.

    The check is a plain float64 forward pass: an input counts only if its output satisfies the
    query's violation predicate exactly as computed there.
    """
    x = x.to(torch.float64)
    x = torch.minimum(torch.maximum(x, query.lower), query.upper)
    y = network.forward(x.reshape(x.shape[0], *network.input_shape)).reshape(x.shape[0], -1)
    hits = query.violates(y).nonzero().flatten()
    if hits.numel() == 0:
        return None
    first = int(hits[0])
    return x[first].clone(), y[first].clone()


def pgd(
    network: Network,
    query: UnsafeQuery,
    lower: torch.Tensor,
    upper: torch.Tensor,
    starts: torch.Tensor,
    steps: int = 50,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Projected sign-gradient ascent of the margin from ``starts`` (N, n) inside boxes (N, n).

    Runs in float32 for speed (the caller re-checks in float64). Returns the best point per
    start and its float32 margin.
    """
    model = _float32_model(network)
    lo, hi = lower.to(torch.float32), upper.to(torch.float32)
    C32, d32 = query.C.to(torch.float32), query.d.to(torch.float32)
    width = (hi - lo).clamp(min=1e-12)
    x = starts.to(torch.float32).clone().clamp(lo, hi).requires_grad_(True)
    best_x = x.detach().clone()
    best = torch.full((x.shape[0],), -torch.inf)
    for step in range(steps):
        y = model(x.reshape(x.shape[0], *network.input_shape)).reshape(x.shape[0], -1)
        value = query.group_margin(y @ C32.T + d32)
        with torch.no_grad():
            better = value > best
            best = torch.where(better, value, best)
            best_x[better] = x[better]
        (grad,) = torch.autograd.grad(value.sum(), x)
        with torch.no_grad():
            size = 0.1 * (1 - step / steps) + 0.005
            x += size * width * grad.sign()
            x.copy_(torch.minimum(torch.maximum(x, lo), hi))
    return best_x.detach(), best


def search(
    network: Network,
    query: UnsafeQuery,
    rng: np.random.Generator,
    restarts: int = 32,
    steps: int = 50,
    samples: int = 1024,
) -> tuple[torch.Tensor, torch.Tensor] | None:
    """Random sampling, then PGD from the best samples and random restarts over the query box."""
    n = query.lower.numel()
    u = torch.as_tensor(rng.uniform(size=(samples, n)))
    points = query.lower + (query.upper - query.lower) * u
    found = confirm(network, query, points)
    if found is not None:
        return found
    values = margins(network, points, query)
    best = points[values.argsort(descending=True)[: restarts // 2]]
    center = ((query.lower + query.upper) / 2).unsqueeze(0)
    starts = torch.cat([center, best, points[: restarts - best.shape[0] - 1]])
    boxes_lo = query.lower.expand_as(starts)
    boxes_hi = query.upper.expand_as(starts)
    x, _ = pgd(network, query, boxes_lo, boxes_hi, starts, steps)
    return confirm(network, query, x)


_MODELS: dict[int, tuple[Network, torch.nn.Module]] = {}


def _float32_model(network: Network) -> torch.nn.Module:
    key = id(network)
    if key not in _MODELS or _MODELS[key][0] is not network:
        model = network.to_torch().to(torch.float32)
        for parameter in model.parameters():
            parameter.requires_grad_(False)
        _MODELS.clear()  # keep one model: the verifier works on one network at a time
        _MODELS[key] = (network, model)
    return _MODELS[key][1]
