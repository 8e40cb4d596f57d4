"""Certify the fairness of KNN decisions when some training labels may be biased.

Implements and extends Li, Wang & Wang, *Certifying the Fairness of KNN in the Presence of Dataset
Bias* (CAV 2023). The learner is KNN whose K is chosen by p-fold cross-validation (see
:mod:`assay.fairness._knn_learner` for the exact definition, tie-breaking included). A decision is
**certified** for an individual ``x`` when it stays the same

* for every training set obtained by flipping at most ``n`` labels (label-flipping fairness),
* and every value of the protected attributes (individual fairness, ``protected=[...]``),
* and every input in the box ``|x'_c − x_c| ≤ ε_c`` (ε-fairness, ``epsilon={column: ε}``),

with K re-chosen by cross-validation on each flipped training set.

Quick use::

    from assay.fairness.knn import certify, KnnFairnessCertifier
    cert = certify(X, y, x, flips=1, protected=[0], k_candidates=[7, 8, 9, 10, 11])
    cert.status          # "certified" | "unknown" | "falsified"

    certifier = KnnFairnessCertifier(X, y, k_candidates=range(470, 520, 10),
                                     class_weights={0: 3, 1: 1}, down_sample=True)
    certs = certifier.certify_many(X_test, flips=50, protected=[8], epsilon={2: 0.07})
    certifier.largest_certified_flips(X_test[0])

Guarantees: ``certified`` is sound (cross-validation is over-approximated including flips of the
validation rows' own labels, which the published bounds miss; float64 distances are either the
learner's own or enclosed with an outward margin). ``falsified`` always carries a
:class:`Counterexample` confirmed by re-running the plain learner. For small budgets the flip
sets are enumerated and, without ε, the verdict is exact (``method="exact"``).
:func:`ground_truth` enumerates flip sets and protected values independently of the certifier,
for tests and small data.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from assay.fairness._knn_certify import KnnFairnessCertifier
from assay.fairness._knn_enumerate import GroundTruth, ground_truth
from assay.fairness._knn_learner import down_sample as _down_sample
from assay.fairness._knn_learner import plain_decision as _plain_decision
from assay.fairness._knn_result import Certificate, Counterexample, Status

__all__ = [
    "Status",
    "Certificate",
    "Counterexample",
    "KnnFairnessCertifier",
    "certify",
    "certify_many",
    "largest_certified_flips",
    "ground_truth",
    "GroundTruth",
    "down_sample",
    "knn_decision",
]


def down_sample(X, y, class_weights: dict[int, int]):
    """The paper's preprocessing: keep every ``class_weights[label]``-th row of each label, in file order.

    Returns ``(X_kept, y_kept, kept_rows)``.
    """
    return _down_sample(np.asarray(X, dtype=np.float64), np.asarray(y), class_weights)


def knn_decision(train_X, train_y, x, *, k_candidates: Sequence[int], folds: int = 10,
                 class_weights: dict[int, int] | None = None) -> tuple[int, int]:
    """The plain learner: choose K by cross-validation on ``(train_X, train_y)``, return ``(K, vote for x)``."""
    from assay.fairness._knn_learner import check_settings

    X, y, settings = check_settings(train_X, train_y, k_candidates, folds, class_weights, "knn_decision")
    return _plain_decision(X, y, np.asarray(x, dtype=np.float64), settings)


def certify(train_X, train_y, x, *, flips: int, protected: Sequence[int] = (), epsilon: dict[int, float] | None = None,
            k_candidates: Sequence[int], folds: int = 10, class_weights: dict[int, int] | None = None,
            down_sample: bool = False, flippable=None, flip_group: dict[int, float] | None = None,
            direction: tuple[int, int] | None = None, falsify: bool = True, falsify_seconds: float = 5.0) -> Certificate:
    """Certify one input. Builds a :class:`KnnFairnessCertifier` (the one-off cross-validation analysis);
    reuse one certifier, or :func:`certify_many`, for many inputs. Options as in :class:`KnnFairnessCertifier`
    and :meth:`KnnFairnessCertifier.certify`."""
    certifier = KnnFairnessCertifier(train_X, train_y, k_candidates=k_candidates, folds=folds, class_weights=class_weights,
                                     down_sample=down_sample, flippable=flippable, flip_group=flip_group, direction=direction)
    return certifier.certify(x, flips, protected=protected, epsilon=epsilon, falsify=falsify, falsify_seconds=falsify_seconds)


def certify_many(train_X, train_y, test_X, *, flips: int, protected: Sequence[int] = (),
                 epsilon: dict[int, float] | None = None, k_candidates: Sequence[int], folds: int = 10,
                 class_weights: dict[int, int] | None = None, down_sample: bool = False, flippable=None,
                 flip_group: dict[int, float] | None = None, direction: tuple[int, int] | None = None,
                 falsify: bool = True, falsify_seconds: float = 5.0, workers: int | None = 1,
                 progress=False) -> list[Certificate]:
    """Certify every row of ``test_X``, sharing one cross-validation analysis.

    ``workers=1`` runs in this process; otherwise the inputs are fanned out with
    :func:`assay.run.run_tasks` (``workers=None``: its default pool).
    """
    certifier = KnnFairnessCertifier(train_X, train_y, k_candidates=k_candidates, folds=folds, class_weights=class_weights,
                                     down_sample=down_sample, flippable=flippable, flip_group=flip_group, direction=direction)
    return certifier.certify_many(test_X, flips, protected=protected, epsilon=epsilon, falsify=falsify,
                                  falsify_seconds=falsify_seconds, workers=workers, progress=progress)


def largest_certified_flips(train_X, train_y, x, *, protected: Sequence[int] = (), epsilon: dict[int, float] | None = None,
                            k_candidates: Sequence[int], folds: int = 10, class_weights: dict[int, int] | None = None,
                            down_sample: bool = False, flippable=None, flip_group: dict[int, float] | None = None,
                            direction: tuple[int, int] | None = None, max_flips: int | None = None) -> int:
    """The largest number of label flips under which ``x``'s decision is certified; -1 if not even 0."""
    certifier = KnnFairnessCertifier(train_X, train_y, k_candidates=k_candidates, folds=folds, class_weights=class_weights,
                                     down_sample=down_sample, flippable=flippable, flip_group=flip_group, direction=direction)
    return certifier.largest_certified_flips(x, protected=protected, epsilon=epsilon, max_flips=max_flips)
