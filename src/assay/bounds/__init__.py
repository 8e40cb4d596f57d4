"""Sound bound propagation shared by every analysis: IBP, CROWN, α-CROWN, β-CROWN, interval weights.

The front door is :func:`compute_bounds`. Analyses that need the engine's steps or its shared
walks use the public functions exported here, never the modules' private names:

* the lowered network: :func:`plan_for` → :class:`Plan` (affine and ReLU stages);
* the steps: :func:`interval_pass` (IBP), :func:`relax_relu`, :func:`backsubstitute` and
  :func:`concretize` (CROWN), :func:`optimize_bounds` (α/β-CROWN);
* the shared walks (:mod:`assay.bounds.walks`): :func:`gradient_bounds`, :func:`affine_forms`,
  :func:`pattern_lower_bound`.
"""

from assay.bounds.api import METHODS, compute_bounds
from assay.bounds.crown import backsubstitute, concretize
from assay.bounds.ibp import center_radius, interval_pass
from assay.bounds.optimize import optimize_bounds
from assay.bounds.options import AlphaCrownOptions, BetaCrownOptions
from assay.bounds.plan import Plan, plan_for
from assay.bounds.relaxation import relax_relu
from assay.bounds.result import BoundsResult, IntermediateBounds, LinearBounds
from assay.bounds.walks import GradientBounds, affine_forms, gradient_bounds, pattern_lower_bound

__all__ = [
    "compute_bounds",
    "METHODS",
    "BoundsResult",
    "LinearBounds",
    "IntermediateBounds",
    "AlphaCrownOptions",
    "BetaCrownOptions",
    "Plan",
    "plan_for",
    "interval_pass",
    "center_radius",
    "relax_relu",
    "backsubstitute",
    "concretize",
    "optimize_bounds",
    "GradientBounds",
    "gradient_bounds",
    "affine_forms",
    "pattern_lower_bound",
]
