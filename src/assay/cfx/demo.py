"""The ``assay demo`` section of cfx: one rejected applicant of a small loan model, explained robustly.

The model is written by hand (no data file, no training): three min-max scaled features (income,
debt, years employed), four ReLU neurons, one logit (> 0: accepted). The section finds the nearest
counterfactual, shows that a δ = 0.05 weight shift can undo it (with the shifted model that does),
finds the MILP-R counterfactual proven for every model within δ, and reports APΔS's largest δ and
the exactly certified one for it.
"""

from __future__ import annotations

import numpy as np

from assay.cfx.apas import apas
from assay.cfx.features import FeatureTypes
from assay.cfx.generate import robust_counterfactual
from assay.cfx.milp import counterfactual
from assay.cfx.robustness import delta_robust, max_certified_delta
from assay.nn import Linear, Network, ReLU

__all__ = ["demo_network", "demo_section"]

NAMES = ("income", "debt", "years_employed")
DELTA = 0.05


def demo_network() -> Network:
    hidden = Linear(np.array([[2.0, -1.0, 0.0], [0.0, 0.0, 1.5], [0.0, 1.0, 0.0], [1.0, 0.0, 1.0]]),
                    np.array([-0.3, -0.5, -0.6, -1.2]))
    out = Linear(np.array([[1.5, 1.0, -2.0, 0.8]]), np.array([-0.6]))
    return Network((hidden, ReLU(), out), (3,), source="demo loan model")


def _change(x, x_cf) -> str:
    moved = [f"{NAMES[i]} {x[i]:.2f}→{x_cf[i]:.2f}" for i in range(len(x)) if abs(x_cf[i] - x[i]) > 1e-9]
    return ", ".join(moved) or "nothing"


def demo_section(progress=None) -> dict:
    """Deterministic, data-free, about a second: a JSON-able summary for the demo printer."""
    network = demo_network()
    features = FeatureTypes(3, names=NAMES)
    x = np.array([0.35, 0.5, 0.2])
    plain = counterfactual(network, x, features=features)
    shift = delta_robust(network, plain.x_cf, DELTA, plain.target)
    robust = robust_counterfactual(network, x, DELTA, features=features)
    probabilistic = apas(network, robust.x_cf, plain.target, rng=np.random.default_rng(0))
    exact = max_certified_delta(network, robust.x_cf, plain.target, tolerance=1e-3)
    return {
        "model": "3 features, 4 ReLU neurons",
        "input": {name: float(v) for name, v in zip(NAMES, x)},
        "delta": DELTA,
        "plain": {"change": _change(x, plain.x_cf), "cost": plain.distance, "robust_after_shift": shift.verdict,
                  "shifted_logit": shift.worst_upper},
        "robust": {"change": _change(x, robust.x_cf), "cost": robust.counterfactual.distance,
                   "candidates": robust.candidates, "proven": robust.robust},
        "apas": {"delta": probabilistic.delta, "confidence": probabilistic.confidence},
        "exact_delta": exact.delta,
    }
