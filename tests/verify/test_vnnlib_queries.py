"""A VNN-LIB property's queries built in bulk (:func:`from_vnnlib_queries`) are the queries
:func:`from_unsafe` builds one by one: same boxes, rows, offsets, groups, index and violation test."""

from __future__ import annotations

import pytest
import torch

from assay.errors import SpecError
from assay.sets import read_vnnlib
from assay.verify.problem import from_unsafe, from_vnnlib_queries
from tests.verify.networks import random_relu_network

HEADER = "".join(f"(declare-const X_{i} Real)\n" for i in range(2)) + "".join(f"(declare-const Y_{j} Real)\n" for j in range(3))


def _box(a, b):
    return f"(>= X_0 {a}) (<= X_0 {b}) (>= X_1 -1) (<= X_1 1)"


# boxes with one conjunction of one row, of two rows, two conjunctions, interleaved (three structures)
BODY = ("(assert (or (and " + _box(0, 1) + " (>= Y_0 0.5))"
        " (and " + _box(1, 2) + " (>= Y_0 0.25) (<= Y_2 -0.5))"
        " (and " + _box(2, 3) + " (<= Y_1 0.125)) (and " + _box(2, 3) + " (>= Y_1 0.75))"
        " (and " + _box(3, 4) + " (>= Y_2 1.5))"
        " (and " + _box(4, 5) + " (<= Y_0 -3) (>= Y_1 2))))")


def _same(bulk, single):
    assert len(bulk) == len(single)
    points = torch.randn(64, single[0].C.shape[1], dtype=torch.float64) * 3
    for mine, theirs in zip(bulk, single):
        for name in ("lower", "upper", "C", "d", "groups"):
            assert torch.equal(getattr(mine, name), getattr(theirs, name)), name
        assert mine.index == theirs.index
        assert torch.equal(mine.violates(points), theirs.violates(points))


def test_bulk_queries_are_the_one_by_one_queries(tmp_path):
    path = tmp_path / "p.vnnlib"
    path.write_text(HEADER + BODY)
    network = random_relu_network(0, widths=(2, 8, 3))
    prop = read_vnnlib(path, 2, 3)
    single = [q for k, x in enumerate(prop.queries) for q in from_unsafe(network, x.input_set, x.unsafe_outputs, k)]
    bulk = from_vnnlib_queries(network, prop.queries)
    assert [q.index for q in bulk] == list(range(5))
    assert [q.num_groups for q in bulk] == [1, 1, 2, 1, 1]
    _same(bulk, single)


def test_bulk_queries_check_the_network_sizes(tmp_path):
    path = tmp_path / "p.vnnlib"
    path.write_text(HEADER + BODY)
    prop = read_vnnlib(path)
    with pytest.raises(SpecError, match="constrains 3 outputs"):
        from_vnnlib_queries(random_relu_network(0, widths=(2, 8, 2)), prop.queries)
    with pytest.raises(SpecError, match="takes 3 inputs"):
        from_vnnlib_queries(random_relu_network(0, widths=(3, 8, 3)), prop.queries)


def test_real_lindex_queries_in_bulk_are_the_one_by_one_queries(data_dir):
    folder = data_dir / "vnncomp2024" / "nn4sys_2023"
    if not (folder / "vnnlib" / "lindex_800.vnnlib.gz").exists():
        pytest.skip("nn4sys_2023 is not in this data folder")
    from assay.nn import load

    network = load(folder / "onnx" / "lindex.onnx.gz")
    prop = read_vnnlib(folder / "vnnlib" / "lindex_800.vnnlib.gz", network.input_size, network.output_size)
    single = [q for k, x in enumerate(prop.queries) for q in from_unsafe(network, x.input_set, x.unsafe_outputs, k)]
    _same(from_vnnlib_queries(network, prop.queries), single)
