"""numba loops shared by the KNN learner, its certifier and its enumerators.

The one rule every other module relies on: **squared Euclidean distances are computed by
:func:`squared_distances` and nothing else** (sum of ``(a_c - b_c)**2`` over the columns, left to
right, in float64), so the learner, the certifier and every re-check see bit-identical distances
and break their ties the same way. Interval bounds for ε-boxes are computed separately, with an
outward margin (:func:`distance_intervals`).

Vote rule used everywhere: the label with the largest count wins; equal counts go to the
**smallest** label (as in the published code).
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

NO_DIRECTION = -1


@njit(cache=True, inline="always")
def _sqdist_row(a, B, out_row):
    m, d = B.shape
    for j in range(m):
        total = 0.0
        for c in range(d):
            diff = a[c] - B[j, c]
            total += diff * diff
        out_row[j] = total


@njit(cache=True)
def _sqdist_serial(A, B, out):
    for i in range(A.shape[0]):
        _sqdist_row(A[i], B, out[i])


@njit(parallel=True, cache=True)
def _sqdist_parallel(A, B, out):
    for i in prange(A.shape[0]):
        _sqdist_row(A[i], B, out[i])


def squared_distances(A: np.ndarray, B: np.ndarray) -> np.ndarray:
    """``out[i, j] = Σ_c (A[i, c] - B[j, c])²`` in float64, summed left to right; shape (len(A), len(B)).

    Large blocks run on all cores; the arithmetic per entry is the same loop either way (no fast-math,
    so no reordering or contraction), which a test pins bit for bit.
    """
    A = np.ascontiguousarray(A, dtype=np.float64)
    B = np.ascontiguousarray(B, dtype=np.float64)
    if A.ndim == 1:
        A = A[None, :]
    out = np.empty((A.shape[0], B.shape[0]), dtype=np.float64)
    if A.shape[0] * B.shape[0] >= 1 << 16 and A.shape[0] > 1:
        _sqdist_parallel(A, B, out)
    else:
        _sqdist_serial(A, B, out)
    return out


@njit(cache=True)
def distance_intervals(x, radius, B, relative_margin):
    """Lower and upper bounds of ``Σ_c (x'_c - B[j, c])²`` over the box ``|x'_c - x_c| ≤ radius_c``.

    Per coordinate, ``|x'_c - b_c|`` lies in ``[max(0, |x_c - b_c| - r_c), |x_c - b_c| + r_c]``; the
    squares are summed and widened by ``relative_margin`` so that the float64 distance the learner
    computes for any float input in the box lies inside (sound against rounding).
    """
    m, d = B.shape
    lo = np.empty(m)
    hi = np.empty(m)
    for j in range(m):
        s_lo = 0.0
        s_hi = 0.0
        for c in range(d):
            gap = abs(x[c] - B[j, c])
            far = gap + radius[c]
            near = gap - radius[c]
            if near < 0.0:
                near = 0.0
            s_lo += near * near
            s_hi += far * far
        lo[j] = s_lo * (1.0 - relative_margin)
        hi[j] = s_hi * (1.0 + relative_margin) + 1e-300
    return lo, hi


@njit(cache=True, inline="always")
def vote(counts):
    """Majority label; ties go to the smallest label."""
    best = 0
    for label in range(1, counts.shape[0]):
        if counts[label] > counts[best]:
            best = label
    return best


@njit(cache=True, inline="always")
def beats(count_t, count_p, t, p):
    """Whether label ``t`` beats label ``p`` in the vote (strictly more votes, or equal and smaller)."""
    return count_t > count_p or (count_t == count_p and t < p)


@njit(cache=True)
def prefix_counts(nbr, labels, ks, n_classes):
    """``out[i, a, l]`` = how many of the first ``ks[a]`` neighbours of row ``i`` carry label ``l``."""
    n = nbr.shape[0]
    slot = _slots(ks)
    out = np.zeros((n, ks.shape[0], n_classes), dtype=np.int64)
    for i in prange(n):
        running = np.zeros(n_classes, dtype=np.int64)
        for r in range(slot.shape[0] - 1):
            running[labels[nbr[i, r]]] += 1
            a = slot[r + 1]
            if a >= 0:
                out[i, a, :] = running
    return out


@njit(cache=True)
def _slots(ks):
    """``slot[k]`` = position of ``k`` in the candidate list, -1 if not a candidate (any order of ks)."""
    slot = np.full(ks.max() + 1, -1, dtype=np.int64)
    for a in range(ks.shape[0]):
        slot[ks[a]] = a
    return slot


@njit(cache=True, inline="always")
def _fold_rows(nbr, labels, slot, weights, start, stop, n_classes, A, f):
    if n_classes == 2:  # one running count of label 1; label 1 wins iff strictly more than half
        for i in range(start, stop):
            own = labels[i]
            w = weights[own]
            ones = 0
            for r in range(slot.shape[0] - 1):
                ones += labels[nbr[i, r]]
                a = slot[r + 1]
                if a >= 0:
                    vote_i = 1 if 2 * ones > r + 1 else 0
                    if vote_i != own:
                        A[a, f] += w
        return
    running = np.zeros(n_classes, dtype=np.int64)
    for i in range(start, stop):
        running[:] = 0
        own = labels[i]
        w = weights[own]
        for r in range(slot.shape[0] - 1):
            running[labels[nbr[i, r]]] += 1
            a = slot[r + 1]
            if a >= 0 and vote(running) != own:
                A[a, f] += w


@njit(cache=True)
def _cv_serial(nbr, labels, slot, weights, starts, stops, n_classes, A):
    for f in range(starts.shape[0]):
        _fold_rows(nbr, labels, slot, weights, starts[f], stops[f], n_classes, A, f)


@njit(parallel=True, cache=True)
def _cv_parallel(nbr, labels, slot, weights, starts, stops, n_classes, A):
    for f in prange(starts.shape[0]):
        _fold_rows(nbr, labels, slot, weights, starts[f], stops[f], n_classes, A, f)


def cv_fold_sums(nbr, labels, ks, weights, starts, stops, n_classes):
    """Weighted cross-validation errors ``A[a, f]`` recounted from the neighbour lists (the plain learner).

    Parallel over folds (each fold owns its column of A) only when the work is large enough to pay
    for waking threads.
    """
    # small label codes keep the gathered labels in L1 cache (the loop is a gather per neighbour)
    labels = np.ascontiguousarray(labels, dtype=np.int8 if n_classes < 127 else np.int64)
    A = np.zeros((len(ks), len(starts)), dtype=np.int64)
    slot = _slots(np.asarray(ks, dtype=np.int64))
    args = (nbr, labels, slot, np.asarray(weights, dtype=np.int64), np.asarray(starts, dtype=np.int64),
            np.asarray(stops, dtype=np.int64), n_classes, A)
    if nbr.shape[0] * nbr.shape[1] >= 50_000_000:
        _cv_parallel(*args)
    else:
        _cv_serial(*args)
    return A


@njit(cache=True)
def fold_sums(counts, labels, weights, fold_of, n_folds):
    """Per candidate K and fold: weighted errors ``A[a, f]``; per fold the weight total ``W[f]``.

    Integer weights keep both exact (int64), so cross-validation errors can be compared exactly.
    """
    n, n_k, _ = counts.shape
    A = np.zeros((n_k, n_folds), dtype=np.int64)
    W = np.zeros(n_folds, dtype=np.int64)
    errors = np.zeros((n, n_k), dtype=np.bool_)
    for i in range(n):
        f = fold_of[i]
        w = weights[labels[i]]
        W[f] += w
        for a in range(n_k):
            if vote(counts[i, a]) != labels[i]:
                errors[i, a] = True
                A[a, f] += w
    return A, W, errors


@njit(cache=True)
def enumerate_fold_sums(nbr, labels, ks, n_classes, weights, fold_of, n_folds, base_A, base_W, base_errors,
                        rev_ptr, rev_idx, flip_rows, flip_to):
    """Exact fold sums after each flip set (rows ``flip_rows[s]``, new labels ``flip_to[s]``, -1 = unused).

    Only the validation rows whose neighbour lists contain a flipped row (and the flipped rows
    themselves, as validation points of their own folds) are recounted.
    """
    n_sets, width = flip_rows.shape
    n_k = ks.shape[0]
    n = labels.shape[0]
    slot = _slots(ks)
    out_A = np.empty((n_sets, n_k, n_folds), dtype=np.int64)
    out_W = np.empty((n_sets, n_folds), dtype=np.int64)
    current = labels.copy()
    stamp = np.full(n, -1, dtype=np.int64)
    affected = np.empty(n, dtype=np.int64)
    running = np.zeros(n_classes, dtype=np.int64)
    for s in range(n_sets):
        A = base_A.copy()
        W = base_W.copy()
        n_aff = 0
        for q in range(width):
            j = flip_rows[s, q]
            if j < 0:
                continue
            current[j] = flip_to[s, q]
            f = fold_of[j]
            W[f] += weights[flip_to[s, q]] - weights[labels[j]]
            if stamp[j] != s:
                stamp[j] = s
                affected[n_aff] = j
                n_aff += 1
            for e in range(rev_ptr[j], rev_ptr[j + 1]):
                i = rev_idx[e]
                if stamp[i] != s:
                    stamp[i] = s
                    affected[n_aff] = i
                    n_aff += 1
        for u in range(n_aff):
            i = affected[u]
            f = fold_of[i]
            old_w = weights[labels[i]]
            new_w = weights[current[i]]
            running[:] = 0
            for r in range(slot.shape[0] - 1):
                running[current[nbr[i, r]]] += 1
                a = slot[r + 1]
                if a >= 0:
                    if base_errors[i, a]:
                        A[a, f] -= old_w
                    if vote(running) != current[i]:
                        A[a, f] += new_w
        out_A[s] = A
        out_W[s] = W
        for q in range(width):
            j = flip_rows[s, q]
            if j >= 0:
                current[j] = labels[j]
    return out_A, out_W


# ---------------------------------------------------------------------------------------------
# Optimal flip adversaries on label counts.
#
# A flip of a row changes its label. ``direction = (src, dst)`` (or NO_DIRECTION) restricts flips to
# src -> dst; ``flippable`` restricts which rows may flip. For "does t beat p", a flip's gain on the
# margin c_t - c_p is 2 (p -> t), 1 (p -> other, other -> t) or 0.
# ---------------------------------------------------------------------------------------------


@njit(cache=True, inline="always")
def flip_gain(label, t, p, src, dst):
    """Largest gain on the margin ``c_t - c_p`` one allowed flip of a row labelled ``label`` can bring."""
    if label == t:
        return 0
    if src < 0:  # any label may become any other
        return 2 if label == p else 1
    if label != src:
        return 0
    if label == p:
        return 2 if dst == t else 1
    return 1 if dst == t else 0


@njit(cache=True)
def min_flips_to_beat(margin, threshold, twos, ones):
    """Fewest flips raising ``margin`` to ``threshold`` with ``twos`` flips worth 2 and ``ones`` worth 1; -1 if impossible."""
    need = threshold - margin
    if need <= 0:
        return 0
    if need <= 2 * twos:
        return (need + 1) // 2
    rest = need - 2 * twos
    if rest <= ones:
        return twos + rest
    return -1


@njit(cache=True)
def min_flips_to_lose(counts, flip_counts, p, src, dst):
    """Fewest flips among a fixed neighbour set making the vote differ from ``p``; -1 if impossible.

    ``counts[l]`` labels among the neighbours, ``flip_counts[l]`` of them flippable. Exact: the vote
    differs from ``p`` iff some ``t`` beats ``p``, and for a fixed ``t`` the best flips are those of
    largest gain on ``c_t - c_p``.
    """
    n_classes = counts.shape[0]
    best = -1
    for t in range(n_classes):
        if t == p:
            continue
        twos = 0
        ones = 0
        for label in range(n_classes):
            g = flip_gain(label, t, p, src, dst)
            if g == 2:
                twos += flip_counts[label]
            elif g == 1:
                ones += flip_counts[label]
        threshold = 0 if t < p else 1
        s = min_flips_to_beat(counts[t] - counts[p], threshold, twos, ones)
        if s >= 0 and (best < 0 or s < best):
            best = s
    return best


@njit(cache=True)
def min_flips_to_win(counts, flip_counts, a, src, dst, cap):
    """Fewest flips (≤ cap) among a fixed neighbour set making the vote equal ``a``; -1 if none ≤ cap.

    Without a direction: flips move votes to ``a``; ``a`` wins with ``s`` flips iff the votes each
    rival must lose, ``max(0, c_l - c_a - s + [l < a])``, are available and sum to at most ``s``.
    With a direction ``src -> dst`` every flip moves one vote from src to dst; try s = 0..cap.
    """
    n_classes = counts.shape[0]
    total_flippable = 0
    for label in range(n_classes):
        if label != a:
            total_flippable += flip_counts[label]
    if src < 0:
        limit = min(cap, total_flippable)
        for s in range(limit + 1):
            ok = True
            needed = 0
            for label in range(n_classes):
                if label == a:
                    continue
                lose = counts[label] - counts[a] - s + (1 if label < a else 0)
                if lose > 0:
                    if lose > flip_counts[label]:
                        ok = False
                        break
                    needed += lose
            if ok and needed <= s:
                return s
        return -1
    limit = min(cap, flip_counts[src]) if src != dst else 0
    trial = counts.copy()
    for s in range(limit + 1):
        if s > 0:
            trial[src] -= 1
            trial[dst] += 1
        if vote(trial) == a:
            return s
    return -1


@njit(cache=True)
def point_flip_distances(counts, flip_counts, labels, src, dst, cap):
    """Per validation row and K: flips to break a correct vote (``brk``) and to fix a wrong one (``fix``).

    Entries are -1 where more than ``cap`` flips would be needed (or it is impossible) and 0 for the
    state the row is already in.
    """
    n, n_k, n_classes = counts.shape
    brk = np.zeros((n, n_k), dtype=np.int64)
    fix = np.zeros((n, n_k), dtype=np.int64)
    for i in prange(n):
        a = labels[i]
        for k in range(n_k):
            if vote(counts[i, k]) == a:
                s = min_flips_to_lose(counts[i, k], flip_counts[i, k], a, src, dst)
                brk[i, k] = s if (s >= 0 and s <= cap) else -1
            else:
                fix[i, k] = min_flips_to_win(counts[i, k], flip_counts[i, k], a, src, dst, cap)
    return brk, fix


@njit(cache=True)
def flip_useful(label_j, label_i, binary, breaking, src, dst):
    """Whether flipping a neighbour labelled ``label_j`` can help break (or fix) row ``i`` labelled ``label_i``.

    For two classes exactly: breaking needs ``label_i -> other`` flips, fixing ``other -> label_i``.
    With more classes every allowed flip may matter, so every flippable neighbour counts (sound).
    """
    if src >= 0 and label_j != src:
        return False
    if not binary:
        return True
    if breaking:
        return label_j == label_i
    return label_j != label_i and (src < 0 or dst == label_i)


@njit(cache=True)
def influence(nbr, ks, labels, flippable, dist, breaking, value, binary, src, dst, n):
    """``out[a, j] = Σ value[i] / dist[i, a]`` over rows ``i`` with ``1 ≤ dist[i, a]`` whose first ``ks[a]`` neighbours hold ``j``.

    The fractional-covering bound: a row whose vote needs ``d`` flips among its neighbours is changed
    only if ``d`` of them flip, so ``Σ_changed value ≤ Σ_{j flipped} out[j]``.
    """
    n_k = ks.shape[0]
    out = np.zeros((n_k, n), dtype=np.float64)
    for a in range(n_k):
        for i in range(nbr.shape[0]):
            d = dist[i, a]
            if d < 1:
                continue
            share = value[i] / d
            for r in range(ks[a]):
                j = nbr[i, r]
                if flippable[j] and flip_useful(labels[j], labels[i], binary, breaking, src, dst):
                    out[a, j] += share
    return out



@njit(cache=True)
def reverse_lists(nbr, n):
    """CSR ``(ptr, rows)``: ``rows[ptr[j]:ptr[j + 1]]`` are the rows whose neighbour lists hold ``j``, ascending."""
    ptr = np.zeros(n + 1, dtype=np.int64)
    for i in range(nbr.shape[0]):
        for r in range(nbr.shape[1]):
            ptr[nbr[i, r] + 1] += 1
    for j in range(n):
        ptr[j + 1] += ptr[j]
    fill = ptr[:-1].copy()
    rows = np.empty(ptr[n], dtype=np.int64)
    for i in range(nbr.shape[0]):
        for r in range(nbr.shape[1]):
            j = nbr[i, r]
            rows[fill[j]] = i
            fill[j] += 1
    return ptr, rows
