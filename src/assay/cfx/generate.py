"""Robust counterfactuals: the paper's Algorithm 2 (grow the margin until the robustness test passes).

:func:`robust_counterfactual` computes the nearest counterfactual with target margin m (by MILP,
:func:`assay.cfx.counterfactual`), tests it for robustness at δ, and if it fails asks for a larger
margin, m ← m + step, until a candidate passes or m exceeds ``max_margin`` (published robust-CE
settings: m starts at 0.01 and grows by 0.2 up to 20). Two tests:

* ``test="exact"``: :func:`assay.cfx.delta_robust` (interval-weight bounds, then the exact MILP).
  This is **MILP-R**, the exact baseline: a returned counterfactual is *proven* Δ-robust.
* ``test="apas"``: :func:`assay.cfx.apas_test` with (R, α). Each candidate is a different point
  tested once on its own fresh sample, but the loop stops at the first pass, so the statement
  for the returned candidate is a **union bound over the candidates tested**: with confidence
  ≥ 1 − k·Rⁿ (k candidates tested), at least a fraction R of the δ-box keeps it valid. The result
  states k and that confidence.

A step whose candidate is a point already tested keeps that test's verdict: the same point is never
tested twice (re-testing it on a fresh sample until it passes would void APΔS's guarantee).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace

import numpy as np

from assay._validate import check_choice
from assay.cfx._model import row_margins, target_rows
from assay.cfx.apas import apas_test, sample_size
from assay.cfx.features import FeatureTypes
from assay.cfx.milp import MIN_MARGIN, Counterfactual, counterfactual, default_target
from assay.cfx.robustness import delta_robust, layer_deltas
from assay.errors import OptionError, UnsupportedError

__all__ = ["RobustCounterfactual", "robust_counterfactual"]

# Two candidates closer than this in every variable are one point (one robustness test between them).
SAME_POINT = 1e-9


@dataclass(frozen=True)
class RobustCounterfactual:
    """The outcome of Algorithm 2.

    Attributes:
        counterfactual: the last candidate (the robust one when ``robust``); None-valued
            ``x_cf`` when no candidate was found at all.
        robust: the returned candidate passed the test.
        test: ``"exact"`` or ``"apas"``.
        deltas: δ per Linear layer.
        margin: the margin of the returned candidate.
        candidates: how many margin steps were decided before the answer: the paper's count of
            candidates (with ``search="skip"`` some were proven to fail without being tested).
        confidence: 1.0 for the exact test (a proof); for APΔS ``1 − tested·Rⁿ``.
        guarantee: the statement, in words.
        seconds: wall time.
        tested: how many candidates ran the robustness test (≤ ``candidates``).
        solves: how many candidate MILPs were solved.
    """

    counterfactual: Counterfactual
    robust: bool
    test: str
    deltas: tuple[float, ...]
    margin: float
    candidates: int
    confidence: float
    guarantee: str
    seconds: float
    tested: int = 1
    solves: int = 1

    @property
    def x_cf(self):
        return self.counterfactual.x_cf

    def to_json(self) -> dict:
        return {"counterfactual": self.counterfactual.to_json(), "robust": self.robust, "test": self.test,
                "deltas": list(self.deltas), "margin": self.margin, "candidates": self.candidates,
                "confidence": self.confidence, "guarantee": self.guarantee, "seconds": self.seconds,
                "tested": self.tested, "solves": self.solves}


def robust_counterfactual(
    network,
    x,
    delta,
    *,
    test: str = "exact",
    features: FeatureTypes | None = None,
    target: int | None = None,
    distance: str = "l1",
    initial_margin: float = 0.01,
    margin_step: float = 0.2,
    max_margin: float = 20.0,
    R: float = 0.995,
    alpha: float = 0.999,
    rng: np.random.Generator | None = None,
    time_limit: float | None = None,
    search: str = "skip",
    samples: int | None = None,
) -> RobustCounterfactual:
    """Algorithm 2 with the exact (MILP-R) or the APΔS test (module docstring).

    Args:
        network, x, features, target, distance: as for :func:`assay.cfx.counterfactual`.
        delta: δ for every weight and bias (or per Linear layer, see :func:`assay.cfx.delta_robust`).
        test: ``"exact"`` (default, MILP-R) or ``"apas"``.
        initial_margin, margin_step, max_margin: the margin schedule (paper: 0.01, +0.2, ≤ 20).
        R, alpha: APΔS's parameters (paper: 0.995, 0.999).
        rng: APΔS's sampler (default: a fresh, unseeded generator).
        samples: the APΔS test's sample size n (default None: n = ⌈log(1 − α) / log R⌉, 1379 for the
            paper's R and α). A larger n only strengthens the statement (confidence 1 − k·Rⁿ). The
            published generation runs (APΔS repository, ``exp_sec7/util_scripts/utilexp.py``,
            ``run_ours_one_delta_robust``) call their sampler with its default of 10000 models per
            candidate; ``samples=10000`` reproduces that test.
        time_limit: seconds per MILP solve (None: no limit).
        search: ``"skip"`` (default) or ``"steps"``. ``"steps"`` is the paper's loop: every margin
            step is solved by the plain MILP (``tighten=False``) and tested in turn. ``"skip"``
            returns the same first passing step with less work: (1) with the exact test on
            one-hidden-layer networks over non-negative features it proves most failing steps
            without solving them (:func:`_skip_prefix`); (2) a step whose margin an earlier step's
            point already meets has that point as its optimum, so no MILP is solved for it (and it
            keeps that point's verdict); (3) each MILP is restricted to the ball a cheap valid point
            proves (``tighten=True``, its greedy search started from the previous candidate). The
            answer is the paper's up to ties between equally near points (the solver may pick
            another of them, and (2) picks the earlier one) and, with a ``time_limit``, up to the
            steps whose solve the paper's loop would have cut short.
    """
    started = time.perf_counter()
    check_choice(test, "test", "robust_counterfactual", ("exact", "apas"))
    check_choice(search, "search", "robust_counterfactual", ("skip", "steps"))
    if not (0 <= initial_margin <= max_margin) or margin_step <= 0:
        raise OptionError("robust_counterfactual needs 0 ≤ initial_margin ≤ max_margin and margin_step > 0; got "
                          f"{initial_margin}, {margin_step}, {max_margin}")
    deltas = layer_deltas(network, delta)
    if test == "apas" and len(set(deltas)) != 1:
        raise OptionError("the APΔS test samples one δ for every layer; give delta as one number")
    if target is None:
        target = default_target(network, np.asarray(x, float).reshape(-1))
    rng = rng if rng is not None else np.random.default_rng()
    n = sample_size(R, alpha)
    if samples is not None:
        if isinstance(samples, bool) or not isinstance(samples, (int, np.integer)) or samples < 1:
            raise OptionError(f"the `samples` option of robust_counterfactual must be an int ≥ 1 (the APΔS test's "
                              f"sample size); got {samples!r}")
        n = int(samples)
    # The paper's schedule, accumulated exactly as its loop does (m ← m + step), plus the margin
    # after the last step (what an exhausted schedule reports).
    margins = [float(initial_margin)]
    while margins[-1] + margin_step <= max_margin + 1e-12:
        margins.append(margins[-1] + margin_step)
    exhausted = margins[-1] + margin_step
    cache: dict = {}  # every candidate is solved over the same feature box: bound it once
    solved: dict[int, Counterfactual] = {}
    fast = search == "skip"
    solves = 0

    def candidate(k: int) -> Counterfactual:
        nonlocal solves
        if k in solved:
            return solved[k]
        if fast:  # an earlier step's point that already has this step's margin is this step's optimum
            earlier = _reusable(solved, k, max(margins[k], MIN_MARGIN))
            if earlier is not None:
                solved[k] = replace(earlier, margin=float(margins[k]))
                return solved[k]
        hint = solved[max(j for j in solved if j < k)].x_cf if fast and any(j < k for j in solved) else None
        solves += 1
        solved[k] = counterfactual(network, x, distance, features, target, margins[k], time_limit=time_limit,
                                   bounds_cache=cache, start=hint, tighten=fast)
        return solved[k]

    fails_by_distance = _never
    start = 0
    if test == "exact" and fast:
        fails_by_distance, start = _skip_prefix(network, x, deltas, features, target, distance, time_limit, margins,
                                                candidate)
    # One test per distinct point: a step that returns a point already tested (to within SAME_POINT,
    # e.g. the solver's rounding noise) has that test's result (for APΔS, re-testing the same point
    # on a fresh sample would void the guarantee). Only failures are ever reused: the loop stops at a pass.
    verdicts: list[tuple[np.ndarray, bool]] = []
    tested = skipped = 0
    last = None
    for k in range(start, len(margins)):
        last = candidate(k)
        if not last.found:
            return _result(last, False, test, deltas, margins[k], k, tested, solves, n, R, alpha,
                           started)
        if fails_by_distance(last):  # proven not Δ-robust without the test (see _skip_prefix)
            skipped += 1
            continue
        passed = next((verdict for point, verdict in verdicts if np.abs(point - last.x_cf).max() <= SAME_POINT), None)
        if passed is None:
            tested += 1
            if test == "exact":
                passed = delta_robust(network, last.x_cf, list(deltas), target, time_limit=time_limit).robust
            else:
                passed = apas_test(network, last.x_cf, deltas[0], target, R, alpha, rng=rng, samples=n).passed
            verdicts.append((last.x_cf, passed))
        if passed:
            return _result(last, True, test, deltas, margins[k], k + 1, tested, solves, n, R, alpha,
                           started)
    if last is None:  # the whole schedule was proven to fail: report its last candidate, as the loop would
        last = candidate(len(margins) - 1)
    return _result(last, False, test, deltas, exhausted, len(margins), tested, solves, n, R, alpha, started)


def _reusable(solved: dict, k: int, required: float):
    """A candidate solved at an earlier step whose point has every target row ≥ ``required`` (a forward
    pass): step k's feasible set is a subset of that step's and contains the point, so the point is
    step k's optimum too (with the same solver guarantee). None if there is none."""
    for j in sorted((j for j in solved if j < k), reverse=True):
        cf = solved[j]
        if cf.found and cf.optimal and cf.achieved_margin >= required:
            return cf
    return None


