"""An O(n²) monitor written independently of assay's kernels, for the conformance tests.

Distances follow the documented canonical formula (sums left to right: ``np.cumsum`` is a
sequential running sum), so ties at exactly ε must agree bit for bit.
"""

from __future__ import annotations

import numpy as np


def distances(rows: np.ndarray, query: np.ndarray, metric: str) -> np.ndarray:
    rows = np.asarray(rows, dtype=np.float64)
    query = np.asarray(query, dtype=np.float64)
    if rows.shape[0] == 0:
        return np.empty(0)
    diff = rows - query
    if metric == "linf":
        return np.abs(diff).max(axis=1)
    if metric == "l1":
        return np.cumsum(np.abs(diff), axis=1)[:, -1]
    if metric == "l2":
        return np.sqrt(np.cumsum(diff * diff, axis=1)[:, -1])
    dot = np.cumsum(rows * query, axis=1)[:, -1]
    row_norms = np.sqrt(np.cumsum(rows * rows, axis=1)[:, -1])
    query_norm = np.sqrt(np.cumsum(query * query)[-1])
    return 1.0 - dot / (row_norms * query_norm)


def oracle_witnesses(X, Y, epsilon, metric="linf", output="label", max_history=None):
    """For each decision i: (ids, distances) of the earlier decisions that witness a violation."""
    X = np.asarray(X, dtype=np.float64)
    answers = []
    for i in range(X.shape[0]):
        low = 0 if max_history is None else max(0, i - max_history)
        d = distances(X[low:i], X[i], metric)
        close = d <= epsilon
        if output == "label":
            different = np.array([Y[j] != Y[i] for j in range(low, i)], dtype=bool)
        else:
            output_metric, delta = output
            Yf = np.asarray(Y, dtype=np.float64).reshape(len(Y), -1)
            different = distances(Yf[low:i], Yf[i], output_metric) > delta
        hit = np.flatnonzero(close & different)
        answers.append((hit + low, d[hit]))
    return answers


def brute_range(rows, ids, queries, radius, metric):
    """faiss-style answers as sets of (id, distance) per query."""
    out = []
    for q in np.asarray(queries, dtype=np.float64):
        d = distances(rows, q, metric)
        hit = np.flatnonzero(d <= radius)
        out.append(sorted(zip(np.asarray(ids)[hit].tolist(), d[hit].tolist())))
    return out
