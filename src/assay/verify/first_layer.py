"""Tighten a ReLU-splitting domain's first-layer pre-activation bounds with its own first-layer splits.

A domain of :mod:`assay.verify.relu_split` is the input box cut by its split constraints
``s_i z_i(x) ≥ 0``. The pre-activations of later layers are re-bounded under the splits before
them (β-CROWN), but a split cannot constrain the other neurons of its own layer that way: their
backward walks never pass through it. On the first ReLU layer, whose pre-activations
``z = W x + b`` are affine in the input, the bound under the same layer's splits is one small
Lagrangian problem per neuron and side:

    max_{x in box, s_i z_i(x) ≥ 0}  σ z_j(x)  ≤  min_{β ≥ 0}  max_{x in box}  σ z_j(x) + Σ_i β_i s_i z_i(x),

(weak duality: on the domain every added term is ≥ 0; the inner maximum over a box is closed
form), which equals the LP's optimum at the best β. A few projected Adam steps on β for every
domain, neuron and side at once give bounds that hold for any β reached; they are evaluated
with outward rounding, so they hold for the exact network. On a one-hidden-layer network with
100 of 128 neurons unstable (VNN-COMP safenlp), ten splits leave a domain's box-only bounds
unchanged, while over the splits many other neurons become stable: the domain's triangle
relaxations shrink, and its leaves (every sign known) come sooner.

A domain whose bounds cross (lower > upper for some neuron) has no point: it is empty.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass

import torch

from assay.bounds import IntermediateBounds
from assay.bounds.ibp import cast_outward
from assay.bounds.optimize import Adam
from assay.bounds.plan import gamma
from assay.nn.layers import Flatten, Linear, Reshape
from assay.nn.network import Network

__all__ = ["FirstLayer", "first_layer", "tighten_first_layer"]

# Projected Adam steps on the multipliers, and their learning rate (the multipliers are ratios
# of weights: near 1 where a split cuts the box across a neuron's own direction).
ITERATIONS = 20
LEARNING_RATE = 0.5
# The multipliers are searched in this dtype (only the final, sound evaluation is float64).
DRAFT_DTYPE = torch.float32
# Most coefficients (domains × unstable neurons × 2 sides × inputs) one tightening may hold at once;
# larger batches go in chunks.
_CHUNK_ELEMENTS = 1 << 22
# First layers larger than this (neurons × inputs) are not tightened (their rows cost more
# than the domain's own bound).
MAX_WEIGHTS = 1 << 20


@dataclass(frozen=True, eq=False)
class FirstLayer:
    """The first ReLU layer's pre-activations ``z = W x + b`` of the flat input: W (N, n), b (N,) float64."""

    W: torch.Tensor
    b: torch.Tensor


_FORMS: "weakref.WeakKeyDictionary[Network, FirstLayer | None]" = weakref.WeakKeyDictionary()


def first_layer(network: Network) -> FirstLayer | None:
    """The network's first ReLU layer as an affine map of the flat input (cached); None when the
    layers before it are not one dense layer (with reshapes) or it is larger than :data:`MAX_WEIGHTS`."""
    if network not in _FORMS:
        _FORMS[network] = _build(network)
    return _FORMS[network]


def _build(network: Network) -> FirstLayer | None:
    relus = network.relu_indices
    if not network.is_chain or not relus:
        return None
    before = network.layers[:relus[0]]
    dense = [layer for layer in before if isinstance(layer, Linear)]
    if len(dense) != 1 or not all(isinstance(layer, (Linear, Flatten, Reshape)) for layer in before):
        return None
    weight, bias = dense[0].weight, dense[0].bias
    if weight.numel() > MAX_WEIGHTS or weight.shape[1] != network.input_size:
        return None
    return FirstLayer(weight.to(torch.float64), bias.to(torch.float64))


