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

Adaptive resampling (PREMAP's, for the *guide* points only): a child left with fewer than n/2
guide points (n = ``samples``) gets fresh uniform points of its piece (:mod:`assay.preimage.resample`:
rejection from the box with the split history checked by a forward pass, hit-and-run below 1 %
acceptance), at most ``resample_draws`` candidates per piece per split. They join the pool as guide
points (their descendants reuse them) and only steer: the α volume objective, the split scores and
the queue's order. The measuring half is the pool drawn at the start, untouched, so every volume
estimate and its exact binomial interval keep their meaning. Off by default (``resample=True`` turns
it on): on digit patches it took as many pieces to reach a ratio and 1.25–2 times as long.

Which ReLU to split, per piece: the unstable, unsplit neuron with the best weighted score
(``heuristic_weights``; every score is divided by its largest value over the piece's candidates
before weighting). PREMAP2's Table I scores, with Λ_j = Σ_rows |coefficient of neuron j's input in
the piece's bound of the rows| (:func:`assay.bounds.relu_coefficients`, with the bound's α slopes)
and [l_j, u_j] its pre-activation bounds on the piece:

* ``extra`` (1.0) — Λ_j times the mean of −z_j over the piece's guide samples with z_j < 0: how
  far below zero the relaxation reaches where the samples are;
* ``area`` (0.75) — Λ_j · l_j²: the area the relaxation loses on the negative side;
* ``under`` (0.5) — Λ_j · |l_j|: the most it loses there;
* ``gap`` (0.25) — the chord's height over zero, u_j·(−l_j)/(u_j − l_j);
* ``stable`` (1.0) — every guide sample of the piece lies on one side of it (pre-emptive
  stabilisation, as PREMAP2: one child holds no sample).

