"""The ten ACAS Xu properties of VNN-COMP (shared data): parse, known values, round trip."""

from __future__ import annotations

import pytest
import torch

from assay.errors import SpecError
from assay.sets import read_vnnlib, write_vnnlib

pytestmark = pytest.mark.data

# (queries, conjunctions per query, rows per conjunction) as written in the files.
STRUCTURE = {
    1: (1, [1], 1), 2: (1, [1], 4), 3: (1, [1], 4), 4: (1, [1], 4), 5: (1, [4], 1),
    6: (2, [4, 4], 1), 7: (1, [2], 3), 8: (1, [3], 2), 9: (1, [4], 1), 10: (1, [4], 1),
}


def acas(data_dir, number: int):
    return read_vnnlib(data_dir / "acasxu" / f"prop_{number}.vnnlib", num_inputs=5, num_outputs=5)


@pytest.mark.parametrize("number", range(1, 11))
def test_every_property_parses_with_five_inputs_and_outputs(data_dir, number):
    prop = acas(data_dir, number)
    queries, conjunctions, rows_each = STRUCTURE[number]
    assert (prop.num_inputs, prop.num_outputs, len(prop.queries)) == (5, 5, queries)
    assert [len(q.unsafe_outputs.conjunctions) for q in prop.queries] == conjunctions
    assert all(c.num_rows == rows_each for q in prop.queries for c in q.unsafe_outputs.conjunctions)
    for query in prop.queries:
        assert query.input_set.shape == (5,) and (query.input_set.width >= 0).all()


def test_property_1_unsafe_region_is_a_large_clear_of_conflict_score(data_dir):
    (query,) = acas(data_dir, 1).queries
    C, d, index = query.unsafe_outputs.rows()
    assert C.tolist() == [[1.0, 0.0, 0.0, 0.0, 0.0]] and d.tolist() == [-3.991125645861615] and index.tolist() == [0]
    assert query.input_set.lower.tolist() == [0.6, -0.5, -0.5, 0.45, -0.5]
    assert query.input_set.upper.tolist() == [0.679857769, 0.5, 0.5, 0.5, -0.45]
    assert query.unsafe_outputs.contains([4.0, 0.0, 0.0, 0.0, 0.0])
    assert not query.unsafe_outputs.contains([3.99, 9.0, 9.0, 9.0, 9.0])


def test_property_2_unsafe_when_clear_of_conflict_is_maximal(data_dir):
    (query,) = acas(data_dir, 2).queries
    C, d, _ = query.unsafe_outputs.rows()
    expected = torch.zeros(4, 5, dtype=torch.float64)
    expected[:, 0] = 1.0
    expected[range(4), range(1, 5)] = -1.0  # y0 − yj ≥ 0: COC is the largest score
    assert torch.equal(C, expected) and (d == 0).all()


@pytest.mark.parametrize("number", [3, 4])
def test_properties_3_and_4_unsafe_when_clear_of_conflict_is_minimal(data_dir, number):
    (query,) = acas(data_dir, number).queries
    C, d, _ = query.unsafe_outputs.rows()
    expected = torch.zeros(4, 5, dtype=torch.float64)
    expected[:, 0] = -1.0
    expected[range(4), range(1, 5)] = 1.0  # yj − y0 ≥ 0: COC has the lowest score, i.e. is the advisory
    assert torch.equal(C, expected) and (d == 0).all()
    assert query.unsafe_outputs.contains([-1.0, 0.0, 0.0, 0.0, 0.0])
    assert not query.unsafe_outputs.contains([1.0, 0.0, 0.0, 0.0, 0.0])
    if number == 4:
        assert query.input_set.lower[2] == 0.0 == query.input_set.upper[2]  # an input fixed to one value


def test_property_6_has_two_input_boxes_and_an_output_disjunction(data_dir):
    first, second = acas(data_dir, 6).queries
    assert first.input_set.lower[1].item() == 0.11140846 and first.input_set.upper[1].item() == 0.499999896
    assert second.input_set.lower[1].item() == -0.499999896 and second.input_set.upper[1].item() == -0.11140846
    y = torch.randn(1000, 5, dtype=torch.float64)
    not_minimal = (y[:, 1:] <= y[:, :1]).any(1)  # unsafe iff some other score is ≤ COC's
    assert torch.equal(first.unsafe_outputs.contains(y), not_minimal)
    assert torch.equal(second.unsafe_outputs.contains(y), not_minimal)


@pytest.mark.parametrize("number", range(1, 11))
def test_acas_properties_survive_a_write_read_round_trip(data_dir, tmp_path, number):
    prop = acas(data_dir, number)
    write_vnnlib(tmp_path / "again.vnnlib", prop)
    again = read_vnnlib(tmp_path / "again.vnnlib", num_inputs=5, num_outputs=5)
    assert len(again.queries) == len(prop.queries)
    for ours, theirs in zip(prop.queries, again.queries):
        assert torch.equal(ours.input_set.lower, theirs.input_set.lower)
        assert torch.equal(ours.input_set.upper, theirs.input_set.upper)
        assert [c.C.tolist() for c in ours.unsafe_outputs.conjunctions] == [c.C.tolist() for c in theirs.unsafe_outputs.conjunctions]
        assert [c.d.tolist() for c in ours.unsafe_outputs.conjunctions] == [c.d.tolist() for c in theirs.unsafe_outputs.conjunctions]


def test_a_network_of_the_wrong_size_is_refused(data_dir):
    with pytest.raises(SpecError, match="prop_1.vnnlib:.*declares 5 inputs .* but num_inputs=784"):
        read_vnnlib(data_dir / "acasxu" / "prop_1.vnnlib", num_inputs=784)
