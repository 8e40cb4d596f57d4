"""Robust counterfactual explanations: MILP counterfactuals, exact and probabilistic Δ-robustness.

A counterfactual explanation tells a rejected applicant what to change to be accepted. Will that
advice stay valid when the lender retrains the model and every weight moves by up to δ?

* :func:`counterfactual`: the nearest valid counterfactual by MILP (or a fast gradient search),
  respecting :class:`FeatureTypes` (continuous, one-hot, ordinal, immutable, bounds).
* :func:`delta_robust`: exact Δ-robustness (interval-weight bounds first, then an exact MILP whose
  refutations come with a shifted model re-checked by a forward pass); :func:`max_certified_delta`.
* :func:`apas` / :func:`apas_test`: APΔS (Marzari, Leofante et al., ECAI 2024), the largest δ at
  which, with confidence α, a fraction ≥ R of uniformly shifted models keep the counterfactual valid.
* :func:`robust_counterfactual`: the paper's Algorithm 2 with the exact test (MILP-R) or APΔS;
  :func:`nearest_robust_counterfactual`: the nearest Δ-robust counterfactual of a one-hidden-layer
  network by one MILP.
* :mod:`assay.cfx.data`: the four data sets and models of the paper's Table 1.
"""

from assay.cfx.apas import ApasResult, ApasTest, apas, apas_test, sample_size
from assay.cfx.features import FeatureTypes
from assay.cfx.generate import RobustCounterfactual, robust_counterfactual
from assay.cfx.milp import Counterfactual, counterfactual
from assay.cfx.robust_milp import nearest_robust_counterfactual
from assay.cfx.robustness import DeltaRobustness, MaxDelta, delta_robust, max_certified_delta, shifted_network

__all__ = [
    "FeatureTypes",
    "Counterfactual",
    "counterfactual",
    "DeltaRobustness",
    "MaxDelta",
    "delta_robust",
    "max_certified_delta",
    "shifted_network",
    "ApasResult",
    "ApasTest",
    "apas",
    "apas_test",
    "sample_size",
    "RobustCounterfactual",
    "robust_counterfactual",
    "nearest_robust_counterfactual",
]
