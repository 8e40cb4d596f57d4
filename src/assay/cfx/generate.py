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
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from assay._validate import check_choice
from assay.cfx.apas import apas_test, sample_size
from assay.cfx.features import FeatureTypes
from assay.cfx.milp import Counterfactual, counterfactual, default_target
from assay.cfx.robustness import delta_robust, layer_deltas
from assay.errors import OptionError

__all__ = ["RobustCounterfactual", "robust_counterfactual"]


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
        candidates: how many candidates were tested.
        confidence: 1.0 for the exact test (a proof); for APΔS ``1 − candidates·Rⁿ``.
        guarantee: the statement, in words.
        seconds: wall time.
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

    @property
    def x_cf(self):
        return self.counterfactual.x_cf

    def to_json(self) -> dict:
        return {"counterfactual": self.counterfactual.to_json(), "robust": self.robust, "test": self.test,
                "deltas": list(self.deltas), "margin": self.margin, "candidates": self.candidates,
                "confidence": self.confidence, "guarantee": self.guarantee, "seconds": self.seconds}


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
) -> RobustCounterfactual:
    """Algorithm 2 with the exact (MILP-R) or the APΔS test (module docstring).

    Args:
        network, x, features, target, distance: as for :func:`assay.cfx.counterfactual`.
        delta: δ for every weight and bias (or per Linear layer, see :func:`assay.cfx.delta_robust`).
        test: ``"exact"`` (default, MILP-R) or ``"apas"``.
        initial_margin, margin_step, max_margin: the margin schedule (paper: 0.01, +0.2, ≤ 20).
        R, alpha: APΔS's parameters (paper: 0.995, 0.999).
        rng: APΔS's sampler (default: a fresh, unseeded generator).
        time_limit: seconds per MILP solve (None: no limit).
    """
    started = time.perf_counter()
    check_choice(test, "test", "robust_counterfactual", ("exact", "apas"))
    if not (0 <= initial_margin <= max_margin) or margin_step <= 0:
        raise OptionError("robust_counterfactual needs 0 ≤ initial_margin ≤ max_margin and margin_step > 0; got "
                          f"{initial_margin}, {margin_step}, {max_margin}")
    deltas = layer_deltas(network, delta)
    if target is None:
        target = default_target(network, np.asarray(x, float).reshape(-1))
    rng = rng if rng is not None else np.random.default_rng()
    n = sample_size(R, alpha)
    margin, tested, candidate = float(initial_margin), 0, None
    cache: dict = {}  # every candidate is solved over the same feature box: bound it once
    while margin <= max_margin + 1e-12:
        candidate = counterfactual(network, x, distance, features, target, margin, time_limit=time_limit,
                                   bounds_cache=cache)
        if not candidate.found:
            break
        tested += 1
        if test == "exact":
            passed = delta_robust(network, candidate.x_cf, list(deltas), target, time_limit=time_limit).robust
        else:
            if len(set(deltas)) != 1:
                raise OptionError("the APΔS test samples one δ for every layer; give delta as one number")
            passed = apas_test(network, candidate.x_cf, deltas[0], target, R, alpha, rng=rng).passed
        if passed:
            return _result(candidate, True, test, deltas, margin, tested, n, R, alpha, started)
        margin += margin_step
    return _result(candidate, False, test, deltas, margin, tested, n, R, alpha, started)


def _result(candidate, robust, test, deltas, margin, tested, n, R, alpha, started) -> RobustCounterfactual:
    if not candidate.found:
        guarantee = (f"no counterfactual with margin {margin:g}: {candidate.message}" if candidate.status == "infeasible"
                     else f"no counterfactual found ({candidate.status}): {candidate.message}")
        return RobustCounterfactual(candidate, False, test, deltas, float(margin), tested, 0.0, guarantee,
                                    time.perf_counter() - started)
    if test == "exact":
        confidence = 1.0 if robust else 0.0
        guarantee = ("proven: every model within δ classifies x_cf as the target" if robust
                     else "no candidate was proven robust within the margin schedule")
    else:
        confidence = max(0.0, 1.0 - tested * R ** n) if robust else 0.0
        guarantee = (f"with confidence ≥ {confidence:.6g} (union bound over {tested} candidate(s) tested, "
                     f"each once on a fresh sample of {n}), at least {R:.4%} of the δ-box keeps x_cf valid"
                     if robust else "no candidate passed the APΔS test within the margin schedule")
    return RobustCounterfactual(candidate, robust, test, deltas, float(margin), tested, confidence, guarantee,
                                time.perf_counter() - started)
