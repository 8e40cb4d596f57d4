"""Exact fixed-radius near-neighbour (FRNN) indexes behind one faiss-like protocol.

=========  =====================================  ===============  ======
name       class                                  metrics          remove
=========  =====================================  ===============  ======
brute      :class:`BruteForceIndex`               all four         yes
kdtree     :class:`KDTreeIndex`                   all four         yes
snn        :class:`SortedProjectionIndex`         linf, l2, l1     yes
grid       :class:`GridIndex`                     linf             yes
=========  =====================================  ===============  ======

Every backend answers ``range_query`` with exactly the stored rows whose canonical float64
distance (:mod:`assay.monitor._kernels`) is ≤ the radius, so all agree bit for bit with brute force.
:func:`make_index` builds one by name; ``"auto"`` picks by metric and dimension.
"""

from __future__ import annotations

from assay.errors import OptionError
from assay.monitor.frnn._base import FrnnIndex
from assay.monitor.frnn.brute import BruteForceIndex
from assay.monitor.frnn.grid import GridIndex
from assay.monitor.frnn.kdtree import KDTreeIndex
from assay.monitor.frnn.snn import SortedProjectionIndex

__all__ = ["FrnnIndex", "BruteForceIndex", "KDTreeIndex", "SortedProjectionIndex", "GridIndex", "BACKENDS", "make_index", "choose_backend"]

BACKENDS: dict[str, type[FrnnIndex]] = {
    "brute": BruteForceIndex,
    "kdtree": KDTreeIndex,
    "snn": SortedProjectionIndex,
    "grid": GridIndex,
}


def choose_backend(metric: str, dim: int, epsilon: float) -> str:
    """The backend ``index="auto"`` uses for this metric, dimension and radius.

    L∞: grid hashing (3^k probes on the best-spread columns) up to 64 columns, then sorted
    projection; L2/L1: k-d trees up to 16 columns, then sorted projection; cosine: k-d tree on
    normalised rows up to 16 columns, else brute force. Past 4,096 columns every index degenerates to
    scanning, and brute force (no key upkeep) is fastest.
    """
    if dim > 4096:
        return "brute"
    if metric == "linf":
        return "grid" if dim <= 64 else "snn"
    if metric in ("l2", "l1"):
        return "kdtree" if dim <= 16 else "snn"
    return "kdtree" if dim <= 16 else "brute"


def make_index(name: str, dim: int, metric: str, epsilon: float, **options) -> FrnnIndex:
    """Build the backend ``name`` (or ``"auto"``) for rows of width ``dim`` and queries of radius ``epsilon``."""
    if name == "auto":
        name = choose_backend(metric, dim, epsilon)
    if name not in BACKENDS:
        listed = ", ".join(repr(n) for n in ("auto", *BACKENDS))
        raise OptionError(f"the `index` option of Monitor must be one of {listed}; got {name!r}")
    cls = BACKENDS[name]
    if name == "grid":
        options.setdefault("epsilon", epsilon)
    return cls(dim, metric, **options)
