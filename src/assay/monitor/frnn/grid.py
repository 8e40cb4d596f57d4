"""Grid hashing: rows bucketed by cells on a few chosen columns; a query walks the cells its ball reaches.

A cell is the tuple ``floor((x_j − s_j)/w_j)`` over k hashed columns (see
:mod:`assay.monitor.frnn._cells` for why every close row is found whatever the widths are: the
probed cell ranges are computed with an outward margin, and the canonical formula decides).
Because ``|x_j − q_j| ≤ d(x, q)`` for L∞, L1 and L2 alike, one grid serves all three metrics.

Which columns, and how wide: a cost model, re-fitted each time the history doubles (from
``min_fit`` rows until ``refit_until``). On an evenly spaced sample of the live rows it
greedily adds the column and width (ε × 1, 2, 4 or 8) that most lower the estimated cost of a
query, ``probe_cost × cells probed + candidate_cost × n × (fraction of sample pairs sharing a probed
cell)``, and stops when scanning all n rows would be as cheap (k = 0: the grid then scans). The
joint fractions are measured on the sample, so correlated columns (one-hot blocks) and discrete
columns (whose neighbouring cells are empty) are valued as they really are.
"""

from __future__ import annotations

from typing import ClassVar

import numpy as np

from assay.errors import OptionError
from assay.monitor.frnn import _cells
from assay.monitor.frnn._cellbase import CellIndex

__all__ = ["GridIndex"]

_ALPHAS = np.array([1.0, 2.0, 4.0, 8.0])


class GridIndex(CellIndex):
    """Exact L∞ / L1 / L2 range queries from a hash grid on cost-chosen columns (re-fitted as the history grows).

    Args:
        dim, metric: as every index (``"linf"``, ``"l2"`` or ``"l1"``).
        epsilon: the radius the monitor queries with; cell widths are multiples of it (with
            ε = 0, of the columns' spread / 1024). Queries with any other radius are still exact.
        hashed_columns: hash exactly this many columns (a test seam; None lets the cost model decide).
        max_hashed_columns: at most this many hashed columns.
        min_fit: first fit at this many rows (below it, queries scan).
        refit_until: stop re-fitting once the history has this many rows.
        fit_sample: at most this many rows of the history are looked at by the cost model
            (fewer while the history is small: a fit costs about ``fit_budget`` ns per row).
    """

    name: ClassVar[str] = "grid"
    metrics: ClassVar[tuple[str, ...]] = ("linf", "l2", "l1")
    fit_budget: ClassVar[float] = 400.0

    def __init__(self, dim: int, metric: str = "linf", epsilon: float = 0.0, hashed_columns: int | None = None,
                 max_hashed_columns: int = 12, min_fit: int = 256, refit_until: int = 1 << 22, fit_sample: int = 320):
        super().__init__(dim, metric)
        epsilon = float(epsilon)
        if not (epsilon >= 0 and np.isfinite(epsilon)):
            raise OptionError(f"the `epsilon` of a grid index must be a finite number ≥ 0; got {epsilon!r}")
        if hashed_columns is not None and not 0 <= int(hashed_columns) <= dim:
            raise OptionError(f"the `hashed_columns` of a grid index must be in 0..{dim}; got {hashed_columns!r}")
        if int(max_hashed_columns) < 1 or int(min_fit) < 2:
            raise OptionError("a grid index needs max_hashed_columns ≥ 1 and min_fit ≥ 2")
        self.epsilon = epsilon
        self.hashed_columns = None if hashed_columns is None else int(hashed_columns)
        self.max_hashed_columns = int(max_hashed_columns) if hashed_columns is None else max(int(hashed_columns), 1)
        self.min_fit = int(min_fit)
        self.refit_until = int(refit_until)
        self.fit_sample = int(fit_sample)
        self._next_fit = None if self.hashed_columns == 0 else self.min_fit

    @property
    def hashed(self) -> tuple[int, ...]:
        """The columns hashed now (empty: queries scan)."""
        return tuple(self._columns.tolist())

    def _maybe_refit(self, incoming: int) -> int:
        live = self._store.live
        if self._next_fit is None:
            return incoming
        if live >= self._next_fit:
            self._refit()
            self._next_fit = 2 * live if 2 * live <= self.refit_until else None
            if self._next_fit is None:
                return incoming
        return self._next_fit - live

    def _reindex(self) -> None:
        self._refit() if self._store.live >= 2 else self._rebuild()

    def _refit(self) -> None:
        store = self._store
        live = np.flatnonzero(store.alive[: store.size])
        if live.size < 2:
            return
        sample = np.ascontiguousarray(store.data[live[np.linspace(0, live.size - 1, min(live.size, self.fit_sample)).astype(np.int64)]])
        spread = sample.max(axis=0) - sample.min(axis=0)
        if self.epsilon > 0:
            bases = np.full(self.dim, self.epsilon)
        else:
            bases = np.where(spread > 0, spread / 1024.0, 1.0)
        cells = np.floor(sample / bases)
        cells.sort(axis=0)
        distinct = 1 + np.count_nonzero(np.diff(cells, axis=0), axis=0)
        candidates = np.flatnonzero(distinct > 1)
        if self.hashed_columns is not None and candidates.size < self.hashed_columns:
            candidates = np.arange(self.dim)  # forced: constant columns too
        candidates = candidates[np.argsort(-distinct[candidates], kind="stable")[:64]].astype(np.int64)
        # The fit costs about 3 ns × m² × (options tried): about fit_budget ns per live row, paid
        # once per doubling of the history, so at most ~2 × fit_budget ns per decision overall.
        options = max(1, 2 * candidates.size * _ALPHAS.size)
        m = int(min(sample.shape[0], max(16, np.sqrt(self.fit_budget * live.size / (3.0 * options)))))
        sample = np.ascontiguousarray(sample[np.linspace(0, sample.shape[0] - 1, m).astype(np.int64)])
        # Past ~10⁵ rows the table and the rows leave the caches: a probe and a candidate then
        # cost about one memory access each.
        big = 2 * live.size > 1 << 17
        columns, widths, shifts = _cells.choose_cells(
            sample, candidates, np.ascontiguousarray(bases[candidates]), _ALPHAS, self.epsilon, float(2 * live.size),
            self.probe_cost, 40.0 if big else self.candidate_cost, self.scan_cost,
            min(self.max_hashed_columns, candidates.size), 0 if self.hashed_columns is None else min(self.hashed_columns, candidates.size))
        # The lead column (checked before anything else) is the one that most often proves d > ε alone.
        small = sample[np.linspace(0, m - 1, min(m, 48)).astype(np.int64)][:, candidates] if candidates.size else None
        if small is not None and small.shape[0] > 1:
            within = (np.abs(small[:, None, :] - small[None, :, :]) <= self.epsilon).mean(axis=(0, 1))
            self._lead = int(candidates[int(np.argmin(within))])
        self._set_cells(columns, widths, shifts)
