"""Brute force: every stored row checked against every query, in one compiled loop.

The loop abandons a row as soon as its partial distance proves ``d > radius`` (for L∞ usually
after the first coordinate), so a query costs about one pass over the rows' first columns.
Exact by construction (it *is* the canonical check); supports every metric and removal.
"""

from __future__ import annotations

from typing import ClassVar

from assay.monitor.frnn._base import FrnnIndex

__all__ = ["BruteForceIndex"]


class BruteForceIndex(FrnnIndex):
    """Exact range queries by a compiled scan of all rows (numba), with early abandoning."""

    name: ClassVar[str] = "brute"

    def _added(self, positions: slice) -> None:
        pass

    def _reindex(self) -> None:
        pass

    def _candidates(self, queries, query_norms, radius):
        return self._verify_slice(queries, query_norms, radius, 0, self._store.size)
