"""Exact fixed-radius near-neighbour (FRNN) indexes behind one faiss-like protocol.

=========  =====================================  ===============  ======  ================================
name       class                                  metrics          remove  needs
=========  =====================================  ===============  ======  ================================
brute      :class:`BruteForceIndex`               all four         yes     numba (else plain Python)
grid       :class:`GridIndex`                     linf, l2, l1     yes
kdtree     :class:`KDTreeIndex`                   all four         yes     scipy
snn        :class:`SortedProjectionIndex`         linf, l2, l1     yes
bdd        :class:`BDDIndex`                      linf, l2, l1     yes     dd (CUDD bindings if available)
partition  :class:`ColumnPartitionIndex`          linf             yes     (sub-indexes in processes)
faiss      :class:`FaissFlatIndex`                linf, l2, l1     yes     faiss-cpu
=========  =====================================  ===============  ======  ================================

Every backend answers ``range_query`` with exactly the stored rows whose canonical float64
distance (:mod:`assay.monitor._kernels`) is ≤ the radius, so all agree bit for bit with brute force.
The protocol — what users, the monitor and a new backend see — is documented on :class:`FrnnIndex`.
:func:`make_index` builds one by name; ``"auto"`` picks by metric, dimension and size
(:func:`choose_backend`). ``brute`` and ``grid`` are *fused*: the monitor runs its whole
query-then-insert loop for a batch (:meth:`FrnnIndex.observe_rows`) or one decision
(:meth:`FrnnIndex.observe_row`) in one compiled call.
"""

from __future__ import annotations

from assay.errors import OptionError
from assay.monitor.frnn._base import FrnnIndex
from assay.monitor.frnn.bdd import BDDIndex
from assay.monitor.frnn.brute import BruteForceIndex
from assay.monitor.frnn.faiss_flat import FaissFlatIndex
from assay.monitor.frnn.grid import GridIndex
from assay.monitor.frnn.kdtree import KDTreeIndex
from assay.monitor.frnn.partition import ColumnPartitionIndex
from assay.monitor.frnn.snn import SortedProjectionIndex

__all__ = [
    "FrnnIndex", "BruteForceIndex", "KDTreeIndex", "SortedProjectionIndex", "GridIndex", "BDDIndex",
    "ColumnPartitionIndex", "FaissFlatIndex", "BACKENDS", "make_index", "choose_backend", "warm_up",
]

BACKENDS: dict[str, type[FrnnIndex]] = {
    "brute": BruteForceIndex,
    "grid": GridIndex,
    "kdtree": KDTreeIndex,
    "snn": SortedProjectionIndex,
    "bdd": BDDIndex,
    "partition": ColumnPartitionIndex,
    "faiss": FaissFlatIndex,
}

#: Backends whose constructor takes the monitor's ε (their cells are multiples of it).
_TAKES_EPSILON = ("grid", "bdd", "partition")


def choose_backend(metric: str, dim: int, size: int | None = None) -> str:
    """The backend ``index="auto"`` uses for this metric, dimension and expected size.

    L∞, L1 and L2: the hash grid. It is a cost-model choice itself: while the history is small
    (or when no set of columns separates the rows, e.g. very wide rows or a radius spanning the
    data) it scans, like brute force, and it re-fits its columns each time the history doubles;
    a ``size`` below 256 picks brute force outright. Cosine: a k-d tree on normalised rows up to
    16 columns, else brute force. The BDD, partition and faiss backends are never chosen
    automatically: on one machine the grid answers the same, faster (see benchmarks/monitor.py).
    """
    if metric in ("linf", "l2", "l1"):
        return "brute" if size is not None and size < 256 else "grid"
    return "kdtree" if dim <= 16 else "brute"


def make_index(name: str, dim: int, metric: str, epsilon: float, **options) -> FrnnIndex:
    """Build the backend ``name`` (or ``"auto"``) for rows of width ``dim`` and queries of radius ``epsilon``."""
    if name == "auto":
        name = choose_backend(metric, dim)
    if name not in BACKENDS:
        listed = ", ".join(repr(n) for n in ("auto", *BACKENDS))
        raise OptionError(f"the `index` option of Monitor must be one of {listed}; got {name!r}")
    cls = BACKENDS[name]
    if name in _TAKES_EPSILON:
        options.setdefault("epsilon", epsilon)
    return cls(dim, metric, **options)


def warm_up(metric: str = "linf", dim: int = 3) -> None:
    """Compile (or load from numba's cache) the kernels a monitor uses, so that the first decisions are not slow.

    Runs a tiny grid and brute-force index through insertion, a refit and queries.
    """
    import numpy as np

    from assay.monitor import _kernels

    rng = np.random.default_rng(0)
    _kernels.all_finite(rng.random(dim))
    rows = rng.random((8, dim))
    for index in (GridIndex(dim, metric, 0.1, min_fit=4) if metric in GridIndex.metrics else None, BruteForceIndex(dim, metric)):
        if index is None:
            continue
        ids = np.arange(8, dtype=np.int64)
        index.observe_rows(rows, ids, ids % 2, True, -1, False, 0.1)
        index.observe_row(rows[0], 8, 0, False, 0.1)
        index.range_query(rows[:2], 0.1)
