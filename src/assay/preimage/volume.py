"""Volume estimates with confidence intervals.

A piece's volume fractions are binomial proportions of uniform samples in its box: each gets an
exact Clopper–Pearson interval. A union of pieces adds its pieces' estimates (a stratified
estimator, one stratum per piece); its interval uses the normal approximation with the
stratified variance, with each proportion shrunk towards 1/2 by one pseudo-sample on each side
(Agresti–Coull style) so that a piece whose samples all agree still contributes variance.
Pieces whose fraction is known exactly (proved inside or empty by sound bounds) contribute
their volume with no variance.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["Estimate", "clopper_pearson", "stratified_sum"]


@dataclass(frozen=True)
class Estimate:
    """A volume: ``value`` with the interval [``low``, ``high``] at ``confidence``."""

    value: float
    low: float
    high: float
    confidence: float

    def to_json(self) -> dict:
        return {"value": self.value, "low": self.low, "high": self.high, "confidence": self.confidence}


def clopper_pearson(successes, trials, confidence: float) -> tuple[np.ndarray, np.ndarray]:
    """Exact two-sided binomial intervals for ``successes`` of ``trials`` (arrays), level ``confidence``."""
    from scipy import stats  # loaded on first use: 0.5–1 s that `assay --help` should not pay

    k = np.asarray(successes, dtype=np.float64)
    n = np.asarray(trials, dtype=np.float64)
    tail = (1.0 - confidence) / 2
    with np.errstate(invalid="ignore", divide="ignore"):
        low = np.where(k > 0, stats.beta.ppf(tail, k, n - k + 1), 0.0)
        high = np.where(k < n, stats.beta.ppf(1 - tail, k + 1, n - k), 1.0)
    return np.nan_to_num(low, nan=0.0), np.nan_to_num(high, nan=1.0)


def stratified_sum(volumes, successes, trials, exact, confidence: float) -> Estimate:
    """Σ volume_j · p̂_j over pieces, with an interval at ``confidence``.

    Args:
        volumes: (J,) box volumes of the pieces.
        successes, trials: (J,) sample counts (``trials`` > 0 where not exact).
        exact: (J,) bool: the piece's fraction is known exactly: ``successes / trials`` is then
            0 or 1 and carries no sampling error.
    """
    from scipy import stats

    v = np.asarray(volumes, dtype=np.float64)
    k = np.asarray(successes, dtype=np.float64)
    n = np.maximum(np.asarray(trials, dtype=np.float64), 1.0)
    exact = np.asarray(exact, dtype=bool)
    p = k / n
    value = float((v * p).sum())
    shrunk = (k + 1.0) / (n + 2.0)
    variance = float(np.where(exact, 0.0, v * v * shrunk * (1 - shrunk) / n).sum())
    z = float(stats.norm.ppf(0.5 + confidence / 2))
    half = z * variance ** 0.5
    return Estimate(value, max(0.0, value - half), value + half, confidence)
