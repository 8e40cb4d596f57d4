"""Complete verification: branch and bound on assay.bounds, with re-checked counterexamples."""

from assay.verify.api import verify, verify_vnnlib
from assay.verify.result import Counterexample, VerificationResult, VerificationStatus

__all__ = ["verify", "verify_vnnlib", "VerificationResult", "VerificationStatus", "Counterexample"]
