"""Sound bound propagation shared by every analysis: IBP, CROWN, α-CROWN, β-CROWN, interval weights."""

from assay.bounds.api import METHODS, compute_bounds
from assay.bounds.options import AlphaCrownOptions, BetaCrownOptions
from assay.bounds.result import BoundsResult, IntermediateBounds, LinearBounds

__all__ = [
    "compute_bounds",
    "METHODS",
    "BoundsResult",
    "LinearBounds",
    "IntermediateBounds",
    "AlphaCrownOptions",
    "BetaCrownOptions",
]
