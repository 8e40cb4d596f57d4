"""The Clemont paper's BDD monitor (Sec. 4.1): ε-cells of a fixed grid, a BDD of the occupied cells, an adjacency relation.

Every column is cut into cells of width ``w = ε(1 + 1e-6)`` on a fixed grid (origin and number
of cells per column fixed from the first rows, or given as ``bounds``; values outside fall into
the border cells, which only adds candidates). A cell index is a ``b_j``-bit unsigned number, so
a row's cell is an assignment of the variables ``x_j_i``. The monitor keeps

* ``H(x)``: the BDD of the occupied cells (the union of their cubes), and
* ``A(x, y)``: the adjacency relation ``⋀_j |x_j − y_j| ≤ 1``, built once
  (variables interleaved column by column, most significant bit first, so it stays small).

A query with radius r ≤ ε whose probed cells (see :mod:`assay.monitor.frnn._cells` for the
outward margin) lie within one cell of its own cell ``c`` computes ``E = A(x, c) ∧ H(x)``; if
``E`` is false there is no close row (the common case, one BDD operation). Otherwise the cells
of ``E`` are enumerated and their rows re-checked with the canonical formula — the exact
post-check — so answers are exact; the paper filtered its false positives the same way. Other
queries (a larger radius, huge values) scan the rows. Needs ``dd`` (CUDD bindings ``dd.cudd``
when the wheel has them, else the pure-Python ``dd.autoref``; see :data:`BDD_ENGINE`).
"""

from __future__ import annotations

from typing import ClassVar

import numpy as np

from assay.errors import OptionError, UnsupportedError
from assay.monitor import _kernels
from assay.monitor.frnn._base import FrnnIndex

__all__ = ["BDDIndex", "BDD_ENGINE"]


def _manager_class():
    try:
        from dd.cudd import BDD

        return BDD, "dd.cudd"
    except ImportError:
        pass
    try:
        from dd.autoref import BDD

        return BDD, "dd.autoref"
    except ImportError as exc:
        raise UnsupportedError(
            "index='bdd' needs the dd package (pip install dd==0.6.0, or assay's `monitor` extra); "
            "index='grid' gives the same answers without it"
        ) from exc


def _engine() -> str | None:
    try:
        return _manager_class()[1]
    except UnsupportedError:
        return None


#: Which BDD engine ``index="bdd"`` uses here: ``"dd.cudd"``, ``"dd.autoref"`` or None (dd missing).
BDD_ENGINE = _engine()


