"""Online verification over ReLU-splitting leaves (networks with many inputs).

ReLU splitting refutes each conjunction of the unsafe query by its own search; a leaf of that
search is a set of sign constraints on hidden neurons, and the leaves of one search partition
the input space whatever the input box. A step therefore keeps every search's leaves and

* reuses a verified leaf while X(t) lies inside the box it was verified on and the network did
  not change (BMI; with RSR the box is first grown by the verifier's current offset);
* bounds every other leaf again (β-CROWN with its splits) on X(t) or for the new weights (BMW),
  starting from its stored pre-activation bounds where they still hold: widened by the inputs'
  sensitivities where the box grew, the layers before the first changed one after an update (IC);
* resumes the search from the leaves left open, within the leaf budget.

The Lipschitz test (LB) and interval weights (INN) act on input-splitting leaves only.

Coverage is the share of points sampled uniformly in X(t) whose leaf is verified in every
search (each point's leaf is read off its activation pattern); it is exactly 1 when every leaf is.

Every leaf carries the network version its verdict and bounds were proved for
(:mod:`assay.verify.online.leaves`). A step that stops early (a counterexample in one conjunction's
search, the deadline) leaves the later searches as they were, proved for the last network they
were bounded for: the next step expires whatever was proved for another version than the one it
starts from, and every reuse is checked against the current version.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import torch

from assay.bounds import IntermediateBounds, compute_bounds, input_sensitivities
from assay.nn.network import Network
from assay.verify.deadline import Deadline
from assay.verify.online.geometry import contains, enlarge
from assay.verify.online.leaves import check_current, stale_rows, unbounded_rows, versions_like
from assay.verify.problem import UnsafeQuery
from assay.verify.relu_split import conjunction_searches, conjunction_strategies
from assay.verify.result import VerificationStatus
from assay.verify.search import Branches, SearchOutcome, SearchState, SearchStats, branch_and_bound

__all__ = ["ReluLeaves", "ReluTree"]

# Points sampled in X(t) to estimate the coverage of a step that is not fully verified.
COVERAGE_SAMPLES = 4096


@dataclass(frozen=True, eq=False)
class ReluLeaves:
    """The leaves of one conjunction's search: ``branches`` (their boxes are the boxes they were
    last bounded on; split histories; pre-activation bounds), ``verified`` (B,) bool, and
    ``network_version`` (B,) int64, the network version the verdicts and bounds were proved for."""

    branches: Branches
    verified: torch.Tensor
    network_version: torch.Tensor

    def __len__(self) -> int:
        return len(self.branches)

    def select(self, which) -> ReluLeaves:
        return ReluLeaves(self.branches.select(which), self.verified[which], self.network_version[which])

    def with_verified(self, verified: torch.Tensor) -> ReluLeaves:
        return ReluLeaves(self.branches, verified, self.network_version)

    def expired(self, version: int) -> ReluLeaves:
        """Leaves proved for another network than ``version`` lose their verdicts and bounds
        (their split histories stay: the leaves still partition the input space)."""
        stale = stale_rows(self.network_version, version)
        if not bool(stale.any()):
            return self
        parents = unbounded_rows(self.branches.parents, stale)
        return ReluLeaves(replace(self.branches, parents=parents, row_upper=None), self.verified & ~stale,
                          versions_like(len(self), version))


@dataclass(frozen=True)
class TreeStep:
    """What a step over ReLU leaves did: the search outcome that decided it and the counts."""

    status: VerificationStatus
    found: tuple | None
    reused: int
    recomputed: int
    resplit: int


class ReluTree:
    """The ReLU-splitting leaves of every conjunction, kept from step to step."""

    def __init__(self, options):
        self.options = options
        self.searches: list[ReluLeaves] = []
        self.rsr_offset = options.rsr_offset
        # The network version of the last step: only leaves proved for it count as verified now.
        self.version = 0

    @property
    def leaf_count(self) -> int:
        return sum(len(s) for s in self.searches)

    def rebuild(self, network: Network, query: UnsafeQuery, deadline: Deadline, stats: SearchStats,
                version: int) -> TreeStep:
        """One search per conjunction from the whole box, within the leaf budget; ``version``
        identifies ``network``."""
        pairs = conjunction_searches(network, query)
        budget = max(1, self.options.max_leaves // len(pairs))
        self.version = version
        # Until its search has run, every conjunction keeps one unverified leaf: the whole box.
        self.searches = [ReluLeaves(replace(state.pending[0], parents=_unbounded(network, 1)),
                                    torch.zeros(1, dtype=torch.bool), versions_like(1, version)) for _, state in pairs]
        for number, (strategy, state) in enumerate(pairs):
            outcome, leaves = self._search(strategy, state, deadline, stats, budget, version)
            if leaves is None:
                return TreeStep(outcome.status, outcome.found, 0, 1, 0)
            self.searches[number] = leaves
            if outcome.status is VerificationStatus.TIMEOUT:
                return TreeStep(outcome.status, None, 0, 1, self.leaf_count)
        return TreeStep(VerificationStatus.HOLDS, None, 0, 1, max(0, self.leaf_count - len(pairs)))

    def step(self, network: Network, query: UnsafeQuery, changed: int | None, deadline: Deadline,
             stats: SearchStats, *, version: int, prior_version: int, domain_changed: bool) -> TreeStep:
        """Verify X(t) (``query``) for ``network`` (network version ``version``), reusing the kept
        leaves (see the module docstring). ``prior_version`` is the version of the last step's
        network (``changed``: its first Linear/Conv2d layer that differs from ``network``, or None);
        ``domain_changed``: X(t) differs from the last step's box."""
        # Only the strategies: every search below starts from kept leaves (bounded here), never
        # from the root, so the root's α-CROWN bounds would be discarded.
        strategies = conjunction_strategies(network, query)
        network_same = version == prior_version
        self.version = version
        if len(strategies) != len(self.searches):
            raise AssertionError("the kept searches do not match the query's conjunctions")  # a bug
        acc = self.options.accelerations
        budget = max(1, self.options.max_leaves // len(strategies))
        reused = recomputed = resplit = 0
        updated: list[ReluLeaves] = []
        for strategy, leaves in zip(strategies, self.searches):
            # What an early stop of an earlier step left proved for an older network is bounded anew.
            leaves = leaves.expired(prior_version)
            branches = leaves.branches
            count = len(branches)
            lower, upper = query.lower.expand(count, -1), query.upper.expand(count, -1)
            keep = leaves.verified & contains(branches.lower, branches.upper, lower, upper) if network_same else (
                torch.zeros(count, dtype=torch.bool))
            check_current(leaves.network_version, keep, version, "ReLU-splitting")
            reused += int(keep.sum())
            redo = ~keep
            recomputed += int(redo.sum())
            if not redo.any():
                updated.append(leaves)
                continue
            todo = branches.select(redo)
            done = []
            fresh_bounds = network_same  # whether todo's bounds were computed for this network
            if "rsr" in acc and self.rsr_offset > 0 and domain_changed:
                # RSR: first on the box grown by the offset; what fails there goes on with X(t).
                grown_lower, grown_upper = enlarge(query.lower, query.upper, self.rsr_offset)
                relaxed, todo = self._refute(network, strategy, todo, grown_lower, grown_upper, changed, network_same,
                                             stats, version)
                done.append(relaxed)
                fresh_bounds, changed = True, None  # bounds now on the grown box, for this network
                if self.options.rsr_adaptive:
                    least = self.options.rsr_offset
                    self.rsr_offset = min(2 * self.rsr_offset, 64 * least) if not len(todo) else max(
                        self.rsr_offset / 2, least)
            if len(todo):
                exact, todo = self._refute(network, strategy, todo, query.lower, query.upper, changed, fresh_bounds,
                                           stats, version)
                done.append(exact)
            done = _concat(done)
            roots = todo
            if not len(roots):
                updated.append(_concat([leaves.select(keep), done]))
                continue
            outcome, fresh = self._search(strategy, SearchState.start(roots), deadline, stats,
                                          max(budget - int(keep.sum()) - len(done), len(roots)), version)
            if fresh is None:
                # A counterexample: this search keeps its leaves, verified only where reused; the
                # later searches keep theirs, proved for the networks they name (expired next step
                # if that is not the network the next step starts from).
                updated.append(leaves.with_verified(leaves.verified & keep))
                self.searches = updated + self.searches[len(updated):]
                return TreeStep(outcome.status, outcome.found, reused, recomputed, resplit)
            resplit += max(0, len(fresh) - len(roots))
            kept = leaves.select(keep)
            updated.append(_concat([kept, done, fresh]))
            if outcome.status is VerificationStatus.TIMEOUT:
                self.searches = updated + self.searches[len(updated):]
                return TreeStep(outcome.status, None, reused, recomputed, resplit)
        self.searches = updated
        return TreeStep(VerificationStatus.HOLDS, None, reused, recomputed, resplit)

    def all_verified(self, query: UnsafeQuery) -> bool:
        """Whether every leaf is verified for the current network on a box containing X(t)
        (``query``'s box)."""
        return all(bool(_verified_now(s, self.version, query).all()) for s in self.searches)

    def coverage(self, network: Network, query: UnsafeQuery) -> float:
        """1.0 when every leaf is verified, else the verified share of points sampled in X(t),
        kept below 1 (an open leaf that no sample reached counts as half a sample: a step with an
        open leaf is not fully covered, however small that leaf)."""
        if self.all_verified(query):
            return 1.0
        rng = np.random.default_rng(0)
        x = torch.as_tensor(rng.uniform(size=(COVERAGE_SAMPLES, query.lower.numel())), dtype=torch.float64)
        x = query.lower + x * (query.upper - query.lower)
        negative, positive = [], []
        for z in network.pre_activations(x.reshape(-1, *network.input_shape)):
            flat = z.reshape(z.shape[0], -1)
            negative.append(flat < 0)
            positive.append(flat > 0)
        negative, positive = torch.cat(negative, 1).to(torch.float32), torch.cat(positive, 1).to(torch.float32)
        covered = torch.ones(x.shape[0], dtype=torch.bool)
        for leaves in self.searches:
            signs = torch.cat([s.reshape(len(leaves), -1) for s in leaves.branches.splits], 1)
            # A point lies in a leaf when no split of the leaf contradicts its activation pattern.
            broken = negative @ (signs > 0).to(torch.float32).T + positive @ (signs < 0).to(torch.float32).T
            inside = broken == 0
            covered &= (inside & _verified_now(leaves, self.version, query).unsqueeze(0)).any(1)
        return min(float(covered.to(torch.float64).mean()), 1.0 - 0.5 / x.shape[0])

    # ------------------------------------------------------------------ pieces
    def _refute(self, network, strategy, todo: Branches, lower, upper, changed, network_same, stats, version):
        """Bound leaves on the box [lower, upper] with plain CROWN and their splits (a kept leaf is
        often refuted again without β-CROWN); returns (the refuted ones, as verified leaves on
        that box; the others on that box, with the bounds just computed)."""
        count = len(todo)
        lower, upper = lower.expand(count, -1), upper.expand(count, -1)
        parents = self._inherited(network, todo, lower, upper, changed, network_same)
        shape = network.input_shape
        quick = compute_bounds(network, (lower.reshape(-1, *shape), upper.reshape(-1, *shape)),
                               spec=(strategy.C, strategy.d), method="crown", sides="upper",
                               splits=[t.to(torch.int64) for t in todo.splits], intermediate=parents)
        stats.bound_calls += 1
        stats.domains += count
        refuted = (quick.upper < 0).any(1)
        boxed = Branches(lower, upper, todo.splits, quick.intermediate, todo.weight)
        return (ReluLeaves(boxed.select(refuted), torch.ones(int(refuted.sum()), dtype=torch.bool),
                           versions_like(int(refuted.sum()), version)),
                boxed.select(~refuted))

    def _search(self, strategy, state, deadline, stats, budget, version):
        outcome: SearchOutcome = branch_and_bound(strategy, state, deadline, batch_size=min(self.options.verify.batch_size, 256),
                                                  stats=stats, keep_closed="with_bounds", max_leaves=max(budget, state.pending_count))
        if outcome.status is VerificationStatus.VIOLATED:
            return outcome, None
        final = outcome.state
        parts = [ReluLeaves(c, torch.ones(len(c), dtype=torch.bool), versions_like(len(c), version))
                 for c in final.closed if len(c)]
        parts += [ReluLeaves(c, torch.zeros(len(c), dtype=torch.bool), versions_like(len(c), version))
                  for c in (*final.unresolved, *final.pending) if len(c)]
        if not parts:
            raise AssertionError("a search ended with no leaves")  # a bug, never bad input
        network = strategy.network
        parts = [p if p.branches.parents is not None else
                 ReluLeaves(replace(p.branches, parents=_unbounded(network, len(p))), p.verified, p.network_version)
                 for p in parts]
        return outcome, _concat(parts)

    def _inherited(self, network, todo: Branches, lower, upper, changed, network_same) -> IntermediateBounds:
        """Pre-activation bounds valid on the new boxes (±inf where nothing is known). The
        bound engine takes a leaf without bounds for a root, ignoring its splits, so leaves
        always get some (infinite ones at worst)."""
        parents = todo.parents
        if parents is None:
            return _unbounded(network, len(todo))
        if network_same:
            excess = torch.clamp(torch.maximum(todo.lower - lower, upper - todo.upper), min=0)
            sensitivities = input_sensitivities(network)
            return IntermediateBounds(
                tuple(lo - (excess @ s.T).reshape(lo.shape) * (1 + 1e-12) for lo, s in zip(parents.lower, sensitivities)),
                tuple(hi + (excess @ s.T).reshape(hi.shape) * (1 + 1e-12) for hi, s in zip(parents.upper, sensitivities)))
        fixed = 0
        if "ic" in self.options.accelerations and changed is not None and bool(
                contains(todo.lower, todo.upper, lower, upper).all()):
            fixed = sum(1 for index in network.relu_indices if index < changed)
        infinite = _unbounded(network, len(todo))
        return IntermediateBounds(
            tuple(p if k < fixed else i for k, (p, i) in enumerate(zip(parents.lower, infinite.lower))),
            tuple(p if k < fixed else i for k, (p, i) in enumerate(zip(parents.upper, infinite.upper))))


def _unbounded(network: Network, count: int) -> IntermediateBounds:
    shapes = [network.shapes[i] for i in network.relu_indices]
    return IntermediateBounds(tuple(torch.full((count, *s), -torch.inf, dtype=torch.float64) for s in shapes),
                              tuple(torch.full((count, *s), torch.inf, dtype=torch.float64) for s in shapes))


def _verified_now(leaves: ReluLeaves, version: int, query: UnsafeQuery) -> torch.Tensor:
    """(B,) bool: the leaves verified for network ``version`` on a box that contains ``query``'s
    box X(t). An early stop may leave others verified for an older network, and a leaf's verdict
    holds only on the box it was bounded on (its ``branches``' box): those count for nothing now."""
    count = len(leaves)
    on_box = contains(leaves.branches.lower, leaves.branches.upper,
                      query.lower.reshape(1, -1).expand(count, -1), query.upper.reshape(1, -1).expand(count, -1))
    return leaves.verified & ~stale_rows(leaves.network_version, version) & on_box


def _concat(parts: list[ReluLeaves]) -> ReluLeaves:
    parts = [p for p in parts if len(p)] or parts[:1]
    if len(parts) == 1:
        return parts[0]
    return ReluLeaves(Branches.concat([p.branches for p in parts]), torch.cat([p.verified for p in parts]),
                      torch.cat([p.network_version for p in parts]))
