"""Brute-force references for the KNN fairness tests, written without the certifier's code.

* :class:`Reference` — the learner of :mod:`assay.fairness._knn_learner` re-implemented directly
  from its definition (contiguous folds, neighbours by (distance, index), votes with ties to the
  smaller label, K by exact rational comparison of the cross-validation errors, first listed on
  ties), with every allowed flip set of a budget enumerated and K re-chosen on each.
  Distances are exact rationals of the float64 inputs (``arithmetic="exact"``; for data on a
  coarse dyadic grid, where the learner's float64 distances are exact too) or the learner's own
  float64 formula, summed left to right (``arithmetic="float"``, for real data).
* :func:`box_faces` — one point on every face of the arrangement of the bisectors
  ``d_i(x') = d_j(x')`` inside a 1-D or 2-D ε-box, in exact rationals, so that every neighbour
  ordering the box contains is visited (the argument is in its docstring).
* :func:`min_flips_among` — the fewest label flips among a fixed neighbour set that change the vote,
  by enumerating multisets of (from, to) flips by size.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Sequence
from fractions import Fraction

import numpy as np


def fraction(value) -> Fraction:
    """The exact rational value of a float64."""
    return Fraction(float(value))


def fold_ranges(n: int, folds: int) -> list[tuple[int, int]]:
    """scikit-learn's unshuffled ``KFold``: contiguous folds, the first ``n mod folds`` one row longer."""
    out, start = [], 0
    for f in range(folds):
        size = n // folds + (1 if f < n % folds else 0)
        out.append((start, start + size))
        start += size
    return out


def vote(labels: Sequence[int], n_classes: int) -> int:
    """Most frequent label; equal counts go to the smaller label."""
    counts = [0] * n_classes
    for label in labels:
        counts[label] += 1
    best = 0
    for label in range(1, n_classes):
        if counts[label] > counts[best]:
            best = label
    return best


