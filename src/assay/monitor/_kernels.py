"""The one distance formula every index uses for its final ``d ≤ radius`` check, and the loops around it.

Exactness across backends rests on a single rule: whatever an index does to find *candidates*
(trees, projections, grid cells, with outward margins), the verdict "close" is decided here, in
float64, by the **canonical formula** below, evaluated in the same order for every backend:

* ``linf``:   ``max_j |x_j - q_j|``
* ``l1``:     ``sum_j |x_j - q_j|``  summed left to right (j = 0, 1, ..., d-1)
* ``l2``:     ``sqrt(sum_j (x_j - q_j)**2)``  summed left to right, then one correctly rounded sqrt
* ``cosine``: ``1 - (sum_j x_j q_j) / (‖x‖ ‖q‖)`` with ``‖x‖ = sqrt(sum_j x_j**2)``, sums left to right

The formula is symmetric in (x, q) bit for bit (IEEE subtraction, products and sums of the same
terms in the same order), so "is decision a close to b" never depends on which came first.
Early abandoning only stops a row once its partial result already proves ``d > radius``
(partial sums of non-negative terms never decrease under round-to-nearest), so it can never turn
a close pair into a far one.

numba compiles the loops when it is installed; without it the same functions run as plain Python
(correct, slow), so nothing here changes the answers.
"""

from __future__ import annotations

import math

import numpy as np

from assay.monitor._canonical import METRIC_CODES

try:  # numba is the fast path; the pure-Python fallback keeps the answers identical.
    from numba import njit

    HAVE_NUMBA = True
except ImportError:  # pragma: no cover - exercised only where numba is absent
    HAVE_NUMBA = False

    def njit(*args, **kwargs):
        if args and callable(args[0]):
            return args[0]
        return lambda function: function


__all__ = [
    "METRIC_CODES",
    "HAVE_NUMBA",
    "canonical_norms",
    "pair_distance",
    "verify_ranges",
    "verify_pairs",
    "all_pairs_within",
    "rowwise_distances",
    "all_finite",
]



@njit(cache=True, inline="always")
def _distance(a, b, metric, a_norm, b_norm, radius):
    """Canonical distance of rows ``a`` and ``b``; ``inf`` once it is proven to exceed ``radius``."""
    d = a.shape[0]
    if metric == 0:
        worst = 0.0
        for j in range(d):
            diff = abs(a[j] - b[j])
            if diff > worst:
                worst = diff
                if worst > radius:
                    return math.inf
        return worst
    if metric == 1:
        # sqrt(s) > radius is certain once s > (radius * (1 + 1e-12))**2.
        limit = radius * (1.0 + 1e-12)
        limit = limit * limit
        total = 0.0
        for j in range(d):
            diff = a[j] - b[j]
            total += diff * diff
            if total > limit:
                return math.inf
        return math.sqrt(total)
    if metric == 2:
        total = 0.0
        for j in range(d):
            total += abs(a[j] - b[j])
            if total > radius:
                return math.inf
        return total
    dot = 0.0
    for j in range(d):
        dot += a[j] * b[j]
    return 1.0 - dot / (a_norm * b_norm)


@njit(cache=True)
def _norms(data):
    out = np.empty(data.shape[0])
    for i in range(data.shape[0]):
        total = 0.0
        for j in range(data.shape[1]):
            total += data[i, j] * data[i, j]
        out[i] = math.sqrt(total)
    return out


def canonical_norms(data: np.ndarray) -> np.ndarray:
    """``sqrt(sum_j x_j**2)`` per row, summed left to right (the cosine formula's norms), float64 (n,)."""
    return _norms(np.ascontiguousarray(data, dtype=np.float64))


def pair_distance(a: np.ndarray, b: np.ndarray, metric: str) -> float:
    """The canonical distance of two float64 vectors (no abandoning); for tests and small checks."""
    a = np.ascontiguousarray(a, dtype=np.float64)
    b = np.ascontiguousarray(b, dtype=np.float64)
    code = METRIC_CODES[metric]
    a_norm = b_norm = 1.0
    if code == 3:
        a_norm, b_norm = float(_norms(a[None])[0]), float(_norms(b[None])[0])
    return float(_distance(a, b, code, a_norm, b_norm, math.inf))


