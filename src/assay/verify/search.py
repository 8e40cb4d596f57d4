"""One branch-and-bound core for every search over a network's inputs or activations.

A search refutes one unsafe query (or one conjunction of it) by splitting its domain into
*branches* until every branch is shown safe by sound bounds, decided exactly, or found to hold
a counterexample. Everything specific to a kind of branching lives in a :class:`SearchStrategy`:

* ``bound``  — bound a batch of branches; say which are closed (safe), and how much of each
  branch's weight is settled (closed branches: all of it; input splitting also settles the part
  of a box its linear bounds clip away);
* ``probe``  — look for a counterexample in the open branches (corners, centres, PGD);
* ``decide`` — decide exactly the open branches that cannot be split further (ReLU splitting:
  an LP per leaf; input splitting: boxes too thin to split make the search UNKNOWN);
* ``split``  — the children of the open branches (one batch, or a list of batches that may
  share their inherited bounds instead of copying them).

:func:`branch_and_bound` is the only loop. Its state is a value: :class:`SearchState` holds the
pending branches (depth first: taken from the end), the closed ones and the settled weight; a
search stopped by its deadline returns its state, and calling :func:`branch_and_bound` again
with that state continues where it stopped (online verification resumes from it).

Soundness: HOLDS is returned only when no branch is pending and no branch was left undecided,
i.e. when every branch of a partition of the query's domain was closed by a strategy's sound
bound or exact decision; VIOLATED only with a point confirmed by a plain forward pass.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

import torch

from assay.bounds import IntermediateBounds
from assay.verify.deadline import Deadline
from assay.verify.result import VerificationStatus

__all__ = ["Branches", "BoundedBranches", "LeafDecision", "SearchState", "SearchOutcome", "SearchStrategy",
           "SearchStats", "branch_and_bound"]

Found = tuple[torch.Tensor, torch.Tensor]  # (input, output) confirmed by a forward pass


@dataclass(frozen=True, eq=False)
class Branches:
    """A batch of B branches (struct of arrays).

    Attributes:
        lower, upper: (B, n_in) float64: the input box of each branch (flat).
        splits: per ReLU layer, (B, *layer shape) int8 split history (+1: z ≥ 0, −1: z ≤ 0,
            0: free); None for input splitting.
        parents: pre-activation bounds valid on each branch (inherited from its parent), or None.
        weight: (B,) float64: the branch's share of the search (volume fraction of the query's
            box for input splitting, 2^−depth for ReLU splitting); the shares of a partition sum to 1.
        row_upper: (B, m) sound upper bounds of the query's rows ``C y + d`` on each branch, set
            by strategies that have them once the branch is bounded (input splitting), else None.
        tags: a strategy's own per-branch values, carried along with the branch: a dict of
            tensors whose first dimension is B (e.g. preimage refinement's polytopes and volume
            estimates), or None. Selecting and concatenating branches selects and concatenates
            them (concatenation keeps the tags every part has); :func:`branch_and_bound` can
            order its pending branches by one of them.
    """

    lower: torch.Tensor
    upper: torch.Tensor
    splits: tuple[torch.Tensor, ...] | None
    parents: IntermediateBounds | None
    weight: torch.Tensor
    row_upper: torch.Tensor | None = None
    tags: dict[str, torch.Tensor] | None = None

    def __len__(self) -> int:
        return self.weight.shape[0]

    @property
    def nbytes(self) -> int:
        """Bytes of the tensors these branches hold."""
        tensors = [self.lower, self.upper, self.weight, *(self.splits or ()), *(self.tags or {}).values()]
        if self.row_upper is not None:
            tensors.append(self.row_upper)
        if self.parents is not None:
            tensors += [*self.parents.lower, *self.parents.upper]
        return sum(t.numel() * t.element_size() for t in tensors)

    def select(self, which) -> Branches:
        """The branches picked by a bool mask, an index tensor or a slice."""
        return Branches(
            self.lower[which], self.upper[which],
            None if self.splits is None else tuple(s[which] for s in self.splits),
            None if self.parents is None else self.parents.select(which),
            self.weight[which],
            None if self.row_upper is None else self.row_upper[which],
            _select_tags(self.tags, which),
        )

    def domains(self, which) -> Branches:
        """The branches picked by ``which`` without their pre-activation bounds (what a closed
        branch keeps; cheaper than :meth:`select` when the bounds are not needed)."""
        return Branches(self.lower[which], self.upper[which],
                        None if self.splits is None else tuple(s[which] for s in self.splits), None,
                        self.weight[which], None if self.row_upper is None else self.row_upper[which],
                        _select_tags(self.tags, which))

    @staticmethod
    def concat(parts: list[Branches]) -> Branches:
        if len(parts) == 1:
            return parts[0]
        splits = None if parts[0].splits is None else tuple(
            torch.cat([p.splits[k] for p in parts]) for k in range(len(parts[0].splits)))
        row_upper = None
        if all(p.row_upper is not None for p in parts):
            row_upper = torch.cat([p.row_upper for p in parts])
        tags = None
        if all(p.tags is not None for p in parts):  # the tags every part carries
            shared = [name for name in parts[0].tags if all(name in p.tags for p in parts)]
            tags = {name: torch.cat([p.tags[name] for p in parts]) for name in shared}
        return Branches(torch.cat([p.lower for p in parts]), torch.cat([p.upper for p in parts]), splits,
                        _concat_bounds([p.parents for p in parts], [len(p) for p in parts]),
                        torch.cat([p.weight for p in parts]), row_upper, tags)


@dataclass(frozen=True, eq=False)
class BoundedBranches:
    """A batch after ``bound``: ``branches`` (input splitting may have shrunk their boxes),
    ``closed`` (B,) bool, ``settled`` (B,) float64 weight settled by this step, the
    strategy's own ``payload`` (its bounds, for probing and splitting)."""

    branches: Branches
    closed: torch.Tensor
    settled: torch.Tensor
    payload: object = None


