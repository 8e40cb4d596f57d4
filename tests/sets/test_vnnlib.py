"""VNN-LIB reading: polarity, syntax coverage, structure, and error messages."""

from __future__ import annotations

import gzip
from fractions import Fraction

import pytest
import torch

from assay.errors import SpecError
from assay.sets import CounterexampleQuery, OutputSpec, VnnlibProperty, read_vnnlib

HEADER = "".join(f"(declare-const X_{i} Real)\n" for i in range(2)) + "".join(f"(declare-const Y_{j} Real)\n" for j in range(3))
BOUNDS = "(assert (>= X_0 -1)) (assert (<= X_0 1.5e0)) (assert (<= X_1 2)) (assert (>= X_1 0))\n"


def write(tmp_path, body, name="p.vnnlib", header=HEADER):
    path = tmp_path / name
    path.write_text(header + body)
    return path


def rows(spec: OutputSpec) -> list[list[tuple]]:
    """Each conjunction's rows as sorted (C row..., d) tuples: comparable regardless of row order."""
    return [sorted(tuple(row) + (offset,) for row, offset in zip(c.C.tolist(), c.d.tolist())) for c in spec.conjunctions]


def test_the_asserts_describe_a_counterexample(tmp_path):
    prop = read_vnnlib(write(tmp_path, BOUNDS + "(assert (>= Y_0 3.5))"), num_inputs=2, num_outputs=3)
    assert isinstance(prop, VnnlibProperty) and prop.num_inputs == 2 and prop.num_outputs == 3
    (query,) = prop.queries
    assert isinstance(query, CounterexampleQuery)
    assert query.input_set.lower.tolist() == [-1.0, 0.0] and query.input_set.upper.tolist() == [1.5, 2.0]
    # The region read is the UNSAFE one: y0 ≥ 3.5 is a counterexample, y0 = 0 is not.
    assert query.unsafe_outputs.contains([4.0, 0.0, 0.0]) and not query.unsafe_outputs.contains([0.0, 0.0, 0.0])
    assert rows(query.unsafe_outputs) == [[(1.0, 0.0, 0.0, -3.5)]]
    assert "no query" in prop.to_json()["holds_iff"]


@pytest.mark.parametrize("atom, expected", [
    ("(<= Y_0 Y_1)", [(-1.0, 1.0, 0.0, 0.0)]),
    ("(>= Y_0 3.5)", [(1.0, 0.0, 0.0, -3.5)]),
    ("(<= 3.5 Y_0)", [(1.0, 0.0, 0.0, -3.5)]),
    ("(>= Y_2 -2)", [(0.0, 0.0, 1.0, 2.0)]),
    ("(<= Y_1 +.5)", [(0.0, -1.0, 0.0, 0.5)]),
    ("(<= Y_1 -1.25E-2)", [(0.0, -1.0, 0.0, -0.0125)]),
    ("(< Y_0 Y_1)", [(-1.0, 1.0, 0.0, 0.0)]),  # strict comparisons are read as their closures
    ("(> Y_0 1)", [(1.0, 0.0, 0.0, -1.0)]),
    ("(>= (+ Y_0 (* -1.0 Y_1)) 0)", [(1.0, -1.0, 0.0, 0.0)]),
    ("(>= (- Y_0 Y_1) 0.5)", [(1.0, -1.0, 0.0, -0.5)]),
    ("(>= (- Y_0 Y_1 Y_2) 0)", [(1.0, -1.0, -1.0, 0.0)]),
    ("(<= (- Y_2) 4)", [(0.0, 0.0, 1.0, 4.0)]),
    ("(>= (* 2 (+ Y_0 1)) (* Y_1 3))", [(2.0, -3.0, 0.0, 2.0)]),
    ("(>= (/ Y_0 4) Y_1)", [(0.25, -1.0, 0.0, 0.0)]),
    ("(= Y_0 Y_1)", [(-1.0, 1.0, 0.0, 0.0), (1.0, -1.0, 0.0, 0.0)]),
    ("(<= Y_0 Y_1 Y_2)", [(-1.0, 1.0, 0.0, 0.0), (0.0, -1.0, 1.0, 0.0)]),  # a chain: y0 ≤ y1 and y1 ≤ y2
    ("(and (<= Y_0 Y_1) (>= Y_0 3.5))", [(-1.0, 1.0, 0.0, 0.0), (1.0, 0.0, 0.0, -3.5)]),
])
def test_output_constraints_become_rows(tmp_path, atom, expected):
    (query,) = read_vnnlib(write(tmp_path, BOUNDS + f"(assert {atom})")).queries
    assert rows(query.unsafe_outputs) == [sorted(expected)]


