"""VNN-LIB bulk reading: one flat ``(assert (or (and ...) ...))`` read into arrays gives exactly the
general reader's property; every other layout, and every malformed file, goes to the general reader."""

from __future__ import annotations

import pytest
import torch

import assay.sets.vnnlib as vnnlib
from assay.errors import AssayError
from assay.sets import read_vnnlib

HEADER = "".join(f"(declare-const X_{i} Real)\n" for i in range(3)) + "".join(f"(declare-const Y_{j} Real)\n" for j in range(2))


def write(tmp_path, body, name="p.vnnlib", header=HEADER):
    path = tmp_path / name
    path.write_text(header + body)
    return path


@pytest.fixture
def bulk(monkeypatch):
    """``bulk(path, ...)`` → (property read with the bulk path available, whether it took it,
    property read by the general reader alone)."""
    taken = []
    original = vnnlib._read_flat_disjunction

    def spy(*args):
        result = original(*args)
        taken.append(result is not None)
        return result

    def read(path, **sizes):
        monkeypatch.setattr(vnnlib, "_read_flat_disjunction", spy)
        fast = read_vnnlib(path, **sizes)
        monkeypatch.setattr(vnnlib, "_read_flat_disjunction", lambda *args: None)
        general = read_vnnlib(path, **sizes)
        monkeypatch.setattr(vnnlib, "_read_flat_disjunction", original)
        return fast, taken[-1], general

    return read


def assert_same(fast, general):
    assert (fast.num_inputs, fast.num_outputs) == (general.num_inputs, general.num_outputs)
    assert len(fast.queries) == len(general.queries)
    for mine, theirs in zip(fast.queries, general.queries):
        assert torch.equal(mine.input_set.lower, theirs.input_set.lower)
        assert torch.equal(mine.input_set.upper, theirs.input_set.upper)
        assert len(mine.unsafe_outputs.conjunctions) == len(theirs.unsafe_outputs.conjunctions)
        for a, b in zip(mine.unsafe_outputs.conjunctions, theirs.unsafe_outputs.conjunctions):
            assert a.C.dtype == b.C.dtype == torch.float64
            assert torch.equal(a.C, b.C) and torch.equal(a.d, b.d)


def box(x0, x1, x2=("0", "0")):
    return f"(>= X_0 {x0[0]}) (<= X_0 {x0[1]}) (>= X_1 {x1[0]}) (<= X_1 {x1[1]}) (>= X_2 {x2[0]}) (<= X_2 {x2[1]})"


FLAT = [
    # negative numbers, scientific notation, signs, strict comparisons, odd spacing and newlines
    "(assert (or\n (and " + box(("-1", "-0.5"), ("1.5e-3", "2E+1")) + " (<= Y_0 -1e-5))\n"
    " ( and (> X_0 -.25) (< X_0 +.75) (>= X_1 0.) (<= X_1 1.0e0) (>= X_2 3) (<= X_2 3) (> Y_1 2.5) (< Y_0 -0.0))))",
    # cases sharing a box become one query with several conjunctions, in file order; boxes in order of first appearance
    "(assert (or (and " + box(("0", "1"), ("0", "1")) + " (<= Y_0 0.25)) (and " + box(("1", "2"), ("0", "1")) + " (>= Y_1 7))"
    " (and " + box(("0", "1"), ("0", "1")) + " (>= Y_0 0.5) (>= Y_1 0.0))))",
    # the bounds may come in any order, repeat (the tightest wins) and mix with the output atoms
    "(assert (or (and (<= Y_0 1) (<= X_2 1) (>= X_0 0) (<= X_0 1) (>= X_0 0.5) (>= X_1 -1) (<= X_1 1) (<= X_1 0.5) (>= X_2 0))"
    " (and (>= X_0 0) (<= X_0 1) (>= X_1 0) (<= X_1 1) (>= X_2 0) (<= X_2 1))))",
    # a case whose box is empty has no counterexample and is dropped
    "(assert (or (and " + box(("1", "0"), ("0", "1")) + " (<= Y_0 0)) (and " + box(("0", "1"), ("0", "1")) + " (>= Y_0 3))))",
    # simple asserts outside the disjunction are conjoined with every case (a bound and an output row)
    "(assert (>= X_2 -2)) (assert (<= X_2 2)) (assert (<= Y_1 4))\n"
    "(assert (or (and (>= X_0 0) (<= X_0 1) (>= X_1 0) (<= X_1 1) (>= Y_0 1)) (and (>= X_0 0) (<= X_0 1) (>= X_1 -3) (<= X_1 1) (>= X_2 0))))\n"
    "(check-sat)",
    # comments are ignored
    "; a comment\n(assert (or ; one\n (and " + box(("0", "1"), ("0", "1")) + " (<= Y_0 0.5)) ; two\n (and " + box(("0", "2"), ("0", "1")) + ")))",
    # one case only
    "(assert (or (and " + box(("0", "1"), ("0", "1")) + " (<= Y_1 0.5))))",
]


@pytest.mark.parametrize("body", FLAT)
def test_the_bulk_path_reads_the_flat_layout_as_the_general_reader_does(tmp_path, bulk, body):
    fast, taken, general = bulk(write(tmp_path, body), num_inputs=3, num_outputs=2)
    assert taken, "the flat layout should be read in bulk"
    assert_same(fast, general)


