"""Fresh uniform points of a ReLU-split piece: PREMAP's adaptive resampling for guide points.

A piece of :mod:`assay.preimage.relu_refinement` is ``{x ∈ box : every split ReLU's pre-activation
has its split's sign}`` (``z ≥ 0`` for +1, ``z < 0`` for −1, the pool's own convention). Deep
pieces hold few pool points; :func:`sample_piece` draws more, uniformly on the piece:

* rejection: uniform points of the box, kept when a forward pass shows the split history holds;
* once the acceptance rate falls below ``switch_rate`` (PREMAP: 1 %), hit-and-run for the rest:
  parallel chains started at points known to be in the piece; each step picks a random direction,
  takes the chord of the box through the current point, draws a point uniformly on the chord and,
  while it violates the split history, shrinks the chord towards the current point and draws again
  (the shrinkage step of Neal's slice sampler). Each step leaves the uniform distribution on the
  piece invariant, also for a non-convex piece, so chains started from uniform points of the
  piece stay uniform (their points are correlated, not independent).

Every point returned satisfies the split history by the forward pass that accepted it. The draws
(forward-passed candidates) are capped by ``max_draws`` and stop when ``deadline`` passes.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from assay.nn import Network

__all__ = ["PieceSample", "sample_piece", "violates"]

# Shrinkage attempts per hit-and-run step before a chain stays where it is for that step.
_SHRINKS = 40


@dataclass(frozen=True)
class PieceSample:
    """Fresh points of a piece: ``z`` (M, k), their flat pre-activations ``pre`` (M, total ReLUs),
    ``draws`` (candidates forward-passed), ``accepted_by_rejection`` and ``hit_and_run`` (whether
    the chains ran)."""

    z: torch.Tensor
    pre: torch.Tensor
    draws: int
    accepted_by_rejection: int
    hit_and_run: bool


def pre_activations(network: Network, z: torch.Tensor) -> list[torch.Tensor]:
    """Every ReLU layer's inputs (flat, (N, n_l)) for points z (N, k), float64."""
    return [p.reshape(p.shape[0], -1) for p in network.pre_activations(z.to(torch.float64))]


def flat_pre_activations(network: Network, z: torch.Tensor) -> torch.Tensor:
    """:func:`pre_activations` side by side: (N, total ReLUs)."""
    return torch.cat(pre_activations(network, z), 1)


def violates(pre: torch.Tensor, split: torch.Tensor) -> torch.Tensor:
    """(N,) bool: some split ReLU's pre-activation lies on the wrong side (``split`` flat, (total ReLUs,),
    +1: needs ``z ≥ 0``, −1: needs ``z < 0``, 0: free)."""
    return ((split > 0) & (pre < 0)).any(1) | ((split < 0) & (pre >= 0)).any(1)


def sample_piece(network: Network, lower: torch.Tensor, upper: torch.Tensor, split: torch.Tensor, need: int,
                 starts: torch.Tensor, rng: torch.Generator, *, max_draws: int, switch_rate: float = 0.01,
                 chains: int = 32, deadline=None) -> PieceSample:
    """Up to ``need`` fresh uniform points of the piece ``{x ∈ [lower, upper] : split history holds}``.

    Args:
        network: the network whose ReLUs ``split`` refers to.
        lower, upper: the piece's box, (k,) float64.
        split: (total ReLUs,) the split history, flat over the ReLU layers in order.
        need: how many points are wanted.
        starts: (S, k) points known to be in the piece, the chains' starting points (uniform on the
            piece for the chains to be); the accepted rejection points join them.
        rng: the source of every random number.
        max_draws: at most this many candidates are forward-passed.
        switch_rate: hit-and-run replaces rejection when fewer than this share of the box's
            points were accepted (PREMAP: 0.01).
        chains: hit-and-run chains run side by side.
        deadline: an object with ``passed()``; no new batch starts after it passed.

    Returns:
        :class:`PieceSample` with at most ``need`` points (fewer when the cap or the deadline
        stopped it, or no point of the piece is known for the chains).
    """
    split = split.to(lower.device)
    k = lower.numel()
    width = upper - lower
    got_z, got_pre = [], []
    got, draws = 0, 0
    # Rejection, in batches sized by the rate seen so far.
    while got < need and draws < max_draws and not (deadline is not None and deadline.passed()):
        rate = got / draws if draws else 1.0
        if draws and rate < switch_rate:
            break
        batch = min(max_draws - draws, max(256, int(2 * (need - got) / max(rate, switch_rate))), 1 << 16)
        z = lower + torch.rand(batch, k, generator=rng, dtype=torch.float64) * width
        pre = flat_pre_activations(network, z)
        ok = ~violates(pre, split)
        draws += batch
        got_z.append(z[ok])
        got_pre.append(pre[ok])
        got += int(ok.sum())
    accepted = got
    ran = False
    pool = torch.cat([starts.to(torch.float64).reshape(-1, k)] + got_z)
    if got < need and draws < max_draws and pool.shape[0]:
        ran = True
        x = pool[torch.randint(pool.shape[0], (min(chains, need - got),), generator=rng)]
        while got < need and draws < max_draws and not (deadline is not None and deadline.passed()):
            x, pre, moved, used = _hit_and_run_step(network, lower, upper, split, x, rng, max_draws - draws)
            draws += used
            take = moved.nonzero().squeeze(1)[: need - got]
            got_z.append(x[take])
            got_pre.append(pre[take])
            got += take.numel()
            if used == 0:
                break
    z = torch.cat(got_z) if got_z else lower.new_zeros(0, k)
    pre = torch.cat(got_pre) if got_pre else lower.new_zeros(0, 0)
    return PieceSample(z[:need], pre[:need], draws, accepted, ran)


def _hit_and_run_step(network, lower, upper, split, x, rng, budget):
    """One hit-and-run step of every chain: (new x, its pre-activations, which chains moved, draws used)."""
    n, k = x.shape
    d = torch.randn(n, k, generator=rng, dtype=torch.float64)
    d = d / d.norm(dim=1, keepdim=True).clamp(min=1e-300)
    # The chord of the box through x: lower ≤ x + t d ≤ upper.
    safe = torch.where(d.abs() > 1e-300, d, torch.full_like(d, 1e-300))
    t1, t2 = (lower - x) / safe, (upper - x) / safe
    t_low = torch.minimum(t1, t2).max(1).values.clamp(max=0.0)
    t_high = torch.maximum(t1, t2).min(1).values.clamp(min=0.0)
    new = x.clone()
    new_pre = torch.zeros(n, int(split.numel()), dtype=torch.float64)
    pending = torch.ones(n, dtype=torch.bool)
    used = 0
    for _ in range(_SHRINKS):
        idx = pending.nonzero().squeeze(1)
        if idx.numel() == 0 or used + idx.numel() > budget:
            break
        t = t_low[idx] + torch.rand(idx.numel(), generator=rng, dtype=torch.float64) * (t_high[idx] - t_low[idx])
        cand = torch.minimum(torch.maximum(x[idx] + t.unsqueeze(1) * d[idx], lower), upper)
        pre = flat_pre_activations(network, cand)
        ok = ~violates(pre, split)
        used += idx.numel()
        new[idx[ok]] = cand[ok]
        new_pre[idx[ok]] = pre[ok]
        pending[idx[ok]] = False
        bad, tb = idx[~ok], t[~ok]
        # Shrink the chord towards the current point (t = 0), which lies in the piece.
        t_low[bad] = torch.where(tb < 0, tb, t_low[bad])
        t_high[bad] = torch.where(tb >= 0, tb, t_high[bad])
    return new, new_pre, ~pending, used
