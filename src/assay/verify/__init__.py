"""Complete verification: branch and bound on assay.bounds, with re-checked counterexamples.

Names are loaded on first use, so that light modules of this package (``assay.verify.options``,
read by the command line for its defaults) do not pull in torch.
"""

from __future__ import annotations

import importlib

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


def __getattr__(name: str):
    if name in _HOMES:
        value = getattr(importlib.import_module(_HOMES[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'assay.verify' has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(__all__))
