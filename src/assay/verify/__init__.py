"""Complete verification: branch and bound on assay.bounds, with re-checked counterexamples.

Names are loaded on first use, so that light modules of this package (``assay.verify.options``,
read by the command line for its defaults) do not pull in torch.
"""

from __future__ import annotations

from assay._lazy import lazy_names

__all__ = ["verify", "verify_vnnlib", "VerifyOptions", "VerificationResult", "VerificationStatus", "VerificationStats",
           "Counterexample"]

_HOMES = {
    "verify": "assay.verify.api",
    "verify_vnnlib": "assay.verify.api",
    "VerifyOptions": "assay.verify.options",
    "VerificationResult": "assay.verify.result",
    "VerificationStatus": "assay.verify.result",
    "VerificationStats": "assay.verify.result",
    "Counterexample": "assay.verify.result",
}


__getattr__, __dir__ = lazy_names(__name__, _HOMES)
