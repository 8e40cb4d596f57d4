"""The public surface of assay.sets is pinned: other packages import exactly these names."""

from __future__ import annotations

import inspect

import assay.sets

PUBLIC = {
    "Box", "HPolytope", "patch_region", "mask_region", "all_patch_regions", "sunbeam_region", "HalfSpaces", "OutputSpec",
    "argmax_is",
    "output_at_least", "untargeted_robustness", "targeted_robustness", "any_of", "all_of", "negation_closure",
    "read_vnnlib", "write_vnnlib", "VnnlibProperty", "CounterexampleQuery",
}


def test_all_is_pinned_and_importable():
    assert set(assay.sets.__all__) == PUBLIC and len(assay.sets.__all__) == len(PUBLIC)
    for name in PUBLIC:
        assert getattr(assay.sets, name) is not None


def test_every_public_name_has_a_docstring():
    for name in PUBLIC:
        assert inspect.getdoc(getattr(assay.sets, name)), name


def test_vnnlib_names_carry_the_polarity():
    fields = assay.sets.CounterexampleQuery.__dataclass_fields__
    assert set(fields) == {"input_set", "unsafe_outputs"}
    assert "COUNTEREXAMPLE" in assay.sets.read_vnnlib.__doc__
    assert "HOLDS iff NO query" in assay.sets.VnnlibProperty.__doc__