Beside them (weight 0 by default): ``sensitivity`` — BaBSR-style bound on the specification's
sensitivity to the neuron times its ``gap``; ``balance`` — how evenly the piece's samples divide.
``heuristic_weights="sensitivity"`` selects assay's earlier scores (stable 1, sensitivity 1,
gap 0.25); see :data:`HEURISTIC_PRESETS`.
"""

from __future__ import annotations

import torch

from assay.bounds import AlphaCrownOptions, BetaCrownOptions, compute_bounds, gradient_bounds, relu_coefficients
from assay.errors import OptionError
from assay.nn import Network
from assay.preimage.refinement import RefinementCounters, check_samples, satisfies, stack_samples, volume_objective
from assay.preimage.resample import pre_activations, sample_piece
from assay.verify.search import BoundedBranches, Branches, LeafDecision

__all__ = ["ReluPreimageRefinement", "DEFAULT_HEURISTIC_WEIGHTS", "HEURISTIC_PRESETS", "heuristic_weights_for",
           "pre_activations"]

# PREMAP2's defaults (Table I) plus its pre-emptive stabilisation.
DEFAULT_HEURISTIC_WEIGHTS = {"extra": 1.0, "area": 0.75, "under": 0.5, "gap": 0.25, "stable": 1.0,
                             "sensitivity": 0.0, "balance": 0.0}
HEURISTIC_PRESETS = {
    "premap2": DEFAULT_HEURISTIC_WEIGHTS,
    # assay's scores before PREMAP2's: BaBSR-style sensitivity, looseness and stabilisation.
    "sensitivity": {"extra": 0.0, "area": 0.0, "under": 0.0, "gap": 0.25, "stable": 1.0, "sensitivity": 1.0,
                    "balance": 0.0},
}
# The pool grows for tiny preimages (see ReluPreimageRefinement._grow_measure) to at most this many
# times its first size and this many stored numbers (points × (inputs + ReLUs); 128 MB in float64).
POOL_GROWTH = 16
POOL_ELEMENTS = 1 << 24
# The scores that weigh a neuron by its coefficient in the piece's bound.
_COEFFICIENT_SCORES = ("extra", "area", "under")


def heuristic_weights_for(weights: dict | str | None) -> dict:
    """Every score's weight: a preset's name (:data:`HEURISTIC_PRESETS`), or a dict of weights by
    name (names left out keep :data:`DEFAULT_HEURISTIC_WEIGHTS`), or None (the defaults).

    Raises:
        OptionError: an unknown preset or score name, or a negative weight.
    """
    if weights is None:
        return dict(DEFAULT_HEURISTIC_WEIGHTS)
    if isinstance(weights, str):
        if weights not in HEURISTIC_PRESETS:
            raise OptionError(f"heuristic_weights={weights!r} is not a preset; use one of {sorted(HEURISTIC_PRESETS)} "
                              f"or a dict of weights by name ({sorted(DEFAULT_HEURISTIC_WEIGHTS)})")
        return dict(HEURISTIC_PRESETS[weights])
    unknown = sorted(set(weights) - set(DEFAULT_HEURISTIC_WEIGHTS))
    if unknown:
        raise OptionError(f"heuristic_weights has unknown names {unknown}; use {sorted(DEFAULT_HEURISTIC_WEIGHTS)} "
                          f"or a preset's name ({sorted(HEURISTIC_PRESETS)})")
    negative = sorted(name for name, value in weights.items() if not float(value) >= 0)
    if negative:
        raise OptionError(f"heuristic_weights must be ≥ 0; {negative} are not")
    return dict(DEFAULT_HEURISTIC_WEIGHTS, **{name: float(value) for name, value in weights.items()})


class ReluPreimageRefinement:
    """The ReLU-splitting strategy of preimage refinement (see the module docstring).

    Args as :class:`~assay.preimage.refinement.PreimageRefinement`, plus ``lower``/``upper`` (the
    region's box, (k,)), ``pool`` (uniform samples of the region), ``min_preimage`` (add measuring
    points when the guide half holds fewer preimage points, see :meth:`_grow_measure`),
    ``heuristic_weights``, ``samples`` (PREMAP's n; default ``pool // 10``), ``resample`` (top up
    children's guide points below n/2, see the module docstring; default off: measured slower on
    digit patches, see the README) and ``resample_draws``
    (candidates per piece per split at most; default 5 n).
    """

    def __init__(self, network: Network, C, d, kind: str, *, lower, upper, pool: int, method: str,
                 alpha_iterations: int, rng: torch.Generator, heuristic_weights: dict | str | None = None,
                 min_preimage: int = 0, samples: int | None = None, resample: bool = False,
                 resample_draws: int | None = None):
        self.network, self.C, self.d, self.kind, self.method = network, C, d, kind, method
        self.lower, self.upper = lower, upper
        self.weights = heuristic_weights_for(heuristic_weights)
        self.alpha_iterations = alpha_iterations
        self.counters = RefinementCounters()
        self._sign = 1.0 if kind == "under" else -1.0
        self.region_volume = float(torch.prod(upper - lower))
        self.z, self.pre, self.inside = self._draw(pool, rng)
        # Half the pool steers the refinement, the other half measures it (as for input splitting).
        self.guide = torch.arange(pool) % 2 == 0
        self._grow_measure(pool, min_preimage, rng)
        self.measure_size = int((~self.guide).sum())
        self.pool_size = int(self.z.shape[0])
        n = samples or max(pool // 10, 1)
        self.resample, self.target = resample, n // 2
        self.resample_draws = resample_draws if resample_draws is not None else 5 * n
        self.rng, self._deadline = rng, None
        # Fresh guide points added by resampling: the stored tensors grow with spare room; rows from
        # self._size on are unused.
        self._size = self.pool_size
        self.resampled = {"pieces": 0, "points": 0, "draws": 0, "hit_and_run": 0}
        # Every ReLU's pre-activation side by side (N, total ReLUs); self.pre are views of it per layer.
        self.flat_pre = torch.cat(self.pre, 1)
        self.pre = list(torch.split(self.flat_pre, [p.shape[1] for p in self.pre], 1))
        self.shapes = [network.shapes[i] for i in network.relu_indices]
        self._members: dict[int, torch.Tensor] = {}
        # Per open piece: Σ_rows |Λ| of every ReLU (flat), for the coefficient scores.
        self._coefficients: dict[int, torch.Tensor] = {}
        self._next_id = 0

    # ------------------------------------------------------------------ the pool
    def _draw(self, count: int, rng: torch.Generator):
        """``count`` uniform points of the region, their pre-activations and whether they lie in the preimage."""
        z = self.lower + torch.rand(count, self.lower.numel(), generator=rng, dtype=torch.float64) * (self.upper - self.lower)
        y = self.network.forward(z)
        self.counters.samples += count
        return z, pre_activations(self.network, z), ((y @ self.C.T + self.d) >= 0).all(1)

    def _grow_measure(self, pool: int, min_preimage: int, rng: torch.Generator) -> None:
        """Add measuring points to the pool when its guide half holds fewer than ``min_preimage``
        preimage points: as many as should bring the measuring half to about ``min_preimage`` of
        them, at most (:data:`POOL_GROWTH` − 1) × ``pool`` and :data:`POOL_ELEMENTS` stored numbers
        (none when the guide half holds no preimage point at all).

        A tiny preimage leaves few preimage points among the measuring samples, and no confidence
        bound on the ratio can pass a threshold with few: 33 of 33 covered proves only ≥ 0.894 at
        95 %. How many to add is read from the guide half alone, so given the guide half the
        measuring points are a fixed number of independent uniform points and their exact
        intervals stay exact; the guide half (what the refinement costs) does not grow.
        """
        seen = int((self.inside & self.guide).sum())
        if seen >= min_preimage or seen == 0:  # none seen: too rare to size the growth by (or empty)
            return
        measure = int((~self.guide).sum())
        per_point = self.lower.numel() + sum(p.shape[1] for p in self.pre)
        room = min((POOL_GROWTH - 1) * pool, POOL_ELEMENTS // per_point - pool)
        extra = min(room, int(measure * (min_preimage / seen - 1)))
        if extra <= 0:
            return
        z, pre, inside = self._draw(extra, rng)
        self.z, self.inside = torch.cat([self.z, z]), torch.cat([self.inside, inside])
        self.pre = [torch.cat([old, new]) for old, new in zip(self.pre, pre)]
        self.guide = torch.cat([self.guide, torch.zeros(extra, dtype=torch.bool)])

    # ------------------------------------------------------------------ the strategy's four steps
    def root(self) -> Branches:
        splits = tuple(torch.zeros(1, *shape, dtype=torch.int8) for shape in self.shapes)
        return self._pieces(splits, [torch.arange(self.z.shape[0])], None)

    def bound(self, branches: Branches, deadline, stats) -> BoundedBranches:
        """Pieces are bounded when created; here: closed are the exact ones and those with no
        unstable, unsplit ReLU left (the network is affine there: the bounds are exact)."""
        self._deadline = deadline  # resampling in split() stops when it passes
        closed = branches.tags["exact"] | ~self._splittable(branches).any(1)
        for piece in branches.tags["id"][closed].tolist():
            self._members.pop(piece, None)
            self._coefficients.pop(piece, None)
        return BoundedBranches(branches, closed, torch.zeros(len(branches), dtype=torch.float64))

    def probe(self, bounded, open_, deadline, stats):
        return None

    def decide(self, bounded, open_, deadline, stats) -> LeafDecision:
        return LeafDecision(torch.zeros_like(open_))

    def split(self, bounded: BoundedBranches, open_: torch.Tensor) -> Branches:
        parents = bounded.branches.select(open_)
        ids = parents.tags["id"].tolist()
        members = [self._members.pop(piece) for piece in ids]
        coefficients = [self._coefficients.pop(piece, None) for piece in ids]
        scores = self._scores(parents, members, coefficients)
        best = scores.argmax(1)
        sizes = [int(torch.tensor(shape).prod()) for shape in self.shapes]
        offsets = torch.tensor([0] + sizes[:-1]).cumsum(0).tolist()
        flat_pre = self.flat_pre
        child_splits = [[] for _ in self.shapes]
        child_members = []
        layers = []
        for p, neuron in enumerate(best.tolist()):
            layer = max(k for k, offset in enumerate(offsets) if offset <= neuron)
            layers.append(layer)
            for sign in (1, -1):
                for k, s in enumerate(parents.splits):
                    flat = s[p].reshape(-1).clone()
                    if k == layer:
                        flat[neuron - offsets[k]] = sign
                    child_splits[k].append(flat.reshape(s.shape[1:]))
                value = flat_pre[members[p], neuron]
                child_members.append(members[p][value >= 0] if sign > 0 else members[p][value < 0])
        splits = tuple(torch.stack(c) for c in child_splits)
        if self.resample:
            self._top_up(splits, child_members)
        both = torch.arange(len(parents)).repeat_interleave(2)
        # The ReLU layers up to the split one keep their parents' bounds (they depend on earlier layers
        # only; the split neuron is clamped by its split): only the later ones are bounded again.
        return self._pieces(splits, child_members, parents.parents.select(both), fixed_layers=min(layers) + 1)

    def split_scores(self, branches: Branches) -> torch.Tensor:
        """(B, total ReLUs) the scores :meth:`split` would rank the open pieces ``branches`` by
        (flat neuron index over the ReLU layers in order; −inf: not a candidate)."""
        ids = branches.tags["id"].tolist()
        return self._scores(branches, [self._members[piece] for piece in ids],
                            [self._coefficients.get(piece) for piece in ids])

    # ------------------------------------------------------------------ adaptive resampling
    def _top_up(self, splits, child_members: list[torch.Tensor]) -> None:
        """Give every child with fewer than n/2 guide points fresh guide points of its piece (in place
        in ``child_members``); the chains start at the child's guide points (never measuring ones)."""
        flat = torch.cat([s.reshape(s.shape[0], -1) for s in splits], 1)
        for c, members in enumerate(child_members):
            have = members[self.guide[members]]
            if have.numel() >= self.target:
                continue
            if self._deadline is not None and self._deadline.passed():
                return
            fresh = sample_piece(self.network, self.lower, self.upper, flat[c], self.target - have.numel(),
                                 self.z[have], self.rng, max_draws=self.resample_draws, deadline=self._deadline)
            self.counters.samples += fresh.draws
            self.resampled["pieces"] += 1
            self.resampled["draws"] += fresh.draws
            self.resampled["hit_and_run"] += int(fresh.hit_and_run)
            if fresh.z.shape[0]:
                self.resampled["points"] += fresh.z.shape[0]
                child_members[c] = torch.cat([members, self._append(fresh.z, fresh.pre)])

    def _append(self, z: torch.Tensor, pre: torch.Tensor) -> torch.Tensor:
        """Store fresh guide points (and whether they lie in the preimage); their pool indices."""
        m, start = z.shape[0], self._size
        end = start + m
        if end > self.z.shape[0]:
            pad = max(end, self.z.shape[0] * 3 // 2) - self.z.shape[0]
            self.z = torch.cat([self.z, self.z.new_zeros(pad, self.z.shape[1])])
            self.inside = torch.cat([self.inside, self.inside.new_zeros(pad)])
            self.guide = torch.cat([self.guide, self.guide.new_zeros(pad)])
            self.flat_pre = torch.cat([self.flat_pre, self.flat_pre.new_zeros(pad, self.flat_pre.shape[1])])
            self.pre = list(torch.split(self.flat_pre, [p.shape[1] for p in self.pre], 1))
        y = self.network.forward(z)
        self.z[start:end] = z
        self.flat_pre[start:end] = pre
        self.inside[start:end] = ((y @ self.C.T + self.d) >= 0).all(1)
        self.guide[start:end] = True
        self._size = end
        return torch.arange(start, end)

    # ------------------------------------------------------------------ pieces
    def _pieces(self, splits, members: list[torch.Tensor], parents, fixed_layers: int = 0) -> Branches:
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
            # The objective reads the guide points only (the measuring ones may be many more).
            steering = [m[self.guide[m]] for m in members]
            gz, ginside, _, gvalid = stack_samples([(self.z[m], self.inside[m], self.guide[m]) for m in steering])
            objective = volume_objective(self.kind, gz, (ginside if self.kind == "under" else ~ginside) & gvalid)
        result = compute_bounds(self.network, (lower, upper), (sign * self.C, sign * self.d), method, dtype="float64",
                                sides="both", splits=[s.to(torch.int64) for s in splits], intermediate=parents,
                                fixed_layers=fixed_layers if parents is not None else 0,
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
        if any(self.weights[name] for name in _COEFFICIENT_SCORES):
            # The rows' bound was of sign·(C y + d): its lower rows' slopes are the first S of result.alphas.
            rows = self.C.shape[0]
            alphas = None if result.alphas is None else [None if a is None else a[:, :rows] for a in result.alphas]
            walk = relu_coefficients(self.network, result.intermediate, sign * self.C, sign * self.d, alphas=alphas)
            weight = torch.cat([layer.abs().sum(1).reshape(B, -1) for layer in walk.layers], 1)
            for i in range(B):
                self._coefficients[int(ids[i])] = weight[i]
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

    def _scores(self, parents: Branches, members: list[torch.Tensor], coefficients: list[torch.Tensor | None]
                ) -> torch.Tensor:
        """(P, total ReLUs) split scores (see the module docstring), −inf where a split is pointless."""
        P = len(parents)
        candidates = self._splittable(parents)
        bounds = parents.parents
        lower = torch.cat([t.reshape(P, -1) for t in bounds.lower], 1)
        upper = torch.cat([t.reshape(P, -1) for t in bounds.upper], 1)
        zero = torch.zeros_like(lower)
        looseness = torch.where(candidates, upper * (-lower) / (upper - lower).clamp(min=1e-30), zero)
        w = self.weights
        score = torch.zeros_like(lower)

        def add(name, values):
            """Each score is scaled to a largest value of 1 over the piece's candidates, then weighted."""
            values = torch.where(candidates, values, zero)
            top = values.max(1, keepdim=True).values
            score.add_(w[name] * values / top.clamp(min=1e-30))

        if w["gap"]:
            add("gap", looseness)
        if w["sensitivity"]:
            rows = self.C.abs().sum(0).expand(P, -1)  # every row's sensitivity at once (magnitudes only)
            sensitivity = torch.cat([g.reshape(P, -1) for g in gradient_bounds(self.network, rows, bounds).relu_outputs], 1)
            add("sensitivity", sensitivity * looseness)
        weight = None
        if any(w[name] for name in _COEFFICIENT_SCORES):
            weight = torch.stack([c if c is not None else torch.zeros(lower.shape[1], dtype=torch.float64)
                                  for c in coefficients])
            if w["area"]:
                add("area", weight * lower.square())
            if w["under"]:
                add("under", weight * lower.abs())
        depth = torch.zeros_like(lower)  # mean of −z over the guide samples with z < 0
        flat_pre = self.flat_pre
        for p, m in enumerate(members):
            m = m[self.guide[m]]
            if m.numel() == 0:
                continue
            z = flat_pre[m]
            if w["extra"]:
                below = (-z).clamp(min=0)
                depth[p] = below.sum(0) / (z < 0).sum(0).clamp(min=1)
            active = (z >= 0).to(torch.float64).mean(0)
            if w["stable"]:
                score[p] += w["stable"] * torch.where(candidates[p], ((active == 0) | (active == 1)).to(torch.float64), 0.0)
            if w["balance"]:
                score[p] += w["balance"] * (1 - (2 * active - 1).abs())
        if w["extra"]:
            add("extra", weight * depth)
        return torch.where(candidates, score + 1e-12, torch.full_like(score, -torch.inf))
