"""The general split: branch and bound on the inputs of a general network's non-linear operators.

Input splitting scales with the number of inputs and ReLU splitting branches on ReLUs only; a
network with many inputs and other non-linear operators (sigmoid, tanh, products, softmax, sine,
sign: transformers, generators, binarised CNNs) is searched by narrowing the interval of one
element of a tensor that a non-linear operator reads (Shi et al., "Neural Network Verification
with Branch-and-Bound for General Nonlinearities", TACAS 2025). A *branch* is the query's box
with bounds on those tensors (:class:`~assay.bounds.IntermediateBounds`, ReLU inputs included):
it stands for the inputs of the box whose values there lie within them. Splitting element j of
tensor t at a point s gives two children, z_tj ≤ s and z_tj ≥ s, whose union is the parent; each
operator's relaxation over the narrower interval is tighter. ReLU splitting is its case s = 0 on
a ReLU's input (without β-CROWN's multipliers, which only ReLU networks get, in
:mod:`assay.verify.relu_split`).

The element: the highest score of :func:`assay.bounds.split_candidates` (what its relaxation
costs the branch's most promising row); the point: where the stage relaxing the tensor says
(:meth:`~assay.bounds.Plan.split_point`): 0 where the interval straddles it (where ReLU, sign,
sigmoid and tanh change shape), else the middle, unless an operator's rule says otherwise.

It is a strategy of :func:`assay.verify.search.branch_and_bound`. Each round bounds its branches
by CROWN on the output rows over the inherited, narrowed bounds (IBP carries a narrowing to the
tensors after it), then α-CROWN on those left open.

Soundness: a branch is closed only by sound bounds over a superset of its inputs (every bound
used holds on the parent, or is the split's own narrowing), or when its intervals are empty (no
input reaches it); the children of a split cover their parent. VIOLATED only with a point
confirmed by a float64 forward pass.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch

from assay.bounds import AlphaCrownOptions, IntermediateBounds, compute_bounds, plan_for, split_candidates
from assay.nn.network import Network
from assay.verify.attack import confirm, pgd
from assay.verify.deadline import Deadline
from assay.verify.input_split import RootBounds, bound_boxes, row_to_refine
from assay.verify.problem import UnsafeQuery
from assay.verify.search import BoundedBranches, Branches, LeafDecision, SearchState, SearchStats

# Below this width (relative to the element's magnitude) an interval is not split further.
_MIN_RELATIVE_WIDTH = 1e-9

# Elements of inherited bounds a round may hold (branches × elements per branch): keeps a batch
# of branches of a wide network (a transformer's attention, a generator's images) within memory.
_ROUND_ELEMENTS = 1 << 25


def root_branch(query: UnsafeQuery) -> SearchState:
    """The start of a general-split search: the query's whole box, no narrowing, weight 1."""
    return SearchState.start(Branches(query.lower.unsqueeze(0), query.upper.unsqueeze(0), None, None,
                                      torch.ones(1, dtype=torch.float64)))


# The root's α-CROWN passes (tighten_root): the rows alone first, with more steps than the root's
# own pass; then intermediate α, a few steps per tensor, each element's rows with slopes and
# operator parameters of their own.
ROOT_ROWS_OPTIONS = AlphaCrownOptions(iterations=50, lr=0.3)
ROOT_ALPHA_OPTIONS = AlphaCrownOptions(iterations=5)


def tighten_root(network: Network, query: UnsafeQuery, root: RootBounds, *, dtype: str, stats: SearchStats,
                 deadline: Deadline) -> RootBounds:
    """The root's bounds tightened twice, each pass starting from the bounds so far (never
    loosened): α-CROWN on the rows over the root's intermediate bounds (:data:`ROOT_ROWS_OPTIONS`;
    vit_2023 ibp_3_3_8 row 116: 0.0043 → 0.0026 in 20 steps, 0.0007 in 100, 2 s and 9 s); then, if the query is still
    open, intermediate α-CROWN (``intermediate_method="alpha"``): every tensor a non-linear
    operator reads, and every ReLU layer after one, bounded by optimised parameters of its own,
    then the rows again. That costs about five CROWN passes on vit_2023 pgd_2_3_16 and settles
    roots that the rows' α leaves just open (row 77: 0.014 → −0.006); every branch of the
    search inherits the tighter bounds. Past ``deadline`` the tensors not reached keep their
    bounds (sound)."""
    lower, upper = query.lower.unsqueeze(0), query.upper.unsqueeze(0)
    box = (lower.reshape(-1, *network.input_shape), upper.reshape(-1, *network.input_shape))
    for intermediate_method, options in ((None, ROOT_ROWS_OPTIONS), ("alpha", ROOT_ALPHA_OPTIONS)):
        if root.refuted or deadline.passed():
            break
        extra = {"intermediate_method": "alpha", "refine_intermediate": True} if intermediate_method else \
            {"refine_intermediate": False}
        result = compute_bounds(network, box, spec=(query.C, query.d), method="alpha", dtype=dtype, sides="upper",
                                return_linear=True, intermediate=root.result.intermediate, options=options,
                                deadline=deadline.at, **extra)
        stats.bound_calls += 1
        stats.domains += 1
        rows = torch.minimum(result.upper, root.result.upper)  # both hold on the whole box
        groups = torch.stack([rows[:, query.groups == g].amin(1) for g in range(root.group_upper.shape[1])], 1)
        root = RootBounds(result, torch.minimum(root.group_upper, groups))
    return root


