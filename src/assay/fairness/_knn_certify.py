"""The certifier: one cross-validation analysis per training set, then milliseconds per input.

Soundness argument (what ``certified`` means and why it holds): let S be any allowed flip set with
``|S| ≤ n``, ``K_S`` the K cross-validation chooses on the flipped labels, ``x'`` any protected
combination / ε-box point. The decision on ``x'`` differs from ``p`` only if

1. ``K_S`` is in the over-approximated K-set (:mod:`._knn_kset`: exact enumeration, or pairwise
   cross-validation bounds that count validation-label flips), and
2. the prediction step for ``K_S`` can change the vote with the flips in S, which needs at least
   ``min_flips[v, K_S]`` flipped rows among the rows that may be ``x'``'s neighbours
   (:mod:`._knn_predict`).

*Shared budget.* Both steps draw on the same ``n`` flips. With exact enumeration the check is joint
and exact: each enumerated S comes with its own ``K_S`` and its flips are applied in the prediction
step. With bounds, a K survives only if the flip sets that would choose it can also hold the
prediction flips: the pairwise bound is recomputed with at least ``min_flips`` of the flips forced
onto the rows near the input (whose influence on cross-validation is often small). Adding the two
budgets (``m_K + p_K > n``) would be unsound, because a flipped row near the input can serve both
steps; the forced-rows bound is the sound version.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

import numpy as np

from assay.errors import DataError, OptionError
from assay.fairness import _knn_learner as learner
from assay.fairness._knn_falsify import Falsifier
from assay.fairness._knn_kset import CvBase, KSetAnalysis
from assay.fairness._knn_predict import analyse_input, exact_joint_unsafe, identical_row_ranks
from assay.fairness._knn_result import Certificate, Counterexample, Status

OWNER = "KnnFairnessCertifier"
BIG = np.iinfo(np.int64).max


class KnnFairnessCertifier:
    """Certify KNN decisions against label-flipping bias (Li, Wang & Wang, CAV 2023), prepared once per training set.

    Parameters
    ----------
    train_X : array (n_rows, n_features)
        Training features as the learner sees them (e.g. the authors' standardised splits).
    train_y : array (n_rows,)
        Integer class labels 0..C-1 (possibly biased).
    k_candidates : sequence of int
        The Ks cross-validation chooses from, in order (equal errors go to the first listed).
    folds : int, default 10
        Cross-validation folds (contiguous, unshuffled, as scikit-learn's ``KFold``).
    class_weights : dict label -> int, optional
        Weights of each class's cross-validation errors (the paper's ``down_sampling_paras``).
    down_sample : bool, default False
        Keep every ``class_weights[label]``-th row of each label (in file order) before anything else,
        as the paper's preprocessing does. Flips are then on the kept rows; evidence still reports
        indices into the ``train_X`` given here.
    flippable : bool array (n_rows,), optional
        Only these rows' labels may be flipped (default: all).
    flip_group : dict column -> value, optional
        Only rows with these feature values may be flipped (e.g. the protected group); combined
        with ``flippable``.
    direction : (from_label, to_label), optional
        Only flips ``from_label -> to_label`` (e.g. ``(1, 0)``: only positive labels may have been
        biased). Default: any label may have been any other.
    enumeration_limit : float, default 2e8
        Budgets whose flip sets can be enumerated within about this many neighbour recounts are
        analysed exactly (every flip set, cross-validation re-run incrementally).
    """

    def __init__(self, train_X, train_y, *, k_candidates: Sequence[int], folds: int = 10,
                 class_weights: dict[int, int] | None = None, down_sample: bool = False,
                 flippable=None, flip_group: dict[int, float] | None = None,
                 direction: tuple[int, int] | None = None, enumeration_limit: float = 2e8):
        started = time.perf_counter()
        X, y, settings = learner.check_settings(train_X, train_y, k_candidates, folds, class_weights, OWNER)
        n_given = X.shape[0]
        mask = np.ones(n_given, dtype=bool)
        if flippable is not None:
            flippable = np.asarray(flippable)
            if flippable.shape != (n_given,) or flippable.dtype != bool:
                raise OptionError(f"the `flippable` option of {OWNER} must be a bool array with one entry per training row "
                                  f"({n_given}); got shape {flippable.shape} and dtype {flippable.dtype}")
            mask &= flippable
        for column, value in (flip_group or {}).items():
            _check_column(column, X.shape[1], "flip_group")
            mask &= X[:, int(column)] == value
        if direction is not None:
            if len(direction) != 2 or any(not 0 <= int(label) < settings.n_classes for label in direction) or direction[0] == direction[1]:
                raise OptionError(f"the `direction` option of {OWNER} must be two different labels (from, to) in "
                                  f"0..{settings.n_classes - 1}; got {direction!r}")
            direction = (int(direction[0]), int(direction[1]))
        else:
            direction = (-1, -1)
        if down_sample:
            X, y, kept = learner.down_sample(X, y, dict(enumerate(settings.weights)))
            mask = mask[kept]
            learner.check_settings(X, y, k_candidates, folds, class_weights, OWNER)
        else:
            kept = np.arange(n_given)
        self.settings = settings
        self.train_X = np.ascontiguousarray(X, dtype=np.float64)
        self.labels = y
        self.kept_rows = kept
        self.flippable = mask
        self.direction = direction
        self.nbr = learner.cv_neighbours(self.train_X, settings.folds, int(max(settings.k_candidates)))
        self.base = CvBase(settings, self.nbr, y, mask, direction)
        self.ksets = KSetAnalysis(self.base, enumeration_limit)
        self.before, self.after = identical_row_ranks(self.train_X)
        self.falsifier = Falsifier(self)
        self._values: dict[int, list[float]] = {}
        self.setup_seconds = time.perf_counter() - started

    # -- properties ------------------------------------------------------------------------------
    @property
    def k_default(self) -> int:
        return self.settings.k_candidates[self.base.k0_index]

    @property
    def cv_errors(self) -> dict[int, float]:
        return {k: float(e) for k, e in zip(self.settings.k_candidates, self.base.cv0)}

    def _column_values(self, protected: tuple[int, ...]) -> dict[int, list[float]]:
        for c in protected:
            if c not in self._values:
                self._values[c] = np.unique(self.train_X[:, c]).tolist()
        return self._values

    def prepare(self, flips: int) -> float:
        """Run the one-off cross-validation analysis for budget ``flips`` now; return its seconds.

        :meth:`certify` does this lazily on first use; calling it first keeps per-input timings clean.
        """
        started = time.perf_counter()
        if flips > 0 and self.ksets.exact_budget_for(flips) >= flips:
            self.ksets.ensure_exact(flips)
        else:
            self.ksets.selectable(flips)
            if flips > 0:
                terms = self.ksets.ensure_bounded().terms(flips)
                for a in range(len(self.settings.k_candidates)):
                    for c in range(len(self.settings.k_candidates)):
                        if a != c:
                            self.ksets.ensure_bounded()._pair_arrays(a, c, terms)
        return time.perf_counter() - started

    # -- input checks ----------------------------------------------------------------------------
    def _check_request(self, x, flips, protected, epsilon):
        d = self.train_X.shape[1]
        x = np.asarray(x, dtype=np.float64)
        if x.shape != (d,):
            raise DataError(f"{OWNER}: the input has shape {x.shape}, but the training rows have {d} features")
        if not np.all(np.isfinite(x)):
            raise DataError(f"{OWNER}: the input has a NaN or infinite value in column {int(np.flatnonzero(~np.isfinite(x))[0])}")
        if isinstance(flips, bool) or not isinstance(flips, (int, np.integer)) or flips < 0:
            raise OptionError(f"the `flips` option of certify must be an int ≥ 0; got {flips!r}")
        protected = tuple(int(_check_column(c, d, "protected")) for c in (protected or ()))
        radius = np.zeros(d)
        for column, r in (epsilon or {}).items():
            c = _check_column(column, d, "epsilon")
            if isinstance(r, bool) or not isinstance(r, (int, float, np.floating, np.integer)) or not np.isfinite(r) or r < 0:
                raise OptionError(f"the `epsilon` option of certify must map columns to finite radii ≥ 0; got {column!r}: {r!r}")
            radius[c] = float(r)
        return x, int(flips), protected, radius

    # -- certification ---------------------------------------------------------------------------
    def certify(self, x, flips: int, *, protected: Sequence[int] = (), epsilon: dict[int, float] | None = None,
                falsify: bool = True, shared_budget: bool = True, falsify_seconds: float = 5.0) -> Certificate:
        """Certify one input; see :class:`~assay.fairness.knn.Certificate` for the verdict's meaning.

        ``flips`` is the number n of training labels that may be wrong; ``protected`` the protected
        columns (every combination of their training values is tried); ``epsilon`` maps columns to
        box radii. Where not certified and ``falsify`` is set, a counterexample search runs (at most
        16 plain-learner re-checks; ``falsify_seconds`` is a safety limit); with enumerated flip sets
        and no ε the enumeration itself yields the counterexample, which is always re-checked.
        ``shared_budget`` enables the joint learning/prediction budget check of the bounds method.
        """
        x, n, protected, radius = self._check_request(x, flips, protected, epsilon)
        started = time.perf_counter()
        st = self.settings
        analysis = analyse_input(x, self.train_X, self.labels, self.flippable, self.direction, st.ks,
                                 self.k_default, st.n_classes, protected, radius, self.before, self.after,
                                 self._column_values(protected))
        p = analysis.prediction
        per_k = analysis.min_flips_per_k()
        exact_budget = self.ksets.exact_budget_for(n) if n > 0 else 0
        stats: dict = {}
        found = None
        if exact_budget >= n:
            method = "exact"
            unsafe_sets, unsafe_combo, possible = self._exact_check(analysis, n)
            if unsafe_sets.size == 0:
                status = Status.CERTIFIED
            else:
                status = Status.UNKNOWN
                exact = self.ksets.exact
                first = int(unsafe_sets[0])
                rows = [int(j) for j in exact.flip_rows[first] if j >= 0]
                new = [int(b) for b in exact.flip_to[first] if b >= 0]
                if not np.any(radius > 0):
                    v = unsafe_combo
                    confirmed = self.falsifier.verify(rows, new, analysis.points[v], p)
                    if confirmed is not None:
                        found = (rows, new, analysis.points[v], v, confirmed)
                elif falsify:
                    fixed = [([int(j) for j in exact.flip_rows[s] if j >= 0], [int(b) for b in exact.flip_to[s] if b >= 0],
                              int(st.k_candidates[exact.k_index[s]])) for s in unsafe_sets[:16]]
                    hit = self.falsifier.search(analysis, n, radius, [], time.perf_counter() + falsify_seconds, fixed)
                    if hit is not None:
                        found = (list(hit.rows), list(hit.new_labels), hit.point, hit.combo, (hit.k, hit.decision))
            stats["flip_sets"] = int((self.ksets.exact.sizes <= n).sum()) if n > 0 else 1
            stats["unsafe_flip_sets"] = int(unsafe_sets.size)
        else:
            method = "bounds"
            possible = self.ksets.selectable(n)
            unsafe = [a for a in range(len(st.k_candidates)) if possible[a] and per_k[a] <= n]
            stats["unsafe_k_before_sharing"] = [st.k_candidates[a] for a in unsafe]
            if shared_budget and unsafe:
                unsafe = [a for a in unsafe if self._jointly_possible(analysis, a, n)]
            status = Status.CERTIFIED if not unsafe else Status.UNKNOWN
            if unsafe and falsify:
                k0 = self.base.k0_index
                order = sorted(unsafe, key=lambda a: (a != k0, abs(a - k0)))  # the default K first, then its neighbours
                hit = self.falsifier.search(analysis, n, radius, order, time.perf_counter() + falsify_seconds)
                if hit is not None:
                    found = (list(hit.rows), list(hit.new_labels), hit.point, hit.combo, (hit.k, hit.decision))
        counterexample = None
        if found is not None:
            rows, new, point, v, (k_sel, decision) = found
            status = Status.FALSIFIED
            counterexample = Counterexample(
                flipped_rows=tuple(int(self.kept_rows[j]) for j in rows), new_labels=tuple(int(b) for b in new),
                input=tuple(float(c) for c in point), protected_values=tuple(float(c) for c in analysis.combos[v]),
                k=int(k_sel), decision=int(decision))
        elapsed = time.perf_counter() - started
        return Certificate(
            status=status, prediction=p, flips=n, k_default=self.k_default, k_candidates=st.k_candidates,
            k_possible=tuple(k for k, ok in zip(st.k_candidates, possible) if ok),
            min_flips_to_change=tuple(None if m == BIG else int(m) for m in per_k), method=method,
            protected=protected, epsilon=tuple((int(c), float(radius[c])) for c in np.flatnonzero(radius > 0)),
            counterexample=counterexample, seconds=elapsed, stats=stats)

    def _exact_check(self, analysis, n: int):
        """Exact joint check over every flip set of size ≤ n: (unsafe set indices, combo of the first, reachable K mask)."""
        exact = self.ksets.ensure_exact(n)
        upto = int(np.searchsorted(exact.sizes, n, side="right"))  # sets are listed by size
        res = exact_joint_unsafe(exact.k_index[:upto], exact.flip_rows[:upto], exact.flip_to[:upto], self.labels,
                                 analysis.key_certain, analysis.key_possible, analysis.categories, self.settings.ks,
                                 analysis.prediction)
        unsafe = np.flatnonzero(res >= 0)
        possible = np.zeros(len(self.settings.k_candidates), dtype=bool)
        possible[np.unique(exact.k_index[:upto])] = True
        return unsafe, (int(res[unsafe[0]]) if unsafe.size else -1), possible

    def _jointly_possible(self, analysis, a: int, n: int) -> bool:
        """Shared budget: may a flip set of size ≤ n both choose K_a and hold the prediction flips?"""
        k = int(self.settings.ks[a])
        usable = (analysis.min_flips[:, a] >= 0) & (analysis.min_flips[:, a] <= n)
        forced_count = int(analysis.min_flips[usable, a].min())
        if forced_count <= 0 or a == self.base.k0_index:
            return True
        near = (analysis.key_possible[usable] <= k - 1).any(axis=0) & self.flippable
        return self.ksets.ensure_bounded().jointly_selectable(a, n, np.flatnonzero(near), forced_count)

    def largest_certified_flips(self, x, *, protected: Sequence[int] = (), epsilon: dict[int, float] | None = None,
                                max_flips: int | None = None) -> int:
        """The largest n ≤ ``max_flips`` for which :meth:`certify` certifies ``x``; -1 if not even n = 0.

        Certification is monotone in n. Budgets that can be enumerated are checked exactly (the
        smallest unsafe flip set ends the scan); beyond them, the answer starts from
        ``min over K of max(flips to choose K, flips to change the vote with K) − 1`` and is raised
        while the shared-budget check still certifies.
        """
        x, _, protected, radius = self._check_request(x, 0, protected, epsilon)
        st = self.settings
        analysis = analyse_input(x, self.train_X, self.labels, self.flippable, self.direction, st.ks,
                                 self.k_default, st.n_classes, protected, radius, self.before, self.after,
                                 self._column_values(protected))
        per_k = analysis.min_flips_per_k()
        k0 = self.base.k0_index
        cap = int(max_flips) if max_flips is not None else len(self.labels)
        # exact joint check over every enumerable budget: the smallest unsafe flip set ends the scan
        # (there K0's own vote is no ceiling: the flips that change it may also move K away from K0)
        exact_budget = self.ksets.exact_budget_for(cap)
        unsafe, _, _ = self._exact_check(analysis, exact_budget)
        if unsafe.size:
            return int(self.ksets.exact.sizes[unsafe[0]]) - 1
        if exact_budget >= cap:
            return cap
        # bounds beyond: K0 stays possible, so its vote bounds n
        ceiling = int(min(per_k[k0] - 1, cap))
        if ceiling <= exact_budget:
            return exact_budget
        min_sel = self.ksets.min_select(ceiling + 1)
        answer = ceiling
        for a in range(len(st.k_candidates)):
            if a != k0:
                answer = min(answer, int(max(min_sel[a], per_k[a])) - 1)
        answer = max(answer, exact_budget)
        while answer < ceiling:
            n = answer + 1
            possible = self.ksets.selectable(n)
            if any(possible[a] and per_k[a] <= n and self._jointly_possible(analysis, a, n) for a in range(len(st.k_candidates))):
                break
            answer = n
        return answer

    def certify_many(self, test_X, flips: int, *, protected: Sequence[int] = (), epsilon: dict[int, float] | None = None,
                     falsify: bool = True, shared_budget: bool = True, falsify_seconds: float = 5.0, workers: int | None = 1,
                     progress: bool | Callable[[int], None] = False, description: str = "certifying") -> list[Certificate]:
        """:meth:`certify` for every row of ``test_X``; with ``workers != 1`` fanned out through :func:`assay.run.run_tasks`."""
        test_X = np.asarray(test_X, dtype=np.float64)
        if test_X.ndim != 2:
            raise DataError(f"{OWNER}: test_X must be a 2-D array (rows × features); got shape {test_X.shape}")
        options = dict(protected=tuple(protected), epsilon=epsilon, falsify=falsify, shared_budget=shared_budget,
                       falsify_seconds=falsify_seconds)
        if len(test_X) == 0:
            return []
        if isinstance(flips, (int, np.integer)) and not isinstance(flips, bool) and flips >= 0:
            self.prepare(int(flips))  # the shared cross-validation analysis, once, before any input
        if workers == 1:
            out = []
            for i, row in enumerate(test_X):
                out.append(self.certify(row, flips, **options))
                if callable(progress):
                    progress(i + 1)
            return out
        from assay.run import run_tasks  # imported only when fanning out

        self.certify(test_X[0], flips, **options)  # validates the request before fanning out
        chunks = np.array_split(np.arange(len(test_X)), max(1, min(len(test_X), 4 * (workers or 4))))
        items = [(self, test_X[idx], flips, options) for idx in chunks if idx.size]
        results = run_tasks(_certify_chunk, items, workers=workers, progress=bool(progress), description=description)
        return [cert for chunk in results for cert in chunk]


def warm_up() -> None:
    """Compile (or load from numba's cache) every kernel on a tiny problem, so that timings exclude JIT."""
    rng = np.random.default_rng(0)
    X = rng.integers(0, 3, size=(40, 3)).astype(np.float64)
    y = (X[:, 1] + rng.normal(0, 0.5, 40) > 1).astype(np.int64)
    y3 = rng.integers(0, 3, 40)
    for labels in (y, y3):
        for limit in (2e8, 0.0):
            certifier = KnnFairnessCertifier(X, labels, k_candidates=[3, 5], folds=4, enumeration_limit=limit)
            for x in X[:3] + 0.2:
                certifier.certify(x, 1, protected=[0], epsilon={1: 0.3})
                certifier.certify(x, 2)
            certifier.falsifier.cv_after([([0], [int(1 - labels[0]) if labels[0] < 2 else 0])])
    KnnFairnessCertifier(X, y, k_candidates=[3, 5], folds=4, direction=(1, 0), flippable=np.arange(40) % 2 == 0).certify(X[0], 1)


def _certify_chunk(item) -> list[Certificate]:
    certifier, rows, flips, options = item
    return [certifier.certify(row, flips, **options) for row in rows]


def _check_column(column, n_features: int, option: str) -> int:
    if isinstance(column, bool) or not isinstance(column, (int, np.integer)) or not 0 <= int(column) < n_features:
        raise OptionError(f"the `{option}` option names column {column!r}, but the features are columns 0..{n_features - 1}")
    return int(column)
