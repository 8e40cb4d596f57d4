"""The leaves online verification keeps from one step to the next, and the rule for reusing them.

A kept leaf carries the identity of what its verdict and its bounds were proved for: the box
(``checked_lower``/``checked_upper`` here, a branch's box for ReLU-splitting leaves) and the
*network version* (an int the verifier bumps whenever the network's parameters change). A verdict
is reused only for the same version and a domain inside that box; :func:`check_current` makes the
version half of that rule a checked invariant of every reuse path, and :func:`stale_rows` is how a
step marks what an earlier step left behind for another network (an early stop, an exception).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from assay.bounds import IntermediateBounds
from assay.verify.search import Branches

__all__ = ["Leaves", "check_current", "stale_rows", "unbounded_rows", "versions_like"]


def versions_like(count: int, version: int) -> torch.Tensor:
    """(count,) int64: ``count`` leaves proved for network ``version``."""
    return torch.full((count,), version, dtype=torch.int64)


def stale_rows(versions: torch.Tensor, version: int) -> torch.Tensor:
    """(N,) bool: the leaves whose verdicts and bounds were proved for another network version."""
    return versions != version


def check_current(versions: torch.Tensor, reused: torch.Tensor, version: int, kind: str) -> None:
    """The reuse invariant: every leaf in ``reused`` was proved for network ``version``.

    Raises AssertionError naming the first offending leaf: reusing it would certify the current
    network with a proof about another one (a bug in the verifier, never bad input).
    """
    stale = reused & stale_rows(versions, version)
    if bool(stale.any()):
        leaf = int(stale.nonzero()[0, 0])
        raise AssertionError(f"online verification would reuse {kind} leaf {leaf}, proved for network version "
                             f"{int(versions[leaf])}, as a proof for network version {version}")


def unbounded_rows(bounds: IntermediateBounds, rows: torch.Tensor) -> IntermediateBounds:
    """``bounds`` with the rows in ``rows`` (N,) bool replaced by ±inf (nothing known)."""
    def mask(tensors, fill):
        return tuple(torch.where(rows.reshape(-1, *([1] * (t.dim() - 1))), fill, t) for t in tensors)
    return IntermediateBounds(mask(bounds.lower, -torch.inf), mask(bounds.upper, torch.inf))


@dataclass(frozen=True, eq=False)
class Leaves:
    """The leaves of one split tree (struct of arrays, N leaves over n inputs, m query rows).

    Attributes:
        cell_lower, cell_upper: (N, n) each leaf's cell (split planes, ±inf on the domain's
            boundary); the cells partition the input space, so cell ∩ X(t) partitions X(t).
        checked_lower, checked_upper: (N, n) the box on which the leaf's verdict was last
            established (its domain then, or that domain grown by RSR's offset).
        verified: (N,) bool: sound bounds showed no point of the checked box violates, for
            network ``network_version``.
        row_upper: (N, m) upper bounds of the query rows on the checked box (+inf if none).
        bounds: the pre-activation bounds on the checked boxes (for incremental computation),
            for network ``network_version``, or None.
        inn: (N,) bool: the verdict holds for every network inside the current INN intervals.
        network_version: (N,) int64: the network version ``verified``, ``row_upper`` and
            ``bounds`` were proved for.
        grow_failed: (N,) bool: RSR's grown box of this leaf failed to verify since the drift
            last changed direction (RSR does not grow it again until then); None: none failed.
    """

    cell_lower: torch.Tensor
    cell_upper: torch.Tensor
    checked_lower: torch.Tensor
    checked_upper: torch.Tensor
    verified: torch.Tensor
    row_upper: torch.Tensor
    bounds: IntermediateBounds | None
    inn: torch.Tensor
    network_version: torch.Tensor
    grow_failed: torch.Tensor | None = None

    def __len__(self) -> int:
        return self.verified.shape[0]

    @property
    def failed_growing(self) -> torch.Tensor:
        """(N,) bool: ``grow_failed`` with None read as all False."""
        return torch.zeros(len(self), dtype=torch.bool) if self.grow_failed is None else self.grow_failed

    def select(self, which) -> Leaves:
        return Leaves(self.cell_lower[which], self.cell_upper[which], self.checked_lower[which],
                      self.checked_upper[which], self.verified[which], self.row_upper[which],
                      None if self.bounds is None else self.bounds.select(which), self.inn[which],
                      self.network_version[which], None if self.grow_failed is None else self.grow_failed[which])

    def with_flags(self, *, verified=None, inn=None, grow_failed=None) -> Leaves:
        return replace(self, verified=self.verified if verified is None else verified,
                       inn=self.inn if inn is None else inn,
                       grow_failed=self.grow_failed if grow_failed is None else grow_failed)

    def stamped(self, version: int) -> Leaves:
        """The same leaves, declared proved for network ``version`` (the caller's argument)."""
        return replace(self, network_version=versions_like(len(self), version))

    def expired(self, version: int) -> Leaves:
        """The leaves proved for another network than ``version`` lose their verdicts, row bounds
        and pre-activation bounds (they must be bounded again); all are then stamped ``version``."""
        stale = stale_rows(self.network_version, version)
        if not bool(stale.any()):
            return self
        row_upper = torch.where(stale.unsqueeze(1), torch.inf, self.row_upper)
        bounds = None if self.bounds is None else unbounded_rows(self.bounds, stale)
        return replace(self, verified=self.verified & ~stale, row_upper=row_upper, bounds=bounds, inn=self.inn & ~stale,
                       network_version=versions_like(len(self), version))

    @staticmethod
    def concat(parts: list[Leaves]) -> Leaves:
        nonempty = [p for p in parts if len(p)]
        if len(nonempty) <= 1:
            return nonempty[0] if nonempty else parts[0]
        parts = nonempty
        bounds = None
        if all(p.bounds is not None for p in parts):
            layers = range(len(parts[0].bounds.lower))
            bounds = IntermediateBounds(tuple(torch.cat([p.bounds.lower[k] for p in parts]) for k in layers),
                                        tuple(torch.cat([p.bounds.upper[k] for p in parts]) for k in layers))
        cat = lambda name: torch.cat([getattr(p, name) for p in parts])  # noqa: E731
        grow_failed = None
        if any(p.grow_failed is not None for p in parts):
            grow_failed = torch.cat([p.failed_growing for p in parts])
        return Leaves(cat("cell_lower"), cat("cell_upper"), cat("checked_lower"), cat("checked_upper"), cat("verified"),
                      cat("row_upper"), bounds, cat("inn"), cat("network_version"), grow_failed)

    @staticmethod
    def from_branches(branches: Branches, verified: bool, cell_lower, cell_upper, rows: int, version: int,
                      grow_failed: torch.Tensor | None = None) -> Leaves:
        """Leaves for branches of an input-splitting search bounded for network ``version``, with
        their cells (and ``grow_failed`` inherited from the leaves they were split from)."""
        count = len(branches)
        row_upper = branches.row_upper
        if row_upper is None:
            row_upper = torch.full((count, rows), torch.inf, dtype=torch.float64)
        return Leaves(cell_lower, cell_upper, branches.lower, branches.upper,
                      torch.full((count,), verified, dtype=torch.bool), row_upper.to(torch.float64),
                      branches.parents, torch.zeros(count, dtype=torch.bool), versions_like(count, version), grow_failed)
