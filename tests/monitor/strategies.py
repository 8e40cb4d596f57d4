"""Hypothesis strategies for decision streams that stress exactness: ties at ε, duplicates, jumps in range."""

from __future__ import annotations

import numpy as np
from hypothesis import strategies as st

DIMS = (1, 2, 3, 4, 7, 12, 33, 128, 512)


@st.composite
def streams(draw, metrics=("linf", "l2", "l1", "cosine")):
    """A stream ``(X, Y, epsilon, metric)``: X float64 (n, d), Y int labels (n,)."""
    metric = draw(st.sampled_from(metrics))
    d = draw(st.sampled_from(DIMS))
    n = draw(st.integers(1, 70 if d <= 12 else 30))
    kind = draw(st.sampled_from(["grid", "pool", "float", "jump"]))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    levels = draw(st.sampled_from([2, 4, 12, 256]))
    if kind == "grid":
        # Pixel-like values k/255: distances land exactly on ε = k/255 often.
        X = rng.integers(0, levels, (n, d)) / 255.0
        epsilon = draw(st.integers(0, 8)) / 255.0 * (1 if metric == "linf" else draw(st.sampled_from([1, 2, 5])))
    elif kind == "pool":
        # Few distinct rows, repeated: duplicates and many ties.
        pool = rng.integers(0, levels, (draw(st.integers(1, 5)), d)) / 255.0
        X = pool[rng.integers(0, pool.shape[0], n)]
        epsilon = draw(st.sampled_from([0.0, 1 / 255, 3 / 255, 0.5]))
    elif kind == "float":
        X = rng.random((n, d))
        epsilon = draw(st.sampled_from([0.0, 0.01, 0.1, 0.3, 1.0, 3.0, 50.0]))
    else:
        # Values outside the range seen so far, far from the first rows.
        X = rng.random((n, d))
        X[n // 2 :] = X[n // 2 :] * draw(st.sampled_from([10.0, 1e3, 1e6, 1e12])) - draw(st.sampled_from([0.0, 7.0, 1e5]))
        epsilon = draw(st.sampled_from([0.05, 0.5, 5.0, 2e6]))
    if metric == "cosine":
        X = X + 1.0 / 255.0  # no zero vectors
        epsilon = min(epsilon, 2.0) * draw(st.sampled_from([1.0, 0.01]))
    classes = draw(st.sampled_from([1, 2, 3, 50]))
    Y = rng.integers(0, classes, n)
    return X, Y, float(epsilon), metric
