"""The leaves online verification keeps from one step to the next."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from assay.bounds import IntermediateBounds
from assay.verify.search import Branches

__all__ = ["Leaves"]


@dataclass(frozen=True, eq=False)
class Leaves:
    """The leaves of one split tree (struct of arrays, N leaves over n inputs, m query rows).

    Attributes:
        cell_lower, cell_upper: (N, n) each leaf's cell (split planes, ±inf on the domain's
            boundary); the cells partition the input space, so cell ∩ X(t) partitions X(t).
        checked_lower, checked_upper: (N, n) the box on which the leaf's verdict was last
            established (its domain then, or that domain grown by RSR's offset).
        verified: (N,) bool: sound bounds showed no point of the checked box violates, for the
            network of the step that checked it.
        row_upper: (N, m) upper bounds of the query rows on the checked box (+inf if none).
        bounds: the pre-activation bounds on the checked boxes (for incremental computation),
            or None.
        inn: (N,) bool: the verdict holds for every network inside the current INN intervals.
    """

    cell_lower: torch.Tensor
    cell_upper: torch.Tensor
    checked_lower: torch.Tensor
    checked_upper: torch.Tensor
    verified: torch.Tensor
    row_upper: torch.Tensor
    bounds: IntermediateBounds | None
    inn: torch.Tensor

    def __len__(self) -> int:
        return self.verified.shape[0]

    def select(self, which) -> Leaves:
        return Leaves(self.cell_lower[which], self.cell_upper[which], self.checked_lower[which],
                      self.checked_upper[which], self.verified[which], self.row_upper[which],
                      None if self.bounds is None else self.bounds.select(which), self.inn[which])

    def with_flags(self, *, verified=None, inn=None) -> Leaves:
        return Leaves(self.cell_lower, self.cell_upper, self.checked_lower, self.checked_upper,
                      self.verified if verified is None else verified, self.row_upper, self.bounds,
                      self.inn if inn is None else inn)

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
        return Leaves(cat("cell_lower"), cat("cell_upper"), cat("checked_lower"), cat("checked_upper"), cat("verified"),
                      cat("row_upper"), bounds, cat("inn"))

    @staticmethod
    def from_branches(branches: Branches, verified: bool, cell_lower, cell_upper, rows: int) -> Leaves:
        """Leaves for bounded branches of an input-splitting search, with their cells."""
        count = len(branches)
        row_upper = branches.row_upper
        if row_upper is None:
            row_upper = torch.full((count, rows), torch.inf, dtype=torch.float64)
        return Leaves(cell_lower, cell_upper, branches.lower, branches.upper,
                      torch.full((count,), verified, dtype=torch.bool), row_upper.to(torch.float64),
                      branches.parents, torch.zeros(count, dtype=torch.bool))
