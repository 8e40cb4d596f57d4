"""Branch and bound over ReLU phases with β-CROWN (for networks with many inputs).

Input splitting scales with the input dimension; for images and other wide inputs the box
stays whole and the search splits unstable ReLUs instead (Wang et al., β-CROWN, NeurIPS 2021).
A *domain* is a split history: some neurons fixed to z ≥ 0 or z ≤ 0. Each round bounds a
batch of domains with β-CROWN (split constraints enter as optimised Lagrange multipliers,
intermediate bounds are inherited from the parent and clamped by the splits), drops the
domains where some row of the unsafe conjunction has a negative upper bound, probes the rest
for counterexamples and splits each on an unstable neuron chosen by filtered smart branching:
BaBSR's intercept scores (what the neuron's relaxation costs the parent's own bound, read off
its backward coefficients; Bunel et al., JMLR 2020) shortlist candidates, and the one whose worse
child has the tightest CROWN bound wins (De Palma et al., ICLR 2021).

A domain whose every ReLU has a known sign is affine on its inputs and is decided exactly by
:mod:`assay.verify.leaf_lp` instead of being split further.

It is the ReLU-splitting strategy of :func:`assay.verify.search.branch_and_bound`, run once per
conjunction of the unsafe query (:func:`conjunction_searches`); the root branch (no split) is
bounded by α-CROWN, the others by β-CROWN.

Soundness: a conjunction is refuted only when every leaf of the split tree (each a set of
inputs whose union is the whole box) has a sound negative upper bound, a re-checked LP dual
certificate, or is empty; VIOLATED only with a point confirmed by a float64 forward pass.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from assay.bounds import (
    AlphaCrownOptions,
    BetaCrownOptions,
    IntermediateBounds,
    compute_bounds,
    plan_for,
    relu_coefficients,
    split_child_bounds,
)
from assay.bounds.ibp import cast_outward
from assay.errors import UnsupportedOperatorError
from assay.nn.network import Network, resolve_dtype
from assay.verify.attack import confirm, pgd
from assay.verify.deadline import Deadline
from assay.verify.first_layer import Multipliers, first_layer, tighten_first_layer_from
from assay.verify.leaf_lp import HOLDS, VIOLATED, decide_leaf, is_leaf
from assay.verify.lp_refine import row_upper_bounds
from assay.verify.problem import UnsafeQuery
from assay.verify.root_lp import open_rows_lp_bounds
from assay.verify.search import BoundedBranches, Branches, LeafDecision, SearchState, SearchStats


def conjunction_searches(network: Network, query: UnsafeQuery, *, dtype: str = "float64",
                         deadline: Deadline | None = None,
                         tighten: list[tuple[ReluSplitting, SearchState]] | None = None,
                         pooled_upper: torch.Tensor | None = None,
                         refined: IntermediateBounds | None = None,
                         ) -> list[tuple[ReluSplitting, SearchState]]:
    """One ReLU-splitting search per conjunction of the query: (strategy, root state) pairs.

    The query holds when every conjunction is refuted. The root — the whole box with no split —
    is bounded here, once by α-CROWN for every row of every conjunction together, and each
    search starts from its rows of that bound (:attr:`ReluSplitting.refuted_at_root` tells
    which need no search): the intermediate bounds, the costly part on wide networks, are
    computed once instead of once per conjunction. (α is optimised per row, so the rows' bounds
    are those of separate calls.) For a network loaded with MaxPool (``network.pooled``), the
    twin's bounds of the rows (:func:`pooled_upper_bounds`; ``pooled_upper`` when the caller
    has them) are taken where tighter; for a network with one ReLU layer, the rows still open
    are bounded by the LP of :mod:`assay.verify.root_lp`.

    ``tighten``: the searches of an earlier call for the same query. Their root's pre-activation
    bounds are tightened by intermediate α-CROWN (each unstable neuron's bounds optimised on
    their own, see ``intermediate_method="alpha"`` of :func:`compute_bounds`) before the rows
    are bounded again: many times the cost of the first call, worth it only for a query that
    call left open, whose whole search then starts from (and inherits) the tighter bounds.
    ``refined`` (with ``tighten``): pre-activation bounds already tightened (e.g. by
    :func:`assay.verify.lp_refine.refine_bounds`), used as they are instead; on a dense network
    the rows of conjunctions still open are then bounded again by the LP over them
    (:func:`assay.verify.lp_refine.row_upper_bounds`), which its cuts make tighter than α-CROWN.
    """
    start = None if not tighten else tighten[0][0].root_bounds.intermediate
    # One conjunction: its search needs no tighter root bounds once one row is refuted (with
    # several, each conjunction needs a refuted row of its own, which `enough` cannot say).
    shared = _root_bounds(network, query, query.C, query.d, dtype, deadline, start, refined,
                          refute=query.num_groups == 1)
    if pooled_upper is None and not tighten:
        pooled_upper = pooled_upper_bounds(network, query, dtype, deadline)
    if pooled_upper is not None:
        shared = replace(shared, upper=torch.minimum(shared.upper, pooled_upper))
    if not tighten:  # one ReLU layer: the rows left open get the (far tighter) hull LP's bounds
        hull = open_rows_lp_bounds(network, query, shared, None if deadline is None else deadline.at)
        if hull is not None:
            # float64 LP bounds into the bounds' dtype rounded upwards (nearest could cut below)
            shared = replace(shared, upper=torch.minimum(shared.upper, _upwards(hull, shared.upper.dtype)))
    if refined is not None:
        shared = _lp_bounded_open_rows(network, query, shared, refined, deadline)
    searches = []
    for g in range(query.num_groups):
        rows = query.groups == g
        root = _rows_of(shared, rows)
        if tighten:  # the earlier call's bounds hold too (e.g. the pooled twin's): keep the tighter
            root = replace(root, upper=torch.minimum(root.upper, tighten[g][0].root_bounds.upper))
        strategy = ReluSplitting(network, query, query.C[rows], query.d[rows], dtype=dtype, root_bounds=root)
        searches.append((strategy, strategy.root()))
    return searches


def conjunction_strategies(network: Network, query: UnsafeQuery, *, dtype: str = "float64") -> list[ReluSplitting]:
    """One :class:`ReluSplitting` per conjunction of the query, without root bounds: for a caller
    that only searches from domains it has bounded itself (online verification's kept leaves),
    never from the root. :func:`conjunction_searches` builds the same strategies and also bounds
    the root once by α-CROWN (with the pooled twin and the root LP), work such a caller would
    discard; a strategy built here bounds a root domain it is given itself."""
    return [ReluSplitting(network, query, query.C[query.groups == g], query.d[query.groups == g], dtype=dtype)
            for g in range(query.num_groups)]


def _lp_bounded_open_rows(network, query, shared, refined: IntermediateBounds, deadline: Deadline | None):
    """``shared`` with the rows of the conjunctions it leaves open bounded by the LP over the
    ``refined`` pre-activation bounds where tighter (unchanged for a network that is not dense)."""
    negative = shared.upper.reshape(-1) < 0
    open_groups = [g for g in range(query.num_groups) if not bool(negative[query.groups == g].any())]
    if not open_groups:
        return shared
    rows = torch.isin(query.groups, torch.tensor(open_groups, dtype=query.groups.dtype))
    bounds = row_upper_bounds(network, query.lower, query.upper, refined, query.C[rows], query.d[rows],
                              None if deadline is None else deadline.at)
    if bounds is None:
        return shared
    upper = shared.upper.clone()
    upper[0, rows] = torch.minimum(upper[0, rows], _upwards(bounds, upper.dtype))
    return replace(shared, upper=upper)


def _upwards(bounds: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Upper bounds cast into ``dtype``, rounded upwards."""
    return cast_outward(bounds, bounds, dtype)[1]


def _root_bounds(network, query, C, d, dtype, deadline: Deadline | None, tighten: IntermediateBounds | None = None,
                 refined: IntermediateBounds | None = None, refute: bool = True):
    """α-CROWN upper bounds of the rows (C, d) on the query's whole box; ``refute``: the rows
    are one conjunction, so the optimisation may stop once one of them is negative. In float32
    for a network of more than :data:`ROOT_FLOAT32_MIN_RELUS` ReLUs (sound either way)."""
    if network.num_relus > ROOT_FLOAT32_MIN_RELUS:
        dtype = "float32"
    box = query.lower.reshape(1, *network.input_shape), query.upper.reshape(1, *network.input_shape)
    refine = {} if tighten is None else {"intermediate": tighten, "intermediate_method": "alpha"}
    if refined is not None:
        refine = {"intermediate": refined, "refine_intermediate": False}
    return compute_bounds(network, box, spec=(C, d), method="alpha", dtype=dtype, sides="upper",
                          options=AlphaCrownOptions(iterations=20), return_linear=True,
                          deadline=None if deadline is None else deadline.at, enough=0.0 if refute else None,
                          **refine)


def pooled_upper_bounds(network: Network, query: UnsafeQuery, dtype: str = "float64",
                        deadline: Deadline | None = None) -> torch.Tensor | None:
    """Upper bounds (1, S) of the query's rows by α-CROWN on ``network.pooled``, or None
    without a pooled twin.

    The twin computes the same function with MaxPool kept whole, so these are sound bounds of
    the same rows, and far tighter where pooling windows are nearly tied (one max relaxed as a
    whole instead of a tournament of ReLUs); they cost a fraction of the lowered network's. A
    search, which splits ReLUs, still runs on the lowered network.
    """
    pooled = network.pooled
    if pooled is None:
        return None
    box = query.lower.reshape(1, *pooled.input_shape), query.upper.reshape(1, *pooled.input_shape)
    return compute_bounds(pooled, box, spec=(query.C, query.d), method="alpha", dtype=dtype, sides="upper",
                          options=AlphaCrownOptions(iterations=20),
                          deadline=None if deadline is None else deadline.at).upper


def refutes_every_conjunction(query: UnsafeQuery, upper: torch.Tensor) -> bool:
    """Whether row upper bounds ``upper`` (1, S) put some negative row in every conjunction."""
    negative = upper.reshape(-1) < 0
    return all(bool(negative[query.groups == g].any()) for g in range(query.num_groups))


def _rows_of(result, rows: torch.Tensor):
    """The bounds of some rows of a root BoundsResult (the intermediate bounds are shared)."""
    linear = result.linear
    alphas = None if result.alphas is None else tuple(None if a is None else a[:, rows] for a in result.alphas)
    return replace(result, lower=result.lower[:, rows], upper=result.upper[:, rows], C=result.C[:, rows],
                   d=result.d[:, rows], alphas=alphas,
                   linear=replace(linear, lower_A=None, lower_b=None, upper_A=linear.upper_A[:, rows],
                                  upper_b=linear.upper_b[:, rows]))


# Above this many ReLUs the root's bounds are computed in float32 whatever the search's dtype:
# CROWN's intermediate layers, most of the root's cost, take about half the time, and the rounding
# they are charged (see assay.bounds.crown) widens them little. On VNN-COMP 2024 yolo_2023
# (TinyYOLO, 167,648 ReLUs over 52×52×3 inputs) the float64 root did not finish within 11 min on
# 2 shared cores; the float32 one takes 250-350 s there and its best row (prop_000034) is −0.49,
# against −0.35 with every rounding term removed.
ROOT_FLOAT32_MIN_RELUS = 100_000
# Above this many ReLUs, children reuse their parents' intermediate bounds without refining them.
REFINE_MAX_RELUS = 2000
# The dtype of that refinement: float32 bounds carry their (sound) rounding margins and cost about
# half as much as float64 ones.
REFINE_DTYPE = "float32"
# A batch whose domains have at most this many unstable neurons in the layers to refine (those
# after the newest split) bounds each of them by β-CROWN of its own instead of by CROWN, so that
# the earlier layers' splits constrain them (box-only bounds ignore the splits, and the search then
# splits neurons that the splits already fix, or domains that are empty). On mnist 256x2 prop_10
# (ε 0.05) the domains left open after 20 s had ~20 unstable second-layer neurons by CROWN and
# 1–2 over the inputs satisfying their first-layer splits; with β-CROWN the search decided the
# instance in 16 s (with CROWN it ran 400 s without end). On mnist 256x4 prop_0 (ε 0.05), domains
# with 9 first-layer splits went from row bounds of +0.44–0.52 to −0.09–−0.29, for ~25 times the
# cost of a CROWN round (100 neurons to bound per domain; 0.11 s a domain in float32).
INTERMEDIATE_BETA_MAX_UNSTABLE = 128
# Split multipliers must grow large to show that a domain is nearly empty: a learning rate of 0.5
# (20 steps) refuted domains that 0.05 left at +0.3.
INTERMEDIATE_BETA_OPTIONS = BetaCrownOptions(iterations=20, lr_beta=0.5)
# The domains' β passes take their Adam steps in this dtype when the search bounds in float64
# (the bounds stay float64: see ``draft_dtype`` of BetaCrownOptions). On oval21 cifar_base
# img8095 the search decides with the same number of domains (13,475 against 13,271) in 33 s
# instead of 49 s.
DRAFT_DTYPE = "float32"


@dataclass(frozen=True, eq=False)
class _DomainBounds:
    result: object  # the round's BoundsResult
    is_root: bool


class ReluSplitting:
    """The ReLU-splitting :class:`~assay.verify.search.SearchStrategy` for one conjunction ``C y + d ≥ 0``.

    ``beta_iterations``: β-CROWN iterations per round; the root gets 20 α-CROWN iterations.

    Children's pre-activation bounds: a split at ReLU layer k leaves the parent's bounds of
    layers ≤ k valid (clamped by the split), so only later layers are recomputed, by CROWN in
    :data:`REFINE_DTYPE` (float32: sound margins, half float64's cost; the β-CROWN pass that
    decides the domain bounds in ``dtype``, its Adam steps drafted in :data:`DRAFT_DTYPE`). On wide
    networks (more than :data:`REFINE_MAX_RELUS` ReLUs) recomputing them costs far more than
    the β-CROWN pass itself, so children keep their parent's bounds as they are (as β-CROWN
    does) and the split constraints enter only through β and the clamping. A batch with few
    neurons left to bound (:data:`INTERMEDIATE_BETA_MAX_UNSTABLE`) bounds them by β-CROWN
    instead of CROWN, so that the earlier splits constrain them too (α,β-CROWN's optimised
    intermediate bounds).
    """

    def __init__(self, network: Network, query: UnsafeQuery, C: torch.Tensor, d: torch.Tensor, *,
                 dtype: str = "float64", beta_iterations: int = 10, root_bounds=None):
        if plan_for(network, resolve_dtype(dtype)).has_maxpool:
            # Splitting ReLUs decides a domain only when the network is piecewise linear in them.
            raise UnsupportedOperatorError(
                f"ReLU splitting needs MaxPool lowered to ReLUs; {network.source} has MaxPool2d layers (a `pooled` "
                "twin?): verify the network as assay.nn.load returns it")
        self.network, self.query, self.C, self.d, self.dtype = network, query, C, d, dtype
        draft = DRAFT_DTYPE if dtype == "float64" else None
        self._options = BetaCrownOptions(iterations=beta_iterations, draft_dtype=draft)
        self._decide_options = replace(INTERMEDIATE_BETA_OPTIONS, draft_dtype=draft)
        self._root_bounds = root_bounds  # the root's bounds when already computed (shared by conjunctions)

    @property
    def root_bounds(self):
        """The root's :class:`~assay.bounds.BoundsResult` when given at construction, else None."""
        return self._root_bounds

    @property
    def refuted_at_root(self) -> bool:
        """True when the root's bounds (given at construction) already refute the conjunction."""
        return self._root_bounds is not None and bool((self._root_bounds.upper < 0).any())

    def root(self) -> SearchState:
        """The whole box with no split, weight 1 (a depth-k branch weighs 2^−k)."""
        box = self.query.lower.unsqueeze(0), self.query.upper.unsqueeze(0)
        # network.shapes[i] is the input shape of layer i (a ReLU's output has the same shape)
        splits = tuple(torch.zeros(1, *self.network.shapes[i], dtype=torch.int8) for i in self.network.relu_indices)
        return SearchState.start(Branches(box[0], box[1], splits, None, torch.ones(1, dtype=torch.float64)))

    def bound(self, branches: Branches, deadline: Deadline, stats: SearchStats) -> BoundedBranches:
        shape = self.network.input_shape
        count = len(branches)
        box = (branches.lower.reshape(count, *shape), branches.upper.reshape(count, *shape))
        is_root = branches.parents is None
        empty, multipliers = None, None
        if is_root and self._root_bounds is not None and count == 1:
            result = self._root_bounds
        elif is_root:
            result = _root_bounds(self.network, self.query, self.C, self.d, self.dtype, deadline)
        else:
            refine = self.network.num_relus <= REFINE_MAX_RELUS
            newest = branches.tags.get("split_layer") if branches.tags else None
            fixed = int(newest.min()) + 1 if refine and newest is not None else 0
            splits = [s.to(torch.int64) for s in branches.splits]
            parents, empty, multipliers = self._first_layer_tightened(branches, newest)
            alphas = _slopes_of(branches)
            to_bound = _unstable_after(parents, fixed) if refine else None
            if to_bound is not None and to_bound <= INTERMEDIATE_BETA_MAX_UNSTABLE:
                # Few neurons left to bound: each gets β-CROWN bounds of its own, which carry the
                # earlier layers' splits (box-only bounds ignore them, and the search then splits
                # neurons that the splits already fix, or domains that are empty). In the cheaper
                # dtype, as below; the β pass that decides keeps its own, with the same options
                # (also where nothing is left to refine: on mnist 256x2 prop_10 its 20 steps at
                # lr_beta 0.5 halve the search's time against the default options).
                if to_bound > 0:
                    parents = compute_bounds(
                        self.network, box, spec=(self.C, self.d), method="beta", dtype=REFINE_DTYPE,
                        sides="upper", splits=splits, intermediate=parents, refine_intermediate=True,
                        fixed_layers=fixed, intermediate_method="alpha", alphas=alphas,
                        options=INTERMEDIATE_BETA_OPTIONS, deadline=deadline.at, intermediate_only=True).intermediate
                result = compute_bounds(
                    self.network, box, spec=(self.C, self.d), method="beta", dtype=self.dtype, sides="upper",
                    splits=splits, intermediate=parents, refine_intermediate=False, alphas=alphas,
                    options=self._decide_options, return_linear=True, deadline=deadline.at, enough=0.0)
            else:
                if refine and REFINE_DTYPE != self.dtype:
                    # The later layers re-bounded by CROWN in the cheaper dtype (the costly part of
                    # a round); its rounding widens them a little, and the β pass keeps its own dtype.
                    parents = compute_bounds(self.network, box, spec=(self.C, self.d), method="crown",
                                             dtype=REFINE_DTYPE, sides="upper", splits=splits, intermediate=parents,
                                             fixed_layers=fixed, deadline=deadline.at,
                                             intermediate_only=True).intermediate
                    refine, fixed = False, 0
                # A domain is closed by one negative row: the optimisation stops once all are.
                result = compute_bounds(
                    self.network, box, spec=(self.C, self.d), method="beta", dtype=self.dtype, sides="upper",
                    splits=splits, intermediate=parents, refine_intermediate=refine, fixed_layers=fixed,
                    alphas=alphas, options=self._options, return_linear=True, deadline=deadline.at, enough=0.0)
        stats.bound_calls += 1
        stats.domains += count
        closed = (result.upper < 0).any(1)
        if empty is not None:
            closed = closed | empty
        # The optimised slopes go to the children, which start from them (α reused from parents).
        alphas = {f"alpha_{k}": a for k, a in enumerate(result.alphas or ()) if a is not None}
        bounded = Branches(branches.lower, branches.upper, branches.splits, result.intermediate, branches.weight,
                           tags={**alphas, **_multiplier_tags(self.network, count, multipliers)})
        settled = torch.where(closed, branches.weight, torch.zeros_like(branches.weight))
        return BoundedBranches(bounded, closed, settled, _DomainBounds(result, is_root))

    def _first_layer_tightened(self, branches: Branches, newest: torch.Tensor | None):
        """The domains' inherited bounds with the first ReLU layer's tightened under its splits
        (:mod:`assay.verify.first_layer`) where the newest split is there, (B,) bool: the
        domains that shows empty (None when nothing was tightened), and the domains' split
        multipliers for their children (None where the layer keeps none).

        Each domain's multipliers start from its parent's (its tags, see :func:`_multiplier_tags`),
        which give the parent's bounds at once, so a few steps suffice. Empty domains keep their
        bounds as they are: they are closed whatever these say."""
        parents = branches.parents
        form = first_layer(self.network)
        inherited = _inherited_multipliers(branches, form)
        if form is None or newest is None:
            return parents, None, inherited
        fresh = newest == 0
        if not bool(fresh.any()):
            return parents, None, inherited
        index = fresh.nonzero().flatten()
        start = None if inherited is None else Multipliers(inherited.beta[index], inherited.columns[index])
        tightened, empty, reached = tighten_first_layer_from(form, branches.lower[index], branches.upper[index],
                                                             branches.splits[0][index], parents.select(index), start)
        keep = index[~empty]
        lower, upper = parents.lower[0].clone(), parents.upper[0].clone()
        lower[keep], upper[keep] = tightened.lower[0][~empty], tightened.upper[0][~empty]
        every_empty = torch.zeros(len(branches), dtype=torch.bool)
        every_empty[index] = empty
        if inherited is not None and reached is not None:
            if len(index) == len(branches):
                inherited = reached
            else:
                inherited = Multipliers(inherited.beta.clone(), inherited.columns.clone())
                inherited.beta[index], inherited.columns[index] = reached.beta, reached.columns
        return (IntermediateBounds((lower, *parents.lower[1:]), (upper, *parents.upper[1:])), every_empty,
                inherited)

    def probe(self, bounded: BoundedBranches, open_, deadline: Deadline, stats: SearchStats):
        payload = bounded.payload
        attack = not payload.is_root and stats.bound_calls % 4 == 0
        return _probe(self.network, self.query, payload.result, open_, attack=attack, deadline=deadline)

    def decide(self, bounded: BoundedBranches, open_, deadline: Deadline, stats: SearchStats) -> LeafDecision:
        """Open domains whose every ReLU has a known sign are decided exactly by an LP."""
        intermediate = bounded.branches.parents
        leaves = open_ & is_leaf(intermediate.lower, intermediate.upper)
        decided = torch.zeros_like(open_)
        for index in leaves.nonzero().flatten().tolist():
            if deadline.passed():
                return LeafDecision(decided, postponed=leaves & ~decided)
            verdict, found = decide_leaf(self.network, self.query, self.C, self.d,
                                         [t[index] for t in intermediate.lower], [t[index] for t in intermediate.upper])
            stats.leaf_lps += 1
            if verdict is VIOLATED:
                return LeafDecision(decided, found=found)
            if verdict is not HOLDS:
                return LeafDecision(decided, undecidable=True)
            decided[index] = True
        return LeafDecision(decided)

    def split(self, bounded: BoundedBranches, open_) -> Branches:
        domains = bounded.branches.select(open_)
        child_splits, child_parents, layer = _branch(self.network, self.C, self.d, domains,
                                                     bounded.payload.result.upper[open_])
        both = torch.cat([torch.arange(len(domains)), torch.arange(len(domains))])
        tags = {name: value[both] for name, value in (domains.tags or {}).items()}
        return Branches(domains.lower[both], domains.upper[both], tuple(child_splits), child_parents,
                        domains.weight[both] / 2, tags={**tags, "split_layer": layer[both]})


def _inherited_multipliers(branches: Branches, form) -> Multipliers | None:
    """The first-layer split multipliers the branches carry (zeros for branches that carry none,
    e.g. the root's children), or None where the layer keeps none."""
    if form is None:
        return None
    tags = branches.tags or {}
    if _BETA in tags and _BETA_COLUMNS in tags:
        return Multipliers(tags[_BETA], tags[_BETA_COLUMNS])
    return Multipliers.none(len(branches), form)


def _multiplier_tags(network: Network, count: int, multipliers: Multipliers | None) -> dict[str, torch.Tensor]:
    """The tags that carry the first-layer split multipliers of ``count`` bounded domains to their
    children (zeros when there are none yet, so that every batch carries them: concatenated
    branches keep only the tags every part has); empty where the network's layer keeps none.
    Each pending domain holds them: 2N × :data:`~assay.verify.first_layer.WARM_COLUMNS` float32
    (32 KiB on safenlp's 128 neurons; at most 64 KiB, see ``WARM_ELEMENTS``)."""
    if multipliers is None:
        form = first_layer(network)
        multipliers = None if form is None else Multipliers.none(count, form)
    if multipliers is None:
        return {}
    return {_BETA: multipliers.beta, _BETA_COLUMNS: multipliers.columns}


# The tags of the first-layer split multipliers (:class:`assay.verify.first_layer.Multipliers`).
_BETA, _BETA_COLUMNS = "first_layer_beta", "first_layer_beta_columns"


def _unstable_after(intermediate: IntermediateBounds, fixed: int) -> int:
    """The most unstable neurons that any domain of the batch has in ReLU layers ``fixed``, …."""
    counts = [((l < 0) & (u > 0)).reshape(l.shape[0], -1).sum(1)
              for l, u in zip(intermediate.lower[fixed:], intermediate.upper[fixed:])]
    return int(torch.stack(counts).sum(0).max()) if counts else 0


def root_corners(plans: list[tuple[ReluSplitting, SearchState]]) -> torch.Tensor | None:
    """(k, n): per row of every conjunction the root leaves open, the corner of the box where
    its linear upper bound (from :func:`conjunction_searches`) peaks; None when none is open.

    Where the relaxation places a violation: good starts for an attack (see the ``guides`` of
    :func:`assay.verify.attack.search`). Only starts, never a verdict."""
    corners = [_corners(plan.root_bounds.linear.upper_A, plan.query).reshape(-1, plan.query.lower.numel())
               for plan, _ in plans
               if not plan.refuted_at_root and plan.root_bounds is not None and plan.root_bounds.linear is not None]
    return torch.cat(corners) if corners else None


def _corners(upper_A: torch.Tensor, query: UnsafeQuery) -> torch.Tensor:
    """(B, S, n): the box corners that maximise linear upper bounds with coefficients ``upper_A`` (B, S, …)."""
    A = upper_A.reshape(upper_A.shape[0], upper_A.shape[1], -1)
    return torch.where(A > 0, query.upper, query.lower)


def _probe(network, query, result, open_, attack: bool = False, deadline: Deadline | None = None):
    """Corners of the box that maximise the open domains' linear upper bounds (+ the center);
    with ``attack``, also PGD started from the corners of the 16 least refuted domains."""
    lower, upper = query.lower, query.upper
    corners = _corners(result.linear.upper_A[open_], query)  # (B, S, n)
    candidates = torch.cat([corners.reshape(-1, lower.numel())[:512], ((lower + upper) / 2).unsqueeze(0)])
    found = confirm(network, query, candidates)
    if found is None and attack:
        worst = result.upper[open_].amin(1).argsort(descending=True)[:16]
        starts = corners[worst, result.upper[open_][worst].argmin(1)]
        x, _ = pgd(network, query, lower.expand_as(starts), upper.expand_as(starts), starts, steps=20,
                   deadline=deadline)
        found = confirm(network, query, x)
    return found


# Filtered smart branching: the best intercept scores per domain whose children are bounded (at
# most every unstable neuron). With the parent's own coefficients (:func:`_intercept_scores`) the
# best split is nearly always among a few: oval21 cifar_base img8194 and cifar_deep img7878
# decide in the same 1,413 and 421 domains with 20 candidates as with 400 candidates ranked by a
# |W| sensitivity bound, each candidate's children costing one walk's rows
# (:func:`assay.bounds.split_child_bounds`): a twentieth of the estimates. On cifar_wide img8517 the
# 400 estimates were 83 % of the search's time; with 20 it holds in 214 s (open at 180 s before).
FSB_CANDIDATES = 20
# The dtype of those children's bounds (they only rank candidates).
ESTIMATE_DTYPE = "float32"
# Coefficients (children × rows × the widest tensor) that one FSB estimate walk may hold.
_FSB_CHUNK_ELEMENTS = 1 << 22


def _branch(network, C, d, domains: Branches, row_upper):
    """Two children per domain, splitting one unstable, unsplit ReLU (every domain must have one:
    leaves are decided by :mod:`assay.verify.leaf_lp`).

    The neuron is chosen by filtered smart branching (FSB; De Palma et al., ICLR 2021, as in
    α,β-CROWN): the :data:`FSB_CANDIDATES` best BaBSR intercept scores of each domain
    (:func:`_intercept_scores`) are shortlisted,
    both children of each candidate are bounded at once by one CROWN pass (the parent's
    pre-activation bounds and slopes, no optimisation), and the candidate whose worse child
    comes closest to being refuted wins. Only the choice depends on these estimates, never a
    verdict.

    Returns (child splits per layer: first every domain's z ≥ 0 child, then its z ≤ 0 child;
    the children's inherited pre-activation bounds; the ReLU layer split in each domain (B,)).
    """
    splits, intermediate = list(domains.splits), domains.parents
    count = splits[0].shape[0]
    scores = _intercept_scores(network, C, d, domains, row_upper)
    flat = torch.cat([s.reshape(count, -1) for s in scores], 1)
    # no longer than the most unstable neurons a domain has (the others score 0 and never win)
    shortlist, candidates = flat.topk(max(1, min(FSB_CANDIDATES, int((flat > 0).sum(1).max()))), dim=1)  # (B, k)
    if not (shortlist[:, 0] > 0).all():
        # Splitting a neuron that is stable or already split changes nothing: the search would
        # never end. Every domain handed here must have an unstable, unsplit neuron.
        raise RuntimeError("ReLU splitting was asked to branch a domain with no unstable, unsplit neuron")
    best = candidates[:, 0]
    if candidates.shape[1] > 1:
        # Estimates only choose the neuron, never a verdict: the cheaper dtype serves.
        worse_child = _children_estimates(network, C, d, domains, candidates, ESTIMATE_DTYPE).amax(2)  # (B, k)
        worse_child = torch.where(shortlist > 0, worse_child, torch.inf)
        best = candidates.gather(1, worse_child.argmin(1, keepdim=True)).squeeze(1)
    offsets = _offsets(splits)
    child_splits = [torch.cat([a, b]) for a, b in zip(_with_split(splits, offsets, best, 1),
                                                      _with_split(splits, offsets, best, -1))]
    both = torch.cat([torch.arange(count), torch.arange(count)])
    layer = torch.bucketize(best, offsets[1:], right=True)
    return child_splits, intermediate.select(both), layer


def _with_split(splits, offsets, neuron, sign: int):
    """``splits`` (per ReLU layer, (B, *shape)) with domain i's flat neuron ``neuron[i]`` set to ``sign``."""
    count = splits[0].shape[0]
    out = []
    for k, s in enumerate(splits):
        flat_split = s.reshape(count, -1).clone()
        in_layer = (neuron >= offsets[k]) & (neuron < offsets[k] + flat_split.shape[1])
        rows = in_layer.nonzero().flatten()
        flat_split[rows, neuron[rows] - offsets[k]] = sign
        out.append(flat_split.reshape(s.shape))
    return out


def _children_estimates(network, C, d, domains: Branches, candidates, dtype: str) -> torch.Tensor:
    """(B, k, 2): for each domain, shortlisted neuron and child (z ≥ 0, then z ≤ 0), the child's
    least row upper bound (lower is better: a child is refuted once some row's bound is negative).

    One walk per chunk of domains (:func:`assay.bounds.split_child_bounds`, each child a row of
    it), chunks sized so that a walk's coefficients stay near :data:`_FSB_CHUNK_ELEMENTS`. (A
    chunk's walk pads each layer's children to the longest list of that layer among its domains,
    so several domains per chunk may hold more rows than 2k; one domain per chunk holds 2k.)
    """
    count, k = candidates.shape
    per_domain = 2 * k * C.shape[0] * max(network.input_size, max(s[0].numel() for s in domains.splits))
    step = max(1, _FSB_CHUNK_ELEMENTS // per_domain)
    alphas = _slopes_of(domains)
    parts = []
    for start in range(0, count, step):
        part = slice(start, start + step)
        lower = split_child_bounds(network, domains.lower[part], domains.upper[part], domains.parents.select(part),
                                   -C, -d, candidates[part], alphas=[None if a is None else a[part] for a in alphas],
                                   dtype=resolve_dtype(dtype))
        parts.append(-lower.amax(3))  # the least upper bound of the rows C y + d
    return torch.cat(parts)


def _slopes_of(branches: Branches) -> list:
    """Per ReLU layer, the optimised slopes (B, S, *shape) the domains' bounds were computed with
    (tagged by :meth:`ReluSplitting.bound`; what children start from), or None."""
    tags = branches.tags or {}
    return [tags.get(f"alpha_{k}") for k in range(len(branches.splits))]


def _offsets(splits) -> torch.Tensor:
    """Where each ReLU layer starts in a domain's flat neuron numbering."""
    sizes = [s[0].numel() for s in splits]
    return torch.tensor([0] + sizes[:-1]).cumsum(0)


def _intercept_scores(network, C, d, domains: Branches, row_upper):
    """Per ReLU layer, (B, *shape) BaBSR intercept scores: > 0 only on unstable, unsplit neurons.

    The parent's own bound of the row it is closest to refuting (least upper bound) is walked
    again with its optimised slopes (:func:`assay.bounds.relu_coefficients`, without β), which
    gives every ReLU input's coefficient Λ in the lower bound of −(row). Where Λ < 0 the walk
    used the neuron's upper (chord) relaxation, whose intercept costs the bound
    (−Λ)·(−l) (Bunel et al., JMLR 2020, §5.1: the intercept term of BaBSR); both children of a
    split are exact there, so that cost is what the split removes at first order. Neurons with
    Λ ≥ 0 (lower relaxation, no intercept) rank after them by |Λ| times the relaxation's area.

    The coefficients are the bound's own, not a bound on them: on oval21 cifar_wide img8517 the
    search settled 72 % of the volume in 90 s shortlisting 20 candidates by these scores, 37 %
    by the earlier |W| sensitivity bound times the area (63 % with 400 of those).
    """
    count = len(domains)
    row = row_upper.argmin(1)
    pick = torch.arange(count), row
    # Only each domain's own row is walked (its slopes are those of that row's bound).
    alphas = [None if a is None else a[pick].unsqueeze(1) for a in _slopes_of(domains)]
    walk = relu_coefficients(network, domains.parents, -C[row].unsqueeze(1), -d[row].unsqueeze(1), alphas=alphas)
    scores = []
    for k, coefficients in enumerate(walk.layers):
        lam = coefficients[:, 0]  # (B, *shape)
        lower, upper = domains.parents.lower[k].to(lam.dtype), domains.parents.upper[k].to(lam.dtype)
        unstable = (lower < 0) & (upper > 0) & (domains.splits[k] == 0)
        intercept = (-lam).clamp(min=0) * (-lower)
        area = upper * (-lower) / (upper - lower).clamp(min=1e-30)
        score = intercept + _BACKUP_WEIGHT * lam.abs() * area
        # Every unstable neuron scores above zero, so a domain that is not a leaf always has a
        # neuron to split even where its coefficient vanishes.
        floor = torch.finfo(lam.dtype).tiny
        scores.append(torch.where(unstable, score + floor, torch.zeros_like(score)))
    return scores


# Weight of the backup score (|Λ| times the relaxation's area) beside the intercept score: it
# only orders the neurons whose relaxation has no intercept in the parent's bound.
_BACKUP_WEIGHT = 1e-3