class Reference:
    """The KNN learner and its flip scenarios, by brute force (see the module docstring)."""

    def __init__(self, X, y, ks: Sequence[int], folds: int, *, class_weights: dict[int, int] | None = None,
                 flippable=None, direction: tuple[int, int] | None = None, arithmetic: str = "exact"):
        self.X = np.asarray(X, dtype=np.float64)
        self.y = [int(v) for v in y]
        self.n = len(self.y)
        self.ks = [int(k) for k in ks]
        self.folds = folds
        self.n_classes = max(self.y) + 1
        self.weights = [int((class_weights or {}).get(label, 1)) for label in range(self.n_classes)]
        self.flippable = [True] * self.n if flippable is None else [bool(v) for v in flippable]
        self.direction = direction
        self.arithmetic = arithmetic
        self.rows = [[fraction(v) for v in row] for row in self.X]
        self.fold_of = [0] * self.n
        for f, (start, stop) in enumerate(fold_ranges(self.n, folds)):
            for i in range(start, stop):
                self.fold_of[i] = f
        kmax = max(self.ks)
        self.cv_nbr = np.empty((self.n, kmax), dtype=np.int64)
        for i in range(self.n):
            d = self.distances(self.X[i])
            others = [j for j in range(self.n) if self.fold_of[j] != self.fold_of[i]]
            self.cv_nbr[i] = sorted(others, key=lambda j: (d[j], j))[:kmax]
        self._scenarios: dict[tuple, list] = {}

    # -- distances and votes ---------------------------------------------------------------------
    def distances(self, point) -> list:
        """Squared distances from ``point`` (floats, or Fractions for exact points) to every row."""
        if self.arithmetic == "float":
            p = np.asarray(point, dtype=np.float64)
            total = np.zeros(self.n)
            for c in range(self.X.shape[1]):  # left to right, as the learner sums
                diff = p[c] - self.X[:, c]
                total = total + diff * diff
            return list(total)
        p = [v if isinstance(v, Fraction) else fraction(v) for v in point]
        return [sum(((p[c] - row[c]) ** 2 for c in range(len(p))), Fraction(0)) for row in self.rows]

    def order(self, point) -> list[int]:
        """All training rows by (distance, index)."""
        d = self.distances(point)
        return sorted(range(self.n), key=lambda j: (d[j], j))

    def decide(self, order: Sequence[int], labels: Sequence[int], k: int) -> int:
        return vote([labels[j] for j in order[:k]], self.n_classes)

    # -- cross-validation --------------------------------------------------------------------------
    def chosen_k(self, labels: Sequence[int]) -> int:
        """The K cross-validation chooses on ``labels`` (exact rational errors; ties: first listed)."""
        labels = np.asarray(labels, dtype=np.int64)
        neighbour_labels = labels[self.cv_nbr]
        counts = np.zeros((self.n, self.n_classes), dtype=np.int64)
        w = np.asarray(self.weights)[labels]
        fold_of = np.asarray(self.fold_of)
        W = [int(w[fold_of == f].sum()) for f in range(self.folds)]
        best, best_value, done = None, None, 0
        for k in sorted(set(self.ks)):
            for r in range(done, k):
                counts[np.arange(self.n), neighbour_labels[:, r]] += 1
            done = k
            votes = np.argmax(counts, axis=1)  # first maximum = smaller label
            wrong = w * (votes != labels)
            value = sum(Fraction(int(wrong[fold_of == f].sum()), W[f]) for f in range(self.folds)) / self.folds
            if best_value is None or value < best_value or (value == best_value and self.ks.index(k) < self.ks.index(best)):
                best, best_value = k, value
        return best

    # -- flips --------------------------------------------------------------------------------------
    def new_labels(self, row: int) -> list[int]:
        if not self.flippable[row]:
            return []
        old = self.y[row]
        if self.direction is None:
            return [b for b in range(self.n_classes) if b != old]
        return [self.direction[1]] if old == self.direction[0] else []

    def flip_sets(self, budget: int, skip: Iterable[int] = ()) -> Iterable[tuple[tuple[int, ...], tuple[int, ...]]]:
        skip = set(skip)
        rows = [j for j in range(self.n) if j not in skip and self.new_labels(j)]
        yield (), ()
        for size in range(1, budget + 1):
            for combo in itertools.combinations(rows, size):
                for new in itertools.product(*(self.new_labels(j) for j in combo)):
                    yield combo, new

    def scenarios(self, budget: int, skip: Iterable[int] = ()) -> list[tuple[tuple[int, ...], tuple[int, ...], list[int], int]]:
        """``(rows, new labels, labels, chosen K)`` for every allowed flip set of size ≤ budget."""
        key = (budget, tuple(sorted(set(skip))))
        if key not in self._scenarios:
            out = []
            for rows, new in self.flip_sets(budget, skip):
                labels = list(self.y)
                for j, b in zip(rows, new):
                    labels[j] = b
                out.append((rows, new, labels, self.chosen_k(labels)))
            self._scenarios[key] = out
        return self._scenarios[key]

    def k_possible(self, budget: int) -> set[int]:
        return {k for *_, k in self.scenarios(budget)}

    def k_default(self) -> int:
        return self.chosen_k(self.y)

    def protected_points(self, x, protected: Sequence[int]) -> list[list]:
        """``x`` with every combination of protected values (training values and its own)."""
        x = [fraction(v) for v in x]
        if not protected:
            return [x]
        values = [sorted({fraction(v) for v in self.X[:, c]} | {x[c]}) for c in protected]
        out = []
        for combo in itertools.product(*values):
            p = list(x)
            for c, v in zip(protected, combo):
                p[c] = v
            out.append(p)
        return out

    def min_flips(self, order: Sequence[int], k: int, p: int) -> int | None:
        return min_flips_among([self.y[j] for j in order[:k]], [self.flippable[j] for j in order[:k]], p,
                               self.n_classes, self.direction)


def min_flips_among(labels: Sequence[int], flippable: Sequence[bool], p: int, n_classes: int,
                    direction: tuple[int, int] | None) -> int | None:
    """Fewest flips among these neighbours after which the vote is not ``p``; None if no flips do it.

    Only the label counts matter, so a flip set is a multiset of (from, to) moves, at most as many
    from a label as it has flippable neighbours; sizes are tried in increasing order.
    """
    counts = [0] * n_classes
    movable = [0] * n_classes
    for label, f in zip(labels, flippable):
        counts[label] += 1
        movable[label] += bool(f)
    if vote([label for label, c in enumerate(counts) for _ in range(c)], n_classes) != p:
        return 0
    if direction is None:
        moves = [(a, b) for a in range(n_classes) for b in range(n_classes) if a != b and movable[a]]
    else:
        moves = [direction] if movable[direction[0]] else []
    for size in range(1, sum(movable) + 1):
        for chosen in itertools.combinations_with_replacement(moves, size):
            used = [0] * n_classes
            trial = list(counts)
            for a, b in chosen:
                used[a] += 1
                trial[a] -= 1
                trial[b] += 1
            if any(used[a] > movable[a] for a in range(n_classes)):
                continue
            best = max(range(n_classes), key=lambda label: (trial[label], -label))
            if best != p:
                return size
    return None


