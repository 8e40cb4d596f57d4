"""The canonical distance formula of :mod:`assay.monitor._kernels`, in numpy, for many pairs at once.

This module needs numpy only: it is what the monitor runs while a job is small (the ``scan``
index) and what validation uses, so that a small job never loads numba. Every function here gives
the same float64 bits as the compiled formula, because it performs the same IEEE operations in the
same order: the sums run over the columns left to right (one column at a time, vectorised over
the pairs), starting from 0.0, and ``sqrt`` is correctly rounded in both. (The compiled formula
also abandons a row once its partial result proves ``d > radius``; that changes only distances
that are then discarded, never a verdict ``d ≤ radius``.)
"""

from __future__ import annotations

import numpy as np

__all__ = ["METRIC_CODES", "canonical_norms", "pair_block", "rowwise_distances", "all_finite"]

METRIC_CODES = {"linf": 0, "l2": 1, "l1": 2, "cosine": 3}


def canonical_norms(data: np.ndarray) -> np.ndarray:
    """``sqrt(sum_j x_j**2)`` per row, summed left to right, float64 (n,): the cosine formula's norms."""
    data = np.asarray(data, dtype=np.float64)
    total = np.zeros(data.shape[0])
    for j in range(data.shape[1]):
        column = data[:, j]
        total += column * column
    return np.sqrt(total)


def pair_block(stored: np.ndarray, queries: np.ndarray, code: int, stored_norms: np.ndarray, query_norms: np.ndarray) -> np.ndarray:
    """Canonical distances of every (query, stored row) pair: float64 (m, n) for ``queries`` (m, d), ``stored`` (n, d).

    ``code`` is the metric's :data:`METRIC_CODES` value; the norms (from :func:`canonical_norms`)
    are read for cosine only.
    """
    m, n = queries.shape[0], stored.shape[0]
    if code == 0:
        out = np.zeros((m, n))
        for j in range(stored.shape[1]):
            np.maximum(out, np.abs(queries[:, j, None] - stored[None, :, j]), out=out)
        return out
    out = np.zeros((m, n))
    for j in range(stored.shape[1]):
        if code == 3:
            out += stored[None, :, j] * queries[:, j, None]
        elif code == 1:
            diff = stored[None, :, j] - queries[:, j, None]
            out += diff * diff
        else:
            out += np.abs(stored[None, :, j] - queries[:, j, None])
    if code == 1:
        return np.sqrt(out, out=out)
    if code == 3:
        return 1.0 - out / (stored_norms[None, :] * query_norms[:, None])
    return out


def rowwise_distances(left: np.ndarray, right: np.ndarray, code: int) -> np.ndarray:
    """Canonical distance of ``left[i]`` and ``right[i]`` for every i, float64 (n,) (the compiled ``rowwise_distances``)."""
    left = np.asarray(left, dtype=np.float64)
    right = np.asarray(right, dtype=np.float64)
    out = np.zeros(left.shape[0])
    for j in range(left.shape[1]):
        if code == 0:
            np.maximum(out, np.abs(left[:, j] - right[:, j]), out=out)
        elif code == 1:
            diff = left[:, j] - right[:, j]
            out += diff * diff
        elif code == 2:
            out += np.abs(left[:, j] - right[:, j])
        else:
            out += left[:, j] * right[:, j]
    if code == 1:
        return np.sqrt(out)
    if code == 3:
        return 1.0 - out / (canonical_norms(left) * canonical_norms(right))
    return out


def all_finite(row: np.ndarray) -> bool:
    """True only if every value of ``row`` is finite (a cheap test: may say False for huge finite values, never True wrongly).

    A sum is finite only when no term is NaN or infinite; a sum that overflows says False, and the
    caller then takes its careful path.
    """
    return bool(np.isfinite(row.sum()))
