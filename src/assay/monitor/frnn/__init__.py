"""Exact fixed-radius near-neighbour (FRNN) indexes behind one faiss-like protocol.

=========  =====================================  ===============  ======  ================================
name       class                                  metrics          remove  needs
=========  =====================================  ===============  ======  ================================
scan       :class:`ScanIndex`                     all four         yes     numpy only
brute      :class:`BruteForceIndex`               all four         yes     numba (else plain Python)
grid       :class:`GridIndex`                     linf, l2, l1     yes     numba (else plain Python)
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
(:func:`choose_backend`). ``scan``, ``brute`` and ``grid`` are *fused*: the monitor runs its whole
query-then-insert loop for a batch (:meth:`FrnnIndex.observe_rows`) or one decision
(:meth:`FrnnIndex.observe_row`) in one call (compiled for brute and grid, whole-array numpy for scan).
A backend's module, and what it needs, is imported when the backend is first looked up
(``BACKENDS[name]``, :func:`make_index`), so a job loads only its own backend.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping

from assay._lazy import lazy_names
from assay.errors import OptionError
from assay.monitor.frnn._base import FrnnIndex

__all__ = [
    "FrnnIndex", "ScanIndex", "BruteForceIndex", "KDTreeIndex", "SortedProjectionIndex", "GridIndex", "BDDIndex",
    "ColumnPartitionIndex", "FaissFlatIndex", "BACKENDS", "make_index", "choose_backend", "warm_up",
]

# Where each backend lives: a backend's module (and what it needs: numba, scipy, dd, faiss) is
# imported when the backend is first used, so that a job loads only its own backend.
_HOMES = {
    "ScanIndex": "assay.monitor.frnn.scan",
    "BruteForceIndex": "assay.monitor.frnn.brute",
    "GridIndex": "assay.monitor.frnn.grid",
    "KDTreeIndex": "assay.monitor.frnn.kdtree",
    "SortedProjectionIndex": "assay.monitor.frnn.snn",
    "BDDIndex": "assay.monitor.frnn.bdd",
    "ColumnPartitionIndex": "assay.monitor.frnn.partition",
    "FaissFlatIndex": "assay.monitor.frnn.faiss_flat",
}
__getattr__, __dir__ = lazy_names(__name__, _HOMES)

_CLASS_OF = {
    "scan": "ScanIndex",
    "brute": "BruteForceIndex",
    "grid": "GridIndex",
    "kdtree": "KDTreeIndex",
    "snn": "SortedProjectionIndex",
    "bdd": "BDDIndex",
    "partition": "ColumnPartitionIndex",
    "faiss": "FaissFlatIndex",
}


class _Backends(Mapping):
    """Backend name → index class; a class (and its module's dependencies) is imported when first looked up."""

    def __getitem__(self, name: str) -> type[FrnnIndex]:
        return __getattr__(_CLASS_OF[name])

    def __iter__(self) -> Iterator[str]:
        return iter(_CLASS_OF)

    def __len__(self) -> int:
        return len(_CLASS_OF)

    def __contains__(self, name: object) -> bool:
        return name in _CLASS_OF

    def __repr__(self) -> str:
        return f"BACKENDS({', '.join(_CLASS_OF)})"


#: The backends by name (a read-only mapping to their classes, imported on first lookup).
BACKENDS: Mapping[str, type[FrnnIndex]] = _Backends()

#: Backends whose constructor takes the monitor's ε (their cells are multiples of it).
_TAKES_EPSILON = ("grid", "bdd", "partition")


def choose_backend(metric: str, dim: int, size: int | None = None) -> str:
    """The compiled backend ``index="auto"`` uses for this metric, dimension and expected size.

    (A :class:`~assay.monitor.Monitor` with ``index="auto"`` keeps its first
    :data:`~assay.monitor.frnn.scan.SCAN_LIMIT` decisions in the numpy ``scan`` index, which
    needs nothing compiled, and then moves them to this backend.)

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
    """Compile (or load from numba's cache) the grid's and brute force's kernels, range queries included.

    For benchmarks that time every backend; a monitor needs less (:func:`assay.monitor.warmup.warm_up`).
    """
    import numpy as np

    from assay.monitor.warmup import warm_up as warm_monitor

    for name in ("grid", "brute") if metric in ("linf", "l2", "l1") else ("brute",):
        warm_monitor(metric, name)
        index = make_index(name, dim, metric, 0.1)
        index.add(np.random.default_rng(0).random((4, dim)), np.arange(4))
        index.range_query(np.zeros((2, dim)), 0.1)