# ---------------------------------------------------------------------------------------------
# exact decision regions of an ε-box
# ---------------------------------------------------------------------------------------------


def _bisectors(rows: list[list[Fraction]], center: list[Fraction], free: list[int], lo: list[Fraction],
               hi: list[Fraction], pairs: Iterable[tuple[int, int]]) -> list[tuple[Fraction, ...]]:
    """Affine forms ``d_i − d_j`` (coefficients on the free coordinates, constant) that vanish inside the box."""
    fixed = [c for c in range(len(center)) if c not in free]
    forms = []
    seen = set()
    for i, j in sorted(pairs):
        # d_i − d_j = Σ_free −2 (a_ic − a_jc) x_c + Σ_free (a_ic² − a_jc²) + Σ_fixed ((x_c − a_ic)² − (x_c − a_jc)²)
        coef = [-2 * (rows[i][c] - rows[j][c]) for c in free]
        const = sum((rows[i][c] ** 2 - rows[j][c] ** 2 for c in free), Fraction(0))
        const += sum(((center[c] - rows[i][c]) ** 2 - (center[c] - rows[j][c]) ** 2 for c in fixed), Fraction(0))
        if all(a == 0 for a in coef):
            continue  # the order of i and j is the same everywhere in the box
        corners = itertools.product(*zip(lo, hi))
        values = [sum((a * v for a, v in zip(coef, corner)), const) for corner in corners]
        if min(values) <= 0 <= max(values) and (*coef, const) not in seen:
            seen.add((*coef, const))
            forms.append((*coef, const))
    return forms


def _line_points(values: Iterable[Fraction], lo: Fraction, hi: Fraction) -> list[Fraction]:
    """The given values inside [lo, hi], the ends, and the midpoint of every gap between them."""
    cuts = sorted({v for v in values if lo <= v <= hi} | {lo, hi})
    return cuts + [(a + b) / 2 for a, b in zip(cuts, cuts[1:])]


def box_faces(rows: list[list[Fraction]], center: list[Fraction], radius: dict[int, Fraction],
              pairs: Iterable[tuple[int, int]]) -> list[list[Fraction]]:
    """One point on every face of the bisector arrangement inside the box (1 or 2 free coordinates).

    Exactness. Let ``f_ij = d_i − d_j`` (squared Euclidean distances, the learner's metric). On the
    box, with the other coordinates fixed, ``f_ij`` is affine in the free coordinates (the
    quadratic terms cancel). The order of the training rows by (distance, index) at a point — hence
    the K nearest for every K and the vote for every labelling — is a function of the sign vector
    ``(sign f_ij)``; ties (``f_ij = 0``) are broken by index, so they are faces of their own. The
    sign vector is constant on each face (vertex, edge, open cell) of the arrangement of the lines
    ``f_ij = 0`` cut by the box. Only the given ``pairs`` are drawn: the caller passes every pair
    whose order can change which rows are the K nearest (:func:`box_orders`).

    * One free coordinate: the faces are the roots of the ``f_ij`` in the segment, the segment
      ends, and the open intervals between consecutive ones; a root, an end, or a midpoint is taken
      from each.
    * Two free coordinates ``(u, v)``: let U be the u-coordinates of all vertices (pairwise line
      intersections inside the box, intersections of the lines with the box's sides, the corners).
      Between two consecutive values of U no line crosses another or a side, so on the vertical
      line at the midpoint of that slab every cell and every non-vertical edge meeting the slab is
      met, as an open interval between consecutive crossings or as a crossing; every vertex and
      every vertical edge lies on a vertical line ``u ∈ U``. On each of these vertical lines the
      crossings with the lines, the box ends and the midpoints between consecutive ones are taken.
      Every face meets one of these vertical lines in a crossing or an open interval, so it is
      visited.
    """
    free = sorted(radius)
    lo = [center[c] - radius[c] for c in free]
    hi = [center[c] + radius[c] for c in free]
    forms = _bisectors(rows, center, free, lo, hi, pairs)

    def point(values):
        p = list(center)
        for c, v in zip(free, values):
            p[c] = v
        return p

    if len(free) == 1:
        roots = [-const / a for a, const in forms]
        return [point([t]) for t in _line_points(roots, lo[0], hi[0])]
    assert len(free) == 2, "exact faces for 1-D and 2-D boxes only"
    us = {lo[0], hi[0]}
    for a, b, const in forms:
        if b == 0:
            us.add(-const / a)
        elif a != 0:
            for v in (lo[1], hi[1]):
                us.add(-(b * v + const) / a)
    for (a1, b1, c1), (a2, b2, c2) in itertools.combinations(forms, 2):
        det = a1 * b2 - a2 * b1
        if det != 0:
            u = (b1 * c2 - b2 * c1) / det
            v = (a2 * c1 - a1 * c2) / det
            if lo[0] <= u <= hi[0] and lo[1] <= v <= hi[1]:
                us.add(u)
    out = []
    for u in _line_points(us, lo[0], hi[0]):
        crossings = [-(a * u + const) / b for a, b, const in forms if b != 0]
        out.extend(point([u, v]) for v in _line_points(crossings, lo[1], hi[1]))
    return out