def tighten_first_layer(form: FirstLayer, lower: torch.Tensor, upper: torch.Tensor, splits: torch.Tensor,
                        bounds: IntermediateBounds, iterations: int | None = None,
                        ) -> tuple[IntermediateBounds, torch.Tensor]:
    """``bounds`` with the first ReLU layer's bounds tightened under each domain's first-layer splits.

    Args:
        form: :func:`first_layer` of the network.
        lower, upper: (B, n) the domains' input boxes.
        splits: (B, *first layer shape) int8 split history of the first ReLU layer (+1: z ≥ 0, −1: z ≤ 0).
        bounds: pre-activation bounds valid on the domains (the first layer's already clamped by its splits).

    Returns:
        (the tightened bounds, never looser than ``bounds``; (B,) bool: domains shown empty).
        Domains without a first-layer split are left as they are.
    """
    iterations = ITERATIONS if iterations is None else iterations
    count = lower.shape[0]
    first_lower, first_upper = bounds.lower[0], bounds.upper[0]
    shape = first_lower.shape
    s = splits.reshape(count, -1)
    new_lower = first_lower.reshape(count, -1).clone()
    new_upper = first_upper.reshape(count, -1).clone()
    # Only unstable, unsplit neurons are worth tightening (the others' relaxations are exact).
    target = (new_lower < 0) & (new_upper > 0) & (s == 0)
    todo = (((s != 0).sum(1) > 0) & target.any(1)).nonzero().flatten()
    if todo.numel():
        rows = 2 * int(target[todo].sum(1).max())
        step = max(1, _CHUNK_ELEMENTS // max(1, rows * form.W.shape[1]))
        for start in range(0, todo.numel(), step):
            index = todo[start:start + step]
            up, low, neuron = _tightened(form, lower[index], upper[index], s[index], target[index], iterations)
            # into the bounds' dtype (float32 where the search refines in it) rounded outwards
            low, up = cast_outward(low, up, new_upper.dtype)
            new_upper[index] = new_upper[index].scatter_reduce(1, neuron, up, "amin")
            new_lower[index] = new_lower[index].scatter_reduce(1, neuron, low, "amax")
    empty = (new_lower > new_upper).any(1)
    new_lower, new_upper = new_lower.reshape(shape), new_upper.reshape(shape)
    return IntermediateBounds((new_lower, *bounds.lower[1:]), (new_upper, *bounds.upper[1:])), empty


def _tightened(form: FirstLayer, lower, upper, s, target, iterations: int):
    """Sound bounds of the ``target`` neurons of ``W x + b`` over each box cut by its splits ``s``.

    Returns (B, R) upper bounds, (B, R) lower bounds and (B, R) the neuron each column is for
    (padding columns repeat a neuron with bounds ±inf, which change nothing)."""
    count, neurons = s.shape
    # The splits of each domain, padded: constraint k of domain i is  sign[i, k] · z_{which[i, k]} ≥ 0.
    width = int((s != 0).sum(1).max())
    which = (s != 0).to(torch.int8).topk(width, dim=1).indices  # split neurons first
    sign = s.gather(1, which).to(torch.float64)  # 0 on padding
    # The neurons to bound, padded the same way.
    size = int(target.sum(1).max())
    chosen, neuron = target.to(torch.int8).topk(size, dim=1)
    chosen = chosen.bool()
    W, b = form.W, form.b
    cut_A, cut_b = sign.unsqueeze(2) * W[which], sign * b[which]  # (B, K, n), (B, K)
    base_A = torch.cat([W[neuron], -W[neuron]], 1)  # (B, 2R, n): rows σ z_j, σ = +1 (upper) then −1 (lower)
    base_b = torch.cat([b[neuron], -b[neuron]], 1)
    center, radius = (lower + upper) / 2, (upper - lower) / 2
    beta = _multipliers(*(t.to(DRAFT_DTYPE) for t in (base_A, base_b, cut_A, cut_b, center, radius)), iterations)
    bound = _sound_value(beta.to(torch.float64), base_A, base_b, cut_A, cut_b, center, radius)
    bound = torch.where(torch.cat([chosen, chosen], 1), bound, torch.inf)
    return bound[:, :size], -bound[:, size:], neuron


def _multipliers(base_A, base_b, cut_A, cut_b, center, radius, iterations: int) -> torch.Tensor:
    """(B, R, K) multipliers β ≥ 0 making ``max over the box of (base + β·cuts)(x)`` small: the
    best iterate of projected Adam (only a choice: any β ≥ 0 gives a sound bound)."""
    count, rows, width = base_A.shape[0], base_A.shape[1], cut_A.shape[1]
    beta = torch.zeros(count, rows, width, dtype=base_A.dtype)
    optimizer = Adam([{"params": [beta], "lr": LEARNING_RATE}], decay=1.0)
    best = torch.full((count, rows), torch.inf, dtype=base_A.dtype)
    best_beta = beta.clone()
    for _ in range(iterations + 1):
        A = base_A + beta.matmul(cut_A)  # (B, R, n)
        corner = center.unsqueeze(1) + A.sign() * radius.unsqueeze(1)  # where each row peaks on the box
        value = (A * corner).sum(2) + base_b + beta.matmul(cut_b.unsqueeze(2)).squeeze(2)
        better = value < best
        best = torch.where(better, value, best)
        best_beta = torch.where(better.unsqueeze(2), beta, best_beta)
        # d value / d β_k: constraint k at the peak (the inner maximum's gradient, Danskin)
        beta.grad = corner.matmul(cut_A.transpose(1, 2)) + cut_b.unsqueeze(1)
        optimizer.step()
        beta.clamp_(min=0)
    return best_beta


def _sound_value(beta, base_A, base_b, cut_A, cut_b, center, radius) -> torch.Tensor:
    """(B, 2N) upper bounds, for the exact network, of ``max over the box of (base + β·cuts)(x)`` (β ≥ 0).

    The combined row is computed in float64; the exact one differs by at most γ times the sum of
    its terms' magnitudes, and its maximum over the box by γ times those magnitudes times
    ``|center| + radius`` (Higham's bound for sums of products, doubled by ``gamma``)."""
    with torch.no_grad():
        A = base_A + beta.matmul(cut_A)
        value = A.matmul(center.unsqueeze(2)).squeeze(2) + A.abs().matmul(radius.unsqueeze(2)).squeeze(2) \
            + base_b + beta.matmul(cut_b.unsqueeze(2)).squeeze(2)
        magnitude_A = base_A.abs() + beta.matmul(cut_A.abs())
        magnitude_b = base_b.abs() + beta.matmul(cut_b.abs().unsqueeze(2)).squeeze(2)
        terms = beta.shape[2] + center.shape[1] + 4
        margin = gamma(terms, torch.float64) * 2 * (
            magnitude_A.matmul((center.abs() + radius).unsqueeze(2)).squeeze(2) + magnitude_b)
        return torch.nextafter(value + margin, torch.tensor(torch.inf, dtype=torch.float64))
