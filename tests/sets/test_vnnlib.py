"""VNN-LIB reading, writing and error messages."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from assay.errors import SpecError
from assay.sets import Box, CounterexampleQuery, HalfSpaces, OutputSpec, read_vnnlib, write_vnnlib

HEADER = "".join(f"(declare-const X_{i} Real)\n" for i in range(2)) + "".join(f"(declare-const Y_{j} Real)\n" for j in range(3))


def write(tmp_path, body, name="p.vnnlib"):
    path = tmp_path / name
    path.write_text(HEADER + body)
    return path


def test_polarity_and_linear_terms(tmp_path):
    path = write(tmp_path, """
; the counterexample region
(assert (>= X_0 -1)) (assert (<= X_0 1.5e0)) (assert (<= X_1 2)) (assert (>= X_1 0))
(assert (or (and (<= Y_0 Y_1) (>= Y_2 3.5)) (and (>= (- Y_0 (* 2 Y_1)) -1))))
""")
    prop = read_vnnlib(path, num_inputs=2, num_outputs=3)
    (query,) = prop.queries
    assert query.input_set.lower.tolist() == [-1.0, 0.0] and query.input_set.upper.tolist() == [1.5, 2.0]
    unsafe = query.unsafe_outputs
    assert unsafe.contains([0.0, 1.0, 4.0])  # y0 ≤ y1 and y2 ≥ 3.5: a counterexample
    assert not unsafe.contains([3.0, 2.5, 4.0])
    assert unsafe.contains([1.0, 0.9, 0.0])  # y0 − 2 y1 ≥ −1
    assert not unsafe.contains([0.0, 1.0, 0.0])


def test_disjunction_over_inputs_gives_several_queries(tmp_path):
    path = write(tmp_path, """
(assert (or (and (>= X_0 0) (<= X_0 1) (>= X_1 0) (<= X_1 1) (>= Y_0 0))
            (and (>= X_0 2) (<= X_0 3) (>= X_1 0) (<= X_1 1) (>= Y_1 0))))
""")
    prop = read_vnnlib(path)
    assert len(prop.queries) == 2
    assert prop.queries[1].input_set.lower.tolist() == [2.0, 0.0]


@pytest.mark.parametrize("body, message", [
    ("(assert (<= X_0 1)", ":1"),  # never closed
    ("(assert (<= X_0 1)))", "unbalanced"),
    ("(assert (<= X_0 1)) (assert (>= X_0 0)) (assert (<= X_1 1))", "X_1 needs both"),
    ("(assert (<= X_7 1))", "not declared"),
    ("(assert (foo X_0 1))", "unsupported operator 'foo'"),
    ("(assert (<= (+ X_0 X_1) 1))", "one input at a time"),
    ("(assert (<= X_0 Y_0))", "mixes inputs and outputs"),
])
def test_malformed_files_name_the_place_and_the_fix(tmp_path, body, message):
    path = write(tmp_path, body)
    with pytest.raises(SpecError, match=message) as info:
        read_vnnlib(path)
    assert str(path) in str(info.value)


def test_size_mismatch_and_missing_file(tmp_path):
    path = write(tmp_path, "(assert (<= X_0 1)) (assert (>= X_0 0)) (assert (<= X_1 1)) (assert (>= X_1 0))")
    with pytest.raises(SpecError, match="declares 2 inputs, but the network has 5"):
        read_vnnlib(path, num_inputs=5)
    with pytest.raises(SpecError, match="cannot read"):
        read_vnnlib(tmp_path / "missing.vnnlib")


numbers = st.floats(-100, 100, allow_nan=False, allow_infinity=False)


@settings(max_examples=40, deadline=None)
@given(lows=st.lists(numbers, min_size=2, max_size=2), widths=st.lists(st.floats(0, 10), min_size=2, max_size=2),
       rows=st.lists(st.lists(numbers, min_size=4, max_size=4), min_size=1, max_size=3), two=st.booleans())
def test_write_then_read_round_trips(tmp_path_factory, lows, widths, rows, two):
    box = Box(torch.tensor(lows), torch.tensor(lows) + torch.tensor(widths))
    table = torch.tensor(rows, dtype=torch.float64)
    table[:, 0] = table[:, 0].abs() + 0.5  # a row with no output coefficient would be a constant
    spec = OutputSpec((HalfSpaces(table[:, :3], table[:, 3]),))
    queries = [CounterexampleQuery(box, spec)]
    if two:
        queries.append(CounterexampleQuery(Box(box.lower + 50, box.upper + 50), spec))
    path = tmp_path_factory.mktemp("vnnlib") / "round.vnnlib"
    write_vnnlib(path, queries)
    prop = read_vnnlib(path)
    assert len(prop.queries) == len(queries)
    for ours, theirs in zip(queries, prop.queries):
        assert torch.equal(ours.input_set.lower, theirs.input_set.lower)
        assert torch.equal(ours.input_set.upper, theirs.input_set.upper)
        y = torch.randn(200, 3, dtype=torch.float64) * 50
        assert torch.equal(ours.unsafe_outputs.contains(y), theirs.unsafe_outputs.contains(y))


@pytest.mark.data
def test_all_acas_xu_properties_parse(data_dir):
    folder = data_dir / "acasxu"
    expected_queries = {6: 2}
    expected_conjunctions = {1: 1, 2: 1, 3: 1, 4: 1, 5: 4, 7: 2, 8: 3, 9: 4, 10: 4}
    for number in range(1, 11):
        prop = read_vnnlib(folder / f"prop_{number}.vnnlib", num_inputs=5, num_outputs=5)
        assert len(prop.queries) == expected_queries.get(number, 1)
        if number in expected_conjunctions:
            assert len(prop.queries[0].unsafe_outputs.conjunctions) == expected_conjunctions[number]
    # Property 1: the unsafe region is "clear of conflict" advisory score y0 ≥ 3.9911256459 (normalised).
    prop1 = read_vnnlib(folder / "prop_1.vnnlib")
    C, d, _ = prop1.queries[0].unsafe_outputs.rows()
    assert C.tolist() == [[1.0, 0.0, 0.0, 0.0, 0.0]] and abs(d.item() + 3.991125645861615) < 1e-12
    assert prop1.queries[0].input_set.lower.tolist() == [0.6, -0.5, -0.5, 0.45, -0.5]