@dataclass(frozen=True)
class LeafDecision:
    """What ``decide`` found among the open branches: ``decided`` (B,) bool (closed exactly),
    ``found`` a counterexample, or ``undecidable`` (a branch that can neither be split nor
    decided: the search answers UNKNOWN). ``postponed`` (B,) bool or None: branches it had to
    leave for later (the deadline passed); they go back to the pending branches as they are."""

    decided: torch.Tensor
    found: Found | None = None
    undecidable: bool = False
    postponed: torch.Tensor | None = None


@dataclass
class SearchStats:
    """Counters of one verification run (shared by the phases and the searches of its queries)."""

    domains: int = 0  # branches bounded
    bound_calls: int = 0
    max_pending: int = 0
    attacks: int = 0  # counterexample searches (sampling + PGD) and PGD probes
    leaf_lps: int = 0  # ReLU splitting: leaves decided by an LP

    def to_json(self) -> dict:
        return {"domains": self.domains, "bound_calls": self.bound_calls, "max_pending": self.max_pending,
                "attacks": self.attacks, "leaf_lps": self.leaf_lps}


class SearchStrategy(Protocol):
    """How one kind of branching bounds, probes, decides and splits (see the module docstring)."""

    def bound(self, branches: Branches, deadline: Deadline, stats: SearchStats) -> BoundedBranches: ...

    def probe(self, bounded: BoundedBranches, open_: torch.Tensor, deadline: Deadline,
              stats: SearchStats) -> Found | None: ...

    def decide(self, bounded: BoundedBranches, open_: torch.Tensor, deadline: Deadline,
               stats: SearchStats) -> LeafDecision: ...

    def split(self, bounded: BoundedBranches, open_: torch.Tensor) -> Branches | list[Branches]: ...


@dataclass(frozen=True, eq=False)
class SearchState:
    """Where a search stands: a value that can be kept and resumed.

    ``pending``: chunks of open branches, taken depth first from the end; ``closed``: chunks of
    branches closed so far (domains only; empty when the search does not keep them);
    ``settled``: the weight settled so far (1.0 when everything is closed); ``unresolved``:
    open branches left unsplit because the search's leaf budget ran out (bounded, with their
    pre-activation bounds; a search with unresolved branches answers UNKNOWN).

    With ``keep_closed``, the closed, pending and unresolved branches of an input-splitting
    search without clipping are the leaves of one split tree: they partition the root box.
    """

    pending: tuple[Branches, ...]
    closed: tuple[Branches, ...] = ()
    settled: float = 0.0
    unresolved: tuple[Branches, ...] = ()

    @staticmethod
    def start(root: Branches) -> SearchState:
        return SearchState((root,))

    @property
    def pending_count(self) -> int:
        return sum(len(chunk) for chunk in self.pending)

    @property
    def pending_bytes(self) -> int:
        """Memory held by the pending branches' tensors (boxes, splits, inherited bounds, tags)."""
        return sum(chunk.nbytes for chunk in self.pending)

    @property
    def closed_count(self) -> int:
        return sum(len(chunk) for chunk in self.closed)

    @property
    def unresolved_count(self) -> int:
        return sum(len(chunk) for chunk in self.unresolved)

    def to_json(self) -> dict:
        return {"pending": self.pending_count, "closed": self.closed_count, "unresolved": self.unresolved_count,
                "settled": self.settled}


