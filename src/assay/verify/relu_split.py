"""Branch and bound over ReLU phases with β-CROWN (for networks with many inputs).

Input splitting scales with the input dimension; for images and other wide inputs the box
stays whole and the search splits unstable ReLUs instead (Wang et al., β-CROWN, NeurIPS 2021).
A *domain* is a split history: some neurons fixed to z ≥ 0 or z ≤ 0. Each round bounds a
batch of domains with β-CROWN (split constraints enter as optimised Lagrange multipliers,
intermediate bounds are inherited from the parent and clamped by the splits), drops the
domains where some row of the unsafe conjunction has a negative upper bound, probes the rest
for counterexamples and splits each on the unstable neuron with the best BaBSR-style score
(the row's gradient bound through the neuron times the area of its relaxation; Bunel et al.,
JMLR 2020).

A domain whose every ReLU has a known sign is affine on its inputs and is decided exactly by
:mod:`assay.verify.leaf_lp` instead of being split further.

Soundness: a group is refuted only when every leaf of the split tree (each a set of inputs
whose union is the whole box) has a sound negative upper bound, a re-checked LP dual
certificate, or is empty; VIOLATED only with a point confirmed by a float64 forward pass.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch

from assay.bounds import AlphaCrownOptions, BetaCrownOptions, IntermediateBounds, compute_bounds, gradient_bounds
from assay.nn.network import Network
from assay.verify.attack import confirm, pgd
from assay.verify.deadline import Deadline
from assay.verify.input_split import SearchStats
from assay.verify.leaf_lp import REFUTED, VIOLATED, decide_leaf, is_leaf
from assay.verify.problem import UnsafeQuery
from assay.verify.result import VerificationStatus


def relu_split(
    network: Network,
    query: UnsafeQuery,
    deadline: Deadline,
    *,
    dtype: str = "float64",
    batch_size: int = 256,
    stats: SearchStats,
    progress: Callable[[float, int], None] | None = None,
    beta_iterations: int = 10,
) -> tuple[VerificationStatus, tuple[torch.Tensor, torch.Tensor] | None]:
    """Decide one unsafe query by ReLU splitting. Returns (status, (x, y) for VIOLATED).

    Each conjunction (group) of the query is refuted separately; the query holds when all are.
    """
    worst = VerificationStatus.HOLDS
    groups = int(query.groups.max()) + 1
    for g in range(groups):
        rows = query.groups == g
        status, found = _refute_conjunction(
            network, query, query.C[rows], query.d[rows], deadline, dtype, batch_size, stats, beta_iterations,
            (lambda done, pending, g=g: progress((g + done) / groups, pending)) if progress else None,
        )
        if status in (VerificationStatus.VIOLATED, VerificationStatus.TIMEOUT):
            return status, found
        if status is VerificationStatus.UNKNOWN:
            worst = status
    return worst, None


def _refute_conjunction(network, query, C, d, deadline, dtype, batch_size, stats, beta_iterations, progress):
    shape = network.input_shape
    box = (query.lower.reshape(1, *shape), query.upper.reshape(1, *shape))
    root = compute_bounds(network, box, spec=(C, d), method="alpha", dtype=dtype, sides="upper",
                          options=AlphaCrownOptions(iterations=20), return_linear=True, deadline=deadline.at)
    stats.bound_calls += 1
    stats.domains += 1
    if (root.upper < 0).any():
        return VerificationStatus.HOLDS, None
    found = _probe(network, query, root, torch.ones(1, dtype=torch.bool))
    if found is not None:
        return VerificationStatus.VIOLATED, found
    if deadline.passed():
        return VerificationStatus.TIMEOUT, None
    if is_leaf(root.intermediate.lower, root.intermediate.upper).item():
        verdict, found = decide_leaf(network, query, C, d, [t[0] for t in root.intermediate.lower],
                                     [t[0] for t in root.intermediate.upper])
        stats.leaf_lps += 1
        status = {REFUTED: VerificationStatus.HOLDS, VIOLATED: VerificationStatus.VIOLATED}
        return status.get(verdict, VerificationStatus.UNKNOWN), found
    relu_shapes = [t.shape[1:] for t in root.intermediate.lower]
    empty_splits = [torch.zeros(1, *s, dtype=torch.int8) for s in relu_shapes]
    children = _branch(network, C, empty_splits, root.intermediate, root.upper)
    # Pending domains in chunks: (splits per layer, the parent's intermediate bounds, depth).
    pending = 2
    pending_chunks = [(children[0], children[1], torch.ones(2, dtype=torch.long))]
    done_mass = 0.0  # fraction of the split tree's leaves closed, weighting a depth-k leaf by 2^-k
    options = BetaCrownOptions(iterations=beta_iterations)
    while pending_chunks:
        if deadline.passed():
            return VerificationStatus.TIMEOUT, None
        splits, parents, depth = _take(pending_chunks, deadline.batch(batch_size))
        count = splits[0].shape[0]
        pending -= count
        started = time.monotonic()
        result = compute_bounds(
            network, (box[0].expand(count, *shape), box[1].expand(count, *shape)), spec=(C, d),
            method="beta", dtype=dtype, sides="upper", splits=[s.to(torch.int64) for s in splits],
            intermediate=parents, options=options, return_linear=True, deadline=deadline.at,
        )
        deadline.record(count, time.monotonic() - started)
        stats.bound_calls += 1
        stats.domains += count
        closed = (result.upper < 0).any(1)
        done_mass += float(torch.pow(2.0, -depth[closed].to(torch.float64)).sum())
        open_ = ~closed
        if open_.any():
            found = _probe(network, query, result, open_, attack=stats.bound_calls % 4 == 0, deadline=deadline)
            if found is not None:
                return VerificationStatus.VIOLATED, found
            # Open domains whose every ReLU has a known sign are decided exactly by an LP.
            leaves = open_ & is_leaf(result.intermediate.lower, result.intermediate.upper)
            for index in leaves.nonzero().flatten().tolist():
                if deadline.passed():
                    return VerificationStatus.TIMEOUT, None
                verdict, found = decide_leaf(network, query, C, d, [t[index] for t in result.intermediate.lower],
                                             [t[index] for t in result.intermediate.upper])
                stats.leaf_lps += 1
                if verdict == VIOLATED:
                    return VerificationStatus.VIOLATED, found
                if verdict != REFUTED:
                    return VerificationStatus.UNKNOWN, None
                done_mass += float(2.0 ** -float(depth[index]))
            open_ = open_ & ~leaves
        if open_.any():
            children = _branch(
                network, C, [s[open_] for s in splits], result.intermediate.select(open_), result.upper[open_],
            )
            child_splits, child_parents, _ = children
            pending_chunks.append((child_splits, child_parents, (depth[open_] + 1).repeat(2)))
            pending += child_splits[0].shape[0]
        stats.max_pending = max(stats.max_pending, pending)
        if progress is not None:
            progress(done_mass, pending)
    return VerificationStatus.HOLDS, None


def _probe(network, query, result, open_, attack: bool = False, deadline: Deadline | None = None):
    """Corners of the box that maximise the open domains' linear upper bounds (+ the center);
    with ``attack``, also PGD started from the corners of the 16 least refuted domains."""
    A = result.linear.upper_A[open_]
    A = A.reshape(A.shape[0], A.shape[1], -1)
    lower, upper = query.lower, query.upper
    corners = torch.where(A > 0, upper, lower)  # (B, S, n)
    candidates = torch.cat([corners.reshape(-1, lower.numel())[:512], ((lower + upper) / 2).unsqueeze(0)])
    found = confirm(network, query, candidates)
    if found is None and attack:
        worst = result.upper[open_].amin(1).argsort(descending=True)[:16]
        starts = corners[worst, result.upper[open_][worst].argmin(1)]
        x, _ = pgd(network, query, lower.expand_as(starts), upper.expand_as(starts), starts, steps=20,
                   deadline=deadline)
        found = confirm(network, query, x)
    return found


def _branch(network, C, splits, intermediate: IntermediateBounds, row_upper):
    """Two children per domain, splitting its best-scoring unstable, unsplit ReLU (every domain
    must have one: leaves are decided by :mod:`assay.verify.leaf_lp`).

    Returns (child splits per layer, child intermediate bounds, None).
    """
    count = splits[0].shape[0]
    scores = _babsr_scores(network, C, splits, intermediate, row_upper)
    flat = torch.cat([s.reshape(count, -1) for s in scores], 1)
    best = flat.argmax(1)
    if not (flat.gather(1, best.unsqueeze(1)) > 0).all():
        # Splitting a neuron that is stable or already split changes nothing: the search would
        # never end. Every domain handed here must have an unstable, unsplit neuron.
        raise RuntimeError("ReLU splitting was asked to branch a domain with no unstable, unsplit neuron")
    sizes = [s[0].numel() for s in splits]
    offsets = torch.tensor([0] + sizes[:-1]).cumsum(0)
    children = []
    for sign in (1, -1):
        child = []
        for k, s in enumerate(splits):
            flat_split = s.reshape(count, -1).clone()
            in_layer = (best >= offsets[k]) & (best < offsets[k] + sizes[k])
            rows = in_layer.nonzero().flatten()
            flat_split[rows, best[rows] - offsets[k]] = sign
            child.append(flat_split.reshape(s.shape))
        children.append(child)
    child_splits = [torch.cat([children[0][k], children[1][k]]) for k in range(len(splits))]
    both = torch.cat([torch.arange(count), torch.arange(count)])
    return child_splits, intermediate.select(both), None


def _babsr_scores(network, C, splits, intermediate, row_upper):
    """Per ReLU layer, (B, *shape) scores: > 0 only on unstable, unsplit neurons.

    The row the domain is closest to refuting (least upper bound) gives a bound on its
    sensitivity to each neuron (:func:`assay.bounds.gradient_bounds`); the score multiplies it by
    the relaxation's intercept u·(−l)/(u − l), the looseness a split removes.
    """
    sensitivity = gradient_bounds(network, C[row_upper.argmin(1)], intermediate).relu_outputs
    scores = []
    for k, g in enumerate(sensitivity):
        lower, upper = intermediate.lower[k], intermediate.upper[k]
        unstable = (lower < 0) & (upper > 0) & (splits[k] == 0)
        area = torch.where(unstable, upper * (-lower) / (upper - lower).clamp(min=1e-30), torch.zeros_like(lower))
        # Every unstable neuron scores above zero, so a domain that is not a leaf always has a
        # neuron to split even where the sensitivity bound vanishes. (The floor is added in the
        # scores' own dtype: float64's tiny is zero in float32.)
        floor = unstable.to(area.dtype) * torch.finfo(area.dtype).tiny
        scores.append(g * area + floor)
    return scores


def _take(chunks: list, count: int):
    """Pop up to ``count`` domains from the end of the pending chunks (depth first)."""
    taken_splits, taken_parents, taken_depths, have = [], [], [], 0
    while chunks and have < count:
        splits, parents, depth = chunks.pop()
        n = splits[0].shape[0]
        need = count - have
        if n > need:
            keep, take = slice(0, n - need), slice(n - need, n)
            chunks.append(([s[keep] for s in splits], parents.select(keep), depth[keep]))
            splits, parents, depth = [s[take] for s in splits], parents.select(take), depth[take]
        taken_splits.append(splits)
        taken_parents.append(parents)
        taken_depths.append(depth)
        have += splits[0].shape[0]
    layers = len(taken_splits[0])
    merged = IntermediateBounds(
        tuple(torch.cat([p.lower[k] for p in taken_parents]) for k in range(layers)),
        tuple(torch.cat([p.upper[k] for p in taken_parents]) for k in range(layers)),
    )
    return [torch.cat([s[k] for s in taken_splits]) for k in range(layers)], merged, torch.cat(taken_depths)