def test_comments_whitespace_and_ignored_commands(tmp_path):
    body = """; header comment (with parentheses
(set-logic QF_LRA)
(assert (>= X_0 -1)) ; trailing comment (assert (<= X_0 100))
(assert
    (<=   X_0
          1))
(assert (and (>= X_1 0) ; inside a formula )
             (<= X_1 1)))
(assert (>= Y_0 0))
(check-sat)
(get-model)
"""
    (query,) = read_vnnlib(write(tmp_path, body)).queries
    assert query.input_set.lower.tolist() == [-1.0, 0.0] and query.input_set.upper.tolist() == [1.0, 1.0]


def test_bounds_are_intersected_and_computed_bounds_rounded_outwards(tmp_path):
    body = "(assert (<= (* 3 X_0) 1)) (assert (>= (* 3 X_0) -1)) (assert (>= X_0 -5)) (assert (<= 0.0 X_1 0.7))"
    body += " (assert (<= X_1 0.5)) (assert (>= Y_0 0))"
    box = read_vnnlib(write(tmp_path, body)).queries[0].input_set
    low, high = box.lower.tolist(), box.upper.tolist()
    assert Fraction(high[0]) >= Fraction(1, 3) and Fraction(low[0]) <= Fraction(-1, 3)
    assert high[0] - 1 / 3 < 1e-15 and low[0] + 1 / 3 > -1e-15
    assert (low[1], high[1]) == (0.0, 0.5)


def test_output_disjunction_is_one_query_with_several_conjunctions(tmp_path):
    body = BOUNDS + "(assert (or (and (<= Y_0 Y_1) (>= Y_2 3.5)) (and (>= (- Y_0 (* 2 Y_1)) -1))))"
    (query,) = read_vnnlib(write(tmp_path, body)).queries
    unsafe = query.unsafe_outputs
    assert len(unsafe.conjunctions) == 2 and unsafe.rows()[2].tolist() == [0, 0, 1]
    assert unsafe.contains([0.0, 1.0, 4.0]) and unsafe.contains([1.0, 0.9, 0.0])
    assert not unsafe.contains([3.0, 2.5, 4.0]) and not unsafe.contains([0.0, 1.0, 0.0])


def test_disjunction_over_inputs_gives_one_query_per_box(tmp_path):
    body = """
(assert (or (and (>= X_0 0) (<= X_0 1) (>= X_1 0) (<= X_1 1) (>= Y_0 0))
            (and (>= X_0 2) (<= X_0 3) (>= X_1 0) (<= X_1 1) (>= Y_1 0))
            (and (>= X_0 0) (<= X_0 1) (>= X_1 0) (<= X_1 1) (>= Y_2 0))
            (and (>= X_0 5) (<= X_0 4) (>= X_1 0) (<= X_1 1))))
"""
    prop = read_vnnlib(write(tmp_path, body))
    assert len(prop.queries) == 2  # the first and third case share a box; the last is empty
    first, second = prop.queries
    assert first.input_set.upper.tolist() == [1.0, 1.0] and len(first.unsafe_outputs.conjunctions) == 2
    assert second.input_set.lower.tolist() == [2.0, 0.0] and rows(second.unsafe_outputs) == [[(0.0, 1.0, 0.0, 0.0)]]


