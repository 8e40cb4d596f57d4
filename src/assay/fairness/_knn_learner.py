"""The KNN learner of Li, Wang & Wang, *Certifying the Fairness of KNN in the Presence of Dataset Bias* (CAV 2023), §2.

Definition (what every certificate in :mod:`assay.fairness.knn` is about):

1. *Down-sampling* (optional preprocessing, §6 of the paper): with class weights ``{label: w}``,
   keep every ``w``-th training row of that label, in file order (rows 0, w, 2w, ... of the label).
2. *Distances*: squared Euclidean distance on the features as given (the authors' splits are
   standardised, with ordinal-encoded categoricals), computed by
   :func:`~assay.fairness._knn_kernels.squared_distances` in float64.
3. *Neighbours*: the ``K`` training rows with the smallest distance; **equal distances are broken by
   the smaller row index**.
4. *Vote*: the most frequent label among the neighbours; **equal counts go to the smallest label**
   (as the published code does).
5. *Choice of K*: ``p``-fold cross-validation (``p = folds``, default 10) with contiguous,
   unshuffled folds (scikit-learn's ``KFold(p)``: the first ``n mod p`` folds get one row more). For
   each candidate K, the error of a fold is ``Σ w[y_i]·[vote_i ≠ y_i] / Σ w[y_i]`` over its rows
   (weights = the class weights, 1 without them) and the cross-validation error is the mean over the
   folds. The candidate with the smallest error is chosen, compared **exactly** (rational
   arithmetic); equal errors go to the candidate listed first.

Class weights must be positive integers (they are down-sampling factors in the paper), which keeps
every error an exact ratio of integers.
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction

import numpy as np

from assay.errors import DataError, OptionError
from assay.fairness import _knn_kernels as kernels

__all__ = [
    "check_settings",
    "LearnerSettings",
    "fold_ranges",
    "fold_assignment",
    "down_sample",
    "cv_neighbours",
    "brute_cv_neighbours",
    "nearest",
    "predict",
    "CvState",
    "select_k",
    "plain_cv_state",
    "plain_decision",
    "select_k_many",
]


@dataclass(frozen=True)
class LearnerSettings:
    """The learner's options: candidate Ks (in order), folds, integer class weights (a tuple, one per label)."""

    k_candidates: tuple[int, ...]
    folds: int
    weights: tuple[int, ...]
    n_classes: int

    @property
    def ks(self) -> np.ndarray:
        return np.asarray(self.k_candidates, dtype=np.int64)

    @property
    def weight_array(self) -> np.ndarray:
        return np.asarray(self.weights, dtype=np.int64)


