"""Preimage refinement by ReLU splitting: the strategy for regions with many free inputs.

A piece is the region's whole box restricted by a *split history*: some ReLUs constrained to be
active (pre-activation ``z ≥ 0``) or inactive (``z ≤ 0``). Its approximation is
``{x ∈ box : the splits hold, A x + b ≥ 0}`` with ``A x + b`` sound linear bounds of the
specification's rows over the box under those splits (:func:`assay.bounds.compute_bounds` with
``splits=``; β-CROWN with the volume objective for ``method="alpha"``). The splits are part of
the membership test (a forward pass tells which side of each split ReLU a point lies on), so the
argument of :mod:`assay.preimage.refinement` carries over unchanged: a point that satisfies the
splits lies in the domain the bounds hold on.

Volumes come from one uniform sample *pool* of the region drawn at the start: a piece's samples
are the pool points whose activations satisfy its splits (children partition their parent's),
so its volume is estimated as (its pool points / pool size) × region volume and every count is
part of one multinomial sample.

Which ReLU to split, per piece (weights by name, see ``heuristic_weights``): ``stable`` — every
pool point of the piece lies on one side of it (pre-emptive stabilisation, as PREMAP2: one child
holds no sample); ``sensitivity`` — BaBSR-style bound on the specification's sensitivity to it
times the looseness of its relaxation ``u·(−l)/(u − l)``; ``gap`` — that looseness alone;
``balance`` — how evenly the piece's pool points divide. PREMAP2's Table I heuristics ``extra``,
``area`` and ``under`` need every neuron's linear bounds, which the bound engine does not return.
"""

from __future__ import annotations

import torch

from assay.bounds import AlphaCrownOptions, BetaCrownOptions, compute_bounds, gradient_bounds
from assay.nn import Network
from assay.preimage.refinement import RefinementCounters, check_samples, satisfies, stack_samples, volume_objective
from assay.verify.search import BoundedBranches, Branches, LeafDecision

__all__ = ["ReluPreimageRefinement", "DEFAULT_HEURISTIC_WEIGHTS", "pre_activations"]

DEFAULT_HEURISTIC_WEIGHTS = {"stable": 1.0, "sensitivity": 1.0, "gap": 0.25, "balance": 0.0}


def pre_activations(network: Network, z: torch.Tensor) -> list[torch.Tensor]:
    """Every ReLU layer's inputs (flat, (N, n_l)) for points z (N, k), float64."""
    return [p.reshape(p.shape[0], -1) for p in network.pre_activations(z.to(torch.float64))]