def test_input_bounds_inside_disjunctions_read_as_the_general_path_reads_them(tmp_path):
    """``(<= X_i c)`` inside ``(or (and ...))`` takes a direct lane; the same bounds written as
    compound terms (which only the general path reads) give the same queries, strict or not, and
    an undeclared variable there still gets its error."""
    direct = """
(assert (or (and (>= X_0 -0.25) (< X_0 1e-1) (> X_1 0) (<= X_1 7) (>= Y_0 Y_1))
            (and (>= X_0 2) (<= X_0 3.5) (>= X_1 -1) (<= X_1 1) (<= Y_2 0))))
"""
    compound = """
(assert (or (and (>= (+ X_0 0) -0.25) (< (* 1 X_0) 1e-1) (> (- X_1 0) 0) (<= (+ X_1 0) 7) (>= Y_0 Y_1))
            (and (>= (+ X_0 0) 2) (<= (+ X_0 0) 3.5) (>= (+ X_1 0) -1) (<= (+ X_1 0) 1) (<= Y_2 0))))
"""
    fast = read_vnnlib(write(tmp_path, direct, "direct.vnnlib"))
    general = read_vnnlib(write(tmp_path, compound, "compound.vnnlib"))
    assert len(fast.queries) == len(general.queries) == 2
    for a, b in zip(fast.queries, general.queries):
        assert a.input_set.lower.tolist() == b.input_set.lower.tolist()
        assert a.input_set.upper.tolist() == b.input_set.upper.tolist()
        assert rows(a.unsafe_outputs) == rows(b.unsafe_outputs)
    assert fast.queries[0].input_set.upper.tolist() == [0.1, 7.0]
    with pytest.raises(SpecError, match="X_7"):
        read_vnnlib(write(tmp_path, "(assert (or (and (<= X_7 1) (>= Y_0 0)) (and (<= X_0 1) (>= Y_0 0))))\n",
                          "undeclared.vnnlib"))


def test_input_bounds_read_early_keep_their_text_and_place_in_messages(tmp_path):
    """The nested bounds read before the tree is built still show as written, where written,
    in errors; a bound alone in an ``or`` (not in an ``and``) reads as one case."""
    with pytest.raises(SpecError, match=r"stray.vnnlib:7:1: '\(<= X_0 1.5\)' stands outside any command"):
        read_vnnlib(write(tmp_path, BOUNDS + "(<= X_0 1.5)\n(assert (>= Y_0 0))\n", "stray.vnnlib"))
    box = "(assert (>= X_0 0)) (assert (<= X_0 1)) (assert (>= X_1 0)) (assert (<= X_1 3))\n"
    lone = read_vnnlib(write(tmp_path, box + "(assert (or (<= X_0 0.5) (>= X_1 2)))\n(assert (>= Y_0 0))\n", "lone.vnnlib"))
    assert [q.input_set.lower.tolist() for q in lone.queries] == [[0.0, 0.0], [0.0, 2.0]]
    assert [q.input_set.upper.tolist() for q in lone.queries] == [[0.5, 3.0], [1.0, 3.0]]


def test_input_and_output_disjunctions_in_separate_asserts_combine(tmp_path):
    body = """
(assert (or (and (>= X_0 0) (<= X_0 1)) (and (>= X_0 2) (<= X_0 3))))
(assert (>= X_1 0)) (assert (<= X_1 1))
(assert (or (>= Y_0 Y_1) (>= Y_0 Y_2)))
"""
    prop = read_vnnlib(write(tmp_path, body))
    assert len(prop.queries) == 2 and all(len(q.unsafe_outputs.conjunctions) == 2 for q in prop.queries)


def test_no_output_constraint_makes_every_output_unsafe(tmp_path):
    (query,) = read_vnnlib(write(tmp_path, BOUNDS)).queries
    assert query.unsafe_outputs.contains(torch.randn(10, 3)).all()


def test_gzipped_files_are_read(tmp_path):
    path = tmp_path / "p.vnnlib.gz"
    with gzip.open(path, "wt") as handle:
        handle.write(HEADER + BOUNDS + "(assert (>= Y_0 1))")
    assert read_vnnlib(path).queries[0].input_set.upper.tolist() == [1.5, 2.0]


