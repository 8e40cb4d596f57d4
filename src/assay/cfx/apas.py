"""APΔS: probabilistic Δ-robustness of a counterfactual (Marzari, Leofante et al., ECAI 2024).

Deciding Δ-robustness exactly is NP-complete. APΔS asks instead: with confidence α, do at least a
fraction R of the models drawn **uniformly** from the δ-box around the weights (every weight and bias
moved by U[−δ, δ], independently) keep ``x_cf`` valid? If all n sampled models keep it valid, a model
from a box where less than a fraction R is valid would have passed with probability < Rⁿ; with
n = ⌈log(1 − α) / log R⌉ (1379 for R = 0.995, α = 0.999; the published code rounds down to 1378)
that is ≤ 1 − α.

**The adaptive search over δ stays honest.** :func:`apas` looks for the largest δ, which tests many
δs; testing each on its own sample and keeping the largest that passed would spend the error budget
once per δ tested. Instead every δ on a *fixed* grid ``δ_1 < … < δ_G`` reuses the same n directions
``u_i ~ U[−1, 1]^P`` (the model θ + δ·u_i is uniform on the δ-box for each δ), and the answer is the
largest ``δ_k`` such that **every** sample is valid at **every** grid point up to ``δ_k``. Let
``g(u)`` be the last grid point up to which direction u stays valid (its first failure minus one);
the answer is ``min_i g(u_i)``, the minimum of n independent copies of g. Let ``δ_R`` be the largest
grid point with ``P(g(u) ≥ δ_R) ≥ R``. The answer exceeds ``δ_R`` only if all n copies of g do,
which has probability ``P(g > δ_R)ⁿ ≤ Rⁿ ≤ 1 − α``. And at any grid point δ ≤ δ_R, the fraction of
the δ-box keeping ``x_cf`` valid is ≥ ``P(g(u) ≥ δ) ≥ R`` (a direction that stays valid up to δ is
valid at δ). Hence: **with probability ≥ 1 − Rⁿ ≥ α over the sampling, at least a fraction R of
the models in the box of the returned δ keep x_cf valid** — one test's confidence, however many grid
points were looked at. The grid's resolution (``delta_max / steps``) is the search's precision.

Re-testing the same counterfactual on fresh samples until it passes voids this guarantee (a
published re-implementation does so); :func:`apas_test` draws one sample per call, and callers that
test several candidates state a union bound (see :func:`assay.cfx.robust_counterfactual`).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import numpy as np
import torch

from assay.cfx._model import check_mlp, predicted_class, row_margins, target_rows
from assay.errors import DataError, OptionError

__all__ = ["ApasResult", "ApasTest", "apas", "apas_test", "sample_size"]


def sample_size(R: float = 0.995, alpha: float = 0.999) -> int:
    """n = ⌈log(1 − α) / log R⌉: the samples that must all pass for the (R, α) guarantee."""
    if not 0 < R < 1 or not 0 < alpha < 1:
        raise OptionError(f"APΔS needs 0 < R < 1 and 0 < alpha < 1; got R={R}, alpha={alpha}")
    n = math.ceil(math.log(1 - alpha) / math.log(R) - 1e-12)
    return max(n, 1)


@dataclass(frozen=True)
class ApasResult:
    """The largest grid δ at which APΔS's (R, α) guarantee holds for ``x_cf``.

    Attributes:
        delta: the largest grid δ such that every sampled direction keeps ``x_cf`` valid at every
            grid point up to it (0.0 when ``x_cf`` fails at the first grid point).
        first_failure: the first grid δ at which some sampled model invalidated ``x_cf`` (None if
            none did up to ``delta_max``).
        R, alpha, samples: the guarantee's parameters and the sample size n.
        confidence: ``1 − Rⁿ``: the probability that the statement holds (≥ alpha unless a caller's
            ``samples`` is below ⌈log(1 − α) / log R⌉; the guarantee then says so).
        guarantee: the statement, in words.
        grid_step: the search's precision; ``grid_points``: the grid points evaluated.
        seconds: wall time.
    """

    delta: float
    first_failure: float | None
    R: float
    alpha: float
    samples: int
    confidence: float
    guarantee: str
    grid_step: float
    grid_points: int
    seconds: float

    def to_json(self) -> dict:
        return {"delta": self.delta, "first_failure": self.first_failure, "R": self.R, "alpha": self.alpha,
                "samples": self.samples, "confidence": self.confidence, "guarantee": self.guarantee,
                "grid_step": self.grid_step, "grid_points": self.grid_points, "seconds": self.seconds}


@dataclass(frozen=True)
class ApasTest:
    """One APΔS test at a fixed δ: ``passed`` iff all ``samples`` shifted models keep ``x_cf`` valid."""

    passed: bool
    delta: float
    R: float
    alpha: float
    samples: int
    failures: int
    confidence: float
    seconds: float

    def to_json(self) -> dict:
        return {"passed": self.passed, "delta": self.delta, "R": self.R, "alpha": self.alpha, "samples": self.samples,
                "failures": self.failures, "confidence": self.confidence, "seconds": self.seconds}


class _ShiftedModels:
    """n models θ + δ·u_i (u_i uniform in [−1, 1]^P), evaluated at one point for any δ, batched in torch."""

    def __init__(self, network, x, C, samples: int, rng: np.random.Generator, dtype=torch.float64):
        self.affine = [(torch.as_tensor(W, dtype=dtype), torch.as_tensor(b, dtype=dtype))
                       for W, b in check_mlp(network, "apas")]
        self.rows = torch.as_tensor(C, dtype=dtype)
        point = torch.as_tensor(np.asarray(x, float), dtype=dtype)
        self.directions = []
        for W, _ in self.affine:
            u_W = torch.as_tensor(rng.uniform(-1.0, 1.0, size=(samples, *W.shape)), dtype=dtype)
            u_b = torch.as_tensor(rng.uniform(-1.0, 1.0, size=(samples, W.shape[0])), dtype=dtype)
            self.directions.append((u_W, u_b))
        # The first layer sees the fixed point: its pre-activation is linear in δ.
        W, b = self.affine[0]
        u_W, u_b = self.directions[0]
        self.first_center = W @ point + b
        self.first_slope = u_W @ point + u_b

    def margins(self, delta: float) -> torch.Tensor:
        """min over target rows of C f_i(x) for each sampled model i at this δ, shape (n,)."""
        with torch.no_grad():
            h = self.first_center + delta * self.first_slope
            for (W, b), (u_W, u_b) in zip(self.affine[1:], self.directions[1:]):
                h = torch.relu(h)
                h = h @ W.T + b + delta * (torch.bmm(u_W, h.unsqueeze(-1)).squeeze(-1) + u_b)
            return (h @ self.rows.T).min(1).values


def _setup(network, x_cf, target, R, alpha, samples):
    x = np.asarray(x_cf, dtype=np.float64).reshape(-1)
    if x.shape != (network.input_size,) or not np.isfinite(x).all():
        raise DataError(f"x_cf must be {network.input_size} finite values for {network.source}; got shape {x.shape}")
    if target is None:
        target = int(predicted_class(network, x)[0])
    C = target_rows(network, target)
    n = sample_size(R, alpha) if samples is None else int(samples)
    if n < 1:
        raise OptionError(f"samples must be ≥ 1; got {samples}")
    return x, C, n


def apas(
    network,
    x_cf,
    target: int | None = None,
    R: float = 0.995,
    alpha: float = 0.999,
    *,
    delta_max: float = 1.0,
    steps: int = 200,
    rng: np.random.Generator | None = None,
    samples: int | None = None,
    margin: float = 0.0,
) -> ApasResult:
    """The largest δ on the grid ``delta_max·k/steps`` with APΔS's (R, α) guarantee (module docstring).

    Args:
        network: a Linear/ReLU chain over flat inputs.
        x_cf: the counterfactual (encoded).
        target: the class ``x_cf`` must keep (default: the class the network gives it).
        R: the fraction of shifted models that must keep ``x_cf`` valid (paper: 0.995).
        alpha: the confidence (paper: 0.999).
        delta_max, steps: the grid (default 1.0 in 200 steps: precision 0.005).
        rng: the sampler (default: a fresh, unseeded generator).
        samples: override n (for experiments; the confidence is then 1 − Rⁿ for that n).
        margin: a sample counts as valid when every target row is > margin.
    """
    started = time.perf_counter()
    x, C, n = _setup(network, x_cf, target, R, alpha, samples)
    if not (delta_max > 0 and np.isfinite(delta_max)) or int(steps) < 1:
        raise OptionError(f"apas needs delta_max > 0 and steps ≥ 1; got delta_max={delta_max}, steps={steps}")
    rng = rng if rng is not None else np.random.default_rng()
    step = float(delta_max) / int(steps)
    confidence = 1.0 - R ** n
    # With a caller-chosen n the confidence may fall short of α: say so rather than claim α.
    versus = f"≥ {alpha}" if confidence >= alpha else f"below the requested {alpha}: n = {n} is too few"
    statement = (f"with confidence {confidence:.6g} ({versus}), at least {R:.4%} of the models drawn uniformly from the "
                 "δ-box keep x_cf valid (one fixed grid, common samples: a single test's error)")
    if float(row_margins(network, x, C)[0]) <= margin:
        return ApasResult(0.0, 0.0, R, alpha, n, confidence, "x_cf is not valid on the model itself", step, 0,
                          time.perf_counter() - started)
    models = _ShiftedModels(network, x, C, n, rng)
    delta, failure, evaluated = 0.0, None, 0
    for k in range(1, int(steps) + 1):
        candidate = step * k
        evaluated += 1
        if not bool((models.margins(candidate) > margin).all()):
            failure = candidate
            break
        delta = candidate
    return ApasResult(delta, failure, R, alpha, n, confidence, statement, step, evaluated, time.perf_counter() - started)


def apas_test(network, x_cf, delta: float, target: int | None = None, R: float = 0.995, alpha: float = 0.999, *,
              rng: np.random.Generator | None = None, samples: int | None = None, margin: float = 0.0) -> ApasTest:
    """One APΔS test at a fixed δ: draw n models uniformly from the δ-box; pass iff all keep ``x_cf`` valid.

    A pass means: with confidence 1 − Rⁿ (≥ α for the default n), at least a fraction R of the δ-box keeps ``x_cf``
    valid. The guarantee holds for one test of one counterfactual; never call this again on the
    same ``x_cf`` after a failure hoping for a pass.
    """
    started = time.perf_counter()
    x, C, n = _setup(network, x_cf, target, R, alpha, samples)
    if not np.isfinite(delta) or delta < 0:
        raise OptionError(f"delta must be a finite number ≥ 0; got {delta}")
    rng = rng if rng is not None else np.random.default_rng()
    valid = _ShiftedModels(network, x, C, n, rng).margins(float(delta)) > margin
    failures = int((~valid).sum())
    return ApasTest(failures == 0, float(delta), R, alpha, n, failures, 1.0 - R ** n, time.perf_counter() - started)
