"""split_child_bounds: one walk gives each split child the bound that bounding it alone gives.

The walk crosses a child's split neuron as stable instead of by its relaxation (``fixed`` rows of
backsubstitute); a wrong side (the intercept left in, the slope of the other child, the neuron of
another row) would rank the branching candidates on bounds of regions that are not the children.
"""

from __future__ import annotations

import numpy as np
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from assay.bounds import BetaCrownOptions, compute_bounds, split_child_bounds

from . import strategies

FEW = settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _unstable_candidates(intermediate, splits, k: int) -> torch.Tensor | None:
    """(B, k) flat indices of unstable, unsplit neurons (over the ReLU layers in order), or None
    when some domain has fewer than k."""
    flat_unstable = torch.cat([((l < 0) & (u > 0) & (s == 0)).reshape(l.shape[0], -1)
                               for l, u, s in zip(intermediate.lower, intermediate.upper, splits)], 1)
    if int(flat_unstable.sum(1).min()) < k:
        return None
    return torch.stack([row.nonzero().flatten()[-k:] for row in flat_unstable])  # later layers too


def _with_split(splits, candidates, j: int, sign: int):
    """Each domain's split history with its candidate j set to ``sign`` (+1: z ≥ 0, −1: z ≤ 0)."""
    out, start = [], 0
    for split in splits:
        flat = split.reshape(split.shape[0], -1).clone()
        size = flat.shape[1]
        inside = (candidates[:, j] >= start) & (candidates[:, j] < start + size)
        rows = inside.nonzero().flatten()
        flat[rows, candidates[rows, j] - start] = sign
        out.append(flat.reshape(split.shape))
        start += size
    return out


@FEW
@given(network=st.one_of(strategies.dense_networks(), strategies.conv_networks(), strategies.graph_networks(pooled=False)),
       seed=st.integers(0, 2**32 - 1), alpha=st.booleans())
def test_each_child_gets_the_bound_of_bounding_it_alone_and_it_holds_on_its_samples(network, seed, alpha):
    rng = np.random.default_rng(seed)
    lower, upper = strategies.random_boxes(network, rng, 3)
    C = torch.as_tensor(rng.normal(size=(2, network.output_size)))
    d = torch.as_tensor(rng.normal(size=2))
    root = compute_bounds(network, (lower, upper), (C, d), "crown")
    splits = strategies.random_splits(network, root.intermediate, rng, per_layer=1)
    parent = compute_bounds(network, (lower, upper), (C, d), "alpha" if alpha else "crown", sides="lower",
                            splits=splits)
    k = 2
    candidates = _unstable_candidates(parent.intermediate, splits, k)
    if candidates is None:
        return  # too few unstable neurons left to shortlist
    alphas = parent.alphas if alpha else None
    flat = lower.reshape(3, -1), upper.reshape(3, -1)
    estimates = split_child_bounds(network, *flat, parent.intermediate, C, d, candidates, alphas=alphas,
                                   dtype=torch.float64)
    assert estimates.shape == (3, k, 2, 2)
    x = strategies.sample_box(lower, upper, rng, 300)
    values = strategies.forward_batched(network, x) @ C.T + d  # (n, B, S)
    for j in range(k):
        for side, sign in enumerate((1, -1)):
            child = _with_split(splits, candidates, j, sign)
            alone = compute_bounds(network, (lower, upper), (C, d), "beta", sides="lower", splits=child,
                                   intermediate=parent.intermediate, refine_intermediate=False, alphas=alphas,
                                   options=BetaCrownOptions(iterations=0), return_linear=True)
            # CROWN's part of that bound (compute_bounds keeps the tighter of it and IBP): its
            # linear bound over the box, equal up to the rounding margins that compute_bounds adds
            A, b = alone.linear.lower_A.reshape(3, 2, -1), alone.linear.lower_b
            center, radius = ((flat[0] + flat[1]) / 2).unsqueeze(1), ((flat[1] - flat[0]) / 2).unsqueeze(1)
            crown = (A * center).sum(-1) - (A.abs() * radius).sum(-1) + b
            finite = torch.isfinite(alone.lower)  # an empty child (+inf) has no linear bound to compare
            assert torch.allclose(estimates[:, j, side][finite], crown[finite], rtol=1e-9, atol=1e-9), (j, sign)
            inside = strategies.satisfies_splits(network, x, child)  # (n, B)
            assert ((values >= estimates[:, j, side].unsqueeze(0) - 1e-9) | ~inside.unsqueeze(-1)).all()


def test_hand_computed_children_of_one_neuron():
    """y = relu(x) on x ∈ [−1, 1]: the z ≥ 0 child computes y = x (bounds −1 and 1 without β:
    the split does not shrink the box), the z ≤ 0 child y = 0."""
    from assay.nn import Linear, Network, ReLU

    network = Network((Linear(torch.ones(1, 1, dtype=torch.float64), torch.zeros(1, dtype=torch.float64)), ReLU(),
                       Linear(torch.ones(1, 1, dtype=torch.float64), torch.zeros(1, dtype=torch.float64))), (1,))
    lower, upper = torch.tensor([[-1.0]], dtype=torch.float64), torch.tensor([[1.0]], dtype=torch.float64)
    root = compute_bounds(network, (lower, upper), (torch.eye(1, dtype=torch.float64), torch.zeros(1, dtype=torch.float64)), "crown")
    rows = torch.tensor([[1.0], [-1.0]], dtype=torch.float64)
    estimates = split_child_bounds(network, lower, upper, root.intermediate, rows, torch.zeros(2, dtype=torch.float64),
                                   torch.tensor([[0]]), dtype=torch.float64)
    z_nonneg, z_nonpos = estimates[0, 0, 0], estimates[0, 0, 1]
    assert torch.allclose(z_nonneg, torch.tensor([-1.0, -1.0], dtype=torch.float64))  # y = x ∈ [−1, 1]
    assert torch.allclose(z_nonpos, torch.tensor([0.0, 0.0], dtype=torch.float64))    # y = 0
