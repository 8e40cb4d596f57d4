"""Preimage refinement as a strategy of the one search core (:func:`assay.verify.search.branch_and_bound`).

Each branch is a *piece*: a box of the free input coordinates ``z`` carrying, in its tags, a
polytope ``A z + b ≥ 0`` built from sound linear bounds of the specification's rows over the box,
and the sample counts that estimate the piece's volumes. The core takes the pieces with the most
unapproximated volume first (``priority`` tag); :meth:`PreimageRefinement.split` halves each one
along the input coordinate whose halves approximate best (PREMAP's input splitting, all
coordinates tried on the parent's samples), and bounds the two children at once, so every piece
in the search's state carries a valid polytope: the state is an approximation at every moment.

Soundness, with ``g(y) = C y + d ≥ 0`` the output region (one conjunction) and ``ℓ_i``/``u_i``
sound linear lower/upper bounds of row i over a box (from :func:`assay.bounds.compute_bounds`):

* under-approximation: ``{z ∈ box : ℓ_i(z) ≥ 0 ∀i} ⊆ {z ∈ box : g(f(z)) ≥ 0}`` because
  ``g_i(f(z)) ≥ ℓ_i(z)``;
* over-approximation: ``{z ∈ box : g(f(z)) ≥ 0} ⊆ {z ∈ box : u_i(z) ≥ 0 ∀i}`` because
  ``u_i(z) ≥ g_i(f(z))``. A piece is dropped only when sound bounds prove it holds no
  preimage point (some row's upper bound is negative on the whole box), never because no
  sample landed in it.

Membership is evaluated with an outward tolerance (inward for under-approximations) that covers
the rounding of evaluating ``A z + b`` in float64, so a point accepted by an under-approximation
truly satisfies the constraints.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from assay.bounds import AlphaCrownOptions, compute_bounds
from assay.nn import Network
from assay.verify.search import BoundedBranches, Branches, LeafDecision

__all__ = ["PreimageRefinement", "satisfies", "volume_objective", "stack_samples", "check_samples", "EPS"]

EPS = 2.0 ** -52
# Pieces whose widest side is below this share of the region's widest side are not split further.
_MIN_WIDTH = 1e-7


def satisfies(A: torch.Tensor, b: torch.Tensor, z: torch.Tensor, inward: bool) -> torch.Tensor:
    """Whether points z (B, N, k) satisfy A z + b ≥ 0 ((B, m, k), (B, m)) for every row: (B, N) bool.

    The evaluation's rounding error is at most ``k · EPS · (|A| |z| + |b|)`` per row (plus the
    final addition); ``inward=True`` demands that much slack (a point accepted truly satisfies
    the constraints: for under-approximations), ``inward=False`` allows it (every point that
    truly satisfies them is accepted: for over-approximations).
    """
    value = torch.einsum("bmk,bnk->bnm", A, z) + b.unsqueeze(1)
    slack = (A.shape[-1] + 2) * EPS * (torch.einsum("bmk,bnk->bnm", A.abs(), z.abs()) + b.abs().unsqueeze(1))
    return (value >= slack).all(-1) if inward else (value >= -slack).all(-1)


def volume_objective(kind: str, z: torch.Tensor, target: torch.Tensor):
    """α/β-CROWN's objective (PREMAP): the smoothed share of the ``target`` samples (B, N) of z
    (B, N, k) that the polytope classifies right (under: preimage samples covered; over:
    others excluded). Maps (LinearBounds, lower) to (B,)."""

    def objective(linear, lower):
        value = torch.einsum("bmk,bnk->bnm", linear.lower_A.reshape(z.shape[0], -1, z.shape[-1]), z) \
            + linear.lower_b.unsqueeze(1)
        margin = value.min(-1).values if kind == "under" else value.max(-1).values  # (B, N)
        scale = margin.detach().abs().mean(1, keepdim=True).clamp(min=1e-12)
        return (torch.sigmoid(margin / scale) * target).sum(1) / target.sum(1).clamp(min=1)

    return objective


@dataclass
class RefinementCounters:
    """Work done: pieces bounded, engine calls, samples pushed through the network."""

    pieces: int = 0
    bound_calls: int = 0
    samples: int = 0


class PreimageRefinement:
    """The search strategy; see the module docstring.

    Args:
        network: the network of the free coordinates z.
        C, d: the output region's rows ``C y + d ≥ 0`` (one conjunction), float64.
        kind: ``"under"`` or ``"over"``.
        samples: uniform samples per piece for its volume estimates.
        method: bound method of the chosen children: ``"crown"`` or ``"alpha"`` (α-CROWN
            maximising the sample-based volume of the approximation, as in PREMAP).
        alpha_iterations: α-CROWN steps.
        max_candidates: coordinates tried per split (all when there are at most this many).
        rng: the source of every sample.
        min_width: pieces narrower than this (widest side) are not split.
    """

    def __init__(self, network: Network, C: torch.Tensor, d: torch.Tensor, kind: str, *, samples: int,
                 method: str, alpha_iterations: int, rng: torch.Generator, min_width: float,
                 max_candidates: int = 8):
        self.network = network
        self.C, self.d = C, d
        self.kind = kind
        self.samples = samples
        self.method = method
        self.alpha_options = AlphaCrownOptions(iterations=alpha_iterations)
        self.rng = rng
        self.min_width = min_width
        self.max_candidates = max_candidates
        self.counters = RefinementCounters()
        # The samples of the open pieces (by the piece's "id" tag), reused by their children.
        self._samples: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        self._next_id = 0
        # Bound g itself (under: its lower side gives the polytope) or −g (over: −g's lower side
        # is g's upper side), so that the side α-CROWN optimises is the polytope's side.
        self._sign = 1.0 if kind == "under" else -1.0

    # ------------------------------------------------------------------ the strategy's four steps
    def bound(self, branches: Branches, deadline, stats) -> BoundedBranches:
        """Pieces are bounded when created (by :meth:`root` and :meth:`split`): here they are only
        sorted into closed (exact, or too small to split) and open."""
        tags = branches.tags
        width = (branches.upper - branches.lower).max(1).values
        closed = tags["exact"] | (width <= self.min_width)
        for piece in tags["id"][closed].tolist():
            self._samples.pop(piece, None)  # a closed piece is never split: its samples are done
        return BoundedBranches(branches, closed, torch.zeros(len(branches), dtype=torch.float64))

    def probe(self, bounded, open_, deadline, stats):
        return None  # a preimage has no counterexamples to look for

    def decide(self, bounded, open_, deadline, stats) -> LeafDecision:
        return LeafDecision(torch.zeros_like(open_))

    def split(self, bounded: BoundedBranches, open_: torch.Tensor) -> Branches:
        """Halve every open piece along its best coordinate; return the bounded children."""
        parents = bounded.branches.select(open_)
        lower, upper = parents.lower, parents.upper
        P, k = lower.shape
        z, inside, guide, valid = stack_samples([self._samples.pop(piece) for piece in parents.tags["id"].tolist()])
        middle = (lower + upper) / 2
        width = upper - lower
        # Candidate cuts: every coordinate for up to `max_candidates` of them, else those that move
        # the parent's constraints most (|A| summed over rows × width, ReluVal's smear on the polytope).
        c = min(k, self.max_candidates)
        smear = parents.tags["A"].abs().sum(1) * width + 1e-12 * width
        axes = smear.topk(c, dim=1).indices                                    # (P, c)
        rows_p = torch.arange(P).unsqueeze(1)
        left_upper = upper.unsqueeze(1).repeat(1, c, 1)                        # (P, c, k)
        left_upper[rows_p, torch.arange(c), axes] = middle[rows_p, axes]
        right_lower = lower.unsqueeze(1).repeat(1, c, 1)
        right_lower[rows_p, torch.arange(c), axes] = middle[rows_p, axes]
        cand_lower = torch.stack([lower.unsqueeze(1).expand(P, c, k), right_lower], 2).reshape(P * c * 2, k)
        cand_upper = torch.stack([left_upper, upper.unsqueeze(1).expand(P, c, k)], 2).reshape(P * c * 2, k)
        # Candidates are only compared: cheap forward intermediate bounds, intersected with the parent's.
        A, b, _, _, _ = self._polytopes(cand_lower, cand_upper, "crown", parents=_repeat(parents.parents, 2 * c),
                                        intermediate_method="forward")
        A, b = A.reshape(P, c, 2, *A.shape[1:]), b.reshape(P, c, 2, -1)
        # Score each cut on the parent's samples: volume of the union of its two children's polytopes.
        cut = torch.gather(middle, 1, axes)                                     # (P, c)
        coordinate = torch.gather(z, 2, axes.unsqueeze(1).expand(P, z.shape[1], c))  # (P, N, c)
        on_right = (coordinate >= cut.unsqueeze(1)).permute(0, 2, 1)          # (P, c, N)
        covered = torch.zeros(P, c, z.shape[1], dtype=torch.bool)
        for side in (0, 1):
            member = satisfies(A[:, :, side].reshape(P * c, *A.shape[3:]), b[:, :, side].reshape(P * c, -1),
                               z.unsqueeze(1).expand(P, c, *z.shape[1:]).reshape(P * c, *z.shape[1:]),
                               inward=self.kind == "under").reshape(P, c, -1)
            covered |= member & (on_right == bool(side))
        covered &= (valid & guide).unsqueeze(1)  # decided on the guide samples only (see _pieces)
        if self.kind == "under":
            score = (covered & inside.unsqueeze(1)).sum(-1).to(torch.float64)
        else:
            score = -covered.sum(-1).to(torch.float64)
        # Ties (e.g. nothing covered either way) go to the widest coordinate.
        score = score + 1e-6 * torch.gather(width, 1, axes) / width.max(1, keepdim=True).values
        axis = score.argmax(1)
        rows = torch.arange(P)
        child_lower = torch.stack([lower, right_lower[rows, axis]], 1).reshape(2 * P, k)
        child_upper = torch.stack([left_upper[rows, axis], upper], 1).reshape(2 * P, k)
        # The children's samples: the parent's, split by the cut (uniform in each half), topped up
        # with fresh ones when fewer than half the sample size are left (PREMAP's resampling rule);
        # all fresh points go through the network in one pass.
        right = on_right[rows, axis]  # (P, N)
        halves, fresh = [], []
        for child in range(2 * P):
            mine = valid[child // 2] & (right[child // 2] == bool(child % 2))
            reuse = z[child // 2, mine]
            halves.append((reuse, inside[child // 2, mine], guide[child // 2, mine]))
            need = max(0, self.samples // 2 - reuse.shape[0])
            fresh.append(self._uniform(child_lower[child].unsqueeze(0), child_upper[child].unsqueeze(0), need)[0])
        drawn = torch.cat(fresh)
        drawn_inside = self._in_preimage(drawn.unsqueeze(0))[0] if drawn.shape[0] else drawn.new_zeros(0, dtype=torch.bool)
        children, start = [], 0
        for (reuse, reuse_inside, reuse_guide), extra in zip(halves, fresh):
            end = start + extra.shape[0]
            children.append((torch.cat([reuse, extra]), torch.cat([reuse_inside, drawn_inside[start:end]]),
                             torch.cat([reuse_guide, _alternate(extra.shape[0])])))
            start = end
        return self._pieces(child_lower, child_upper, *stack_samples(children), parents.weight.repeat_interleave(2) / 2,
                            _repeat(parents.parents, 2))

    # ------------------------------------------------------------------ pieces
    def root(self, lower: torch.Tensor, upper: torch.Tensor) -> Branches:
        """The whole region as one bounded piece."""
        self.region_volume = float(torch.prod(upper - lower))
        lower, upper = lower.unsqueeze(0), upper.unsqueeze(0)
        z = self._uniform(lower, upper, self.samples)
        return self._pieces(lower, upper, z, self._in_preimage(z), _alternate(self.samples).unsqueeze(0),
                            torch.ones(1, self.samples, dtype=torch.bool), torch.ones(1, dtype=torch.float64))

    def _pieces(self, lower, upper, z, inside, guide, valid, weight, parents=None) -> Branches:
        """Bound boxes (B, k) whose samples z (B, N, k) and memberships are given (``valid`` marks
        the real samples of each row, the rest is padding); tag them.

        Half the samples (``guide``) steer the refinement (α-CROWN's volume objective, the choice
        of cuts); the other half only measure it (the volume counts and the stop rule), so that
        the estimates are not fitted to the points the polytopes were optimised on. Every sample
        tests soundness.
        ``parents``: pre-activation bounds valid on each box (its parent's), or None."""
        # Children start from their parent's pre-activation bounds: forward linear bounds intersected
        # with them are nearly as tight here as CROWN's and several times cheaper (few inputs).
        A, b, row_lower, row_upper, intermediate = self._polytopes(
            lower, upper, self.method, z, inside & valid & guide, ~inside & valid & guide, parents=parents,
            intermediate_method="crown" if parents is None else "forward")
        B = lower.shape[0]
        # Sound shortcuts. g's bounds: under bounds g (rows as they are), over bounds −g.
        g_lower, g_upper = (row_lower, row_upper) if self.kind == "under" else (-row_upper, -row_lower)
        everywhere = (g_lower >= 0).all(1)   # the whole box maps into the region
        nowhere = (g_upper < 0).any(1)       # no point of the box does
        A = torch.where((everywhere | nowhere).view(B, 1, 1), torch.zeros_like(A), A)
        b = torch.where(everywhere.view(B, 1), torch.zeros_like(b), b)
        b = torch.where(nowhere.view(B, 1), torch.full_like(b, -1.0), b)  # an empty polytope: 0 ≥ 1
        member = satisfies(A, b, z, inward=self.kind == "under") & valid
        inside = inside & valid
        measure = valid & ~guide
        # A piece proved to hold no preimage point must hold no preimage sample either.
        wrong_empty = nowhere.unsqueeze(1) & inside
        check_samples(self.kind, member, inside, z, wrong_empty)
        volume = torch.prod(upper - lower, 1)
        n = measure.sum(1).to(torch.float64)
        k_pre = (inside & measure).sum(1).to(torch.float64)
        k_poly = (member & measure).sum(1).to(torch.float64)
        # The queue is ordered by the guide samples' gap: what the measure samples show must not
        # steer the refinement (chasing them would fit the estimates to them).
        steer = valid & guide
        seen_pre, seen_poly = (inside & steer).sum(1).to(torch.float64), (member & steer).sum(1).to(torch.float64)
        gap = (seen_pre - seen_poly) if self.kind == "under" else (seen_poly - seen_pre)
        n_steer = steer.sum(1).to(torch.float64)
        # Best first: pieces whose samples show unapproximated volume, largest first; then pieces
        # not proved exact whose samples show none (a preimage sliver no sample hit may hide there:
        # they stay in the queue, never out), the largest first, all ranked behind the first kind.
        unseen = -1.0 / (1.0 + volume / self.region_volume)  # in (−1, −0.5]
        priority = torch.where(gap > 0, volume * gap / n_steer.clamp(min=1), unseen)
        self.counters.pieces += B
        ids = torch.arange(self._next_id, self._next_id + B)
        self._next_id += B
        for i in range(B):
            self._samples[self._next_id - B + i] = (z[i][valid[i]], inside[i][valid[i]], guide[i][valid[i]])
        tags = {"A": A, "b": b, "n": n, "k_pre": k_pre, "k_poly": k_poly, "exact": everywhere | nowhere,
                "empty": nowhere, "inside": everywhere, "priority": priority, "id": ids, "volume": volume}
        return Branches(lower, upper, None, intermediate, weight, None, tags)

    def _polytopes(self, lower, upper, method, z=None, inside=None, outside=None, parents=None,
                   intermediate_method="crown"):
        """Linear bounds of ±g over boxes → polytope (A, b) in the ``A z + b ≥ 0`` form, plus the
        concrete lower and upper bounds of the bounded rows (±g)."""
        sign = self._sign
        C, d = sign * self.C, sign * self.d
        objective = None
        options = None
        if method == "alpha":
            options = self.alpha_options
            objective = volume_objective(self.kind, z, inside if self.kind == "under" else outside)
        result = compute_bounds(self.network, (lower, upper), (C, d), method, dtype="float64", sides="both",
                                return_linear=True, options=options, objective=objective, intermediate=parents,
                                intermediate_method=intermediate_method)
        self.counters.bound_calls += 1
        linear = result.linear
        A, b = linear.lower_A.reshape(lower.shape[0], C.shape[0], -1), linear.lower_b
        if self.kind == "over":  # −g ≥ ℓ(z)  ⇒  g ≤ −ℓ(z): the polytope is −ℓ(z) ≥ 0
            A, b = -A, -b
        return A, b, result.lower, result.upper, result.intermediate

    # ------------------------------------------------------------------ sampling
    def _uniform(self, lower, upper, count) -> torch.Tensor:
        u = torch.rand(lower.shape[0], count, lower.shape[1], generator=self.rng, dtype=torch.float64)
        return lower.unsqueeze(1) + u * (upper - lower).unsqueeze(1)

    def _in_preimage(self, z) -> torch.Tensor:
        """Whether the network maps each sample (B, N, k) into the region (float64 forward pass)."""
        B, N, k = z.shape
        y = self.network.forward(z.reshape(B * N, k))
        self.counters.samples += B * N
        return ((y @ self.C.T + self.d) >= 0).all(1).reshape(B, N)



def _repeat(bounds, times: int):
    """Each piece's pre-activation bounds ``times`` times in a row (for its children)."""
    if bounds is None:
        return None
    return bounds.select(torch.arange(bounds.batch_size).repeat_interleave(times))


def check_samples(kind: str, member, inside, z, also_wrong) -> None:
    """Every sample is a test of the approximation's soundness: refuse to go on after a failed one.

    ``member``/``inside`` (B, N): in the piece's approximation / in the preimage; ``also_wrong``
    marks samples wrong for another reason (a preimage point in a piece proved empty)."""
    wrong = (member & ~inside if kind == "under" else inside & ~member) | also_wrong
    if wrong.any():
        index = tuple(int(i) for i in torch.nonzero(wrong)[0])
        point = z[index[0], index[1]].tolist()
        raise RuntimeError(f"soundness bug: the {kind}-approximation of a piece misclassifies the sampled point "
                           f"{point}; please report it")


def stack_samples(triples) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Samples of several pieces (each ``(z (n_i, k), inside (n_i,), guide (n_i,))``) as padded
    (B, N, k), (B, N), (B, N) tensors plus the (B, N) mask of the real ones (padding is 0)."""
    longest = max(1, max(t[0].shape[0] for t in triples))
    k = triples[0][0].shape[1]
    z = torch.zeros(len(triples), longest, k, dtype=torch.float64)
    inside = torch.zeros(len(triples), longest, dtype=torch.bool)
    guide = torch.zeros(len(triples), longest, dtype=torch.bool)
    valid = torch.zeros(len(triples), longest, dtype=torch.bool)
    for i, (points, members, guides) in enumerate(triples):
        count = points.shape[0]
        z[i, :count], inside[i, :count], guide[i, :count], valid[i, :count] = points, members, guides, True
    return z, inside, guide, valid


def _alternate(count: int) -> torch.Tensor:
    """Roles of ``count`` fresh samples: guide, measure, guide, … (independent halves: the samples are i.i.d.)."""
    return torch.arange(count) % 2 == 0
