"""Brute force: every stored row checked against every query, in one compiled loop.

The loop abandons a row as soon as its partial distance proves ``d > radius`` (for L∞ usually
after the first coordinate), and in the monitor skips rows with the same label before touching
their coordinates, so a query costs about one pass over the labels and the rows' first columns.
Exact by construction (it *is* the canonical check); supports every metric and removal. It is
the hash-grid core with no hashed column, so it shares the fused query-then-insert loop.
"""

from __future__ import annotations

from typing import ClassVar

from assay.monitor.frnn._cellbase import CellIndex

__all__ = ["BruteForceIndex"]


class BruteForceIndex(CellIndex):
    """Exact range queries by a compiled scan of all rows (numba), with early abandoning."""

    name: ClassVar[str] = "brute"
