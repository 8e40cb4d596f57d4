"""Input splitting: the search strategy for networks with few inputs (e.g. ACAS Xu).

Plugged into :func:`assay.verify.search.branch_and_bound`. Each round bounds a batch of boxes
with :func:`assay.bounds.compute_bounds` (CROWN, then α-CROWN on the output rows of the boxes
CROWN leaves open); a box is closed when every conjunction of the unsafe query has a negative
upper bound on it (no point of the box can satisfy any). Open boxes shrink to the part their
linear bounds leave possible, are probed for a counterexample (their center, the corner that
maximises the linear upper bound of the most promising row, and PGD every eighth bound call)
and are split in two along the dimension with the largest smear (ReluVal: the gradient bound
of that row times the box's width). A box too thin to split leaves the query UNKNOWN.

Soundness: boxes are closed only by sound bounds (or clipped to nothing by them); VIOLATED comes
only with a point confirmed by a float64 forward pass.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np
import torch

from assay.bounds import (
    AlphaCrownOptions,
    BoundsResult,
    LinearBounds,
    Plan,
    compute_bounds,
    gradient_bounds,
    intermediate_method_for,
    plan_for,
)
from assay.bounds.forward import MAX_FORWARD_INPUTS, backward_refinement_cost, varying_inputs
from assay.nn.network import Network
from assay.verify.attack import confirm, pgd
from assay.verify.deadline import Deadline
from assay.verify.problem import UnsafeQuery
from assay.verify.search import BoundedBranches, Branches, LeafDecision, SearchState, SearchStats

# α-CROWN on the boxes CROWN leaves open: few iterations, since most boxes it can refute it
# refutes early, and the best bound over all iterations is kept.
_ALPHA_OPTIONS = AlphaCrownOptions(iterations=5, lr=0.3)



@dataclass
class AlphaLedger:
    """Whether α-CROWN still pays for itself in one input-splitting search.

    α-CROWN costs about a CROWN pass per box it is given, and earns only the boxes it refutes
    that CROWN left open. The ledger counts both (halved every round, so recent rounds count
    most) and keeps α on while it refutes at least :attr:`min_rate` of the boxes it is given;
    otherwise the search bounds by CROWN alone and re-tries α on a sample of
    :attr:`sample` open boxes every :attr:`retry_every` rounds. On ACAS Xu α refutes ~95 % of
    the boxes CROWN leaves open and stays on; on networks where it refutes almost none, it would
    double the cost of every round. Soundness does not depend on it (either bound is sound).
    """

    min_rate: float = 1 / 8
    sample: int = 32
    retry_every: int = 8
    tried: float = 0.0
    refuted: float = 0.0
    rounds: int = 0

    @property
    def active(self) -> bool:
        """Whether α-CROWN currently earns its cost (True before any evidence)."""
        return self.tried == 0 or self.refuted >= self.min_rate * self.tried

    def choose(self, open_: torch.Tensor) -> torch.Tensor:
        """The open boxes (a mask over ``open_``'s boxes) to give α-CROWN this round: all of them
        while :attr:`active`, else every :attr:`retry_every`-th round a sample spread evenly over
        them, else none."""
        self.rounds += 1
        if self.active:
            return open_
        chosen = torch.zeros_like(open_)
        if self.rounds % self.retry_every == 0:
            where = open_.nonzero().flatten()
            picks = torch.linspace(0, where.numel() - 1, min(self.sample, where.numel())).round().long()
            chosen[where[picks]] = True
        return chosen

    def record(self, tried: int, refuted: int) -> None:
        """α-CROWN was given ``tried`` boxes that CROWN left open and refuted ``refuted`` of them."""
        self.tried = self.tried / 2 + tried
        self.refuted = self.refuted / 2 + refuted


# Below this relative width a box is not split further: bounds cannot be trusted to tighten.
_MIN_RELATIVE_WIDTH = 1e-10

# A dense layer's backward walk costs its weights per row, which the engine's rule
# (:func:`assay.bounds.intermediate_method_for`, counting tensor elements) does not see. Past both
# thresholds (multiply-adds per box of the backward pass, and its ratio to one forward pass of
# a linear function per input), a plain ReLU network's boxes get forward intermediate bounds:
# looser, so the search splits more, but each box is cheap. On VNN-COMP tllverifybench (2
# inputs, 10 M weights, 6,700 ReLUs; ratio 2,400) one CROWN pass over a box cost ~10 s and the
# search ran 600 s over 3 boxes; with forward bounds N=40 instance 0 holds after 495 boxes in
# 31 s of CPU (hybrid bounds: 27 boxes in 150 s). ACAS Xu (ratio 30, 2·10⁶) keeps CROWN.
FORWARD_MIN_BACKWARD_COST = 5e8
FORWARD_MIN_COST_RATIO = 100.0
# Beyond this backward refinement cost per box (backward_refinement_cost: cctsdb_yolo's detector
# 5.7e10, minutes per box on 2 cores, while its interval pass takes a fraction of a second), and
# where forward bounds do not apply, a box's intermediate tensors get interval bounds; its
# output rows still get CROWN. Input splitting then shrinks boxes instead of waiting on one.
INTERVAL_INTERMEDIATE_COST = 3e10


# Input splitting's rounds grow past ``batch_size`` on networks whose boxes are cheap: a bound
# call walks every stage of the plan once whatever its batch, and on a network of small tensors
# that walk is most of its cost (lsnc's quadrotor, 46 stages of 145 elements in all: CROWN costs
# 0.9 ms a box on 100 boxes, 0.55 ms on 400, 0.11 ms on 6,400). A round holds at most
# INPUT_ROUND_ELEMENTS elements of the network's tensors (boxes × elements per box), and at most
# INPUT_ROUND_GROWTH times ``batch_size`` boxes; ACAS Xu (615 elements a box) and larger networks keep
# ``batch_size``.
INPUT_ROUND_ELEMENTS = 1 << 19
INPUT_ROUND_GROWTH = 8


def input_round_size(network: Network, batch_size: int) -> int:
    """How many boxes an input-splitting round bounds at most: ``batch_size``, or more (up to
    :data:`INPUT_ROUND_GROWTH` times as many) where :data:`INPUT_ROUND_ELEMENTS` elements of the
    network's tensors hold more boxes than that."""
    per_box = max(1, sum(int(np.prod(shape)) for shape in network.shapes))
    return max(batch_size, min(INPUT_ROUND_GROWTH * batch_size, INPUT_ROUND_ELEMENTS // per_box))


def root_branch(query: UnsafeQuery) -> SearchState:
    """The start of an input-splitting search: the query's whole box, weight 1."""
    root = Branches(query.lower.unsqueeze(0), query.upper.unsqueeze(0), None, None,
                    torch.ones(1, dtype=torch.float64))
    return SearchState.start(root)


def family_root(queries: list[UnsafeQuery]) -> SearchState:
    """The start of one input-splitting search over several queries (see :class:`InputSplitting`'s
    ``family``): each query's whole box, weight 1/Q, tagged with its position in the list."""
    count = len(queries)
    root = Branches(torch.stack([q.lower for q in queries]), torch.stack([q.upper for q in queries]), None, None,
                    torch.full((count,), 1.0 / count, dtype=torch.float64),
                    tags={"query": torch.arange(count)})
    return SearchState.start(root)


@dataclass(frozen=True, eq=False)
class _BoxBounds:
    """What probing and splitting need from a round's bounds (rows of the open boxes only)."""

    rows: torch.Tensor  # (B_open,): the row to refine per open box
    row_A: torch.Tensor  # (B_open, n): its linear upper bound's coefficients
    group_upper: torch.Tensor  # (B_open, G)


class InputSplitting:
    """The input-splitting :class:`~assay.verify.search.SearchStrategy` for one unsafe query.

    ``root``: :func:`bound_root` of this query with the same method and dtype, used as the bounds
    of the first round instead of bounding the whole box again.

    ``clip=False`` keeps every box whole (no shrinking to the part its linear bounds leave
    possible), so that the leaves of the search partition the query's box: what online
    verification keeps from step to step. ``weight_perturbation`` (as in
    :func:`~assay.bounds.compute_bounds`) makes every bound hold for every network whose
    weights lie within it; ``fixed_layers`` = k tells the engine that, in the first round (the
    branches the search starts from), the first k ReLU layers of their inherited bounds are
    exact for this network (the layers before them did not change), so only later layers are
    bounded again; their children are bounded as usual, every layer tightened on their smaller box.

    ``family``: several queries with one structure (the same conjunctions, rows per conjunction,
    as ``query``, the first of them) searched at once (start from :func:`family_root`): every box
    carries the tag ``"query"`` (its query's position) and is bounded, probed and split with its
    own query's box and rows, so that a thousand small queries share each bound call (nn4sys'
    cardinality properties). The search holds iff every query holds; a counterexample belongs
    to :meth:`query_of` it.
    """

    def __init__(self, network: Network, query: UnsafeQuery, *, method: str = "crown", dtype: str = "float64",
                 root: RootBounds | None = None, clip: bool = True, weight_perturbation=None, fixed_layers: int = 0,
                 family: list[UnsafeQuery] | None = None):
        self.network, self.query, self.method, self.dtype = network, query, method, dtype
        self.clip = clip
        self._engine = {"weight_perturbation": weight_perturbation, "fixed_layers": fixed_layers}
        self._root = root
        self._grids: dict = {}
        self.ledger = AlphaLedger()
        self.family = family
        if family is not None:
            if any(not torch.equal(q.groups, query.groups) for q in family):
                raise ValueError("a query family shares one structure of conjunctions (groups)")
            self._C, self._d = torch.stack([q.C for q in family]), torch.stack([q.d for q in family])
            self._full_width = torch.stack([q.upper - q.lower for q in family]).clamp(min=1e-30)
            self._intermediate = many_boxes_intermediate_method(network, family)
            # A family's boxes are many and small: splitting them costs less than optimising α on
            # them (nn4sys mscn, 750 queries: CROWN alone holds in 34 s; α timed out at 60 s).
            self.method = "crown" if method == "alpha" else method
        else:
            self._full_width = (query.upper - query.lower).clamp(min=1e-30).unsqueeze(0)
            self._intermediate = None  # bound_boxes chooses per batch
        # ReluVal's smear walks ReLU networks and affine general operators (the others have no
        # gradient rule yet)
        self._smear = not plan_for(network, torch.float64).has_nonlinear_operators

    def _tags(self, branches: Branches) -> torch.Tensor:
        """Each branch's query (its position in the family; 0 for a single query)."""
        if self.family is None:
            return torch.zeros(len(branches), dtype=torch.long)
        return branches.tags["query"]

    def _volume(self, lower, upper, tags):
        # Inputs the query fixes (zero width) are never split: they count as full width.
        full = self._full_width[tags]
        fixed = full <= 1e-30
        return torch.where(fixed, 1.0, (upper - lower) / full).prod(1)

    def query_of(self, found) -> UnsafeQuery:
        """The query a counterexample ``(x, y)`` of this search violates (its box holds x)."""
        if self.family is None:
            return self.query
        x, y = found
        for query in self.family:
            inside = bool(((x >= query.lower) & (x <= query.upper)).all())
            if inside and bool(query.violates(y.reshape(1, -1)).all()):
                return query
        raise AssertionError("a counterexample of a query family violates none of its queries")

    def bound(self, branches: Branches, deadline: Deadline, stats: SearchStats) -> BoundedBranches:
        query = self.query
        lower, upper = branches.lower, branches.upper
        tags = self._tags(branches)
        if self._root is not None and branches.parents is None and len(branches) == 1:
            result, group_upper, self._root = self._root.result, self._root.group_upper, None
        else:
            # The first round (no parents: the query's box, as bound_root bounds it) gives α every
            # open box, so that a search started from bound_root's result is the same search.
            ledger = self.ledger if branches.parents is not None else None
            spec = None if self.family is None else (self._C[tags], self._d[tags])
            result, group_upper = bound_boxes(self.network, query, lower, upper, branches.parents, self.method,
                                               self.dtype, stats, self._grids, deadline, ledger=ledger,
                                               spec=spec, intermediate_method=self._intermediate, **self._engine)
            # Fixed layers hold for the first round only: children tighten every layer on their box.
            self._engine = {**self._engine, "fixed_layers": 0}
        best_row = row_to_refine(result.upper, query.groups)
        safe = (group_upper < 0).all(1)
        if self.clip:
            # Inside a box, only points where every row of some conjunction can be ≥ 0 matter:
            # shrink each box to the hull of those regions (and drop it if they are empty).
            clipped_lower, clipped_upper, empty = _clip_boxes(result.linear, lower, upper, query.groups, group_upper)
        else:
            clipped_lower, clipped_upper, empty = lower, upper, torch.zeros_like(safe)
        closed = safe | empty
        open_ = ~closed
        # a box's share of the search: its volume within its query's box, times that query's share
        share = 1.0 if self.family is None else 1.0 / len(self.family)
        volume = self._volume(lower, upper, tags) * share
        kept = self._volume(clipped_lower, clipped_upper, tags) * share
        settled = torch.where(closed, volume, volume - kept)
        keep = open_.unsqueeze(1)
        shrunk = Branches(torch.where(keep, clipped_lower, lower), torch.where(keep, clipped_upper, upper), None,
                          result.intermediate, torch.where(open_, kept, volume), result.upper, branches.tags)
        rows = best_row[open_]
        # Linear upper bound of each open box's most promising row: y_r ≤ A·x + b.
        A = result.linear.upper_A[open_].reshape(int(open_.sum()), query.C.shape[0], lower.shape[1])
        A = A[torch.arange(A.shape[0]), rows]
        return BoundedBranches(shrunk, closed, settled, _BoxBounds(rows, A, group_upper[open_]))

    def probe(self, bounded: BoundedBranches, open_, deadline: Deadline, stats: SearchStats):
        lower, upper = bounded.branches.lower[open_], bounded.branches.upper[open_]
        corner = torch.where(bounded.payload.row_A > 0, upper, lower)
        center = (lower + upper) / 2
        if self.family is not None:
            return self._probe_family(bounded.branches.tags["query"][open_], lower, upper, corner, center,
                                      bounded.payload.group_upper, deadline, stats)
        found = confirm(self.network, self.query, torch.cat([corner, center]))
        if found is None and stats.bound_calls % 8 == 1:
            found = _attack_worst(self.network, self.query, lower, upper, bounded.payload.group_upper, stats, deadline)
        return found

    def _probe_family(self, tags, lower, upper, corner, center, group_upper, deadline, stats):
        """:meth:`probe` for a family: one float64 forward pass of every box's corner and centre,
        each read against its own query's rows; a point that looks unsafe is confirmed by its
        query (:func:`confirm`), and PGD (every eighth bound call) runs in the boxes of the query
        whose bound is least negative."""
        points, owners = torch.cat([corner, center]), torch.cat([tags, tags])
        with torch.no_grad():
            y = self.network.forward(points.reshape(points.shape[0], *self.network.input_shape))
        values = torch.einsum("nmo,no->nm", self._C[owners], y.reshape(points.shape[0], -1)) + self._d[owners]
        for k in (values.min(1).values >= 0).nonzero().flatten().tolist()[:8]:
            found = confirm(self.network, self.family[int(owners[k])], points[k:k + 1])
            if found is not None:
                return found
        if stats.bound_calls % 8 == 1:
            worst = int(tags[group_upper.amax(1).argmax()])
            mine = tags == worst
            return _attack_worst(self.network, self.family[worst], lower[mine], upper[mine], group_upper[mine],
                                 stats, deadline)
        return None

    def decide(self, bounded: BoundedBranches, open_, deadline: Deadline, stats: SearchStats) -> LeafDecision:
        width = bounded.branches.upper[open_] - bounded.branches.lower[open_]
        full = self._full_width[self._tags(bounded.branches)[open_]]
        too_thin = (width <= _MIN_RELATIVE_WIDTH * full).all(1).any()
        return LeafDecision(torch.zeros_like(open_), undecidable=bool(too_thin))

    def split(self, bounded: BoundedBranches, open_) -> list[Branches]:
        boxes = bounded.branches.select(open_)
        lower, upper = boxes.lower, boxes.upper
        # ReluVal's smear (gradient bound × width) beats the output's linear sensitivity
        # |A|·width by far on ACAS Xu: the looseness lives in the unstable ReLUs, which
        # |A| does not see (1_3 prop 1: 133 boxes against > 160,000 undecided).
        width = upper - lower
        # The payload has a row per box left open by `bound`; the search may split fewer of them.
        chosen = open_[~bounded.closed]
        if self._smear:
            rows = bounded.payload.rows[chosen]
            C = self.query.C[rows] if self.family is None else self._C[self._tags(boxes), rows]
            score = gradient_bounds(self.network, C, boxes.parents).inputs * width
        else:  # a general network has no gradient walk: the row's linear bound's sensitivity |A|·width
            score = bounded.payload.row_A[chosen].abs() * width
        dim = score.argmax(1)
        if not self._smear:
            dim = _widest_if_lopsided(dim, width / self._full_width[self._tags(boxes)])
        arange = torch.arange(lower.shape[0])
        middle = (lower[arange, dim] + upper[arange, dim]) / 2
        left_upper = upper.clone()
        left_upper[arange, dim] = middle
        right_lower = lower.clone()
        right_lower[arange, dim] = middle
        half = boxes.weight / 2
        # Two batches sharing the parents' pre-activation bounds (valid on both halves), not copies.
        return [Branches(lower, left_upper, None, boxes.parents, half, tags=boxes.tags),
                Branches(right_lower, upper, None, boxes.parents, half, tags=boxes.tags)]


# Without a gradient walk, a box is split along its relatively widest input once that input is this
# many times wider (relative to its query's box) than the one |A|·width chose.
_MAX_ASPECT = 4.0


def _widest_if_lopsided(dim: torch.Tensor, relative: torch.Tensor) -> torch.Tensor:
    """``dim`` (B,), replaced by the relatively widest input (``relative``: (B, n) widths over the
    query's) where that is more than :data:`_MAX_ASPECT` times wider than ``dim``'s.

    A linear bound's coefficient |A| does not see the slack its relaxations carry: a box of
    mscn_dual (sigmoid outputs, two inputs varying) whose upper bound has a near-zero coefficient
    on one input was split along the other only, hundreds of times, and never closed. Bounding
    the aspect ratio makes every input shrink as the search deepens."""
    arange = torch.arange(dim.shape[0])
    widest = relative.argmax(1)
    lopsided = relative[arange, widest] > _MAX_ASPECT * relative[arange, dim]
    return torch.where(lopsided, widest, dim)


@dataclass(frozen=True)
class RootBounds:
    """Sound bounds over a query's whole box: the first round of :class:`InputSplitting`, computed once."""

    result: BoundsResult
    group_upper: torch.Tensor  # (1, G): upper bounds of max_x min_i row_i(x) per conjunction

    @property
    def refuted(self) -> bool:
        """True when the bounds show that no point of the box is unsafe."""
        return bool((self.group_upper < 0).all())


def bound_root(network: Network, query: UnsafeQuery, *, method: str, dtype: str, stats: SearchStats,
               deadline: Deadline | None = None) -> RootBounds:
    """Bound the query's whole box (CROWN, then α-CROWN if ``method="alpha"`` and CROWN leaves it open).

    The verifier does this before searching for counterexamples: on ACAS Xu it settles 18 of
    the 139 holding instances in ~15 ms, where the search would spend ~0.4 s sampling a safe
    box. Pass the result to :class:`InputSplitting` as ``root`` so that it is not computed twice.
    """
    lower, upper = query.lower.unsqueeze(0), query.upper.unsqueeze(0)
    return RootBounds(*bound_boxes(network, query, lower, upper, None, method, dtype, stats, {}, deadline))


def bound_boxes(network, query, lower, upper, parents, method, dtype, stats, grids, deadline=None,
                weight_perturbation=None, fixed_layers=0, refine_intermediate=True, ledger: AlphaLedger | None = None,
                spec=None, intermediate_method: str | None = None):
    """Bound the unsafe rows on boxes (B, n); returns (BoundsResult-like, group upper bounds (B, G)).

    A child box lies inside its parent, so the parent's pre-activation bounds hold on it:
    starting from them leaves few unstable ReLUs to bound again. With ``method="alpha"`` the
    boxes that CROWN leaves open get a second pass of α-CROWN on the output rows, reusing the
    pre-activation bounds just computed: on ACAS Xu 3_3 property 2 it refutes ~95 % of the
    boxes CROWN leaves open, at about the cost of the CROWN pass itself, where each open box
    would otherwise cost two children. ``refine_intermediate=False``: the parents' bounds stand
    as given (see :func:`~assay.bounds.compute_bounds`). With a ``ledger``, α-CROWN is given only
    the open boxes the ledger chooses (:class:`AlphaLedger`), and its outcome is recorded there.
    ``spec``: per-box rows ``(C (B, m, n_out), d (B, m))`` of queries that share ``query``'s
    conjunctions (its ``groups``), in place of ``query.C``, ``query.d`` (:func:`screen_queries`).
    ``intermediate_method``: how the intermediate tensors are bounded (default: chosen here).
    """
    shape = network.input_shape
    C, d = (query.C, query.d) if spec is None else spec
    first = "crown" if method == "alpha" else method
    # A generator's images cost minutes of backward CROWN per box, forward bounds a fraction of a
    # second (cgan: 5 inputs); weight perturbation and fixed layers need the backward pass.
    if intermediate_method is None or first == "ibp" or weight_perturbation is not None or fixed_layers:
        intermediate_method = "crown"
        if first != "ibp" and weight_perturbation is None and not fixed_layers:
            intermediate_method = box_intermediate_method(network, varying_inputs(lower, upper)[0].numel())
    if first != "ibp" and refine_intermediate and weight_perturbation is None and not fixed_layers \
            and intermediate_method == "crown" and interval_intermediates(network):
        parents = compute_bounds(network, (lower.reshape(-1, *shape), upper.reshape(-1, *shape)), method="ibp",
                                 dtype=dtype).intermediate
        refine_intermediate = False
    # a disjunction's groups often repeat a row (lsnc's 13 groups each hold V(x) ≤ ρ): each
    # distinct row is bounded once and its bounds copied to its repeats
    C_distinct, d_distinct, inverse = _distinct_spec_rows(C, d)
    result = compute_bounds(
        network, (lower.reshape(-1, *shape), upper.reshape(-1, *shape)), spec=(C_distinct, d_distinct),
        method=first, dtype=dtype, sides="upper", return_linear=True, intermediate=parents,
        refine_intermediate=refine_intermediate, intermediate_method=intermediate_method,
        weight_perturbation=weight_perturbation, fixed_layers=fixed_layers,
        deadline=None if deadline is None else deadline.at,
    )
    result = _repeated_rows(result, inverse)
    stats.bound_calls += 1
    stats.domains += lower.shape[0]
    # A conjunction is unreachable on a box when max_x min_i row_i(x) < 0 there.
    group_upper = _conjunction_upper(result, lower, upper, query.groups, grids)
    open_ = ~(group_upper < 0).all(1)
    if method == "alpha" and ledger is not None and open_.any():
        open_ = ledger.choose(open_)
    if method != "alpha" or not open_.any():
        return result, group_upper
    sub_lower, sub_upper = lower[open_], upper[open_]
    sub_spec = (C_distinct, d_distinct) if spec is None else (C[open_], d[open_])
    tighter = compute_bounds(
        network, (sub_lower.reshape(-1, *shape), sub_upper.reshape(-1, *shape)), spec=sub_spec,
        method="alpha", dtype=dtype, sides="upper", return_linear=True,
        intermediate=result.intermediate.select(open_), refine_intermediate=False, options=_ALPHA_OPTIONS,
        deadline=None if deadline is None else deadline.at, weight_perturbation=weight_perturbation,
    )
    stats.bound_calls += 1
    if spec is None:
        tighter = _repeated_rows(tighter, inverse)
    tighter_group = torch.minimum(group_upper[open_], _conjunction_upper(tighter, sub_lower, sub_upper, query.groups, grids))
    if ledger is not None:
        ledger.record(int(open_.sum()), int((tighter_group < 0).all(1).sum()))
    group_upper = group_upper.clone()
    group_upper[open_] = tighter_group
    return _replace_rows(result, tighter, open_), group_upper


# Queries bounded together by screen_queries: enough to keep each batch's tensors small.
SCREEN_BATCH = 1024
# Up to this many varying inputs, a screen bounds intermediate tensors by forward linear bounds.
_SCREEN_FORWARD_INPUTS = 8


def many_boxes_intermediate_method(network: Network, queries: list[UnsafeQuery]) -> str:
    """How the boxes of many small queries are bounded (a screen, a family search): forward
    linear bounds where they let few inputs vary (lindex: 1 of 1, mscn: 1–2 of 154; two passes of
    the network per box, where mscn's CROWN walks cost 0.4 s of CPU a box), else as input
    splitting bounds any box (:func:`box_intermediate_method`)."""
    varying = max(int((q.upper > q.lower).sum()) for q in queries)
    if varying <= _SCREEN_FORWARD_INPUTS and not plan_for(network, torch.float64).has_maxpool:
        return "forward"
    return box_intermediate_method(network, varying)


def screen_queries(network: Network, queries: list[UnsafeQuery], *, method: str, dtype: str, stats: SearchStats,
                   deadline: Deadline | None = None, linear: bool = True) -> list[UnsafeQuery] | None:
    """The queries whose whole box sound bounds do not refute, bounding many queries' boxes at
    once (batches of :data:`SCREEN_BATCH`, each box with its own query's rows), as
    :func:`bound_root` bounds one. None where the deadline passed before every batch was bounded.

    A VNN-LIB property may be a disjunction of thousands of small boxes (nn4sys: lindex's
    20,000 one-input boxes, mscn's 750–11,080 cardinality queries); bounding them one by one costs
    a bound call each, where one call bounds a thousand. Queries are batched with others of
    the same input shape and the same conjunctions (rows per group); each is refuted only by
    bounds on its own box and rows, as :func:`bound_root` would refute it. Interval bounds go
    first while they refute many boxes (:func:`_interval_screen`: lindex's tiny boxes), and the
    linear bounds only see what they leave. ``linear=False``: the interval screen only (where a
    family search follows, whose first round bounds the boxes left as the linear screen would).
    """
    shape = network.input_shape
    first = "crown" if method == "alpha" else method
    intermediate_method = "crown" if first == "ibp" else many_boxes_intermediate_method(network, queries)
    by_shape: dict[tuple, list[int]] = {}
    for number, query in enumerate(queries):
        by_shape.setdefault((tuple(query.groups.tolist()), query.C.shape[1]), []).append(number)
    refuted = torch.zeros(len(queries), dtype=torch.bool)
    for members in by_shape.values():
        members = _by_varying_inputs(queries, members)
        if first != "ibp":
            members = _interval_screen(network, queries, members, dtype, stats, deadline, refuted)
            if members is None:
                return None
        for start in range(0, len(members) if linear else 0, SCREEN_BATCH):
            if deadline is not None and deadline.passed():
                return None
            batch = [queries[k] for k in members[start:start + SCREEN_BATCH]]
            lower = torch.stack([q.lower for q in batch])
            upper = torch.stack([q.upper for q in batch])
            spec = (torch.stack([q.C for q in batch]), torch.stack([q.d for q in batch]))
            result = compute_bounds(network, (lower.reshape(-1, *shape), upper.reshape(-1, *shape)), spec=spec,
                                    method=first, dtype=dtype, sides="upper", return_linear=True,
                                    intermediate_method=intermediate_method,
                                    deadline=None if deadline is None else deadline.at)
            stats.bound_calls += 1
            stats.domains += len(batch)
            group_upper = _conjunction_upper(result, lower, upper, batch[0].groups, {})
            refuted[members[start:start + SCREEN_BATCH]] = (group_upper < 0).all(1)
    return [query for query, done in zip(queries, refuted.tolist()) if not done]


def _by_varying_inputs(queries: list[UnsafeQuery], members: list[int]) -> list[int]:
    """``members`` (positions in ``queries``) ordered by the inputs their boxes let vary (stably),
    so that each batch's boxes vary few inputs together: forward linear bounds carry a coefficient
    column for every input some box of the batch lets vary (mscn_dual: 9 over its 960 queries,
    1–3 per query)."""
    varies = (torch.stack([queries[k].upper for k in members]) > torch.stack([queries[k].lower for k in members]))
    order = np.lexsort(varies.numpy().T[::-1])  # rows in lexicographic order (np.lexsort's last key is primary)
    return [members[i] for i in order.tolist()]


# The interval screen goes first while it refutes at least this share of its batch: an interval
# pass costs about a sixth of the linear screen (lindex_deep, 8,192 boxes: 0.7 s of CPU against
# 4.2 s) and refutes 93 % of lindex's tiny boxes, but 2 % of mscn's (where it stops after one batch).
INTERVAL_SCREEN_MIN_SHARE = 0.25
INTERVAL_SCREEN_PROBE = 128  # boxes in the interval screen's first batch


def _interval_screen(network: Network, queries: list[UnsafeQuery], members: list[int], dtype: str,
                     stats: SearchStats, deadline: Deadline | None, refuted: torch.Tensor) -> list[int] | None:
    """The members (positions in ``queries``, all of one structure) that interval bounds do not
    refute, marking the refuted ones in ``refuted``; batches of :data:`SCREEN_BATCH` while each
    refutes at least :data:`INTERVAL_SCREEN_MIN_SHARE` of its boxes (the rest are kept unscreened),
    the first of :data:`INTERVAL_SCREEN_PROBE` boxes.
    None where the deadline passed. A conjunction is refuted when one of its rows' interval upper
    bound is negative (max_x min_i row_i(x) ≤ min_i max_x row_i(x))."""
    shape = network.input_shape
    left: list[int] = []
    # the first batch is small: where intervals refute little, trying them costs little
    starts = [0, *range(min(INTERVAL_SCREEN_PROBE, len(members)), len(members), SCREEN_BATCH)]
    for start, end in zip(starts, starts[1:] + [len(members)]):
        if deadline is not None and deadline.passed():
            return None
        chunk = members[start:end]
        batch = [queries[k] for k in chunk]
        lower = torch.stack([q.lower for q in batch])
        upper = torch.stack([q.upper for q in batch])
        spec = (torch.stack([q.C for q in batch]), torch.stack([q.d for q in batch]))
        result = compute_bounds(network, (lower.reshape(-1, *shape), upper.reshape(-1, *shape)), spec=spec,
                                method="ibp", dtype=dtype, sides="upper")
        stats.bound_calls += 1
        stats.domains += len(batch)
        groups = batch[0].groups
        group_upper = torch.stack([result.upper[:, groups == g].amin(1) for g in range(int(groups.max()) + 1)], 1)
        done = (group_upper < 0).all(1)
        refuted[chunk] = done
        left += [k for k, gone in zip(chunk, done.tolist()) if not gone]
        if float(done.double().mean()) < INTERVAL_SCREEN_MIN_SHARE:
            return left + members[end:]
    return left


def interval_intermediates(network: Network) -> bool:
    """Whether input splitting bounds ``network``'s intermediate tensors by intervals (their
    backward refinement would cost more than :data:`INTERVAL_INTERMEDIATE_COST` per box)."""
    return backward_refinement_cost(plan_for(network, torch.float64)) > INTERVAL_INTERMEDIATE_COST


def box_intermediate_method(network: Network, inputs: int | None = None) -> str:
    """How input splitting bounds the intermediate tensors of ``network``'s boxes: ``"forward"``
    for a plain ReLU network whose backward pass would cost far more per box in weights walked
    (see :data:`FORWARD_MIN_COST_RATIO`), else the engine's choice
    (:func:`assay.bounds.intermediate_method_for`: ``"hybrid"`` or ``"crown"``). ``inputs``: how
    many inputs the boxes let vary (default: all), which is what forward bounds cost."""
    plan = plan_for(network, torch.float64)
    inputs = network.input_size if inputs is None else inputs
    if (inputs <= MAX_FORWARD_INPUTS and network.is_relu_network and not plan.has_maxpool):
        backward, forward = _pass_costs(plan, inputs)
        if backward >= FORWARD_MIN_BACKWARD_COST and backward >= FORWARD_MIN_COST_RATIO * forward:
            return "forward"
    return intermediate_method_for(plan, inputs)


def _pass_costs(plan: Plan, inputs: int) -> tuple[int, int]:
    """Estimated multiply-adds per box of the two intermediate passes: backward, every ReLU
    layer's neurons walked through all the weights before it; forward, every weight once per
    varying input (``inputs`` of them)."""
    network = plan.network
    before = backward = 0
    for index, (layer, stage) in enumerate(zip(network.layers, plan.stages)):
        if stage.splits_at_zero:
            backward += int(np.prod(network.shapes[index])) * before
        elif getattr(layer, "weight", None) is not None:
            before += layer.weight.numel()
    return backward, inputs * before


def _distinct_spec_rows(C: torch.Tensor, d: torch.Tensor):
    """The distinct rows of ``(C, d)`` (a query's rows (m, n_out), (m,); per-box rows (B, m, n_out)
    are kept as they are) and, per original row, its distinct row: ``(C', d', inverse)`` with
    ``C'[inverse] == C``; ``inverse`` None where every row is distinct or the rows are per box."""
    if C.dim() != 2:
        return C, d, None
    rows = torch.cat([C.reshape(C.shape[0], -1), d.reshape(-1, 1).to(C.dtype)], 1)
    distinct, inverse = torch.unique(rows, dim=0, return_inverse=True)
    if distinct.shape[0] == C.shape[0]:
        return C, d, None
    first = torch.full((distinct.shape[0],), C.shape[0], dtype=torch.long).scatter_reduce(
        0, inverse, torch.arange(C.shape[0]), reduce="amin")
    return C[first], d[first], inverse


def _repeated_rows(result: BoundsResult, inverse: torch.Tensor | None) -> BoundsResult:
    """``result`` (bounds of the distinct rows) with every original row's bounds: row s takes
    distinct row ``inverse[s]``'s (the same row, so the same bounds)."""
    if inverse is None:
        return result
    linear = result.linear
    if linear is not None:
        pick = lambda t: None if t is None else t[:, inverse]  # noqa: E731
        linear = LinearBounds(pick(linear.lower_A), pick(linear.lower_b), pick(linear.upper_A), pick(linear.upper_b))
    return BoundsResult(result.lower[:, inverse], result.upper[:, inverse], result.method, linear, result.intermediate,
                        result.C[:, inverse], result.d[:, inverse], result.stats)


def _replace_rows(result: BoundsResult, tighter: BoundsResult, where: torch.Tensor) -> BoundsResult:
    """``result`` with the boxes marked by ``where`` taking their row bounds and linear bounds from
    ``tighter`` (computed on exactly those boxes with the same pre-activation bounds)."""
    upper = result.upper.clone()
    upper[where] = torch.minimum(upper[where], tighter.upper)
    upper_A, upper_b = result.linear.upper_A.clone(), result.linear.upper_b.clone()
    upper_A[where], upper_b[where] = tighter.linear.upper_A, tighter.linear.upper_b
    linear = LinearBounds(None, None, upper_A, upper_b)
    return BoundsResult(result.lower, upper, "alpha", linear, result.intermediate, result.C, result.d, result.stats)


def _simplex_grid(rows: int, resolution: int = 6) -> torch.Tensor:
    """Points λ ≥ 0 with Σλ = 1 on a regular grid of the simplex: (K, rows)."""
    if rows == 1:
        return torch.ones(1, 1, dtype=torch.float64)
    points = [p for p in itertools.product(range(resolution + 1), repeat=rows) if sum(p) == resolution]
    return torch.tensor(points, dtype=torch.float64) / resolution


def _conjunction_upper(result, lower, upper, groups, grids) -> torch.Tensor:
    """Upper bound of max_x min_{i in g} row_i(x) over each box, for each group g: (B, G).

    Every row has a linear upper bound a_i·x + b_i on the box, and for any λ in the simplex
    min_i row_i(x) ≤ Σ_i λ_i (a_i·x + b_i), whose maximum over the box is exact to compute.
    The least of these over a grid of λ (and over the rows' own bounds) is a sound bound; it
    refutes a conjunction when different rows are negative on different parts of the box.
    Groups with the same number of rows are combined together (one tensor operation for all of
    them: lsnc's 13 groups of 2 rows cost one pass, not 13).
    """
    B, n = lower.shape
    A = result.linear.upper_A.reshape(B, -1, n)
    b = result.linear.upper_b
    count = int(groups.max()) + 1
    members = [(groups == g).nonzero().flatten() for g in range(count)]
    out = torch.empty(B, count, dtype=result.upper.dtype)
    magnitude = torch.maximum(lower.abs(), upper.abs()).unsqueeze(1).unsqueeze(1)  # (B, 1, 1, n)
    unit = torch.finfo(A.dtype).eps / 2
    for m in sorted({len(rows) for rows in members}):
        same = [g for g in range(count) if len(members[g]) == m]
        rows = torch.stack([members[g] for g in same])  # (Gm, m)
        bound = result.upper[:, rows].amin(2)  # (B, Gm)
        if m > 1:
            if m not in grids:
                grids[m] = _simplex_grid(m)
            weights = grids[m]  # (K, m)
            A_g, b_g = A[:, rows], b[:, rows]  # (B, Gm, m, n), (B, Gm, m)
            combined_A = torch.einsum("km,bgmn->bgkn", weights, A_g)
            combined_b = b_g @ weights.T  # (B, Gm, K)
            box_max = torch.maximum(combined_A * lower[:, None, None], combined_A * upper[:, None, None]).sum(3) \
                + combined_b
            # The rows' offsets already include their rounding margins; forming and maximising the
            # combination adds at most (n + m + 2)·u relative to the magnitudes involved (Higham §3.1).
            scale = (A_g.abs() * magnitude).sum(3) + b_g.abs()  # (B, Gm, m)
            box_max = box_max + 4 * (n + m + 2) * unit * (scale @ weights.T)
            bound = torch.minimum(bound, box_max.amin(2))
        out[:, same] = bound
    return out


def _clip_boxes(linear, lower, upper, groups, group_upper):
    """Shrink boxes to the part that can hold a violation, using the rows' linear upper bounds.

    A violation of group g needs a_i·x + b_i ≥ 0 for every row i of g. With
    s_i = max over the box of a_i·x + b_i, that forces x_j ≥ u_j − s_i / a_ij when a_ij > 0
    and x_j ≤ l_j + s_i / |a_ij| when a_ij < 0. Each group gives a box (empty when some
    row's s_i < 0); the result is the hull of the groups' boxes. Returns
    (lower, upper, empty (B,)). Rounding only ever enlarges the clipped boxes (s_i is
    inflated and the new bounds moved outwards), so no violation is cut away.
    """
    B, n = lower.shape
    A = linear.upper_A.reshape(B, -1, n)
    b = linear.upper_b
    peak = torch.maximum(A * lower.unsqueeze(1), A * upper.unsqueeze(1))
    scale = (A.abs() * torch.maximum(lower.abs(), upper.abs()).unsqueeze(1)).sum(2) + b.abs()
    slack = peak.sum(2) + b + 1e-12 * scale  # ≥ the true max of each row's linear bound on the box
    hull_lower = torch.full_like(lower, torch.inf)
    hull_upper = torch.full_like(upper, -torch.inf)
    width = upper - lower
    for g in range(int(groups.max()) + 1):
        in_group = groups == g
        A_g, slack_g = A[:, in_group], slack[:, in_group].unsqueeze(2)  # (B, m, n), (B, m, 1)
        reach = slack_g / A_g.abs()  # inf where a_ij = 0: no constraint
        reach = torch.where(torch.isnan(reach), torch.inf, reach)
        # covers the rounding of slack / |a| and of u − reach (relative to the values involved)
        margin = (1e-9 * width + 1e-12 * (1 + torch.maximum(lower.abs(), upper.abs()))).unsqueeze(1)
        g_lower = torch.where(A_g > 0, upper.unsqueeze(1) - reach - margin, lower.unsqueeze(1)).amax(1)
        g_upper = torch.where(A_g < 0, lower.unsqueeze(1) + reach + margin, upper.unsqueeze(1)).amin(1)
        g_lower, g_upper = torch.maximum(g_lower, lower), torch.minimum(g_upper, upper)
        g_empty = (g_lower > g_upper).any(1) | (group_upper[:, g] < 0)
        hull_lower = torch.where(g_empty.unsqueeze(1), hull_lower, torch.minimum(hull_lower, g_lower))
        hull_upper = torch.where(g_empty.unsqueeze(1), hull_upper, torch.maximum(hull_upper, g_upper))
    empty = (hull_lower > hull_upper).any(1)
    return torch.where(empty.unsqueeze(1), lower, hull_lower), torch.where(empty.unsqueeze(1), upper, hull_upper), empty


def row_to_refine(row_upper: torch.Tensor, groups: torch.Tensor) -> torch.Tensor:
    """Per box: in the conjunction hardest to refute (largest min-row upper bound), its lowest row."""
    masked = []
    for g in range(int(groups.max()) + 1):
        in_group = groups == g
        masked.append(torch.where(in_group, row_upper, torch.inf))
    per_group = torch.stack(masked, 1)  # (B, G, m)
    hardest = per_group.amin(2).masked_fill(per_group.amin(2) < 0, -torch.inf).argmax(1)
    return per_group[torch.arange(row_upper.shape[0]), hardest].argmin(1)


def _attack_worst(network, query, lower, upper, group_upper, stats, deadline, count: int = 16):
    """PGD inside the open boxes whose bounds are least negative (most likely to hide a violation)."""
    stats.attacks += 1
    order = group_upper.amax(1).argsort(descending=True)[:count]
    lo, hi = lower[order], upper[order]
    x, _ = pgd(network, query, lo, hi, (lo + hi) / 2, steps=20, deadline=deadline)
    return confirm(network, query, x)
