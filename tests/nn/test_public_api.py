"""The public surface of assay.nn is pinned: other packages import exactly these names."""

from __future__ import annotations

import importlib
import inspect

import assay.nn

PUBLIC = {"Network", "Linear", "Conv2d", "ReLU", "AvgPool2d", "Flatten", "Reshape", "Add", "load"}


def test_all_is_pinned_and_importable():
    assert set(assay.nn.__all__) == PUBLIC and len(assay.nn.__all__) == len(PUBLIC)
    for name in PUBLIC:
        assert inspect.getdoc(getattr(assay.nn, name)), name


def test_load_module_names_and_formats():
    module = importlib.import_module("assay.nn.load")  # the attribute assay.nn.load is the function
    assert module.__all__ == ["load", "nnet_input_bounds", "SUPPORTED_FORMATS"]
    assert any(".gz" in entry for entry in module.SUPPORTED_FORMATS)