@dataclass(frozen=True, eq=False)
class SearchOutcome:
    """``status`` (HOLDS, VIOLATED, UNKNOWN or TIMEOUT), ``found`` for VIOLATED, and the
    ``state`` to resume from (for TIMEOUT: every pending branch is still there)."""

    status: VerificationStatus
    found: Found | None
    state: SearchState = field(repr=False)


def branch_and_bound(
    strategy: SearchStrategy,
    state: SearchState,
    deadline: Deadline,
    *,
    batch_size: int,
    stats: SearchStats,
    keep_closed: bool | str = False,
    max_leaves: int | None = None,
    priority: str | None = None,
    stop: Callable[[SearchState], bool] | None = None,
    progress: Callable[[float, int], None] | None = None,
) -> SearchOutcome:
    """Run (or resume) a search until it is decided or ``deadline`` passes.

    Args:
        strategy: the kind of branching.
        state: :meth:`SearchState.start` of the root branch, or the state of an earlier outcome.
        deadline: rounds are sized by it and none starts after it.
        batch_size: the most branches bounded per round.
        keep_closed: keep the closed branches' domains in the state (for reuse, e.g. by online
            verification); ``"with_bounds"`` keeps their pre-activation bounds too. Off by
            default: for ReLU splitting each closed leaf keeps a split history, which grows with
            the search; pending branches are always kept.
        max_leaves: a leaf budget (needs ``keep_closed``): open branches are split only while
            the closed, pending, unresolved and open branches number at most this many, the
            heaviest first; the others become ``unresolved`` and the search answers UNKNOWN
            once nothing is pending. Used where a bounded tree is wanted (online verification).
        priority: the name of a tag (see :attr:`Branches.tags`): each round takes the pending
            branches with the largest values of it (best first, e.g. preimage refinement's
            unapproximated volume) instead of the most recent ones (depth first, the default).
        stop: a caller's rule, asked after each round with the search's state: when it answers
            True the search returns UNKNOWN (not finished) with that state, which stays a
            valid value to resume from or read (anytime searches: a time-limited run, Ctrl-C).
        progress: optional ``(settled weight, pending branches)`` callback after each round.
    """
    if max_leaves is not None and not keep_closed:
        raise ValueError("a leaf budget (max_leaves) counts the closed branches: pass keep_closed=True")
    pending = list(state.pending)
    closed = list(state.closed)
    unresolved = list(state.unresolved)
    settled = state.settled

    def snapshot() -> SearchState:
        return SearchState(tuple(pending), tuple(closed), settled, tuple(unresolved))

    def leaf_count() -> int:
        return sum(len(chunk) for chunk in (*pending, *closed, *unresolved))

    while pending:
        if deadline.passed():
            return SearchOutcome(VerificationStatus.TIMEOUT, None, snapshot())
        batch = _take(pending, deadline.batch(batch_size)) if priority is None else \
            _take_best(pending, deadline.batch(batch_size), priority)
        started = time.monotonic()
        bounded = strategy.bound(batch, deadline, stats)
        deadline.record(len(batch), time.monotonic() - started)
        settled += float(bounded.settled.sum())
        open_ = ~bounded.closed
        done = bounded.closed
        if open_.any():
            found = strategy.probe(bounded, open_, deadline, stats)
            if found is not None:
                return SearchOutcome(VerificationStatus.VIOLATED, found, snapshot())
            leaves = strategy.decide(bounded, open_, deadline, stats)
            if leaves.found is not None:
                return SearchOutcome(VerificationStatus.VIOLATED, leaves.found, snapshot())
            if leaves.undecidable:
                pending.append(bounded.branches.select(open_))
                return SearchOutcome(VerificationStatus.UNKNOWN, None, snapshot())
            settled += float(bounded.branches.weight[leaves.decided].sum())
            done = done | leaves.decided
            open_ = open_ & ~leaves.decided
            if leaves.postponed is not None and leaves.postponed.any():
                pending.append(bounded.branches.select(leaves.postponed))  # bounded again when resumed
                open_ = open_ & ~leaves.postponed
            if open_.any() and max_leaves is not None:
                open_ = _within_budget(bounded.branches, open_, max_leaves - leaf_count() - int(done.sum()) - int(open_.sum()),
                                       unresolved)
            if open_.any():
                children = strategy.split(bounded, open_)
                pending.extend(children if isinstance(children, list) else [children])
        if keep_closed and done.any():
            closed.append(bounded.branches.select(done) if keep_closed == "with_bounds" else bounded.branches.domains(done))
        stats.max_pending = max(stats.max_pending, sum(len(chunk) for chunk in pending))
        if progress is not None:
            progress(settled, sum(len(chunk) for chunk in pending))
        if stop is not None and pending and stop(snapshot()):
            return SearchOutcome(VerificationStatus.UNKNOWN, None, snapshot())
    status = VerificationStatus.UNKNOWN if unresolved else VerificationStatus.HOLDS
    return SearchOutcome(status, None, snapshot())