def _never(candidate) -> bool:
    return False


def _skip_prefix(network, x, deltas, features, target, distance, time_limit, margins, candidate):
    """The margin steps Algorithm 2 would test in vain, proven without testing them (``search="skip"``).

    Let L be a proven lower bound on the distance of every Δ-robust counterfactual (the robust MILP
    with the weakest requirement, :func:`assay.cfx.robust_milp.robust_distance_bound`; one hidden
    layer only). A candidate nearer than L cannot pass the exact test. The candidate's distance
    d_k never decreases along the schedule (each step only shrinks the feasible set), so the steps
    with d_k < L form a prefix of the schedule, found with few candidate solves: the last step at
    or below the robust point's own margin usually ends it, which a point on the segment from x to
    the robust point proves without any solve (:func:`_nearer_than`); otherwise a galloping search
    (down from that step, or up from the first when no robust point exists).
    A small slack covers the solver's absolute gap (1e-6), so a skipped step is always one the
    paper's loop would have tested and rejected.

    Returns ``(fails_by_distance, start)``: the predicate "this candidate is nearer than L" (also
    applied to later candidates, which saves their test) and the first step left to test. Where the
    bound does not apply, nothing is skipped.
    """
    from assay.cfx.robust_milp import robust_distance_bound  # robust_milp builds on this module

    features = features if features is not None else FeatureTypes.continuous(network.input_size)
    try:
        point = features.check_input(x, "the input to explain")
        bound, nearest = robust_distance_bound(network, point, deltas, features, target, distance, time_limit)
    except UnsupportedError:
        return _never, 0
    if not bound > 0:
        return _never, 0
    # The slack: an unsolved step j < k would give d_j ≤ opt_j + gap ≤ d_k + gap, with HiGHS's absolute
    # gap 1e-6 (the relative gap is 0); keep twice that, plus a relative 1e-5 for rounding.
    limit = bound * (1.0 - 1e-5) - 2e-6 if np.isfinite(bound) else np.inf

    def fails(cf) -> bool:
        return cf.found and cf.optimal and cf.distance < limit

    def below(k: int) -> bool:
        return fails(candidate(k))

    last = len(margins) - 1
    hint = last
    if nearest is not None:  # the robust point is feasible for every margin up to its own
        C = target_rows(network, target)
        reached = float(row_margins(network, nearest, C)[0])
        hint = max((k for k, m in enumerate(margins) if m <= reached), default=-1)
        if hint >= 0 and _nearer_than(network, point, nearest, features, C, max(margins[hint], MIN_MARGIN), distance,
                                      limit):
            return fails, hint + 1
    if hint < 0 or not below(0):
        return fails, 0
    if nearest is None:  # no robust point (or none found in time): gallop up from the start
        good, bad, step = 0, last + 1, 1
        while good + step < bad:
            if not below(good + step):
                bad = good + step
                break
            good, step = good + step, 2 * step
    else:  # the prefix usually ends at the hint: gallop down from it
        if below(hint):
            return fails, hint + 1
        good, bad, step = 0, hint, 1
        while bad - step > good:
            if below(bad - step):
                good = bad - step
                break
            bad, step = bad - step, 2 * step
    while bad - good > 1:  # below(good) holds, below(bad) fails (bad = last + 1: past the schedule)
        mid = (good + bad) // 2
        if below(mid):
            good = mid
        else:
            bad = mid
    return fails, good + 1


