"""The prediction step: can flips, a protected value and a point of the ε-box change one vote?

For an input ``x`` and every combination ``v`` of protected values (the values seen in training,
plus ``x``'s own), ``x_v`` is ``x`` with those values. For each candidate K, every training row is
classified against the box around ``x_v``:

* **certain** — among the K nearest for every point of the box: fewer than K rows can come before
  it (a row ``i`` can come before ``j`` iff ``lo_i ≤ hi_j``, or ``i`` is an identical row with a
  smaller index);
* **possible** — among the K nearest for some point: fewer than K rows surely come before it
  (``hi_i < lo_j``, or identical with a smaller index);
* out otherwise.

Without ε the distances are the learner's own float64 distances and certain = possible = the exact
K nearest. The adversary then picks any K rows containing all certain ones from the possible
ones, and flips labels; the vote differs from the original prediction ``p`` iff some label ``t``
beats ``p``. For a fixed ``t`` the best choice is solved exactly (rows labelled ``t`` first, then
other labels, then ``p``; flips worth 2 on ``c_t − c_p`` before flips worth 1), which gives the
fewest flips that can change the vote: a sound lower bound for the true learner, and exact when
ε = 0.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np
from numba import njit

from assay.fairness import _knn_kernels as kernels
from assay.fairness._knn_learner import _top_sorted_rows

CERTAIN, UNCERTAIN = 0, 1


def protected_combinations(train_X: np.ndarray, x: np.ndarray, protected: tuple[int, ...],
                           column_values: dict[int, list[float]] | None = None) -> list[tuple[float, ...]]:
    """All combinations of protected values (training values plus ``x``'s own); ``x``'s own first."""
    if not protected:
        return [()]
    own = tuple(float(x[c]) for c in protected)
    values = []
    for i, c in enumerate(protected):
        seen = column_values[c] if column_values is not None and c in column_values else np.unique(train_X[:, c]).tolist()
        values.append(sorted(set(seen) | {own[i]}))
    return [own] + [combo for combo in itertools.product(*values) if combo != own]


def identical_row_ranks(train_X: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per row: how many identical rows have a smaller index (``before``) and a larger one (``after``)."""
    _, inverse, sizes = np.unique(train_X, axis=0, return_inverse=True, return_counts=True)
    inverse = inverse.ravel()
    order = np.argsort(inverse, kind="stable")
    starts = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    before = np.empty(len(inverse), dtype=np.int64)
    before[order] = np.arange(len(inverse)) - starts[inverse[order]]
    after = sizes[inverse] - 1 - before
    return before, after


def membership_keys(point: np.ndarray, radius: np.ndarray, train_X: np.ndarray, kmax: int,
                    before: np.ndarray, after: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Keys with: row certain for K iff ``key_certain ≤ K``; possible for K iff ``key_possible ≤ K − 1``."""
    n, d = train_X.shape
    if not np.any(radius > 0):
        dist = kernels.squared_distances(point, train_X)
        order = _top_sorted_rows(dist, min(kmax, n))[0]
        rank = np.full(n, n + 1, dtype=np.int64)
        rank[order] = np.arange(order.size)
        return rank + 1, rank
    margin = 1e-12 + 8.0 * (d + 4) * np.finfo(np.float64).eps
    lo, hi = kernels.distance_intervals(np.ascontiguousarray(point, dtype=np.float64), radius, train_X, margin)
    # only the smallest few bounds matter for K ≤ kmax: counts are needed exactly up to
    # kmax + 1 + (largest number of identical rows after a row), beyond that a row is out anyway
    keep = min(n, kmax + 1 + int(after.max(initial=0)))
    lo_small = np.sort(np.partition(lo, keep - 1)[:keep]) if keep < n else np.sort(lo)
    hi_small = np.sort(np.partition(hi, keep - 1)[:keep]) if keep < n else np.sort(hi)
    candidates = np.flatnonzero(lo <= hi_small[min(kmax, n) - 1])
    big = np.iinfo(np.int64).max // 2
    key_certain = np.full(n, big, dtype=np.int64)
    key_possible = np.full(n, big, dtype=np.int64)
    key_certain[candidates] = np.searchsorted(lo_small, hi[candidates], side="right") - after[candidates]
    key_possible[candidates] = np.searchsorted(hi_small, lo[candidates], side="left") + before[candidates]
    if keep < n:  # a count that reached the end of the kept bounds may be larger: never certain then
        key_certain[candidates[np.searchsorted(lo_small, hi[candidates], side="right") >= keep]] = big
    return key_certain, key_possible


@njit(cache=True)
def category_counts(key_certain, key_possible, labels, flippable, ks, n_classes):
    """``out[a, 0/1/2/3, l]``: certain rows, certain flippable, uncertain rows, uncertain flippable, per label."""
    n_k = ks.shape[0]
    out = np.zeros((n_k, 4, n_classes), dtype=np.int64)
    for j in range(labels.shape[0]):
        lab = labels[j]
        f = flippable[j]
        for a in range(n_k):
            if key_certain[j] <= ks[a]:
                out[a, 0, lab] += 1
                if f:
                    out[a, 1, lab] += 1
            elif key_possible[j] <= ks[a] - 1:
                out[a, 2, lab] += 1
                if f:
                    out[a, 3, lab] += 1
    return out


@njit(cache=True)
def relaxed_min_flips(cat, k, p, src, dst):
    """Fewest flips with which some label beats ``p`` for some admissible choice of K rows; -1 if impossible."""
    n_classes = cat.shape[1]
    n_certain = 0
    for label in range(n_classes):
        n_certain += cat[0, label]
    slots = k - n_certain
    best = -1
    for t in range(n_classes):
        if t == p:
            continue
        threshold = 0 if t < p else 1
        margin_c = cat[0, t] - cat[0, p]
        twos_c = 0
        ones_c = 0
        other_flip = 0
        other_fixed = 0
        p2 = 0
        p1 = 0
        for label in range(n_classes):
            g = kernels.flip_gain(label, t, p, src, dst)
            if g == 2:
                twos_c += cat[1, label]
            elif g == 1:
                ones_c += cat[1, label]
            if label != p and label != t:
                if g == 1:
                    other_flip += cat[3, label]
                    other_fixed += cat[2, label] - cat[3, label]
                else:
                    other_fixed += cat[2, label]
        if kernels.flip_gain(p, t, p, src, dst) == 2:
            p2 = cat[3, p]
        elif kernels.flip_gain(p, t, p, src, dst) == 1:
            p1 = cat[3, p]
        p0 = cat[2, p] - p2 - p1
        take_t = min(slots, cat[2, t])
        rest0 = slots - take_t
        for q in range(min(p2, rest0) + 1):
            rest = rest0 - q
            take_of = min(rest, other_flip)
            rest -= take_of
            take_on = min(rest, other_fixed)
            rest -= take_on
            extra_p2 = min(rest, p2 - q)
            rest -= extra_p2
            take_p1 = min(rest, p1)
            rest -= take_p1
            take_p0 = min(rest, p0)
            margin = margin_c + take_t - (q + extra_p2 + take_p1 + take_p0)
            s = kernels.min_flips_to_beat(margin, threshold, twos_c + q + extra_p2, ones_c + take_of + take_p1)
            if s >= 0 and (best < 0 or s < best):
                best = s
            if take_on == 0:
                break  # displacing rows that are not fixed-other ones cannot help any more
    return best


@njit(cache=True)
def changed_without_flips(certain, uncertain, k, p):
    """Whether, with labels fixed, some admissible choice of K rows makes the vote differ from ``p``."""
    n_classes = certain.shape[0]
    slots = k
    for label in range(n_classes):
        slots -= certain[label]
    for t in range(n_classes):
        if t == p:
            continue
        take_t = min(slots, uncertain[t])
        rest = slots - take_t
        others = 0
        for label in range(n_classes):
            if label != p and label != t:
                others += uncertain[label]
        rest -= min(rest, others)
        if kernels.beats(certain[t] + take_t, certain[p] + rest, t, p):
            return True
    return False


@njit(cache=True)
def exact_joint_unsafe(k_of_set, flip_rows, flip_to, labels, key_certain, key_possible, base, ks, p):
    """For each flip set (with the K it makes cross-validation choose): first combo whose vote may change, else -1.

    ``base[v, a, 0]`` / ``base[v, a, 2]`` are the certain / uncertain label counts of combo ``v``
    for candidate ``a``; each flip moves one row between labels.
    """
    n_sets, width = flip_rows.shape
    n_combos = key_certain.shape[0]
    out = np.full(n_sets, -1, dtype=np.int64)
    for s in range(n_sets):
        a = k_of_set[s]
        k = ks[a]
        for v in range(n_combos):
            certain = base[v, a, 0].copy()
            uncertain = base[v, a, 2].copy()
            for q in range(width):
                j = flip_rows[s, q]
                if j < 0:
                    continue
                if key_certain[v, j] <= k:
                    certain[labels[j]] -= 1
                    certain[flip_to[s, q]] += 1
                elif key_possible[v, j] <= k - 1:
                    uncertain[labels[j]] -= 1
                    uncertain[flip_to[s, q]] += 1
            if changed_without_flips(certain, uncertain, k, p):
                out[s] = v
                break
    return out


@dataclass
class InputAnalysis:
    """What the prediction step knows about one input, for every protected combination and candidate K."""

    prediction: int
    combos: list[tuple[float, ...]]
    points: np.ndarray  # (V, D) the inputs x_v
    key_certain: np.ndarray  # (V, N)
    key_possible: np.ndarray  # (V, N)
    categories: np.ndarray  # (V, nK, 4, C)
    min_flips: np.ndarray  # (V, nK); -1 = no number of flips changes the vote

    def min_flips_per_k(self) -> np.ndarray:
        """Per candidate, the fewest flips over all combos (a huge number where impossible)."""
        big = np.iinfo(np.int64).max
        values = np.where(self.min_flips < 0, big, self.min_flips)
        return values.min(axis=0)


def analyse_input(x: np.ndarray, train_X: np.ndarray, labels: np.ndarray, flippable: np.ndarray,
                  direction: tuple[int, int], ks: np.ndarray, k0: int, n_classes: int,
                  protected: tuple[int, ...], radius: np.ndarray, before: np.ndarray, after: np.ndarray,
                  column_values: dict[int, list[float]] | None = None) -> InputAnalysis:
    """Original prediction (K0, unflipped labels, ``x`` itself) and the per-combo, per-K analysis."""
    dist = kernels.squared_distances(x, train_X)
    order = _top_sorted_rows(dist, k0)[0]
    prediction = int(np.argmax(np.bincount(labels[order], minlength=n_classes)))
    combos = protected_combinations(train_X, x, protected, column_values)
    points = np.repeat(np.asarray(x, dtype=np.float64)[None, :], len(combos), axis=0)
    for v, combo in enumerate(combos):
        for c, value in zip(protected, combo):
            points[v, c] = value
    kmax = int(ks.max())
    n = len(labels)
    key_c = np.empty((len(combos), n), dtype=np.int64)
    key_p = np.empty((len(combos), n), dtype=np.int64)
    cats = np.empty((len(combos), len(ks), 4, n_classes), dtype=np.int64)
    mins = np.empty((len(combos), len(ks)), dtype=np.int64)
    src, dst = direction
    for v in range(len(combos)):
        key_c[v], key_p[v] = membership_keys(points[v], radius, train_X, kmax, before, after)
        cats[v] = category_counts(key_c[v], key_p[v], labels, flippable, ks, n_classes)
        for a in range(len(ks)):
            mins[v, a] = relaxed_min_flips(cats[v, a], int(ks[a]), prediction, src, dst)
    return InputAnalysis(prediction, combos, points, key_c, key_p, cats, mins)
