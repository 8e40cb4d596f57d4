"""Sound bound propagation shared by every analysis: IBP, CROWN, α-CROWN, β-CROWN, interval weights.

The front door is :func:`compute_bounds`. Analyses that need the engine's steps or its shared
walks use the public functions exported here, never the modules' private names:

* the methods: :data:`METHODS`, the registry of :class:`BoundMethod` (name, options, ReLU
  relaxation), which every method list of assay reads;
* the lowered network: :func:`plan_for` → :class:`Plan` (its stages, :mod:`assay.bounds.stages`,
  each built by its layer's registered rule, :mod:`assay.bounds.rules`);
* the steps: :func:`interval_pass` (IBP), :func:`relax_relu`, :func:`backsubstitute` and
  :func:`concretize` (CROWN), :func:`optimize_bounds` (α/β-CROWN);
* the shared walks (:mod:`assay.bounds.walks`): :func:`gradient_bounds`, :func:`lipschitz_bounds`,
  :func:`input_sensitivities`, :func:`affine_forms`, :func:`pattern_lower_bound`;
* :func:`relu_coefficients`: the weight of every ReLU input in CROWN's bound of the rows,
  and :func:`split_child_bounds`: CROWN's bounds of a domain's split children (branching heuristics);
  :func:`split_candidates`: the general split's scores of every splittable operator input.

Names are loaded on first use: the method registry (:mod:`assay.bounds.methods`) can be read
without loading torch.
"""

from __future__ import annotations

from assay._lazy import lazy_names

__all__ = [
    "compute_bounds",
    "METHODS",
    "BoundMethod",
    "bound_method",
    "method_names",
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
    "intermediate_method_for",
    "backsubstitute",
    "concretize",
    "optimize_bounds",
    "GradientBounds",
    "gradient_bounds",
    "lipschitz_bounds",
    "input_sensitivities",
    "affine_forms",
    "pattern_lower_bound",
    "ReluCoefficients",
    "relu_coefficients",
    "split_child_bounds",
    "SplitCandidates",
    "split_candidates",
]

_HOMES = {
    "compute_bounds": "assay.bounds.api",
    "METHODS": "assay.bounds.methods",
    "BoundMethod": "assay.bounds.methods",
    "bound_method": "assay.bounds.methods",
    "method_names": "assay.bounds.methods",
    "BoundsResult": "assay.bounds.result",
    "LinearBounds": "assay.bounds.result",
    "IntermediateBounds": "assay.bounds.result",
    "AlphaCrownOptions": "assay.bounds.options",
    "BetaCrownOptions": "assay.bounds.options",
    "Plan": "assay.bounds.plan",
    "plan_for": "assay.bounds.plan",
    "interval_pass": "assay.bounds.ibp",
    "center_radius": "assay.bounds.ibp",
    "relax_relu": "assay.bounds.relaxation",
    "intermediate_method_for": "assay.bounds.forward",
    "backsubstitute": "assay.bounds.crown",
    "concretize": "assay.bounds.crown",
    "optimize_bounds": "assay.bounds.optimize",
    "GradientBounds": "assay.bounds.walks",
    "gradient_bounds": "assay.bounds.walks",
    "lipschitz_bounds": "assay.bounds.walks",
    "input_sensitivities": "assay.bounds.walks",
    "affine_forms": "assay.bounds.walks",
    "pattern_lower_bound": "assay.bounds.walks",
    "ReluCoefficients": "assay.bounds.coefficient_walk",
    "relu_coefficients": "assay.bounds.coefficient_walk",
    "split_child_bounds": "assay.bounds.split_estimates",
    "SplitCandidates": "assay.bounds.branching",
    "split_candidates": "assay.bounds.branching",
}


__getattr__, __dir__ = lazy_names(__name__, _HOMES)
