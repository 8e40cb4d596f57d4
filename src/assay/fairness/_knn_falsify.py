"""Search for a concrete flip set (and protected value / box point) that changes a KNN decision.

Used for inputs the certifier cannot certify. Candidates come from the certifier's analysis: the
candidate Ks that cross-validation may choose, the protected combinations and box points for which
few flips suffice. For each, the optimal prediction flips are built on the exact neighbours of that
point (labels that most help the runner-up), and, when the K is not the default one, flips that
steer cross-validation towards it are added greedily (exact incremental cross-validation on the
most influential rows). **Every candidate is re-checked with the plain learner** (cross-validation
recounted from scratch on the flipped labels, then the vote); only confirmed ones are returned.
"""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass

import numpy as np

from assay.fairness import _knn_kernels as kernels
from assay.fairness._knn_learner import _top_sorted_rows, plain_decision, select_k


@dataclass(frozen=True)
class Found:
    rows: tuple[int, ...]  # indices into the (down-sampled) training set
    new_labels: tuple[int, ...]
    point: np.ndarray
    combo: int
    k: int
    decision: int


def box_points(center: np.ndarray, radius: np.ndarray, rng: np.random.Generator, grid: int = 9, max_corners: int = 64) -> np.ndarray:
    """The centre, corners (all, or ``max_corners`` random ones) and an axis grid of the box."""
    dims = np.flatnonzero(radius > 0)
    points = [center.copy()]
    if dims.size == 0:
        return np.asarray(points)
    if dims.size <= 6:
        signs = np.array(list(itertools.product((-1.0, 1.0), repeat=dims.size)))
    else:
        signs = rng.choice((-1.0, 1.0), size=(max_corners, dims.size))
    for sign in signs:
        p = center.copy()
        p[dims] += sign * radius[dims]
        points.append(p)
    for c in dims:
        for step in np.linspace(-1.0, 1.0, grid):
            p = center.copy()
            p[c] += step * radius[c]
            points.append(p)
    return np.asarray(points)