def test_the_bulk_path_reads_numbers_exactly(tmp_path, bulk):
    body = "(assert (or (and " + box(("0.1130307763814926", "0.1130745038390160"), ("-1.7976931348623157e308", "1e-320"))
    body += " (<= Y_0 0.9606135399830147) (>= Y_1 -0.1))))"
    fast, taken, general = bulk(write(tmp_path, body))
    assert taken
    assert_same(fast, general)
    (query,) = fast.queries
    assert query.input_set.lower.tolist() == [float("0.1130307763814926"), -1.7976931348623157e308, 0.0]
    assert query.input_set.upper.tolist() == [float("0.1130745038390160"), 1e-320, 0.0]
    (conjunction,) = query.unsafe_outputs.conjunctions
    # (<= Y_0 v): −y0 + v ≥ 0; (>= Y_1 w): y1 − w ≥ 0
    assert conjunction.C.tolist() == [[-1.0, 0.0], [0.0, 1.0]]
    assert conjunction.d.tolist() == [0.9606135399830147, 0.1]


OTHER = [
    # an (or ...) nested in a case, output comparisons between outputs, equalities, arithmetic
    "(assert (or (and " + box(("0", "1"), ("0", "1")) + " (or (<= Y_0 0) (>= Y_1 1))) (and " + box(("0", "2"), ("0", "1")) + ")))",
    "(assert (or (and " + box(("0", "1"), ("0", "1")) + " (<= Y_0 Y_1)) (and " + box(("0", "2"), ("0", "1")) + " (<= Y_1 0))))",
    "(assert (or (and " + box(("0", "1"), ("0", "1")) + " (= Y_0 1)) (and " + box(("0", "2"), ("0", "1")) + " (<= Y_1 0))))",
    "(assert (or (and " + box(("0", "1"), ("0", "1")) + " (<= (* 2 Y_0) 1)) (and " + box(("0", "2"), ("0", "1")) + ")))",
    # reversed operands, two disjunctive asserts
    "(assert (or (and " + box(("0", "1"), ("0", "1")) + " (>= 1 Y_0)) (and " + box(("0", "2"), ("0", "1")) + ")))",
    "(assert (or (and " + box(("0", "1"), ("0", "1")) + ") (and " + box(("0", "2"), ("0", "1")) + ")))\n(assert (or (<= Y_0 0) (>= Y_0 1)))",
]


@pytest.mark.parametrize("body", OTHER)
def test_other_layouts_go_to_the_general_reader(tmp_path, bulk, body):
    fast, taken, general = bulk(write(tmp_path, body), num_inputs=3, num_outputs=2)
    assert not taken
    assert_same(fast, general)


MALFORMED = [
    ("(assert (or (and " + box(("0", "1"), ("0", "1")) + " (<= X_7 1)) (and " + box(("0", "2"), ("0", "1")) + ")))", "X_7 is used but not declared"),
    ("(assert (or (and " + box(("0", "1"), ("0", "1")) + " (<= Y_0 1e999)) (and " + box(("0", "2"), ("0", "1")) + ")))", "outside the float64 range"),
    ("(assert (or (and (>= X_0 0) (<= X_0 1) (>= X_1 0) (>= X_2 0) (<= X_2 1)) (and " + box(("0", "2"), ("0", "1")) + ")))", "X_1 (declared here) has no upper bound"),
    ("(assert (or (and " + box(("1", "0"), ("0", "1")) + ") (and " + box(("0", "1"), ("3", "2")) + ")))", "which no number is"),
    ("(assert (or (and " + box(("0", "1"), ("0", "1")) + " (<= Y_0 1.0e)) (and " + box(("0", "2"), ("0", "1")) + ")))", "expected a number"),
    ("(assert (or (and " + box(("0", "1"), ("0", "1")) + " (<= Y_0 1) (and " + box(("0", "2"), ("0", "1")) + ")))", "never closed"),
    ("(assert (or (and " + box(("0", "1"), ("0", "1")) + ") (and)))", "(and) needs at least one formula"),
    ("(assert (or (and " + box(("0", "1"), ("0", "1")) + " (<== Y_0 1)) (and " + box(("0", "2"), ("0", "1")) + ")))", "unknown operator '<=='"),
    ("(assert (or (and " + box(("0", "1"), ("0", "1")) + " (<= Y_01 1)) (and " + box(("0", "2"), ("0", "1")) + ")))", "Y_01 is used but not declared"),
]


@pytest.mark.parametrize(("body", "message"), MALFORMED)
def test_malformed_flat_files_get_the_general_readers_message(tmp_path, body, message):
    path = write(tmp_path, body)
    with pytest.raises(AssayError) as caught:
        read_vnnlib(path)
    text = str(caught.value)
    assert message in text
    assert text.startswith(f"{path}:") and text.split(":")[1].isdigit(), "the message names the file, line and column"


def test_declared_sizes_are_checked_on_the_bulk_path(tmp_path):
    path = write(tmp_path, "(assert (or (and " + box(("0", "1"), ("0", "1")) + ") (and " + box(("0", "2"), ("0", "1")) + ")))")
    with pytest.raises(AssayError, match="num_outputs=3"):
        read_vnnlib(path, num_inputs=3, num_outputs=3)


@pytest.mark.parametrize("name", ["lindex_800", "cardinality_0_1_128", "cardinality_1_1_128_dual", "cardinality_1_240_128_dual", "pensieve_parallel_0"])
def test_real_nn4sys_files_read_the_same_both_ways(data_dir, bulk, name):
    path = data_dir / "vnncomp2024" / "nn4sys_2023" / "vnnlib" / f"{name}.vnnlib.gz"
    if not path.exists():
        pytest.skip(f"{path} is not in this data folder")
    fast, taken, general = bulk(path)
    assert taken == (name != "pensieve_parallel_0")
    assert_same(fast, general)
