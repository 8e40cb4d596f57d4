"""Exact ground truth by enumeration, written independently of the certifier (for tests and small data).

For every allowed flip set of size ≤ n: relabel, re-run cross-validation from scratch (full
lexicographic sorts, vote counts, exact rational comparison of the errors), then vote for every
protected combination of the input. Shares only the distance formula with the rest of the module.
Exact for label flipping and individual fairness. ε-boxes are infinite sets: pass
``box_points`` (a list of points per input) to search them for counterexamples; the answer is then
only a lower bound on unfairness (``exact=False``).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from fractions import Fraction

import numpy as np

from assay.fairness import _knn_kernels as kernels
from assay.fairness._knn_learner import brute_cv_neighbours, check_settings, fold_assignment
from assay.fairness._knn_learner import down_sample as _down_sample
from assay.fairness._knn_predict import protected_combinations


@dataclass(frozen=True)
class GroundTruth:
    """``fair``: no flip set / protected value (/ listed box point) changes the decision."""

    fair: bool
    prediction: int
    flip_sets: int
    exact: bool
    flipped_rows: tuple[int, ...] = ()
    new_labels: tuple[int, ...] = ()
    input: tuple[float, ...] = ()
    k: int | None = None
    decision: int | None = None


def _allowed_flips(labels, n_classes, flippable, direction):
    options = {}
    for j, lab in enumerate(labels):
        if not flippable[j]:
            continue
        if direction is None:
            new = [b for b in range(n_classes) if b != lab]
        else:
            new = [direction[1]] if lab == direction[0] else []
        if new:
            options[j] = new
    return options


def _flip_sets(options, budget):
    yield (), ()
    rows = sorted(options)
    for size in range(1, budget + 1):
        for combo in itertools.combinations(rows, size):
            for new in itertools.product(*(options[j] for j in combo)):
                yield combo, new


def _chosen_k(nbr, labels, ks, folds, weights, n_classes):
    n = len(labels)
    fold_of = fold_assignment(n, folds)
    neighbour_labels = labels[nbr]
    onehot = neighbour_labels[:, :, None] == np.arange(n_classes)[None, None, :]
    cumulative = np.cumsum(onehot, axis=1)
    best, best_value = None, None
    for a, k in enumerate(ks):
        votes = np.argmax(cumulative[:, k - 1, :], axis=1)  # first maximum = smallest label
        wrong = votes != labels
        value = Fraction(0)
        for f in range(folds):
            rows = fold_of == f
            w = weights[labels[rows]]
            value += Fraction(int((w * wrong[rows]).sum()), int(w.sum()))
        if best_value is None or value < best_value:
            best, best_value = a, value
    return ks[best]


def _vote(train_X, labels, point, k, n_classes):
    d = kernels.squared_distances(point, train_X)[0]
    order = np.lexsort((np.arange(len(d)), d))[:k]
    return int(np.argmax(np.bincount(labels[order], minlength=n_classes)))


def ground_truth(train_X, train_y, test_X, *, flips: int, protected=(), k_candidates, folds: int = 10,
                 class_weights=None, down_sample: bool = False, flippable=None, direction=None,
                 box_points=None) -> list[GroundTruth]:
    """Enumerate every flip set of size ≤ ``flips`` for each row of ``test_X`` (see the module docstring).

    Row indices in the evidence refer to the (down-sampled, if requested) training set.
    """
    X, y, settings = check_settings(train_X, train_y, k_candidates, folds, class_weights, "ground_truth")
    if down_sample:
        X, y, kept = _down_sample(X, y, dict(enumerate(settings.weights)))
        if flippable is not None:
            flippable = np.asarray(flippable)[kept]
    flippable = np.ones(len(y), dtype=bool) if flippable is None else np.asarray(flippable, dtype=bool)
    test_X = np.atleast_2d(np.asarray(test_X, dtype=np.float64))
    ks = list(settings.k_candidates)
    weights = np.asarray(settings.weights)
    nbr = brute_cv_neighbours(X, settings.folds, max(ks))
    options = _allowed_flips(y, settings.n_classes, flippable, direction)
    scenarios = []
    for rows, new in _flip_sets(options, flips):
        labels = y.copy()
        labels[list(rows)] = new
        scenarios.append((rows, new, labels, _chosen_k(nbr, labels, ks, settings.folds, weights, settings.n_classes)))
    k0 = scenarios[0][3]
    out = []
    for t, x in enumerate(test_X):
        prediction = _vote(X, y, x, k0, settings.n_classes)
        points = []
        for combo in protected_combinations(X, x, tuple(protected)):
            point = x.copy()
            point[list(protected)] = combo
            points.append(point)
        exact = box_points is None
        if box_points is not None:
            points = points + [np.asarray(p, dtype=np.float64) for p in box_points[t]]
        verdict = None
        for rows, new, labels, k in scenarios:
            for point in points:
                decision = _vote(X, labels, point, k, settings.n_classes)
                if decision != prediction:
                    verdict = GroundTruth(False, prediction, len(scenarios), exact, tuple(int(r) for r in rows),
                                          tuple(int(b) for b in new), tuple(float(c) for c in point), int(k), decision)
                    break
            if verdict is not None:
                break
        out.append(verdict or GroundTruth(True, prediction, len(scenarios), exact))
    return out