def _nearer_than(network, x, robust_point, features, C, required, distance, limit, steps: int = 64) -> bool:
    """Is there a valid input with every target row ≥ ``required`` nearer to ``x`` than ``limit``?

    Tried along the segment from x to the robust point: its bits (one-hot, thermometer) taken as
    they are, its continuous variables moved a fraction t of the way (a convex combination keeps
    the bounds and the immutable values). Each point is checked by a forward pass; a point found
    bounds the distance of the nearest candidate with that margin from above (with the solver's
    absolute gap, 1e-6, as slack), which is all :func:`_skip_prefix` needs."""
    bits = np.array([features.is_binary(i) for i in range(features.size)], dtype=bool)
    base = np.where(bits, robust_point, x)
    direction = robust_point - base
    t = np.linspace(0.0, 1.0, steps + 1)[1:]
    points = base[None, :] + t[:, None] * direction[None, :]
    ok = row_margins(network, points, C) >= required
    for point in points[ok]:
        if not features.violations(point, x) and features.distance(x, point, distance) * (1 + 2e-6) + 2e-6 < limit:
            return True
    return False


def _result(candidate, robust, test, deltas, margin, candidates, tested, solves, n, R, alpha,
            started) -> RobustCounterfactual:
    if not candidate.found:
        guarantee = (f"no counterfactual with margin {margin:g}: {candidate.message}" if candidate.status == "infeasible"
                     else f"no counterfactual found ({candidate.status}): {candidate.message}")
        return RobustCounterfactual(candidate, False, test, deltas, float(margin), candidates, 0.0, guarantee,
                                    time.perf_counter() - started, tested, solves)
    if test == "exact":
        confidence = 1.0 if robust else 0.0
        guarantee = ("proven: every model within δ classifies x_cf as the target" if robust
                     else "no candidate was proven robust within the margin schedule")
    else:
        confidence = max(0.0, 1.0 - tested * R ** n) if robust else 0.0
        guarantee = (f"with confidence ≥ {confidence:.6g} (union bound over {tested} candidate(s) tested, "
                     f"each once on a fresh sample of {n}), at least {R:.4%} of the δ-box keeps x_cf valid"
                     if robust else "no candidate passed the APΔS test within the margin schedule")
    return RobustCounterfactual(candidate, robust, test, deltas, float(margin), candidates, confidence, guarantee,
                                time.perf_counter() - started, tested, solves)
