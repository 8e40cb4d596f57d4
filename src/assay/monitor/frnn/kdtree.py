"""k-d trees with online insertion: scipy's cKDTree under the logarithmic method, plus a buffer.

New rows land in a small buffer that is scanned by brute force. When the buffer is full it
becomes a tree; trees of similar size are merged (Bentley–Saxe), so each row is rebuilt
O(log n) times and a query visits O(log n) trees. Each tree answers with an outward margin
(relative 1e-9) and every candidate is re-checked with the canonical formula
(:mod:`assay.monitor._kernels`), so answers are exact and identical to brute force, ties at ε
included. Cosine is searched as L2 on normalised rows (‖u − v‖ = sqrt(2 d_cos)) with a margin.
Removed rows stay in their tree, marked dead, until the store is compacted.
"""

from __future__ import annotations

import math
from typing import ClassVar

import numpy as np
from scipy.spatial import cKDTree

from assay.monitor import _kernels
from assay.monitor.frnn._base import FrnnIndex

__all__ = ["KDTreeIndex"]

_P = {"linf": math.inf, "l2": 2.0, "l1": 1.0, "cosine": 2.0}


class KDTreeIndex(FrnnIndex):
    """Exact range queries from a forest of cKDTrees (logarithmic rebuilds) plus a brute-force buffer.

    Args:
        dim, metric: as every index.
        buffer_size: rows kept outside the trees (scanned by brute force) before a tree is built.
        leafsize: cKDTree's leaf size.
    """

    name: ClassVar[str] = "kdtree"

    def __init__(self, dim: int, metric: str = "linf", buffer_size: int = 1024, leafsize: int = 16):
        super().__init__(dim, metric)
        self.buffer_size = int(buffer_size)
        self.leafsize = int(leafsize)
        self._trees: list[tuple[int, int, cKDTree]] = []
        self._buffer_start = 0

    def _coords(self, start: int, end: int) -> np.ndarray:
        rows = self._store.data[start:end]
        if self.metric == "cosine":
            return rows / self._store.norms[start:end, None]
        return rows

    def _build(self, start: int, end: int) -> cKDTree:
        return cKDTree(self._coords(start, end), leafsize=self.leafsize, compact_nodes=False, balanced_tree=False, copy_data=True)

    def _added(self, positions: slice) -> None:
        size = self._store.size
        while size - self._buffer_start >= self.buffer_size:
            start, end = self._buffer_start, size
            while self._trees and self._trees[-1][1] - self._trees[-1][0] <= 2 * (end - start):
                start = self._trees.pop()[0]
            self._trees.append((start, end, self._build(start, end)))
            self._buffer_start = end

    def _reindex(self) -> None:
        self._trees = []
        self._buffer_start = 0
        self._added(slice(0, self._store.size))

    def _tree_radius(self, radius: float) -> float:
        if self.metric == "cosine":
            return math.sqrt(2.0 * radius + 1e-12) * (1.0 + 1e-9) + 1e-9
        return radius * (1.0 + 1e-9) + 1e-150

    def _candidates(self, queries, query_norms, radius):
        store = self._store
        parts = [self._verify_slice(queries, query_norms, radius, self._buffer_start, store.size)]
        if self._trees:
            coords = queries / query_norms[:, None] if self.metric == "cosine" else queries
            p = _P[self.metric]
            tree_radius = self._tree_radius(radius)
            query_tree = cKDTree(coords, leafsize=self.leafsize) if queries.shape[0] >= 32 else None
            for start, _end, tree in self._trees:
                if query_tree is None:
                    found = tree.query_ball_point(coords, tree_radius, p=p, return_sorted=False)
                    lengths = np.fromiter((len(hit) for hit in found), dtype=np.int64, count=len(found))
                    if not lengths.sum():
                        continue
                    pair_query = np.repeat(np.arange(len(found), dtype=np.int64), lengths)
                    pair_position = np.concatenate([np.asarray(hit, dtype=np.int64) for hit in found]) + start
                else:
                    pairs = query_tree.sparse_distance_matrix(tree, tree_radius, p=p, output_type="ndarray")
                    if not pairs.shape[0]:
                        continue
                    pair_query = pairs["i"].astype(np.int64)
                    pair_position = pairs["j"].astype(np.int64) + start
                keep, distances = _kernels.verify_pairs(
                    store.data, store.norms, store.alive, pair_query, pair_position, queries, query_norms, radius, self._code
                )
                parts.append((pair_query[keep], pair_position[keep], distances[keep]))
        return tuple(np.concatenate([part[k] for part in parts]) for k in range(3))