MALFORMED = [
    # (body after HEADER, expected "line:column", what the message must say)
    (BOUNDS + "(assert (or (>= Y_0 1)\n", "7:9", r"this '\(' is never closed: add the missing '\)'"),
    (BOUNDS + "(assert (>= Y_0 1)))\n", "7:20", r"unbalanced '\)': remove it"),
    (BOUNDS + "(assert (foo Y_0 1))", "7:10", "unknown operator 'foo' in a formula"),
    (BOUNDS + "(assert (>= (exp Y_0) 1))", "7:14", "unknown operator 'exp' in a term"),
    (BOUNDS + "(assert (>= Y_7 1))", "7:13", r"Y_7 is used but not declared: add \(declare-const Y_7 Real\)"),
    (BOUNDS + "(assert (<= X_9 1))", "7:13", "X_9 is used but not declared"),
    ("(assert (<= X_0 1)) (assert (>= X_1 0)) (assert (<= X_1 1))", "1:16",
     r"input X_0 \(declared here\) has no lower bound; every input needs both bounds: add \(assert \(>= X_0"),
    ("(assert (or (and (>= X_0 0) (<= X_0 1) (>= X_1 0) (<= X_1 1)) (and (>= X_0 0) (<= X_0 1) (>= X_1 0))))", "2:16",
     "X_1 .* has no upper bound in case 2 of 2"),
    (BOUNDS + "(assert (<= X_0 Y_0))", "7:13", "mixes inputs X and outputs Y"),
    (BOUNDS + "(assert (<= (+ X_0 X_1) 1))", "7:13", "one input at a time"),
    (BOUNDS + "(assert (<= (* Y_0 Y_1) 1))", "7:14", "product of two variables is not linear"),
    (BOUNDS + "Y_0", "7:1", "stands outside any command"),
    (BOUNDS + "(assert (<= Y_0 1e999))", "7:17", "outside the float64 range"),
    (BOUNDS + "(assert (<= Y_0 1.2.3))", "7:17", "expected a number or a declared variable, found '1.2.3'"),
    (BOUNDS + "(assert (<= Y_0 nan))", "7:17", "found 'nan'"),
    (BOUNDS + "(assert (<= Y_0 1) (<= Y_1 1))", "7:2", r"takes exactly one formula, got 2; combine them with \(and"),
    (BOUNDS + "(push 1)", "7:2", "unsupported command 'push'"),
    (BOUNDS + "(assert (<= 2 1))", "7:10", "can never hold"),
    ("(assert (>= X_0 2)) (assert (<= X_0 1)) (assert (>= X_1 0)) (assert (<= X_1 1))", "1:16",
     "X_0 must be ≥ 2.0 and ≤ 1.0, which no number is"),
    (BOUNDS + "()", "7:1", r"expected an operator after '\('"),
    (BOUNDS + "(assert (and))", "7:10", r"\(and\) needs at least one formula"),
    (BOUNDS + "(assert (>= (/ Y_0 Y_1) 1))", "7:14", "divides a term by one nonzero number"),
]


@pytest.mark.parametrize("body, place, message", MALFORMED)
def test_malformed_files_name_the_file_the_place_and_the_fix(tmp_path, body, place, message):
    path = write(tmp_path, body)
    with pytest.raises(SpecError, match=message) as info:
        read_vnnlib(path)
    assert str(info.value).startswith(f"{path}:{place}: ")


@pytest.mark.parametrize("text, place, message", [
    ("(declare-const X_0 Real)(declare-const X_2 Real)(declare-const Y_0 Real)", "1:40", "X_1 is not declared, but X_2 is"),
    ("(declare-const X_0 Real)\n(declare-const X_0 Real)", "2:16", r"X_0 is declared twice \(first at .*:1:16\)"),
    ("(declare-const X_0 Int)", "1:20", "only Real variables"),
    ("(declare-const Z Real)", "1:16", "named X_i .* or Y_j"),
    ("(declare-const X_0)", "1:1", r"expected \(declare-const NAME Real\)"),
])
def test_bad_declarations(tmp_path, text, place, message):
    path = write(tmp_path, text, header="")
    with pytest.raises(SpecError, match=message) as info:
        read_vnnlib(path)
    assert str(info.value).startswith(f"{path}:{place}: ")