def _within_budget(branches: Branches, open_: torch.Tensor, spare: int, unresolved: list[Branches]) -> torch.Tensor:
    """Keep at most ``spare`` open branches for splitting (each split adds one leaf), the
    heaviest first; move the rest to ``unresolved``. Returns the mask of branches to split."""
    count = int(open_.sum())
    if spare >= count:
        return open_
    indices = open_.nonzero().squeeze(1)
    order = branches.weight[indices].argsort(descending=True, stable=True)
    split = torch.zeros_like(open_)
    split[indices[order[:max(spare, 0)]]] = True
    rest = open_ & ~split
    unresolved.append(branches.select(rest))
    return split


def _take(pending: list[Branches], count: int) -> Branches:
    """Pop up to ``count`` branches from the end of the pending chunks (depth first)."""
    parts, have = [], 0
    while pending and have < count:
        chunk = pending.pop()
        need = count - have
        if len(chunk) > need:
            pending.append(chunk.select(slice(0, len(chunk) - need)))
            chunk = chunk.select(slice(len(chunk) - need, len(chunk)))
        parts.append(chunk)
        have += len(chunk)
    return Branches.concat(parts)


def _take_best(pending: list[Branches], count: int, tag: str) -> Branches:
    """Pop the ``count`` pending branches with the largest ``tags[tag]`` (best first); the rest
    stay pending as one chunk."""
    every = Branches.concat(pending)
    pending.clear()
    if len(every) <= count:
        return every
    order = every.tags[tag].argsort(descending=True, stable=True)
    pending.append(every.select(order[count:]))
    return every.select(order[:count])


def _select_tags(tags: dict[str, torch.Tensor] | None, which) -> dict[str, torch.Tensor] | None:
    return None if tags is None else {name: value[which] for name, value in tags.items()}


def _concat_bounds(parts: list[IntermediateBounds | None], sizes: list[int]) -> IntermediateBounds | None:
    """Concatenate branches' intermediate bounds; branches without some get (−inf, +inf) there."""
    if all(p is None for p in parts):
        return None
    template = max((p for p in parts if p is not None), key=lambda p: len(p.operator_lower))

    def unknown(like: tuple[torch.Tensor, ...], n: int, value: float) -> tuple[torch.Tensor, ...]:
        return tuple(torch.full((n, *t.shape[1:]), value, dtype=t.dtype) for t in like)

    def joined(field: str, value: float) -> tuple[torch.Tensor, ...]:
        like = getattr(template, field)
        pieces = [getattr(p, field) if p is not None and getattr(p, field) else unknown(like, n, value)
                  for p, n in zip(parts, sizes)]
        return tuple(torch.cat([piece[k] for piece in pieces]) for k in range(len(like)))

    return IntermediateBounds(joined("lower", -torch.inf), joined("upper", torch.inf),
                              joined("operator_lower", -torch.inf), joined("operator_upper", torch.inf))
