"""faiss's exhaustive index (``IndexFlat``) as a candidate generator, made exact by a float64 re-check.

faiss stores float32 and computes in float32, so its own ``d < r`` is not the canonical float64
``d ≤ ε`` (and faiss reports squared L2). This backend asks faiss for every row within an
*outward* radius that covers the worst float32 error for the rows' magnitude and dimension, then
keeps exactly the rows whose canonical distance (:mod:`assay.monitor._kernels`) is ≤ the radius.
Values beyond 10³⁰ in magnitude (where float32 is no longer trustworthy) make the queries scan.
Needs ``faiss-cpu`` (the ``monitor`` extra); without it, building the index raises
:class:`~assay.errors.UnsupportedError`.
"""

from __future__ import annotations

import math
from typing import ClassVar

import numpy as np

from assay.errors import UnsupportedError
from assay.monitor import _kernels
from assay.monitor.frnn._base import FrnnIndex

__all__ = ["FaissFlatIndex"]

_F32 = 2.0**-23  # float32 unit roundoff is 2⁻²⁴; one ulp of slack on top


def _faiss():
    try:
        import faiss
    except ImportError as exc:
        raise UnsupportedError(
            "index='faiss' needs the faiss-cpu package (pip install faiss-cpu, or assay's `monitor` extra); "
            "index='brute' or 'grid' give the same answers without it"
        ) from exc
    return faiss


class FaissFlatIndex(FrnnIndex):
    """Exact range queries: faiss ``IndexFlat`` range search with an outward radius, then the canonical check."""

    name: ClassVar[str] = "faiss"
    metrics: ClassVar[tuple[str, ...]] = ("linf", "l2", "l1")

    def __init__(self, dim: int, metric: str = "linf"):
        faiss = _faiss()
        super().__init__(dim, metric)
        self._faiss_metric = {"linf": faiss.METRIC_Linf, "l2": faiss.METRIC_L2, "l1": faiss.METRIC_L1}[metric]
        self._flat = faiss.IndexFlat(self.dim, self._faiss_metric)
        self._max_abs = 0.0

    def _added(self, positions: slice) -> None:
        rows = self._store.data[positions]
        if rows.shape[0]:
            self._max_abs = max(self._max_abs, float(np.abs(rows).max()))
            self._flat.add(np.ascontiguousarray(rows, dtype=np.float32))

    def _reindex(self) -> None:
        self._flat.reset()
        self._max_abs = 0.0
        self._added(slice(0, self._store.size))

    def _faiss_radius(self, radius: float, scale: float) -> float:
        d = self.dim
        if self.metric == "linf":
            return radius * (1 + 4 * _F32) + 4 * scale * _F32 + 1e-30
        if self.metric == "l1":
            return radius * (1 + 4 * _F32) + (4 * d + 2 * d * d) * scale * _F32 + 1e-30
        # faiss compares squared L2, possibly as ‖x‖² + ‖q‖² − 2x·q (cancellation up to ~d·u·4d·scale²).
        outer = radius * (1 + 4 * _F32) + 4 * math.sqrt(d) * scale * _F32
        return outer * outer + 8 * (d + 4) * d * scale * scale * _F32 + 1e-30

    def _candidates(self, queries, query_norms, radius):
        store = self._store
        scale = max(self._max_abs, float(np.abs(queries).max()) if queries.size else 0.0)
        if scale > 1e30 or not np.isfinite(self._faiss_radius(radius, scale)):
            return self._verify_slice(queries, query_norms, radius, 0, store.size)
        lims, _, found = self._flat.range_search(np.ascontiguousarray(queries, dtype=np.float32), self._faiss_radius(radius, scale))
        pair_query = np.repeat(np.arange(queries.shape[0], dtype=np.int64), np.diff(lims).astype(np.int64))
        pair_position = np.asarray(found, dtype=np.int64)
        keep, distances = _kernels.verify_pairs(store.data, store.norms, store.alive, pair_query, pair_position,
                                                 queries, query_norms, radius, self._code)
        return pair_query[keep], pair_position[keep], distances[keep]
