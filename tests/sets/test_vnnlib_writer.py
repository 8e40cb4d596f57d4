"""VNN-LIB writing: read_vnnlib(write_vnnlib(p)) is p again."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from assay.errors import SpecError
from assay.sets import (
    Box,
    CounterexampleQuery,
    HalfSpaces,
    OutputSpec,
    any_of,
    argmax_is,
    read_vnnlib,
    write_vnnlib,
)


def rows(spec: OutputSpec) -> list[list[tuple]]:
    return [sorted(tuple(row) + (offset,) for row, offset in zip(c.C.tolist(), c.d.tolist())) for c in spec.conjunctions]


def assert_same_queries(ours, theirs):
    assert len(ours) == len(theirs)
    for mine, read in zip(ours, theirs):
        assert torch.equal(mine.input_set.lower.reshape(-1), read.input_set.lower)
        assert torch.equal(mine.input_set.upper.reshape(-1), read.input_set.upper)
        assert rows(mine.unsafe_outputs) == rows(read.unsafe_outputs)


finite = st.floats(allow_nan=False, allow_infinity=False, width=64)
coefficient = st.one_of(st.sampled_from([0.0, 1.0, -1.0, 0.5]), finite)


@st.composite
def output_specs(draw, num_outputs: int) -> OutputSpec:
    conjunctions = []
    for _ in range(draw(st.integers(1, 3))):
        table = draw(st.lists(st.lists(coefficient, min_size=num_outputs, max_size=num_outputs), min_size=1, max_size=3))
        for row in table:
            if all(c == 0 for c in row):
                row[0] = 1.0  # an all-zero row is a constant, which the reader folds away
        offsets = draw(st.lists(st.one_of(st.just(0.0), finite), min_size=len(table), max_size=len(table)))
        conjunctions.append(HalfSpaces(torch.tensor(table, dtype=torch.float64), torch.tensor(offsets, dtype=torch.float64)))
    return OutputSpec(tuple(conjunctions))


@st.composite
def properties(draw) -> list[CounterexampleQuery]:
    num_inputs, num_outputs = draw(st.integers(1, 4)), draw(st.integers(1, 4))
    pair = st.lists(finite, min_size=2, max_size=2).map(sorted)
    boxes = draw(st.lists(st.lists(pair, min_size=num_inputs, max_size=num_inputs), min_size=1, max_size=3,
                          unique_by=lambda bounds: tuple(map(tuple, bounds))))
    return [
        CounterexampleQuery(Box([low for low, _ in bounds], [high for _, high in bounds]), draw(output_specs(num_outputs)))
        for bounds in boxes
    ]


@settings(max_examples=60, deadline=None)
@given(queries=properties())
def test_write_then_read_gives_back_the_same_queries(tmp_path_factory, queries):
    path = tmp_path_factory.mktemp("vnnlib") / "round.vnnlib"
    write_vnnlib(path, queries)
    prop = read_vnnlib(path, num_inputs=queries[0].input_set.dim, num_outputs=queries[0].unsafe_outputs.num_outputs)
    assert_same_queries(queries, prop.queries)


def test_the_file_uses_the_simple_forms_and_repr_precision(tmp_path):
    unsafe = any_of(argmax_is(1, 3), OutputSpec((HalfSpaces([[0.0, 0.0, -1.0], [2.0, 0.0, 0.0]], [0.1 + 0.2, -0.0]),)))
    query = CounterexampleQuery(Box(torch.zeros(1, 2, 2), torch.full((1, 2, 2), 0.1 + 0.2, dtype=torch.float64)), unsafe)
    path = tmp_path / "simple.vnnlib"
    write_vnnlib(path, query)
    text = path.read_text()
    assert "COUNTEREXAMPLE" in text and "(declare-const X_3 Real)" in text
    assert "(>= Y_1 Y_0)" in text and "(<= Y_2 0.30000000000000004)" in text and "(* 2.0 Y_0)" in text
    assert "(<= X_3 0.30000000000000004)" in text and "-0.0" not in text
    prop = read_vnnlib(path)
    assert prop.num_inputs == 4 and prop.queries[0].input_set.shape == (4,)  # written and read back flat
    assert_same_queries([query], prop.queries)
    again = tmp_path / "again.vnnlib"
    write_vnnlib(again, prop)
    assert again.read_text() == text


def test_queries_with_the_same_box_are_read_back_as_one(tmp_path):
    box = Box([0.0], [1.0])
    queries = [CounterexampleQuery(box, argmax_is(0, 2)), CounterexampleQuery(box, argmax_is(1, 2))]
    write_vnnlib(tmp_path / "same.vnnlib", queries)
    (query,) = read_vnnlib(tmp_path / "same.vnnlib").queries
    y = torch.randn(500, 2, dtype=torch.float64)
    assert torch.equal(query.unsafe_outputs.contains(y), any_of(argmax_is(0, 2), argmax_is(1, 2)).contains(y))


@pytest.mark.parametrize("queries, message", [
    ([], "at least one query"),
    ([CounterexampleQuery(Box([0.0], [1.0]), argmax_is(0, 2)), CounterexampleQuery(Box([0.0, 0.0], [1.0, 1.0]), argmax_is(0, 2))],
     "query 1 has 2 inputs and 2 outputs, but query 0 has 1 and 2"),
    ([CounterexampleQuery(Box([0.0], [float("inf")]), argmax_is(0, 2))], "infinite bounds"),
    (["(assert (<= X_0 1))"], "item 0 is a str"),
])
def test_writer_errors(tmp_path, queries, message):
    with pytest.raises(SpecError, match=message):
        write_vnnlib(tmp_path / "bad.vnnlib", queries)
