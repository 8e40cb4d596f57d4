"""Online verification: re-check a property at every step of a changing domain or network.

See :mod:`assay.verify.online.verifier` for the accelerations and their soundness arguments.
"""

from assay.verify.online.verifier import ACCELERATIONS, OnlineOptions, OnlineStep, OnlineVerifier

__all__ = ["ACCELERATIONS", "OnlineOptions", "OnlineStep", "OnlineVerifier"]
