"""The KNN-fairness section of ``assay demo``: are a KNN's decisions robust to biased training labels?

A K-nearest-neighbour classifier (K chosen by 5-fold cross-validation among 3, 5, 7) is trained on
200 synthetic applicants whose first feature is a protected attribute (0 or 1). For 20 new
applicants, :func:`assay.fairness.knn.certify_many` asks: if up to two training labels were wrong
(biased), and whatever the protected attribute, would the decision be the same? ``certified``
answers are proofs; ``falsified`` ones carry the flipped labels that change the decision,
confirmed by re-running the learner.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np

__all__ = ["demo_section"]

_TRAIN, _TEST, _FLIPS = 200, 20, 2


def demo_section(progress: Callable[[str], None] | None = None, seed: int = 0) -> dict:
    """Certify 20 inputs against 2 label flips and the protected attribute; return counts and one counterexample."""
    from assay.fairness import certify_many
    from assay.fairness._knn_certify import warm_up

    (progress or (lambda stage: None))("certifying KNN decisions against biased labels")
    rng = np.random.default_rng(seed)
    X = np.column_stack([rng.integers(0, 2, _TRAIN + _TEST), rng.normal(size=(_TRAIN + _TEST, 2))])
    y = ((X[:, 1] + 0.5 * X[:, 2] + rng.normal(scale=0.5, size=len(X))) > 0).astype(int)
    # Loading the compiled kernels (compiling them once, the first time) is not certification work:
    # timed apart, so that "seconds" is what certifying costs in a warm process.
    started = time.perf_counter()
    warm_up()
    one_off = time.perf_counter() - started
    started = time.perf_counter()
    certificates = certify_many(X[:_TRAIN], y[:_TRAIN], X[_TRAIN:], flips=_FLIPS, protected=(0,),
                                k_candidates=(3, 5, 7), folds=5, falsify_seconds=1.0)
    seconds = time.perf_counter() - started
    counts = {status: sum(c.status.value == status for c in certificates) for status in ("certified", "falsified", "unknown")}
    example = next((i for i, c in enumerate(certificates) if c.counterexample is not None), None)
    counterexample = None
    if example is not None:
        found = certificates[example]
        counterexample = found.counterexample.to_json() | {"row": example, "prediction": found.prediction}
    return {"train": _TRAIN, "inputs": _TEST, "flips": _FLIPS, "protected": [0], "k_candidates": [3, 5, 7],
            "counts": counts, "seconds": seconds, "one_off_seconds": one_off, "counterexample": counterexample}