def test_size_mismatches_missing_declarations_and_missing_files(tmp_path):
    path = write(tmp_path, BOUNDS + "(assert (>= Y_0 1))")
    with pytest.raises(SpecError, match=r":2:16: the file declares 2 inputs \(X_0 … X_1\), but num_inputs=5"):
        read_vnnlib(path, num_inputs=5)
    with pytest.raises(SpecError, match=r":5:16: the file declares 3 outputs \(Y_0 … Y_2\), but num_outputs=4"):
        read_vnnlib(path, num_outputs=4)
    with pytest.raises(SpecError, match="no outputs are declared"):
        read_vnnlib(write(tmp_path, "(declare-const X_0 Real)(assert (<= X_0 1))", header=""))
    with pytest.raises(SpecError, match="has no \\(assert"):
        read_vnnlib(write(tmp_path, ""))
    with pytest.raises(SpecError, match="cannot read the VNN-LIB file"):
        read_vnnlib(tmp_path / "missing.vnnlib")


def test_a_large_file_parses_quickly_enough(tmp_path):
    """A 20,000-input file (the shape of VNN-COMP's image benchmarks) goes through the fast lanes."""
    n = 20_000
    lines = [f"(declare-const X_{i} Real)" for i in range(n)] + [f"(declare-const Y_{j} Real)" for j in range(10)]
    lines += [f"(assert (<= X_{i} {i / n + 0.01!r}))\n(assert (>= X_{i} {i / n - 0.01!r}))" for i in range(n)]
    lines.append("(assert (or " + " ".join(f"(and (>= Y_{j} Y_0))" for j in range(1, 10)) + "))")
    path = tmp_path / "big.vnnlib"
    path.write_text("\n".join(lines))
    (query,) = read_vnnlib(path, num_inputs=n, num_outputs=10).queries
    assert query.input_set.upper[123].item() == 123 / n + 0.01
    assert len(query.unsafe_outputs.conjunctions) == 9


def test_absurdly_deep_nesting_is_an_error_not_a_crash(tmp_path):
    deep = "(and " * 3000 + "(>= Y_0 0)" + ")" * 3000
    with pytest.raises(SpecError, match="nests its formulas too deeply"):
        read_vnnlib(write(tmp_path, BOUNDS + f"(assert {deep})"))


def test_the_case_limit_refuses_a_product_of_disjunctions_not_one_long_disjunction(tmp_path, monkeypatch):
    """Distributing two (or ...) asserts over each other multiplies their cases beyond what the
    file states (refused past the limit); one (or ...) listing its cases, as nn4sys' lindex_60000
    lists 120,000, is as large as the file and is read whole."""
    import assay.sets.vnnlib as vnnlib

    monkeypatch.setattr(vnnlib, "_MAX_CASES", 10)
    boxes = "".join(f"(and (>= X_0 {k}) (<= X_0 {k + 0.5}) (>= X_1 0) (<= X_1 1) (>= Y_0 {k}))\n" for k in range(12))
    prop = read_vnnlib(write(tmp_path, f"(assert (or {boxes}))"), num_inputs=2, num_outputs=3)
    assert len(prop.queries) == 12
    two = "(assert (or " + " ".join(f"(and (>= X_0 {k}) (<= X_0 {k + 0.5}))" for k in range(4)) + "))\n"
    two += "(assert (or " + " ".join(f"(and (>= X_1 {k}) (<= X_1 {k + 0.5}))" for k in range(4)) + "))\n"
    with pytest.raises(SpecError, match="16 cases"):
        read_vnnlib(write(tmp_path, two + "(assert (>= Y_0 1))", name="two.vnnlib"), num_inputs=2, num_outputs=3)
