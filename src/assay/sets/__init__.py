"""Input sets (boxes, polytopes, image patches), output specifications and VNN-LIB files."""

from assay.sets.box import Box
from assay.sets.patch import all_patch_regions, mask_region, patch_region
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
    "Box", "HPolytope", "patch_region", "mask_region", "all_patch_regions", "HalfSpaces", "OutputSpec", "argmax_is",
    "output_at_least", "untargeted_robustness", "targeted_robustness", "any_of", "all_of", "negation_closure",
    "read_vnnlib", "write_vnnlib", "VnnlibProperty", "CounterexampleQuery",
]
