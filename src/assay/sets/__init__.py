"""Input sets (boxes, polytopes, image patches), output specifications and VNN-LIB files.

* :class:`Box`, :class:`HPolytope` and the patch regions (:func:`patch_region`, :func:`mask_region`,
  :func:`all_patch_regions`) are input sets, stored in float64.
* :class:`OutputSpec` is a region of outputs: an OR of :class:`HalfSpaces` conjunctions of rows
  ``C y + d ≥ 0``; the builders (:func:`argmax_is`, :func:`any_of`, …) make the common ones.
* :func:`read_vnnlib` returns COUNTEREXAMPLE queries: a :class:`VnnlibProperty` holds iff no
  :class:`CounterexampleQuery` has an input in its ``input_set`` whose output lies in its
  ``unsafe_outputs``.
"""

from assay.sets.box import Box
from assay.sets.patch import all_patch_regions, mask_region, patch_region, sunbeam_region
from assay.sets.polytope import HPolytope
from assay.sets.spec import (
    HalfSpaces,
    OutputSpec,
    all_of,
    any_of,
    argmax_is,
    negation_closure,
    output_at_least,
    targeted_robustness,
    untargeted_robustness,
)
from assay.sets.vnnlib import CounterexampleQuery, VnnlibProperty, read_vnnlib, write_vnnlib

__all__ = [
    "Box",
    "HPolytope",
    "patch_region",
    "mask_region",
    "all_patch_regions",
    "sunbeam_region",
    "HalfSpaces",
    "OutputSpec",
    "argmax_is",
    "output_at_least",
    "untargeted_robustness",
    "targeted_robustness",
    "any_of",
    "all_of",
    "negation_closure",
    "read_vnnlib",
    "write_vnnlib",
    "VnnlibProperty",
    "CounterexampleQuery",
]