def round_size(network: Network, batch_size: int) -> int:
    """How many branches a round bounds at most (``batch_size``, less on wide networks)."""
    plan = plan_for(network, torch.float64)
    per_branch = sum(math.prod(network.shapes[t]) for t in set(plan.relu_positions) | set(plan.operator_tensors))
    return max(1, min(batch_size, _ROUND_ELEMENTS // max(1, 2 * per_branch)))


class _Choice(NamedTuple):
    """The elements chosen for the branches open at ``decide``: ``open`` (B,) their mask; per open
    branch the ``tensor`` index, the flat ``element``, its interval ``lower``/``upper`` and its ``score``."""

    open: torch.Tensor
    tensor: torch.Tensor
    element: torch.Tensor
    lower: torch.Tensor
    upper: torch.Tensor
    score: torch.Tensor


class OperatorSplitting:
    """The general-split :class:`~assay.verify.search.SearchStrategy` for one unsafe query.

    ``root``: :func:`~assay.verify.input_split.bound_root` of this query (the first round's
    bounds, with the intermediate bounds the children inherit).
    """

    def __init__(self, network: Network, query: UnsafeQuery, *, method: str = "alpha", dtype: str = "float64",
                 root: RootBounds | None = None):
        self.network, self.query, self.method, self.dtype = network, query, method, dtype
        self._root = root
        self._grids: dict = {}
        self._plan = plan = plan_for(network, torch.float64)
        self._relu_index = {t: k for k, t in enumerate(plan.relu_positions)}
        self._operator_index = {t: k for k, t in enumerate(plan.operator_tensors)}

    def bound(self, branches: Branches, deadline: Deadline, stats: SearchStats) -> BoundedBranches:
        query = self.query
        if self._root is not None and branches.parents is None and len(branches) == 1:
            result, group_upper, self._root = self._root.result, self._root.group_upper, None
        else:
            # The inherited bounds stand as they are: CROWN's pass over every intermediate tensor
            # costs far more than a round, and IBP already carries each narrowing forward.
            result, group_upper = bound_boxes(self.network, query, branches.lower, branches.upper, branches.parents,
                                              self.method, self.dtype, stats, self._grids, deadline,
                                              refine_intermediate=True)
        row_upper = result.upper
        if branches.row_upper is not None:
            # a child lies within its parent: the parent's bounds hold on it too (CROWN over
            # narrower intervals is not always tighter, e.g. where a ReLU's adaptive slope flips)
            row_upper = torch.minimum(row_upper, branches.row_upper)
            per_group = torch.stack([row_upper[:, query.groups == g].amin(1) for g in range(group_upper.shape[1])], 1)
            group_upper = torch.minimum(group_upper, per_group)
        closed = (group_upper < 0).all(1)
        rows = row_to_refine(row_upper, query.groups)
        open_ = ~closed
        A = result.linear.upper_A.reshape(len(branches), query.C.shape[0], -1)
        row_A = A[torch.arange(len(branches)), rows]
        bounded = Branches(branches.lower, branches.upper, None, result.intermediate, branches.weight, row_upper)
        return BoundedBranches(bounded, closed, torch.where(closed, branches.weight, 0.0),
                               (rows, row_A, group_upper, open_))

    def probe(self, bounded: BoundedBranches, open_, deadline: Deadline, stats: SearchStats):
        rows, row_A, group_upper, _ = bounded.payload
        lower, upper = bounded.branches.lower[open_], bounded.branches.upper[open_]
        # where the most promising row's linear upper bound peaks, for the branches closest to a violation
        order = group_upper[open_].amax(1).argsort(descending=True)[:16]
        corner = torch.where(row_A[open_][order] > 0, upper[order], lower[order])
        found = confirm(self.network, self.query, corner)
        if found is None and stats.bound_calls % 8 == 1:  # PGD from those corners and random points
            stats.attacks += 1
            count = min(4, len(order))
            lo, hi = lower[order[:count]], upper[order[:count]]
            generator = torch.Generator().manual_seed(stats.bound_calls)
            starts = lo + (hi - lo) * torch.rand(lo.shape, dtype=lo.dtype, generator=generator)
            x, _ = pgd(self.network, self.query, torch.cat([lo, lo]), torch.cat([hi, hi]),
                       torch.cat([corner[:count], starts]), steps=20, deadline=deadline)
            found = confirm(self.network, self.query, x)
        return found

    def decide(self, bounded: BoundedBranches, open_, deadline: Deadline, stats: SearchStats) -> LeafDecision:
        # The elements to split are chosen here (split uses them): a branch with nothing worth
        # splitting, or only intervals too thin to split, leaves the search UNKNOWN.
        self._choice = choice = self._choose(bounded, open_)
        width = choice.upper - choice.lower
        magnitude = torch.maximum(choice.lower.abs(), choice.upper.abs())
        stuck = (choice.score <= 0) | ~(width > _MIN_RELATIVE_WIDTH * (1 + magnitude))
        return LeafDecision(torch.zeros_like(open_), undecidable=bool(stuck.any()))

    def _choose(self, bounded: BoundedBranches, open_) -> _Choice:
        """Per open branch, the element to split (see :class:`_Choice`)."""
        rows = bounded.payload[0][open_]
        branches = bounded.branches.select(open_)
        candidates = split_candidates(self.network, branches.lower.reshape(-1, *self.network.input_shape),
                                      branches.upper.reshape(-1, *self.network.input_shape), branches.parents,
                                      self.query.C[rows].unsqueeze(1), self.query.d[rows].unsqueeze(1))
        k, element, score = candidates.best()
        lows, highs = torch.empty_like(score), torch.empty_like(score)
        for i in range(len(candidates.tensors)):
            mine = (k == i).nonzero().flatten()
            lows[mine] = candidates.lower[i][mine, element[mine]]
            highs[mine] = candidates.upper[i][mine, element[mine]]
        return _Choice(open_.clone(), torch.tensor(candidates.tensors)[k], element, lows, highs, score)

    def split(self, bounded: BoundedBranches, open_) -> list[Branches]:
        choice = self._choice
        # the search may split fewer branches than were open when they were chosen
        keep = open_[choice.open]
        tensors, elements, lows, highs = choice.tensor[keep], choice.element[keep], choice.lower[keep], choice.upper[keep]
        branches = bounded.branches.select(open_)
        point = torch.empty_like(lows)
        for tensor in torch.unique(tensors).tolist():  # the stage relaxing each tensor says where
            which = tensors == tensor
            point[which] = self._plan.split_point(tensor, lows[which], highs[which])
        left = self._narrowed(branches.parents, tensors, elements, upper=point)
        right = self._narrowed(branches.parents, tensors, elements, lower=point)
        half = branches.weight / 2
        return [Branches(branches.lower, branches.upper, None, left, half, branches.row_upper),
                Branches(branches.lower, branches.upper, None, right, half, branches.row_upper)]

    def _narrowed(self, parents: IntermediateBounds, tensors, elements, lower=None, upper=None) -> IntermediateBounds:
        """``parents`` with element ``elements[i]`` of tensor ``tensors[i]`` of branch i bounded by
        ``lower[i]`` from below or ``upper[i]`` from above (in every field that holds the tensor)."""
        fields = [list(parents.lower), list(parents.upper), list(parents.operator_lower), list(parents.operator_upper)]
        for tensor in torch.unique(tensors).tolist():
            which = (tensors == tensor).nonzero().flatten()
            slots = []
            if tensor in self._relu_index:
                slots += [(0, 1, self._relu_index[tensor])]
            if tensor in self._operator_index and parents.operator_lower:
                slots += [(2, 3, self._operator_index[tensor])]
            for low_field, high_field, k in slots:
                if lower is not None:
                    fields[low_field][k] = _raise(fields[low_field][k], which, elements[which], lower[which], True)
                if upper is not None:
                    fields[high_field][k] = _raise(fields[high_field][k], which, elements[which], upper[which], False)
        return IntermediateBounds(*(tuple(f) for f in fields))


def _raise(bound: torch.Tensor, branches: torch.Tensor, elements: torch.Tensor, values: torch.Tensor,
           from_below: bool) -> torch.Tensor:
    """A copy of ``bound`` (B, *shape) with entry ``elements[i]`` of branch ``branches[i]`` moved
    to ``values[i]`` where that narrows it (a lower bound raised, an upper bound lowered)."""
    flat = bound.reshape(bound.shape[0], -1).clone()
    current = flat[branches, elements]
    values = values.to(flat.dtype)
    flat[branches, elements] = torch.maximum(current, values) if from_below else torch.minimum(current, values)
    return flat.reshape(bound.shape)