class ReluPreimageRefinement:
    """The ReLU-splitting strategy of preimage refinement (see the module docstring).

    Args as :class:`~assay.preimage.refinement.PreimageRefinement`, plus ``lower``/``upper`` (the
    region's box, (k,)), ``pool`` (uniform samples of the region) and ``heuristic_weights``.
    """

    def __init__(self, network: Network, C, d, kind: str, *, lower, upper, pool: int, method: str,
                 alpha_iterations: int, rng: torch.Generator, heuristic_weights: dict | None = None):
        self.network, self.C, self.d, self.kind, self.method = network, C, d, kind, method
        self.lower, self.upper = lower, upper
        self.weights = dict(DEFAULT_HEURISTIC_WEIGHTS, **(heuristic_weights or {}))
        self.alpha_iterations = alpha_iterations
        self.counters = RefinementCounters()
        self._sign = 1.0 if kind == "under" else -1.0
        self.region_volume = float(torch.prod(upper - lower))
        self.z = lower + torch.rand(pool, lower.numel(), generator=rng, dtype=torch.float64) * (upper - lower)
        self.pre = pre_activations(network, self.z)
        y = network.forward(self.z)
        self.inside = ((y @ C.T + d) >= 0).all(1)
        # Half the pool steers the refinement, the other half measures it (as for input splitting).
        self.guide = torch.arange(pool) % 2 == 0
        self.measure_size = int((~self.guide).sum())
        self.counters.samples += pool
        self.shapes = [network.shapes[i] for i in network.relu_indices]
        self._members: dict[int, torch.Tensor] = {}
        self._next_id = 0

    # ------------------------------------------------------------------ the strategy's four steps
    def root(self) -> Branches:
        splits = tuple(torch.zeros(1, *shape, dtype=torch.int8) for shape in self.shapes)
        return self._pieces(splits, [torch.arange(self.z.shape[0])], None)

    def bound(self, branches: Branches, deadline, stats) -> BoundedBranches:
        """Pieces are bounded when created; here: closed are the exact ones and those with no
        unstable, unsplit ReLU left (the network is affine there: the bounds are exact)."""
        closed = branches.tags["exact"] | ~self._splittable(branches).any(1)
        for piece in branches.tags["id"][closed].tolist():
            self._members.pop(piece, None)
        return BoundedBranches(branches, closed, torch.zeros(len(branches), dtype=torch.float64))

    def probe(self, bounded, open_, deadline, stats):
        return None

    def decide(self, bounded, open_, deadline, stats) -> LeafDecision:
        return LeafDecision(torch.zeros_like(open_))

    def split(self, bounded: BoundedBranches, open_: torch.Tensor) -> Branches:
        parents = bounded.branches.select(open_)
        members = [self._members.pop(piece) for piece in parents.tags["id"].tolist()]
        scores = self._scores(parents, members)
        best = scores.argmax(1)
        sizes = [int(torch.tensor(shape).prod()) for shape in self.shapes]
        offsets = torch.tensor([0] + sizes[:-1]).cumsum(0).tolist()
        flat_pre = torch.cat(self.pre, 1)
        child_splits = [[] for _ in self.shapes]
        child_members = []
        for p, neuron in enumerate(best.tolist()):
            layer = max(k for k, offset in enumerate(offsets) if offset <= neuron)
            for sign in (1, -1):
                for k, s in enumerate(parents.splits):
                    flat = s[p].reshape(-1).clone()
                    if k == layer:
                        flat[neuron - offsets[k]] = sign
                    child_splits[k].append(flat.reshape(s.shape[1:]))
                value = flat_pre[members[p], neuron]
                child_members.append(members[p][value >= 0] if sign > 0 else members[p][value < 0])
        splits = tuple(torch.stack(c) for c in child_splits)
        both = torch.arange(len(parents)).repeat_interleave(2)
        return self._pieces(splits, child_members, parents.parents.select(both))

    # ------------------------------------------------------------------ pieces
    def _pieces(self, splits, members: list[torch.Tensor], parents) -> Branches:
        B, k = len(members), self.lower.numel()
        lower, upper = self.lower.expand(B, k), self.upper.expand(B, k)
        if any(m.numel() for m in members):
            z, inside, guide, valid = stack_samples([(self.z[m], self.inside[m], self.guide[m]) for m in members])
        else:
            z = torch.zeros(B, 1, k, dtype=torch.float64)
            inside = guide = valid = torch.zeros(B, 1, dtype=torch.bool)
        sign = self._sign
        options, objective, method = None, None, "crown"
        if self.method == "alpha":
            method = "alpha" if parents is None else "beta"
            options = AlphaCrownOptions(iterations=self.alpha_iterations) if parents is None else \
                BetaCrownOptions(iterations=self.alpha_iterations)
            objective = volume_objective(self.kind, z, (inside if self.kind == "under" else ~inside) & valid & guide)
        result = compute_bounds(self.network, (lower, upper), (sign * self.C, sign * self.d), method, dtype="float64",
                                sides="both", splits=[s.to(torch.int64) for s in splits], intermediate=parents,
                                return_linear=True, options=options, objective=objective)
        self.counters.bound_calls += 1
        A = result.linear.lower_A.reshape(B, self.C.shape[0], k)
        b = result.linear.lower_b
        if self.kind == "over":
            A, b = -A, -b
        infeasible = torch.isinf(result.lower).all(1) & (result.lower > 0).all(1)  # the splits contradict each other
        row_lower, row_upper = result.lower, result.upper
        g_lower, g_upper = (row_lower, row_upper) if self.kind == "under" else (-row_upper, -row_lower)
        nowhere = infeasible | (g_upper < 0).any(1)
        everywhere = ~nowhere & (g_lower >= 0).all(1)
        A = torch.where((everywhere | nowhere).view(B, 1, 1), torch.zeros_like(A), A)
        b = torch.where(everywhere.view(B, 1), torch.zeros_like(b), b)
        b = torch.where(nowhere.view(B, 1), torch.full_like(b, -1.0), b)
        member = satisfies(A, b, z, inward=self.kind == "under") & valid
        inside = inside & valid
        # A piece proved to hold no preimage point must hold no preimage sample either.
        wrong_empty = nowhere.unsqueeze(1) & inside
        check_samples(self.kind, member, inside, z, wrong_empty)
        measure = valid & ~guide
        n = measure.sum(1).to(torch.float64)
        volume = self.region_volume * n / self.measure_size
        k_pre, k_poly = (inside & measure).sum(1).to(torch.float64), (member & measure).sum(1).to(torch.float64)
        # The queue is ordered by the guide samples' gap: what the measure samples show must not
        # steer the refinement (chasing them would fit the estimates to them).
        steer = valid & guide
        seen_pre, seen_poly = (inside & steer).sum(1).to(torch.float64), (member & steer).sum(1).to(torch.float64)
        gap = (seen_pre - seen_poly) if self.kind == "under" else (seen_poly - seen_pre)
        n_steer = steer.sum(1).to(torch.float64)
        unseen = -1.0 / (1.0 + volume / self.region_volume)
        ids = torch.arange(self._next_id, self._next_id + B)
        self._next_id += B
        for i, m in enumerate(members):
            self._members[int(ids[i])] = m
        self.counters.pieces += B
        tags = {"A": A, "b": b, "n": n, "k_pre": k_pre, "k_poly": k_poly, "exact": everywhere | nowhere,
                "empty": nowhere, "inside": everywhere, "volume": volume,
                "priority": torch.where(gap > 0, volume * gap / n_steer.clamp(min=1), unseen), "id": ids}
        weight = n / self.measure_size  # the piece's share of the region (the leaves' shares sum to 1)
        return Branches(lower, upper, tuple(s.to(torch.int8) for s in splits), result.intermediate, weight, None, tags)

    def _splittable(self, branches: Branches) -> torch.Tensor:
        """(B, total ReLUs) bool: unstable and not yet split."""
        bounds = branches.parents
        return torch.cat([((bounds.lower[k] < 0) & (bounds.upper[k] > 0) & (branches.splits[k] == 0)).reshape(len(branches), -1)
                          for k in range(len(self.shapes))], 1)

    def _scores(self, parents: Branches, members: list[torch.Tensor]) -> torch.Tensor:
        """(P, total ReLUs) split scores, −inf where a split is pointless."""
        P = len(parents)
        candidates = self._splittable(parents)
        bounds = parents.parents
        lower = torch.cat([t.reshape(P, -1) for t in bounds.lower], 1)
        upper = torch.cat([t.reshape(P, -1) for t in bounds.upper], 1)
        looseness = torch.where(candidates, upper * (-lower) / (upper - lower).clamp(min=1e-30), torch.zeros_like(lower))
        w = self.weights
        score = torch.zeros_like(lower)

        def normalised(values):
            top = values.max(1, keepdim=True).values
            return values / top.clamp(min=1e-30)

        if w["gap"]:
            score += w["gap"] * normalised(looseness)
        if w["sensitivity"]:
            rows = self.C.abs().sum(0).expand(P, -1)  # every row's sensitivity at once (magnitudes only)
            sensitivity = torch.cat([g.reshape(P, -1) for g in gradient_bounds(self.network, rows, bounds).relu_outputs], 1)
            score += w["sensitivity"] * normalised(sensitivity * looseness)
        if w["stable"] or w["balance"]:
            flat_pre = torch.cat(self.pre, 1)
            for p, m in enumerate(members):
                m = m[self.guide[m]]
                if m.numel() == 0:
                    continue
                active = (flat_pre[m] >= 0).to(torch.float64).mean(0)
                if w["stable"]:
                    score[p] += w["stable"] * ((active == 0) | (active == 1)).to(torch.float64)
                if w["balance"]:
                    score[p] += w["balance"] * (1 - (2 * active - 1).abs())
        return torch.where(candidates, score + 1e-12, torch.full_like(score, -torch.inf))