def prediction_flips(order: np.ndarray, k: int, labels: np.ndarray, flippable: np.ndarray, direction: tuple[int, int],
                     p: int, n_classes: int, budget: int, farthest_first: bool = True) -> tuple[list[int], list[int]] | None:
    """Fewest flips among the K nearest rows ``order[:k]`` that make some label beat ``p``; None if > budget."""
    src, dst = direction
    top = order[:k]
    counts = np.bincount(labels[top], minlength=n_classes)
    best = None
    for t in range(n_classes):
        if t == p:
            continue
        gain_of = np.array([kernels.flip_gain(label, t, p, src, dst) for label in range(n_classes)])
        gains = np.where(flippable[top], gain_of[labels[top]], 0)
        twos = top[gains == 2]
        ones = top[gains == 1]
        threshold = 0 if t < p else 1
        s = kernels.min_flips_to_beat(int(counts[t] - counts[p]), threshold, twos.size, ones.size)
        if s < 0 or s > budget or (best is not None and s >= best[0]):
            continue
        if farthest_first:
            twos, ones = twos[::-1], ones[::-1]
        need = threshold - int(counts[t] - counts[p])
        n_two = min(twos.size, max(0, (need + 1) // 2))
        rows = list(twos[:n_two])
        need -= 2 * n_two
        rows += list(ones[: max(need, 0)])
        new = []
        for j in rows:
            lab = int(labels[j])
            if lab == p:
                new.append(t if (src < 0 or dst == t) else dst)
            else:
                new.append(t)
        best = (s, [int(j) for j in rows], new)
    return None if best is None else (best[1], best[2])


class Falsifier:
    """Concrete counterexample search around one certifier (see the module docstring)."""

    def __init__(self, certifier):
        self.c = certifier
        self._rev = None

    def _reverse(self):
        if self._rev is None:
            from assay.fairness._knn_kset import reverse_neighbours

            self._rev = reverse_neighbours(self.c.nbr, len(self.c.labels))
        return self._rev

    def cv_after(self, flip_sets: list[tuple[list[int], list[int]]]) -> tuple[np.ndarray, np.ndarray]:
        """Exact fold sums after each flip set (incremental recount)."""
        base = self.c.base
        st = base.settings
        width = max(1, max(len(rows) for rows, _ in flip_sets))
        rows_arr = np.full((len(flip_sets), width), -1, dtype=np.int64)
        to_arr = np.full((len(flip_sets), width), -1, dtype=np.int64)
        for s, (rows, new) in enumerate(flip_sets):
            rows_arr[s, : len(rows)] = rows
            to_arr[s, : len(new)] = new
        ptr, idx = self._reverse()
        return kernels.enumerate_fold_sums(base.nbr, base.labels, st.ks, st.n_classes, st.weight_array, base.fold_of,
                                           st.folds, base.A, base.W, base.errors, ptr, idx, rows_arr, to_arr)

    def steer(self, rows: list[int], new: list[int], a: int, budget: int, total: int, deadline: float, width: int = 24) -> tuple[list[int], list[int]]:
        """Greedily add up to ``budget`` flips that make cross-validation choose candidate ``a``."""
        c = self.c
        base = c.base
        bounded = c.ksets.ensure_bounded()
        terms = bounded.terms(max(1, total))
        rows, new = list(rows), list(new)
        for _ in range(budget):
            A, W = self.cv_after([(rows, new)])
            if select_k(A[0], W[0]) == a or time.perf_counter() > deadline:
                break
            cv = (A[0] / W[0]).mean(axis=1)
            rival = int(np.argmin(np.where(np.arange(cv.size) == a, np.inf, cv)))
            score = terms["rho_fix"][a] + bounded.own_down[a] + terms["rho_brk"][rival] + bounded.own_up[rival]
            score = score.copy()
            score[rows] = -np.inf
            picks = np.argsort(-score)[:width]
            trials = []
            for j in picks:
                for b in base.new_labels(int(j)):
                    trials.append((rows + [int(j)], new + [b]))
            if not trials:
                break
            A, W = self.cv_after(trials)
            cv_all = (A / W[:, None, :]).mean(axis=2)
            others = np.delete(cv_all, a, axis=1).min(axis=1)
            best = int(np.argmin(cv_all[:, a] - others))
            rows, new = trials[best]
        return rows, new

    def verify(self, rows: list[int], new: list[int], point: np.ndarray, p: int) -> tuple[int, int] | None:
        labels = self.c.labels.copy()
        labels[rows] = new
        k, decision = plain_decision(self.c.train_X, labels, point, self.c.settings, nbr=self.c.nbr)
        return (k, decision) if decision != p else None

    def search(self, analysis, budget: int, radius: np.ndarray, k_order: list[int], deadline: float,
               fixed_sets: list[tuple[list[int], list[int], int]] | None = None, max_checks: int = 16) -> Found | None:
        """Try the analysis' weakest (K, combo) pairs first; return a confirmed counterexample or None.

        At most ``max_checks`` candidates are re-checked with the plain learner (the expensive step),
        so the search is deterministic; ``deadline`` is only a safety net.
        """
        checks = 0
        c = self.c
        p = analysis.prediction
        st = c.settings
        rng = np.random.default_rng(0)
        kmax = int(max(st.k_candidates))
        attempts = []
        for a in k_order:
            for v in np.argsort(np.where(analysis.min_flips[:, a] < 0, 1 << 60, analysis.min_flips[:, a]), kind="stable"):
                m = analysis.min_flips[v, a]
                if m < 0 or m > budget:
                    continue
                attempts.append((a, int(v)))
        for a, v in attempts:
            k = int(st.k_candidates[a])
            # the combo's own point first; the rest of the box only if that fails
            points = box_points(analysis.points[v], radius, rng)
            for group in (points[:1], points[1:]):
                if len(group) == 0:
                    continue
                found, checks = self._try_points(group, a, v, k, p, budget, kmax, deadline, checks, max_checks)
                if found is not None:
                    return found
                if checks >= max_checks or time.perf_counter() > deadline:
                    return None
        return self._try_fixed(analysis, radius, fixed_sets, p, rng, deadline, checks, max_checks)

    def _try_points(self, points, a, v, k, p, budget, kmax, deadline, checks, max_checks):
        """Build prediction flips at each point (fewest first), steer towards K_a if needed, and re-check."""
        c = self.c
        st = c.settings
        scored = []
        for point in points:
            dist = kernels.squared_distances(point, c.train_X)
            order = _top_sorted_rows(dist, k)[0]
            plan = prediction_flips(order, k, c.labels, c.flippable, c.direction, p, st.n_classes, budget)
            if plan is not None:
                scored.append((len(plan[0]), point, order))
        scored.sort(key=lambda item: item[0])
        for _, point, order in scored[:4]:
            for farthest in (True, False):
                plan = prediction_flips(order, k, c.labels, c.flippable, c.direction, p, st.n_classes, budget, farthest)
                if plan is None:
                    continue
                rows, new = plan
                if a != c.base.k0_index and len(rows) < budget:
                    rows, new = self.steer(rows, new, a, budget - len(rows), budget, deadline)
                confirmed = self.verify(rows, new, point, p)
                checks += 1
                if confirmed is not None:
                    return Found(tuple(rows), tuple(new), point, v, confirmed[0], confirmed[1]), checks
                if checks >= max_checks or time.perf_counter() > deadline:
                    return None, checks
        return None, checks

    def _try_fixed(self, analysis, radius, fixed_sets, p, rng, deadline, checks, max_checks):
        """Given flip sets (with the K they make cross-validation choose): search the box for a changed vote."""
        c = self.c
        st = c.settings
        for rows, new, k in fixed_sets or []:
            labels = c.labels.copy()
            labels[list(rows)] = new
            for v in range(len(analysis.combos)):
                for point in box_points(analysis.points[v], radius, rng):
                    # screen with the vote on the flipped labels before the full re-check
                    order = _top_sorted_rows(kernels.squared_distances(point, c.train_X), k)[0]
                    if int(np.argmax(np.bincount(labels[order], minlength=st.n_classes))) == p:
                        continue
                    confirmed = self.verify(list(rows), list(new), point, p)
                    checks += 1
                    if confirmed is not None:
                        return Found(tuple(rows), tuple(new), point, v, confirmed[0], confirmed[1])
                    if checks >= max_checks or time.perf_counter() > deadline:
                        return None
        return None
