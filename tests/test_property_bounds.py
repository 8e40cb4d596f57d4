"""bound_property (what `assay bounds` prints) at its library home, on networks with known ranges."""

from __future__ import annotations

import pytest

import assay.property_bounds
from assay.nn import load
from assay.property_bounds import bound_property
from assay.sets import read_vnnlib
from tests.cli.models import holding_property, violated_property, write_tiny_onnx, write_vnnlib


@pytest.fixture
def network(tmp_path):
    return load(write_tiny_onnx(tmp_path / "tiny.onnx"))


def read(path, network):
    return read_vnnlib(path, num_inputs=network.input_size, num_outputs=network.output_size)


def test_public_names():
    assert assay.property_bounds.__all__ == ["bound_property"]


@pytest.mark.parametrize("method", ["ibp", "crown", "alpha", "beta"])
def test_known_range_and_the_unsafe_check(network, tmp_path, method):
    result = bound_property(network, read(holding_property(tmp_path / "holds.vnnlib"), network), method)
    (query,) = result["queries"]
    # Every ReLU is active over [0, 1]², so y0 ∈ [0, 2] exactly (up to outward rounding).
    assert query["lower"][0] <= 0.0 <= query["upper"][0] and query["lower"][0] == pytest.approx(0.0, abs=1e-9)
    assert query["upper"][0] >= 2.0 and query["upper"][0] == pytest.approx(2.0, abs=1e-9)
    assert query["unsafe_unreachable"] is True and result["holds"] is True
    assert query["unsafe_row_upper"][0] < 0  # its one row, −y0 − 0.5 ≥ 0, is provably negative
    assert result["method"] == method and result["dtype"] == "float64" and result["seconds"] >= 0
    violated = bound_property(network, read(violated_property(tmp_path / "violated.vnnlib"), network), method)
    assert violated["queries"][0]["unsafe_unreachable"] is False and violated["holds"] is False


def test_a_disjunction_is_excluded_only_when_every_conjunction_is(network, tmp_path):
    # y0 ≤ −0.5 is impossible, y0 ≥ 1.5 is reachable: their union is not excluded.
    either = write_vnnlib(tmp_path / "either.vnnlib", "(or (<= Y_0 -0.5) (>= Y_0 1.5))")
    result = bound_property(network, read(either, network), "crown")
    assert [q["unsafe_unreachable"] for q in result["queries"]] == [False] and result["holds"] is False
    # (y0 ≤ −0.5 and y1 ≤ 0) or (y1 ≥ 0.5): y1 = −y0 ≤ 0, so both conjunctions are impossible.
    both = write_vnnlib(tmp_path / "both.vnnlib", "(or (and (<= Y_0 -0.5) (<= Y_1 0.0)) (>= Y_1 0.5))")
    result = bound_property(network, read(both, network), "crown")
    assert result["holds"] is True and len(result["queries"][0]["unsafe_row_upper"]) == 3


def test_json_names_the_files(network, tmp_path):
    path = holding_property(tmp_path / "holds.vnnlib")
    result = bound_property(network, read(path, network), "ibp", dtype="float32")
    assert result["network"] == str(network.source) and result["property"] == str(path) and result["dtype"] == "float32"
