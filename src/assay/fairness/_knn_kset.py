"""Which K can cross-validation choose when up to ``b`` training labels are flipped?

Two sound answers, both exact about the learner of :mod:`._knn_learner`:

* :class:`ExactKSet` — enumerate every allowed flip set of size ≤ ``b`` (when few enough) and re-run
  cross-validation incrementally (only the validation rows whose neighbour lists hold a flipped row,
  and the flipped rows themselves, are recounted). This is exact, and per flip set it also records
  the chosen K, which the certifier uses for an exact joint (learning + prediction) check.

* :class:`BoundedKSet` — for larger budgets, a lower bound on
  ``CV_S(K) − CV_S(K')`` for every pair of candidates, valid for every flip set ``S`` with
  ``|S| ≤ b``. K can be chosen only if that lower bound is ≤ 0 against every other K'.

  Beyond the paper, the bound counts flips of the validation rows' **own** labels (the published
  bounds keep validation labels fixed, which is unsound: one flip of a validation label changes
  that fold's error, and its weight, directly) and shares **one** budget ``b`` among all validation
  rows (the paper gives each row its own ``b`` flips). Derivation, per fold ``f`` with weighted
  errors ``A`` and weight total ``W`` and ``E = A / W``::

      E' ≤ (A + G) / W + D / W        E' ≥ (A − G') / W − I / W

  where ``G``/``G'`` bound the growth/shrinkage of the weighted errors and ``D``/``I`` the
  decrease/increase of ``W`` (own-label flips change a row's weight); both use ``A' ≤ W'``. A row
  whose vote needs ``d`` flips among its neighbours to change contributes only if ``d`` of them
  flip, so (fractional covering) ``Σ_changed value ≤ Σ_{j ∈ S} Σ_{i ∋ j} value_i / d_i``; the
  largest ``b`` such per-row sums, plus each flipped row's own-label effect, bound the change.
  The plain count of changeable rows is a second, independent bound; the smaller is used.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field

import numpy as np

from assay.fairness import _knn_kernels as kernels
from assay.fairness._knn_learner import LearnerSettings, fold_assignment, select_k, select_k_many

#: float slack for comparing cross-validation errors that were bounded in float64
CV_SLACK = 1e-9


@dataclass
class CvBase:
    """Cross-validation of the unflipped training set, and which flips are allowed."""

    settings: LearnerSettings
    nbr: np.ndarray
    labels: np.ndarray
    flippable: np.ndarray
    direction: tuple[int, int]
    fold_of: np.ndarray = field(init=False)
    counts: np.ndarray = field(init=False)
    flip_counts: np.ndarray = field(init=False)
    A: np.ndarray = field(init=False)
    W: np.ndarray = field(init=False)
    errors: np.ndarray = field(init=False)
    k0_index: int = field(init=False)
    cv0: np.ndarray = field(init=False)

    def __post_init__(self):
        s = self.settings
        self.fold_of = fold_assignment(len(self.labels), s.folds)
        self.counts = kernels.prefix_counts(self.nbr, self.labels, s.ks, s.n_classes)
        if self.flippable.all():
            self.flip_counts = self.counts
        else:
            # flippable rows per label: count labels with unflippable rows moved to a phantom class
            shadow = np.where(self.flippable, self.labels, s.n_classes)
            self.flip_counts = np.ascontiguousarray(kernels.prefix_counts(self.nbr, shadow, s.ks, s.n_classes + 1)[:, :, : s.n_classes])
        self.A, self.W, self.errors = kernels.fold_sums(self.counts, self.labels, s.weight_array, self.fold_of, s.folds)
        self.k0_index = select_k(self.A, self.W)
        self.cv0 = (self.A / self.W).mean(axis=1)

    def new_labels(self, row: int) -> list[int]:
        """Labels row ``row`` may be flipped to under the flip restrictions."""
        if not self.flippable[row]:
            return []
        src, dst = self.direction
        old = int(self.labels[row])
        if src >= 0:
            return [dst] if old == src and dst != old else []
        return [b for b in range(self.settings.n_classes) if b != old]


def reverse_neighbours(nbr: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
    """CSR lists: for each row ``j``, the rows whose neighbour lists contain ``j`` (counting sort)."""
    return kernels.reverse_lists(nbr, n)


class ExactKSet:
    """Every flip set of size ≤ ``budget`` with the K cross-validation chooses after it."""

    def __init__(self, base: CvBase, budget: int):
        self.base = base
        self.budget = budget
        n = len(base.labels)
        singles = [(j, b) for j in range(n) for b in base.new_labels(j)]
        rows_sets: list[tuple[int, ...]] = [()]
        to_sets: list[tuple[int, ...]] = [()]
        by_row: dict[int, list[int]] = {}
        for j, b in singles:
            by_row.setdefault(j, []).append(b)
        rows = sorted(by_row)
        for size in range(1, budget + 1):
            for combo in itertools.combinations(rows, size):
                for labels in itertools.product(*(by_row[j] for j in combo)):
                    rows_sets.append(combo)
                    to_sets.append(labels)
        width = max(budget, 1)
        self.flip_rows = np.full((len(rows_sets), width), -1, dtype=np.int64)
        self.flip_to = np.full((len(rows_sets), width), -1, dtype=np.int64)
        for s, (combo, labels) in enumerate(zip(rows_sets, to_sets)):
            self.flip_rows[s, : len(combo)] = combo
            self.flip_to[s, : len(labels)] = labels
        self.sizes = (self.flip_rows >= 0).sum(axis=1)
        st = base.settings
        ptr, idx = reverse_neighbours(base.nbr, n)
        A, W = kernels.enumerate_fold_sums(base.nbr, base.labels, st.ks, st.n_classes, st.weight_array, base.fold_of,
                                           st.folds, base.A, base.W, base.errors, ptr, idx, self.flip_rows, self.flip_to)
        self.k_index = select_k_many(A, W)
        n_k = len(st.k_candidates)
        self.min_select = np.full(n_k, np.iinfo(np.int64).max, dtype=np.int64)
        for a in range(n_k):
            hit = self.sizes[self.k_index == a]
            if hit.size:
                self.min_select[a] = int(hit.min())

    def reachable(self, b: int) -> np.ndarray:
        return self.min_select <= b


class BoundedKSet:
    """Sound pairwise bounds on cross-validation errors under ≤ ``b`` flips (see the module docstring)."""

    def __init__(self, base: CvBase):
        self.base = base
        st = base.settings
        n = len(base.labels)
        src, dst = base.direction
        kmax = int(max(st.k_candidates))
        self.brk, self.fix = kernels.point_flip_distances(base.counts, base.flip_counts, base.labels, src, dst, kmax + 1)
        w = st.weight_array.astype(np.float64)
        scale = st.folds * base.W[base.fold_of].astype(np.float64)
        self.value = w[base.labels] / scale  # what one row's error is worth in CV units
        n_k = len(st.k_candidates)
        self.own_up = np.zeros((n_k, n))
        self.own_down = np.zeros((n_k, n))
        for j in range(n):
            targets = base.new_labels(j)
            if not targets:
                continue
            a = base.labels[j]
            wt = w[targets]
            err = base.errors[j].astype(np.float64)
            num_up = np.maximum(0.0, wt.max() - w[a] * err)
            den_up = max(0.0, float((w[a] - wt).max()))
            num_down = w[a] * err
            den_down = max(0.0, float((wt - w[a]).max()))
            self.own_up[:, j] = (num_up + den_up) / scale[j]
            self.own_down[:, j] = (num_down + den_down) / scale[j]
        self._cache: dict[int, dict] = {}

    def terms(self, b: int) -> dict:
        """Per-row influence (CV units) at budget ``b``: ``r_up[a]``, ``r_down[a]`` and caps per candidate."""
        if b in self._cache:
            return self._cache[b]
        base = self.base
        st = base.settings
        src, dst = base.direction
        binary = st.n_classes == 2
        brk = np.where(self.brk <= b, self.brk, -1)
        fix = np.where(self.fix <= b, self.fix, -1)
        n = len(base.labels)
        flippable = base.flippable
        rho_brk = kernels.influence(base.nbr, st.ks, base.labels, flippable, brk, True, self.value, binary, src, dst, n)
        rho_fix = kernels.influence(base.nbr, st.ks, base.labels, flippable, fix, False, self.value, binary, src, dst, n)
        cap_brk = np.array([self.value[brk[:, a] >= 1].sum() for a in range(brk.shape[1])])
        cap_fix = np.array([self.value[fix[:, a] >= 1].sum() for a in range(fix.shape[1])])
        out = {"rho_brk": rho_brk, "rho_fix": rho_fix, "cap_brk": cap_brk, "cap_fix": cap_fix}
        if len(self._cache) >= 3:  # keep a few budgets: the arrays are large on big data
            self._cache.pop(next(iter(self._cache)))
        self._cache[b] = out
        return out

    def _pair_arrays(self, a: int, c: int, terms: dict) -> tuple[list[np.ndarray], list[np.ndarray], list[float]]:
        """Influence arrays of the pair (K_a, K_c), their descending prefix sums, and the caps they combine with."""
        key = ("pair", a, c)
        if key not in terms:
            own = self.own_down[a] + self.own_up[c]
            arrays = [terms["rho_fix"][a] + terms["rho_brk"][c] + own,  # fractional covering for both
                      terms["rho_brk"][c] + own,  # with the plain cap on fixes of K_a
                      terms["rho_fix"][a] + own,  # with the plain cap on breaks of K_c
                      own]  # with both caps
            caps = [0.0, terms["cap_fix"][a], terms["cap_brk"][c], terms["cap_fix"][a] + terms["cap_brk"][c]]
            stacked = np.stack(arrays)
            prefix = np.concatenate([np.zeros((4, 1)), np.cumsum(-np.sort(-stacked, axis=1), axis=1)], axis=1)
            terms[key] = (stacked, prefix, np.asarray(caps))
        return terms[key]

    def pair_bound(self, a: int, c: int, b: int, terms: dict, forced: np.ndarray | None = None, forced_count: int = 0) -> float:
        """Largest decrease of ``CV(K_a) − CV(K_c)`` over flip sets of size ≤ b (upper bound).

        With ``forced`` rows and ``forced_count`` = p, only flip sets holding at least p rows of
        ``forced`` are considered (the flips the prediction step needs): a flip set's p rows in
        ``forced`` weigh at most the p largest influences there, its other ≤ b − p rows at most the
        b − p largest overall (influences are ≥ 0).
        """
        if b <= 0:
            return 0.0
        arrays, prefix, caps = self._pair_arrays(a, c, terms)
        n = arrays.shape[1]
        if forced is not None and forced_count > 0 and forced.size:
            p = min(forced_count, b, forced.size)
            chosen = arrays[:, forced]
            if p < forced.size:
                chosen = np.partition(chosen, forced.size - p, axis=1)[:, forced.size - p:]
            totals = chosen.sum(axis=1) + prefix[:, min(b - p, n)]
        else:
            totals = prefix[:, min(b, n)]
        return float((caps + totals).min())

    def selectable(self, b: int) -> np.ndarray:
        """Candidates that cross-validation may choose under some flip set of size ≤ b (over-approximation)."""
        base = self.base
        n_k = len(base.settings.k_candidates)
        out = np.zeros(n_k, dtype=bool)
        out[base.k0_index] = True
        if b <= 0:
            return out
        terms = self.terms(b)
        for a in range(n_k):
            if a == base.k0_index:
                continue
            out[a] = all(base.cv0[a] - base.cv0[c] - self.pair_bound(a, c, b, terms) <= CV_SLACK
                         for c in range(n_k) if c != a)
        return out

    def jointly_selectable(self, a: int, b: int, forced: np.ndarray, forced_count: int) -> bool:
        """Whether K_a may be chosen by a flip set of size ≤ b that holds ≥ forced_count rows of ``forced``."""
        base = self.base
        if a == base.k0_index:
            return True
        terms = self.terms(b)
        return all(base.cv0[a] - base.cv0[c] - self.pair_bound(a, c, b, terms, forced, forced_count) <= CV_SLACK
                   for c in range(len(base.settings.k_candidates)) if c != a)


class KSetAnalysis:
    """Exact enumeration up to ``exact_budget`` flips, sound bounds beyond; ``min_select[a]`` per candidate."""

    def __init__(self, base: CvBase, enumeration_limit: float):
        self.base = base
        self.enumeration_limit = enumeration_limit
        self.exact: ExactKSet | None = None
        self.bounded: BoundedKSet | None = None
        self._selectable: dict[int, np.ndarray] = {}
        self._exact_cap: int | None = None

    def exact_budget_for(self, n: int) -> int:
        """Largest budget ≤ n whose flip sets are cheap enough to enumerate (0 = only the empty set)."""
        if self._exact_cap is None:
            options = np.array([len(self.base.new_labels(j)) for j in range(len(self.base.labels))], dtype=np.float64)
            options = options[options > 0]
            kmax = max(self.base.settings.k_candidates)
            # e_b = number of flip sets of size b (elementary symmetric sums, Newton's identities);
            # each flipped row is recounted in about kmax + 1 validation rows of kmax neighbours
            e, powers, work, best = [1.0], [], 0.0, 0
            for b in range(1, len(options) + 1):
                powers.append(float((options ** b).sum()))
                e_b = sum((-1) ** (i - 1) * e[b - i] * powers[i - 1] for i in range(1, b + 1)) / b
                e.append(e_b)
                work += e_b * b * (kmax + 1) * kmax
                if not math.isfinite(work) or e_b < 0 or work > self.enumeration_limit:
                    break
                best = b
            self._exact_cap = best
        return min(n, self._exact_cap)

    def ensure_exact(self, budget: int) -> ExactKSet:
        if self.exact is None or self.exact.budget < budget:
            self.exact = ExactKSet(self.base, budget)
        return self.exact

    def ensure_bounded(self) -> BoundedKSet:
        if self.bounded is None:
            self.bounded = BoundedKSet(self.base)
        return self.bounded

    def selectable(self, b: int) -> np.ndarray:
        """Sound over-approximation of the Ks cross-validation may choose with ≤ b flips."""
        if b not in self._selectable:
            if self.exact is not None and b <= self.exact.budget:
                out = self.exact.reachable(b)
            else:
                out = self.ensure_bounded().selectable(b)
                if self.exact is not None:
                    out = out | self.exact.reachable(self.exact.budget)
            self._selectable[b] = out
        return self._selectable[b]

    def min_select(self, cap: int) -> np.ndarray:
        """Per candidate, the fewest flips (lower bound) that may make cross-validation choose it; cap + 1 if > cap."""
        n_k = len(self.base.settings.k_candidates)
        out = np.full(n_k, cap + 1, dtype=np.int64)
        for a in range(n_k):
            if not self.selectable(cap)[a]:
                continue
            lo, hi = 0, cap
            while lo < hi:
                mid = (lo + hi) // 2
                if self.selectable(mid)[a]:
                    hi = mid
                else:
                    lo = mid + 1
            out[a] = lo
        return out
