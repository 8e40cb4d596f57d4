"""The published cross-validation bounds (binary labels), kept only to show where they are unsound.

Per validation row, with its own label fixed, the paper asks whether ``n`` flips among its K
neighbours can make it right (lower bound) or wrong (upper bound), each row on its own; K may be
chosen iff its lower bound is at most the smallest upper bound. Flips of the validation rows' own
labels are not considered.
"""

from __future__ import annotations

from fractions import Fraction

import numpy as np

from assay.fairness._knn_learner import brute_cv_neighbours, fold_assignment


def paper_k_set(X, y, ks, folds, flips):
    nbr = brute_cv_neighbours(X, folds, max(ks))
    fold_of = fold_assignment(len(y), folds)
    lower = {k: Fraction(0) for k in ks}
    upper = {k: Fraction(0) for k in ks}
    for f in range(folds):
        rows = np.flatnonzero(fold_of == f)
        for k in ks:
            always_wrong = may_be_wrong = 0
            for i in rows:
                counts = np.bincount(y[nbr[i, :k]], minlength=2)
                a = y[i]
                margin = int(counts[a] - counts[1 - a])

                def wins(m, a=a):
                    return m > 0 or (m == 0 and a == 0)

                always_wrong += not wins(margin + 2 * flips)
                may_be_wrong += not wins(margin - 2 * flips)
            lower[k] += Fraction(always_wrong, len(rows))
            upper[k] += Fraction(may_be_wrong, len(rows))
    best = min(upper.values())
    return [k for k in ks if lower[k] <= best]