def fold_ranges(n: int, folds: int) -> list[tuple[int, int]]:
    """Contiguous validation ranges ``[start, stop)`` of scikit-learn's unshuffled ``KFold(folds)``."""
    sizes = np.full(folds, n // folds, dtype=np.int64)
    sizes[: n % folds] += 1
    stops = np.cumsum(sizes)
    return [(int(stop - size), int(stop)) for size, stop in zip(sizes, stops)]


def fold_assignment(n: int, folds: int) -> np.ndarray:
    out = np.empty(n, dtype=np.int64)
    for f, (start, stop) in enumerate(fold_ranges(n, folds)):
        out[start:stop] = f
    return out


def down_sample(X: np.ndarray, y: np.ndarray, weights: dict[int, int]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Keep every ``weights[label]``-th row of each label, in file order; return ``(X, y, kept_rows)``."""
    y = np.asarray(y)
    keep = np.zeros(len(y), dtype=bool)
    for label in np.unique(y):
        rows = np.flatnonzero(y == label)
        step = int(weights.get(int(label), 1))
        keep[rows[::step]] = True
    kept = np.flatnonzero(keep)
    return np.asarray(X)[kept], y[kept], kept


def _top_sorted_rows(D: np.ndarray, k: int) -> np.ndarray:
    """For each row of ``D``, the ``k`` column indices of smallest value, ordered by (value, index)."""
    n_rows, n_cols = D.shape
    if k >= n_cols:
        return np.argsort(D, axis=1, kind="stable")
    part = np.argpartition(D, k - 1, axis=1)[:, :k]
    theta = np.take_along_axis(D, part, axis=1).max(axis=1)
    spill = np.flatnonzero((D <= theta[:, None]).sum(axis=1) > k)
    for r in spill:  # ties at the boundary: keep the smallest indices among the tied
        row = D[r]
        less = np.flatnonzero(row < theta[r])
        equal = np.flatnonzero(row == theta[r])
        part[r] = np.concatenate([less, equal[: k - less.size]])
    part.sort(axis=1)
    order = np.argsort(np.take_along_axis(D, part, axis=1), axis=1, kind="stable")
    return np.take_along_axis(part, order, axis=1)


def nearest(train_X: np.ndarray, x: np.ndarray, k: int) -> np.ndarray:
    """Indices of the ``k`` nearest training rows to ``x``, ordered by (distance, index)."""
    d = kernels.squared_distances(x, train_X)
    return _top_sorted_rows(d, k)[0]


def predict(train_X: np.ndarray, labels: np.ndarray, x: np.ndarray, k: int, n_classes: int) -> int:
    """The learner's vote for ``x`` with ``k`` neighbours (ties: smaller index, then smaller label)."""
    counts = np.bincount(labels[nearest(train_X, x, k)], minlength=n_classes)
    return int(np.argmax(counts))  # argmax returns the first (smallest) label among equal counts


def cv_neighbours(X: np.ndarray, folds: int, kmax: int, block: int = 256) -> np.ndarray:
    """For every row, its ``kmax`` nearest rows outside its own fold, ordered by (distance, index)."""
    X = np.ascontiguousarray(X, dtype=np.float64)
    n = X.shape[0]
    out = np.empty((n, kmax), dtype=np.int32)
    for start, stop in fold_ranges(n, folds):
        for lo in range(start, stop, block):
            hi = min(lo + block, stop)
            D = kernels.squared_distances(X[lo:hi], X)
            D[:, start:stop] = np.inf
            out[lo:hi] = _top_sorted_rows(D, kmax)
    return out


def brute_cv_neighbours(X: np.ndarray, folds: int, kmax: int) -> np.ndarray:
    """Reference for :func:`cv_neighbours`: a full lexicographic sort per row (slow; for tests)."""
    n = X.shape[0]
    out = np.empty((n, kmax), dtype=np.int32)
    fold_of = fold_assignment(n, folds)
    for i in range(n):
        others = np.flatnonzero(fold_of != fold_of[i])
        d = kernels.squared_distances(X[i], X[others])[0]
        order = np.lexsort((others, d))
        out[i] = others[order[:kmax]]
    return out


@dataclass(frozen=True)
class CvState:
    """Cross-validation of one labelling: weighted fold errors ``A[k, f]``, fold weights ``W[f]``, the chosen K."""

    A: np.ndarray
    W: np.ndarray
    k_index: int
    errors: np.ndarray  # float CV error per candidate (for reports)


def _exact_cv(A_row: np.ndarray, W: np.ndarray) -> Fraction:
    return sum((Fraction(int(a), int(w)) for a, w in zip(A_row, W)), Fraction(0)) / len(W)


def select_k(A: np.ndarray, W: np.ndarray) -> int:
    """Index of the candidate with the smallest CV error (exact comparison; ties → first listed)."""
    approx = (A / W).mean(axis=-1)
    best = approx.min()
    close = np.flatnonzero(approx <= best + 1e-9)
    if close.size == 1:
        return int(close[0])
    exact = [_exact_cv(A[a], W) for a in close]
    return int(close[int(np.argmin(exact))])  # argmin over Fractions keeps the first minimum


def select_k_many(A: np.ndarray, W: np.ndarray) -> np.ndarray:
    """:func:`select_k` for a stack of labellings: ``A[s, k, f]``, ``W[s, f]``."""
    approx = (A / W[:, None, :]).mean(axis=-1)
    chosen = np.argmin(approx, axis=1)
    near = (approx <= approx.min(axis=1, keepdims=True) + 1e-9).sum(axis=1) > 1
    for s in np.flatnonzero(near):
        chosen[s] = select_k(A[s], W[s])
    return chosen


def plain_cv_state(nbr: np.ndarray, labels: np.ndarray, settings: LearnerSettings) -> CvState:
    """Cross-validation from the neighbour lists and a labelling, recounting every vote."""
    labels = np.asarray(labels, dtype=np.int64)
    ranges = fold_ranges(len(labels), settings.folds)
    starts = np.array([a for a, _ in ranges])
    stops = np.array([b for _, b in ranges])
    A = kernels.cv_fold_sums(nbr, labels, settings.ks, settings.weight_array, starts, stops, settings.n_classes)
    w = settings.weight_array[labels]
    W = np.array([int(w[a:b].sum()) for a, b in ranges], dtype=np.int64)
    k_index = select_k(A, W)
    return CvState(A=A, W=W, k_index=k_index, errors=(A / W).mean(axis=1))


def plain_decision(train_X: np.ndarray, labels: np.ndarray, x: np.ndarray, settings: LearnerSettings,
                   nbr: np.ndarray | None = None) -> tuple[int, int]:
    """Re-run the learner on ``labels``: (chosen K, its vote for ``x``).

    ``nbr`` (the cross-validation neighbour lists, which depend on the features only) may be passed
    to skip recomputing them; the votes, fold errors and choice of K are always recounted.
    """
    labels = np.asarray(labels, dtype=np.int64)
    if nbr is None:
        nbr = cv_neighbours(train_X, settings.folds, int(max(settings.k_candidates)))
    state = plain_cv_state(nbr, labels, settings)
    k = settings.k_candidates[state.k_index]
    return k, predict(train_X, labels, x, k, settings.n_classes)


def check_settings(train_X, train_y, k_candidates, folds, class_weights, owner: str) -> tuple[np.ndarray, np.ndarray, LearnerSettings]:
    """Validate the training data and learner options at the public boundary."""
    X = np.asarray(train_X)
    y = np.asarray(train_y)
    if X.ndim != 2:
        raise DataError(f"{owner}: train_X must be a 2-D array (rows × features); got shape {X.shape}")
    if y.ndim != 1 or y.shape[0] != X.shape[0]:
        raise DataError(f"{owner}: train_y must have one label per row of train_X ({X.shape[0]}); got shape {y.shape}")
    try:
        X = X.astype(np.float64)
    except (TypeError, ValueError) as exc:
        raise DataError(f"{owner}: train_X must be numeric; encode categorical columns first") from exc
    if not np.all(np.isfinite(X)):
        row, col = np.argwhere(~np.isfinite(X))[0]
        raise DataError(f"{owner}: train_X has a NaN or infinite value at row {row}, column {col}; impute or drop it")
    if y.dtype.kind not in "iub" and not (y.dtype.kind == "f" and np.all(y == np.round(y))):
        raise DataError(f"{owner}: train_y must hold integer class labels 0, 1, ...; got dtype {y.dtype}")
    y = y.astype(np.int64)
    if y.size and y.min() < 0:
        raise DataError(f"{owner}: class labels must be 0, 1, ..., C-1; found {y.min()}")
    n_classes = int(y.max()) + 1 if y.size else 0
    if n_classes < 2:
        raise DataError(f"{owner}: train_y needs at least two classes (labels 0 and 1)")
    if isinstance(folds, bool) or not isinstance(folds, (int, np.integer)) or folds < 2:
        raise OptionError(f"the `folds` option of {owner} must be an int ≥ 2; got {folds!r}")
    folds = int(folds)
    ks = tuple(int(k) for k in k_candidates)
    if not ks or any(k < 1 for k in ks) or len(set(ks)) != len(ks):
        raise OptionError(f"the `k_candidates` option of {owner} must list distinct ints ≥ 1; got {k_candidates!r}")
    if X.shape[0] < folds:
        raise DataError(f"{owner}: {X.shape[0]} training rows cannot be split into {folds} folds; give at least "
                        f"{folds} rows or fewer folds")
    first_start, first_stop = fold_ranges(X.shape[0], folds)[0]  # the first fold is the largest
    smallest_train = X.shape[0] - (first_stop - first_start)
    if max(ks) > smallest_train:
        raise OptionError(f"the `k_candidates` option of {owner} must not exceed {smallest_train}, the rows left for "
                          f"training in a cross-validation fold; got K = {max(ks)}")
    weights = [1] * n_classes
    for label, w in (class_weights or {}).items():
        if isinstance(w, bool) or not isinstance(w, (int, np.integer)) or w < 1:
            raise OptionError(f"the `class_weights` option of {owner} must map labels to ints ≥ 1; got {label!r}: {w!r}")
        if not 0 <= int(label) < n_classes:
            raise OptionError(f"the `class_weights` option of {owner} names label {label!r}, but the labels are 0..{n_classes - 1}")
        weights[int(label)] = int(w)
    return X, y, LearnerSettings(k_candidates=ks, folds=folds, weights=tuple(weights), n_classes=n_classes)