class BDDIndex(FrnnIndex):
    """Exact range queries from a BDD of occupied ε-cells and the cell-adjacency relation, with an exact post-check.

    Args:
        dim, metric: as every index (``"linf"``, ``"l2"`` or ``"l1"``: a row within r of q in any
            of them is within r of q on every column).
        epsilon: the monitor's radius; the cell width is ``ε(1 + 1e-6)`` (with ε = 0, the
            columns' spread / 4096).
        bounds: ``(low, high)`` per column (arrays of shape (dim,)) fixing the grid; None fixes
            it from the first rows added, with 16 cells of head room on each side.
        max_bits: at most this many bits (2^max_bits cells) per column.
    """

    name: ClassVar[str] = "bdd"
    metrics: ClassVar[tuple[str, ...]] = ("linf", "l2", "l1")

    def __init__(self, dim: int, metric: str = "linf", epsilon: float = 0.0, bounds=None, max_bits: int = 16):
        manager, self.engine = _manager_class()
        super().__init__(dim, metric)
        epsilon = float(epsilon)
        if not (epsilon >= 0 and np.isfinite(epsilon)):
            raise OptionError(f"the `epsilon` of a bdd index must be a finite number ≥ 0; got {epsilon!r}")
        if not 1 <= int(max_bits) <= 30:
            raise OptionError(f"the `max_bits` of a bdd index must be in 1..30; got {max_bits!r}")
        self.epsilon = epsilon
        self.max_bits = int(max_bits)
        self._manager_type = manager
        self._bounds = None if bounds is None else (np.asarray(bounds[0], dtype=np.float64), np.asarray(bounds[1], dtype=np.float64))
        if self._bounds is not None and (self._bounds[0].shape != (self.dim,) or self._bounds[1].shape != (self.dim,)):
            raise OptionError(f"the `bounds` of a bdd index must be two arrays of shape ({self.dim},)")
        self._bdd = None  # built with the grid, at the first rows

    # -- the fixed grid and the BDDs ----------------------------------------------------
    def _build(self, rows: np.ndarray) -> None:
        low, high = self._bounds if self._bounds is not None else (rows.min(axis=0), rows.max(axis=0))
        spread = np.maximum(high - low, 0.0)
        if self.epsilon > 0:
            width = np.full(self.dim, self.epsilon * (1.0 + 1e-6))
        else:
            width = np.where(spread > 0, spread / 4096.0, 1.0)
        head_room = 0 if self._bounds is not None else 16
        self._width = width
        self._origin = low - head_room * width
        cells = np.ceil(np.minimum((spread + 2 * head_room * width) / width, 2.0**self.max_bits)).astype(np.int64) + 1
        self._bits = np.maximum(1, np.ceil(np.log2(np.maximum(cells, 2))).astype(np.int64))
        self._bits = np.minimum(self._bits, self.max_bits)
        self._top = (1 << self._bits) - 1
        bdd = self._manager_type()
        names_x, names_y = [], []
        for j in range(self.dim):
            for i in reversed(range(int(self._bits[j]))):  # most significant bit first, x and y interleaved
                names_x.append(f"x{j}_{i}")
                names_y.append(f"y{j}_{i}")
        order = [name for pair in zip(names_x, names_y) for name in pair]
        bdd.declare(*order)
        # The interleaved order is already good for A and H; CUDD's dynamic reordering (on by
        # default) would spend seconds sifting thousands of variables.
        bdd.configure(reordering=False)
        self._bdd = bdd
        self._x_names = names_x
        self._adjacency = self._adjacency_relation()
        self._history = bdd.false
        self._cells: dict[tuple, list[int]] = {}

    def _adjacency_relation(self):
        """``⋀_j |x_j − y_j| ≤ 1`` over unsigned b_j-bit numbers, O(Σ b_j) BDD operations.

        ``first = second + 1`` means: some bit k where first has 1 and second 0, equal bits above
        it, and first 0s / second 1s below it. Prefix equalities and suffix patterns are
        accumulated once per column; the columns are conjoined from the last (lowest in the
        variable order) up, so each conjunction only adds the new column on top.
        """
        bdd = self._bdd
        relation = bdd.true
        for j in reversed(range(self.dim)):
            bits = int(self._bits[j])
            x = [bdd.var(f"x{j}_{i}") for i in reversed(range(bits))]  # MSB first
            y = [bdd.var(f"y{j}_{i}") for i in reversed(range(bits))]
            prefix_equal = [bdd.true]
            for a, b in zip(x, y):
                prefix_equal.append(prefix_equal[-1] & a.equiv(b))
            column = prefix_equal[bits]
            for first, second in ((x, y), (y, x)):
                below = bdd.true  # first has 0s and second 1s on the bits after k
                for k in reversed(range(bits)):
                    column |= prefix_equal[k] & first[k] & ~second[k] & below
                    below = below & ~first[k] & second[k]
            relation = column & relation
        return relation

    def _cell_of(self, rows: np.ndarray) -> np.ndarray:
        cells = np.floor(np.clip((rows - self._origin) / self._width, -1.0, 2.0**40))
        return np.clip(cells, 0, self._top).astype(np.int64)

    def _assignment(self, cell: np.ndarray, prefix: str) -> dict:
        values = {}
        for j in range(self.dim):
            value = int(cell[j])
            for i in range(int(self._bits[j])):
                values[f"{prefix}{j}_{i}"] = bool(value >> i & 1)
        return values

    def _decode(self, assignment: dict) -> tuple:
        return tuple(sum(1 << i for i in range(int(self._bits[j])) if assignment[f"x{j}_{i}"]) for j in range(self.dim))

    # -- FrnnIndex hooks ------------------------------------------------------------------
    def _added(self, positions: slice) -> None:
        store = self._store
        if positions.stop <= positions.start:
            return
        if self._bdd is None:
            self._build(store.data[: store.size][store.alive[: store.size]])
        cells = self._cell_of(store.data[positions])
        for offset, cell in enumerate(cells):
            key = tuple(cell.tolist())
            members = self._cells.get(key)
            if members is None:
                self._cells[key] = [positions.start + offset]
                self._history |= self._bdd.cube(self._assignment(cell, "x"))
            else:
                members.append(positions.start + offset)

    def _reindex(self) -> None:
        if self._bdd is None:
            return
        self._history = self._bdd.false
        self._cells = {}
        store = self._store
        if store.size:
            self._added(slice(0, store.size))

    def _candidates(self, queries, query_norms, radius):
        store = self._store
        if self._bdd is None:
            return self._verify_slice(queries, query_norms, radius, 0, store.size)
        own = self._cell_of(queries)
        margin = radius * (1.0 + 1e-12) + np.abs(queries) * 2.0**-51 + 1e-300
        low, high = self._cell_of(queries - margin), self._cell_of(queries + margin)
        adjacent = np.all((low >= own - 1) & (high <= own + 1), axis=1)
        pair_query, pair_position = [], []
        scan = []
        for i in range(queries.shape[0]):
            if not adjacent[i]:
                scan.append(i)
                continue
            neighbours = self._bdd.let(self._assignment(own[i], "y"), self._adjacency) & self._history
            if neighbours == self._bdd.false:
                continue
            for assignment in self._bdd.pick_iter(neighbours, care_vars=self._x_names):
                members = self._cells.get(self._decode(assignment), ())
                pair_query.extend([i] * len(members))
                pair_position.extend(members)
        pair_query = np.asarray(pair_query, dtype=np.int64)
        pair_position = np.asarray(pair_position, dtype=np.int64)
        keep, distances = _kernels.verify_pairs(store.data, store.norms, store.alive, pair_query, pair_position,
                                                 queries, query_norms, radius, self._code)
        parts = [(pair_query[keep], pair_position[keep], distances[keep])]
        for i in scan:
            q, p, d = self._verify_slice(queries[i : i + 1], query_norms[i : i + 1], radius, 0, store.size)
            parts.append((q + i, p, d))
        return tuple(np.concatenate([part[k] for part in parts]) for k in range(3))