def box_classes(rows: list[list[Fraction]], center: list[Fraction], radius: dict[int, Fraction],
                ks: Sequence[int]) -> tuple[dict[int, list[int]], dict[int, list[int]]]:
    """Per K: the rows among the K nearest everywhere in the box, and those that are so only somewhere.

    Exact interval distances ``[lo_j, hi_j]`` over the box. A row is *certain* for K when fewer than
    K others can come before it (``lo_i ≤ hi_j``), *out* when at least K others surely come before
    it (``hi_i < lo_j``), *uncertain* otherwise. Non-strict tests on ties only move rows to
    *uncertain*, which is always safe. The K nearest anywhere in the box are the certain rows plus
    the first ``K − #certain`` uncertain rows by (distance, index).
    """
    lo_d, hi_d = [], []
    for row in rows:
        near = far = Fraction(0)
        for c, value in enumerate(center):
            gap = abs(value - row[c])
            r = radius.get(c, Fraction(0))
            near += max(Fraction(0), gap - r) ** 2
            far += (gap + r) ** 2
        lo_d.append(near)
        hi_d.append(far)
    n = len(rows)
    certain, uncertain = {}, {}
    for k in ks:
        certain[k] = [j for j in range(n) if sum(1 for i in range(n) if i != j and lo_d[i] <= hi_d[j]) < k]
        possible = [j for j in range(n) if sum(1 for i in range(n) if i != j and hi_d[i] < lo_d[j]) < k]
        uncertain[k] = [j for j in possible if j not in certain[k]]
    return certain, uncertain


def box_orders(reference: Reference, center: list[Fraction], radius: dict[int, Fraction]) -> dict[tuple, list[Fraction]]:
    """Every distinct neighbour signature in the box (the K nearest, for each candidate K) with one point realising it.

    Only the order among each K's uncertain rows (:func:`box_classes`) matters, so the bisectors of
    those pairs are the arrangement :func:`box_faces` enumerates.
    """
    certain, uncertain = box_classes(reference.rows, center, radius, reference.ks)
    relevant = sorted(set().union(*uncertain.values()))
    pairs = {(i, j) for k in reference.ks for i, j in itertools.combinations(uncertain[k], 2)}
    points = box_faces(reference.rows, center, radius, pairs) if radius else [center]
    # distances scaled to integers (all data are dyadic rationals): d_j · (S·den)² for a point p = num / den
    scale = math.lcm(*(v.denominator for j in relevant for v in reference.rows[j]))
    rows = {j: [int(v * scale) for v in reference.rows[j]] for j in relevant}
    out: dict[tuple, list[Fraction]] = {}
    for p in points:
        den = math.lcm(*(v.denominator for v in p))
        num = [int(v * den * scale) for v in p]
        d = {j: sum((a - den * b) ** 2 for a, b in zip(num, rows[j])) for j in relevant}
        signature = []
        for k in reference.ks:
            ranked = sorted(uncertain[k], key=lambda j: (d[j], j))
            signature.append(tuple(sorted(certain[k] + ranked[: k - len(certain[k])])))
        out.setdefault(tuple(signature), p)
    return out