@njit(cache=True)
def _grow(array, size):
    bigger = np.empty(max(2 * array.shape[0], size), dtype=array.dtype)
    bigger[: array.shape[0]] = array
    return bigger


@njit(cache=True)
def verify_ranges(data, norms, alive, order, use_order, range_query, range_start, range_end, queries, query_norms, radius, metric):
    """Check every stored row named by a set of ranges against its query; keep those with ``d ≤ radius``.

    Range ``r`` covers positions ``order[range_start[r]:range_end[r]]`` (or the positions
    ``range_start[r]:range_end[r]`` themselves when ``use_order`` is False) and belongs to query
    ``range_query[r]``; ranges must be grouped by non-decreasing query. Dead rows (``alive`` False)
    are skipped. Returns ``(query, position, distance)`` triples in range order.
    """
    capacity = 1024
    out_query = np.empty(capacity, dtype=np.int64)
    out_position = np.empty(capacity, dtype=np.int64)
    out_distance = np.empty(capacity, dtype=np.float64)
    count = 0
    for r in range(range_query.shape[0]):
        qi = range_query[r]
        query = queries[qi]
        query_norm = query_norms[qi]
        for k in range(range_start[r], range_end[r]):
            position = order[k] if use_order else k
            if not alive[position]:
                continue
            distance = _distance(data[position], query, metric, norms[position], query_norm, radius)
            if distance <= radius:
                if count == out_query.shape[0]:
                    out_query = _grow(out_query, count + 1)
                    out_position = _grow(out_position, count + 1)
                    out_distance = _grow(out_distance, count + 1)
                out_query[count] = qi
                out_position[count] = position
                out_distance[count] = distance
                count += 1
    return out_query[:count], out_position[:count], out_distance[:count]


@njit(cache=True)
def verify_pairs(data, norms, alive, pair_query, pair_position, queries, query_norms, radius, metric):
    """Like :func:`verify_ranges` for explicit (query, position) candidate pairs (any order)."""
    keep = np.zeros(pair_query.shape[0], dtype=np.bool_)
    distances = np.empty(pair_query.shape[0])
    for p in range(pair_query.shape[0]):
        qi = pair_query[p]
        position = pair_position[p]
        if not alive[position]:
            continue
        distance = _distance(data[position], queries[qi], metric, norms[position], query_norms[qi], radius)
        distances[p] = distance
        keep[p] = distance <= radius
    return keep, distances


@njit(cache=True)
def all_pairs_within(rows, norms, radius, metric):
    """All pairs ``(later, earlier)`` with ``earlier < later`` among ``rows`` and canonical ``d ≤ radius``.

    Returned grouped by ``later`` ascending: ``(later, earlier, distance)``.
    """
    capacity = 1024
    out_later = np.empty(capacity, dtype=np.int64)
    out_earlier = np.empty(capacity, dtype=np.int64)
    out_distance = np.empty(capacity, dtype=np.float64)
    count = 0
    for i in range(rows.shape[0]):
        for j in range(i):
            distance = _distance(rows[j], rows[i], metric, norms[j], norms[i], radius)
            if distance <= radius:
                if count == out_later.shape[0]:
                    out_later = _grow(out_later, count + 1)
                    out_earlier = _grow(out_earlier, count + 1)
                    out_distance = _grow(out_distance, count + 1)
                out_later[count] = i
                out_earlier[count] = j
                out_distance[count] = distance
                count += 1
    return out_later[:count], out_earlier[:count], out_distance[:count]


@njit(cache=True)
def rowwise_distances(left, right, metric):
    """Canonical distance of ``left[i]`` and ``right[i]`` for every i (no abandoning), float64 (n,)."""
    out = np.empty(left.shape[0])
    for i in range(left.shape[0]):
        left_norm = 1.0
        right_norm = 1.0
        if metric == 3:
            a = 0.0
            b = 0.0
            for j in range(left.shape[1]):
                a += left[i, j] * left[i, j]
                b += right[i, j] * right[i, j]
            left_norm = math.sqrt(a)
            right_norm = math.sqrt(b)
        out[i] = _distance(left[i], right[i], metric, left_norm, right_norm, math.inf)
    return out


@njit(cache=True)
def all_finite(row):
    """Whether every value of a 1-D float64 array is finite (the monitor's single-decision check)."""
    for j in range(row.shape[0]):
        if not math.isfinite(row[j]):
            return False
    return True
