"""VNN-LIB 1.0 reader and writer (the VNN-COMP subset).

POLARITY — read this first. A VNN-LIB file describes a **counterexample**: an input ``X`` and
output ``Y = f(X)`` that satisfy every assert. The property the file encodes HOLDS iff **no**
such pair exists (the asserted formula is unsatisfiable for the network). The names here keep
that polarity so that no caller can read it backwards:

* :class:`CounterexampleQuery` ``(input_set, unsafe_outputs)``: a counterexample is an ``x`` in
  ``input_set`` whose output lies in ``unsafe_outputs`` (the *forbidden* region);
* :class:`VnnlibProperty` ``.queries``: the property holds iff **every** query is infeasible.

Supported syntax: ``(declare-const X_i Real)``, ``(declare-const Y_j Real)``, ``(assert F)``
where F is built from ``and``, ``or``, ``<=``, ``>=``, ``=`` (and ``<``, ``>``, read as their
closures, which over-approximates the counterexample region: sound for proving that the
property holds; a counterexample on the boundary must be re-checked) over linear terms:
variables, numbers (``3``, ``-0.5``, ``1.5e-3``), ``(+ ...)``, ``(- a b ...)``, ``(- a)``,
``(* number term)`` and ``(/ term number)``; ``;`` comments; ``(check-sat)``, ``(get-model)``,
``(set-logic ...)``, ``(set-info ...)`` and ``(exit)`` are ignored. Constraints on inputs must bound
one input at a time, and every input needs both bounds in every case. Decimal literals are read
as the nearest float64 (as VNN-COMP tools do); an input bound computed by arithmetic (e.g.
``(<= (* 3 X_0) 1)``) is rounded outwards so that the box contains the exact set.

Structure: the asserts are conjoined and put in disjunctive normal form. Cases with the same
input box become one query whose ``unsafe_outputs`` is the OR of their output constraints;
cases with different boxes (a top-level ``(or (and X-bounds Y-constraints) ...)``, as in some
VNN-COMP benchmarks) become separate queries. Cases whose input bounds contradict each other
have no counterexample and are dropped.
"""

from __future__ import annotations

import gzip
import math
import re
from dataclasses import dataclass
from fractions import Fraction
from itertools import chain, product
from pathlib import Path

import numpy as np
import torch

from assay.errors import SpecError
from assay.sets.box import Box
from assay.sets.spec import HalfSpaces, OutputSpec

__all__ = ["CounterexampleQuery", "VnnlibProperty", "read_vnnlib", "write_vnnlib"]

# Anything that is not whitespace is a comment, a parenthesis or an atom; whitespace is skipped by finditer.
_TOKEN = re.compile(r";[^\n]*|[()]|[^\s();]+")
_VARIABLE = re.compile(r"([XY])_(\d+)")
_NUMBER = re.compile(r"[+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?")
# Fast lanes for the lines that make up almost all of a large file (one per input bound and per
# declaration): matched by one regex each, so the general parser only sees what remains.
_ATOM = r"([^\s();]+)"
_SIMPLE_DECLARATION = re.compile(r"\(\s*declare-const\s+" + _ATOM + r"\s+" + _ATOM + r"\s*\)")
_SIMPLE_ASSERT = re.compile(r"\(\s*assert\s*\(\s*(<=|>=|<|>)\s+" + _ATOM + r"\s+" + _ATOM + r"\s*\)\s*\)")
_COMMENT = re.compile(r";[^\n]*")
# An input bound (op X_i number) anywhere inside a formula: the bulk of large disjunctive files
# (nn4sys' cardinality properties hold 463,500 of them in (or (and ...))).
_NESTED_INPUT_BOUND = re.compile(r"\(\s*(<=|>=|<|>)\s+(X_\d+)\s+(" + _NUMBER.pattern + r")\s*\)")
_PLACED = "#"  # what scan leaves in the text where it read such a bound (see _Reader.placed)
_IGNORED_COMMANDS = frozenset({"check-sat", "get-model", "set-logic", "set-info", "set-option", "exit"})
_COMPARISONS = frozenset({"<=", ">=", "<", ">", "="})
# Distributing AND over OR multiplies the number of cases; beyond this the property is unreasonable
# (one (or ...) of many cases, as written in the file, is not limited: nn4sys' lindex_60000 lists 120,000).
_MAX_CASES = 100_000


# ---------------------------------------------------------------------------------------- values
@dataclass(frozen=True, eq=False)
class CounterexampleQuery:
    """One search for a COUNTEREXAMPLE: an ``x`` in ``input_set`` with ``f(x)`` in ``unsafe_outputs``.

    ``unsafe_outputs`` is the FORBIDDEN output region (an OR of conjunctions of ``C y + d ≥ 0``).
    The query is *infeasible* (good) iff no input of the box maps into it. Pass it to a verifier as
    ``unsafe=query.unsafe_outputs``, never as a required region.
    """

    input_set: Box
    unsafe_outputs: OutputSpec

    def __post_init__(self):
        if not isinstance(self.input_set, Box) or not isinstance(self.unsafe_outputs, OutputSpec):
            raise SpecError("a CounterexampleQuery needs a Box input_set and an OutputSpec unsafe_outputs")

    def to_json(self) -> dict:
        return {"input_set": self.input_set.to_json(), "unsafe_outputs": self.unsafe_outputs.to_json()}


@dataclass(frozen=True, eq=False)
class VnnlibProperty:
    """A VNN-LIB property: it HOLDS iff NO query has a counterexample (every query is infeasible).

    Attributes:
        path: the file it was read from.
        num_inputs, num_outputs: the declared X_i and Y_j counts; every ``input_set`` is a flat
            Box of shape (num_inputs,) (reshape it to the network's input shape).
        queries: the counterexample queries, in the order their cases appear in the file.
    """

    path: str
    num_inputs: int
    num_outputs: int
    queries: tuple[CounterexampleQuery, ...]

    def to_json(self) -> dict:
        return {
            "path": self.path, "num_inputs": self.num_inputs, "num_outputs": self.num_outputs,
            "holds_iff": "no query has an input in input_set whose output lies in unsafe_outputs",
            "queries": [q.to_json() for q in self.queries],
        }


# ---------------------------------------------------------------------------------------- reading
# An atom is a tuple: ("lower" | "upper", input index, value) or ("row", {output index: coefficient}, constant),
# the latter meaning Σ coefficient·y + constant ≥ 0. A conjunction is a list of atoms; a formula in
# disjunctive normal form is a list of conjunctions ([] = unsatisfiable, [[]] = always true).


def _blank(match: re.Match) -> str:
    return " " * (match.end() - match.start())


class _Reader:
    """One file's text, declarations and position-aware errors."""

    def __init__(self, text: str, path: str):
        self.text = text
        self.path = path
        self.variables: dict[str, tuple[str, int]] = {}
        self.declared_at: dict[str, int] = {}
        # offset of '(' → (atom, end) of the nested input bounds scan read directly
        self.placed: dict[int, tuple[tuple, int]] = {}

    # ------------------------------------------------------------ errors
    def where(self, offset: int | None) -> str:
        if offset is None:
            return self.path
        line = self.text.count("\n", 0, offset) + 1
        column = offset - (self.text.rfind("\n", 0, offset) + 1) + 1
        return f"{self.path}:{line}:{column}"

    def error(self, offset: int | None, message: str) -> SpecError:
        return SpecError(f"{self.where(offset)}: {message}")

    # ------------------------------------------------------------ syntax
    def scan(self) -> tuple[list[tuple], str]:
        """Split the file into simple asserts ``(assert (op a b))`` and the text of the rest.

        Declarations are recorded on the way. Comments and everything the fast lanes take are
        blanked with spaces of the same length, so every offset still points into the file.
        """
        text = _COMMENT.sub(_blank, self.text) if ";" in self.text else self.text
        for match in _SIMPLE_DECLARATION.finditer(text):
            self.declare_atoms((match.group(1), match.start(1)), (match.group(2), match.start(2)))
        text = _SIMPLE_DECLARATION.sub(_blank, text)
        simple = [(m.group(1), m.start(1), m.group(2), m.start(2), m.group(3), m.start(3)) for m in _SIMPLE_ASSERT.finditer(text)]
        return simple, _SIMPLE_ASSERT.sub(_blank, text)

    def tree(self, rest: str) -> list[list]:
        """The parse tree of what :meth:`scan` left (nested input bounds read on the way)."""
        if "X_" in rest:
            rest = _NESTED_INPUT_BOUND.sub(self._place_input_bound, rest)
        return self.parse_tree(rest)

    def _place_input_bound(self, match: re.Match) -> str:
        """Read a nested ``(op X_i number)`` now and leave one token in its place (same length, so
        offsets still point into the file): the tree then has one atom where it had five tokens.
        (:meth:`input_bound` inlined: this runs once per bound, 463,500 times in nn4sys' largest
        files; the pattern admits numbers only.)"""
        op, name, number = match.groups()
        variable = self.variables.get(name)
        value = float(number)
        if variable is None or variable[0] != "X" or not math.isfinite(value):
            return match.group()  # not an input bound after all (undeclared X, overflow): the general path
        start, end = match.span()
        self.placed[start] = (("upper" if op in ("<=", "<") else "lower", variable[1], value), end)
        return _PLACED + " " * (end - start - 1)

    def parse_tree(self, text: str) -> list[list]:
        """The commands as nested lists: a node is ``[offset of '(', child, ...]``, an atom ``(text, offset)``."""
        commands: list = []
        stack: list[list] = []
        current = commands
        for match in _TOKEN.finditer(text):
            piece = match.group()
            if piece == "(":
                node = [match.start()]
                current.append(node)
                stack.append(current)
                current = node
            elif piece == ")":
                if not stack:
                    raise self.error(match.start(), "unbalanced ')': remove it or add the matching '('")
                current = stack.pop()
            elif piece[0] != ";":
                if piece == _PLACED and match.start() in self.placed:  # shown as written in messages
                    piece = self.text[match.start():self.placed[match.start()][1]]
                if not stack:
                    raise self.error(match.start(), f"'{piece}' stands outside any command; wrap it in (assert ...) or remove it")
                current.append((piece, match.start()))
        if stack:
            raise self.error(current[0], "this '(' is never closed: add the missing ')'")
        return commands

    def head(self, node: list, expected: str) -> tuple[str, int]:
        if len(node) < 2 or not isinstance(node[1], tuple):
            raise self.error(node[0], f"expected an operator after '(' ({expected})")
        return node[1]

    # ------------------------------------------------------------ commands
    def read_commands(self, commands: list) -> list[list]:
        """Record the declarations; return the asserted formulas."""
        formulas = []
        for command in commands:
            name, offset = self.head(command, "a command such as (declare-const X_0 Real) or (assert ...)")
            if name == "declare-const":
                self.declare(command)
            elif name == "assert":
                if len(command) != 3:
                    raise self.error(offset, f"(assert F) takes exactly one formula, got {len(command) - 2}; combine them with (and ...)")
                formulas.append(command[2])
            elif name not in _IGNORED_COMMANDS:
                raise self.error(offset, f"unsupported command '{name}' (supported: declare-const, assert)")
        return formulas

    def declare(self, command: list) -> None:
        if len(command) != 4 or not isinstance(command[2], tuple) or not isinstance(command[3], tuple):
            raise self.error(command[0], "expected (declare-const NAME Real)")
        self.declare_atoms(command[2], command[3])

    def declare_atoms(self, variable: tuple[str, int], sort_atom: tuple[str, int]) -> None:
        (name, offset), (sort, sort_offset) = variable, sort_atom
        match = _VARIABLE.fullmatch(name)
        if not match:
            raise self.error(offset, f"variables must be named X_i (inputs) or Y_j (outputs), not '{name}'")
        if sort != "Real":
            raise self.error(sort_offset, f"only Real variables are supported, not '{sort}'")
        if name in self.variables:
            raise self.error(offset, f"{name} is declared twice (first at {self.where(self.declared_at[name])}); remove one")
        self.variables[name] = (match.group(1), int(match.group(2)))
        self.declared_at[name] = offset

    def count(self, kind: str, expected: int | None, what: str, parameter: str) -> int:
        """The number of declared ``kind`` variables, checked to be 0 … n−1 and to equal ``expected``."""
        names = sorted((index, name) for name, (k, index) in self.variables.items() if k == kind)
        for position, (index, name) in enumerate(names):
            if index != position:
                raise self.error(self.declared_at[name], f"{kind}_{position} is not declared, but {name} is: declare the {what} as {kind}_0 … {kind}_{len(names) - 1} without gaps")
        if not names:
            raise self.error(None, f"no {what} are declared: add (declare-const {kind}_0 Real) and so on")
        if expected is not None and len(names) != expected:
            last = self.declared_at[names[-1][1]]
            raise self.error(last, f"the file declares {len(names)} {what} ({kind}_0 … {kind}_{len(names) - 1}), but {parameter}={expected} (the network's) was given; use the property file written for this network")
        return len(names)

    # ------------------------------------------------------------ formulas
    def simple_atoms(self, simple: list[tuple]) -> list:
        """The atoms of the simple asserts ``(assert (op a b))`` found by :meth:`scan` (all conjoined)."""
        atoms = []
        for op, op_offset, left, left_offset, right, right_offset in simple:
            bound = self.input_bound(op, left, right)
            if bound is not None:
                atoms.append(bound)
                continue
            cases = self.comparison(op, op_offset, [(left, left_offset), (right, right_offset)])
            if not cases:
                raise self.error(op_offset, "this assert can never hold, so the file describes no counterexample; check its bounds and signs")
            atoms += cases[0]
        return atoms

    def input_bound(self, op: str, left: str, right: str):
        """The atom of ``(op X_i number)`` directly (the bulk of large files), or None for anything else."""
        variable = self.variables.get(left)
        if variable is None or variable[0] != "X" or not _NUMBER.fullmatch(right):
            return None
        value = float(right)
        if not math.isfinite(value):
            return None  # the general path reports it
        return ("upper" if op in ("<=", "<") else "lower", variable[1], value)

    def formula(self, node) -> list[list]:
        """A formula in disjunctive normal form (see the atom comment above)."""
        if isinstance(node, tuple):
            placed = self.placed.get(node[1])
            if placed is not None:
                return [[placed[0]]]
            raise self.error(node[1], f"expected a formula such as (<= X_0 1.0), found '{node[0]}'")
        name, offset = self.head(node, "and, or, <=, >=")
        args = node[2:]
        if name in _COMPARISONS:
            return self.comparison(name, offset, args)
        if name == "and" or name == "or":
            if not args:
                raise self.error(offset, f"({name}) needs at least one formula")
            if name == "and":  # the input bounds scan read, in one step (bounds of a box commute)
                placed = [self.placed[a[1]][0] for a in args if isinstance(a, tuple) and a[1] in self.placed]
                if placed:
                    rest = [a for a in args if not (isinstance(a, tuple) and a[1] in self.placed)]
                    return self.conjunction([[placed]] + [self.formula(a) for a in rest], offset)
            parts = [self.formula(a) for a in args]
            return self.disjunction(parts) if name == "or" else self.conjunction(parts, offset)
        raise self.error(offset, f"unknown operator '{name}' in a formula (supported: and, or, <=, >=, <, >, =)")

    @staticmethod
    def disjunction(parts: list[list[list]]) -> list[list]:
        return [conjunction for part in parts for conjunction in part]

    def conjunction(self, parts: list[list[list]], offset: int) -> list[list]:
        if any(not part for part in parts):
            return []
        if all(len(part) == 1 for part in parts):
            return [[atom for part in parts for atom in part[0]]]
        cases = math.prod(len(part) for part in parts)
        if cases > _MAX_CASES:
            raise self.error(offset, f"this (and ...) of disjunctions expands to {cases} cases (more than {_MAX_CASES}); simplify the property")
        return [list(chain.from_iterable(combination)) for combination in product(*parts)]

    def comparison(self, name: str, offset: int, args: list) -> list[list]:
        if len(args) < 2:
            raise self.error(offset, f"({name} a b) compares at least two terms, got {len(args)}")
        terms = [self.term(a) for a in args]
        atoms = []
        for (left, left_node), right in zip(zip(terms, args), terms[1:]):
            anchor = left_node[1] if isinstance(left_node, tuple) else left_node[0]
            if name in (">=", ">", "="):
                atom = self.atom(_difference(left, right), anchor)
                if atom is False:
                    return []
                atoms += [atom] if atom is not True else []
            if name in ("<=", "<", "="):
                atom = self.atom(_difference(right, left), anchor)
                if atom is False:
                    return []
                atoms += [atom] if atom is not True else []
        return [atoms]

    def term(self, node) -> tuple[dict, float | Fraction]:
        """A linear term as ({variable name: coefficient}, constant)."""
        if isinstance(node, tuple):
            text, offset = node
            if text in self.variables:
                return {text: 1.0}, 0.0
            return {}, self.number(text, offset)
        name, offset = self.head(node, "+, -, *, /")
        if name not in ("+", "-", "*", "/"):
            raise self.error(offset, f"unknown operator '{name}' in a term (supported: +, -, * by a number, / by a number)")
        parts = [self.term(a) for a in node[2:]]
        if not parts:
            raise self.error(offset, f"({name}) needs at least one term")
        if name == "+":
            return _combine(parts, [1] * len(parts))
        if name == "-":
            return _combine(parts, [-1]) if len(parts) == 1 else _combine(parts, [1] + [-1] * (len(parts) - 1))
        if name == "*":
            return self.product(parts, offset)
        (numerator, divisor) = parts if len(parts) == 2 else (None, None)
        if divisor is None or divisor[0] or divisor[1] == 0:
            raise self.error(offset, "(/ term number) divides a term by one nonzero number")
        return _combine([numerator], [1 / Fraction(divisor[1])])

    def product(self, parts: list, offset: int) -> tuple[dict, Fraction]:
        with_variables = [p for p in parts if p[0]]
        if len(with_variables) > 1:
            raise self.error(offset, "a product of two variables is not linear; VNN-LIB properties must be linear")
        scale = Fraction(1)
        for variables, constant in parts:
            if not variables:
                scale *= Fraction(constant)
        base = with_variables[0] if with_variables else ({}, 1)
        return _combine([base], [scale])

    def number(self, text: str, offset: int) -> float:
        if _VARIABLE.fullmatch(text):
            raise self.error(offset, f"{text} is used but not declared: add (declare-const {text} Real)")
        if not _NUMBER.fullmatch(text):
            raise self.error(offset, f"expected a number or a declared variable, found '{text}'")
        value = float(text)
        if not math.isfinite(value):
            raise self.error(offset, f"the number {text} is outside the float64 range")
        return value

    def atom(self, linear: tuple[dict, float | Fraction], offset: int):
        """``Σ c·v + constant ≥ 0`` as an input bound, an output row, or True/False when it has no variables."""
        coefficients, constant = linear
        coefficients = {name: c for name, c in coefficients.items() if c != 0}
        if not coefficients:
            return constant >= 0
        kinds = {self.variables[name][0] for name in coefficients}
        if kinds == {"Y"}:
            return ("row", {self.variables[name][1]: c for name, c in coefficients.items()}, constant)
        if kinds != {"X"}:
            raise self.error(offset, "this constraint mixes inputs X and outputs Y; assay reads input bounds and output constraints only")
        if len(coefficients) != 1:
            raise self.error(offset, "input constraints must bound one input at a time, e.g. (<= X_0 0.5); general input polytopes are not supported in VNN-LIB files")
        ((name, c),) = coefficients.items()
        index = self.variables[name][1]
        if isinstance(c, float) and isinstance(constant, float) and abs(c) == 1.0:
            return ("lower" if c > 0 else "upper", index, -constant / c)  # exact: division by ±1
        # c·x + constant ≥ 0 ⇔ x ≥ −constant/c (c > 0) or x ≤ −constant/c (c < 0): round the bound outwards.
        bound = -Fraction(constant) / Fraction(c)
        return ("lower", index, _float_down(bound)) if c > 0 else ("upper", index, _float_up(bound))


def _combine(parts: list[tuple[dict, float | Fraction]], scales: list) -> tuple[dict, Fraction]:
    """Σ scale·part, in exact rational arithmetic (compound terms are rare; exactness keeps bounds sound)."""
    coefficients: dict[str, Fraction] = {}
    constant = Fraction(0)
    for (variables, value), scale in zip(parts, scales):
        for name, c in variables.items():
            coefficients[name] = coefficients.get(name, 0) + Fraction(scale) * Fraction(c)
        constant += Fraction(scale) * Fraction(value)
    return coefficients, constant


def _difference(big: tuple[dict, float | Fraction], small: tuple[dict, float | Fraction]) -> tuple[dict, float | Fraction]:
    """big − small (so that ``≥ 0`` is the comparison big ≥ small).

    The common case, a variable against a number or another variable (float coefficients 1.0 and
    at most one nonzero float constant), is exact in floats; anything else goes through exact
    rational arithmetic.
    """
    (big_vars, big_const), (small_vars, small_const) = big, small
    if not (isinstance(big_const, float) and isinstance(small_const, float) and (big_const == 0 or small_const == 0)):
        return _combine([big, small], [1, -1])
    coefficients = dict(big_vars)
    for name, c in small_vars.items():
        coefficients[name] = coefficients.get(name, 0.0) - c
    return coefficients, big_const - small_const


def _float_down(value: Fraction) -> float:
    result = float(value)
    return math.nextafter(result, -math.inf) if Fraction(result) > value else result


def _float_up(value: Fraction) -> float:
    result = float(value)
    return math.nextafter(result, math.inf) if Fraction(result) < value else result


def _read_text(path: Path) -> str:
    try:
        if path.suffix.lower() == ".gz":
            with gzip.open(path, "rt", encoding="utf-8") as handle:
                return handle.read()
        return path.read_text(encoding="utf-8")
    except OSError as exc:
        raise SpecError(f"cannot read the VNN-LIB file {path}: {exc.strerror or exc}; check the path") from exc
    except (UnicodeDecodeError, EOFError) as exc:
        raise SpecError(f"{path} is not a text VNN-LIB file ({exc})") from exc


def read_vnnlib(path, num_inputs: int | None = None, num_outputs: int | None = None) -> VnnlibProperty:
    """Read a VNN-LIB file into COUNTEREXAMPLE queries (the property holds iff every query is infeasible).

    Args:
        path: a ``.vnnlib`` file (or ``.vnnlib.gz``).
        num_inputs, num_outputs: the numbers of X and Y variables expected (the network's);
            a mismatch raises SpecError. None: accept what the file declares.
    Returns:
        a :class:`VnnlibProperty`; each query's ``input_set`` is a flat Box of shape (num_inputs,)
        and ``unsafe_outputs`` the FORBIDDEN output region. See the module docstring for how
        disjunctions become queries and conjunctions.
    Raises:
        SpecError naming the file, line and column, and the fix: unbalanced parentheses, an
        unknown operator, an undeclared variable, an input without both bounds, a size mismatch.
    """
    path = Path(path)
    reader = _Reader(_read_text(path), str(path))
    simple, rest = reader.scan()
    flat = _read_flat_disjunction(reader, simple, rest, num_inputs, num_outputs)
    if flat is not None:
        return VnnlibProperty(str(path), *flat)
    formulas = reader.read_commands(reader.tree(rest))
    n_in = reader.count("X", num_inputs, "inputs", "num_inputs")
    n_out = reader.count("Y", num_outputs, "outputs", "num_outputs")
    if not formulas and not simple:
        raise reader.error(None, "the file has no (assert ...): it describes no counterexample; add the input bounds and the unsafe output region")
    common: list = reader.simple_atoms(simple)
    alternatives: list[tuple[int, list[list]]] = []
    for formula in formulas:
        try:
            cases = reader.formula(formula)
        except RecursionError:
            raise reader.error(formula[0], "this assert nests its formulas too deeply to read; flatten its (and ...)/(or ...)") from None
        if not cases:
            raise reader.error(formula[0] if isinstance(formula, list) else formula[1], "this assert can never hold, so the file describes no counterexample; check its bounds and signs")
        if len(cases) == 1:
            common += cases[0]
        else:
            alternatives.append((formula[0], cases))
    total = math.prod(len(cases) for _, cases in alternatives)
    # One disjunctive assert lists its cases (the file grows with them); only distributing
    # several over each other multiplies them beyond what the file states.
    if len(alternatives) > 1 and total > _MAX_CASES:
        raise reader.error(alternatives[-1][0], f"the asserts together expand to {total} cases (more than {_MAX_CASES}); simplify the property")
    queries = _queries(reader, common, [cases for _, cases in alternatives], total, n_in, n_out)
    return VnnlibProperty(str(path), n_in, n_out, queries)


def _queries(reader: _Reader, common: list, alternatives: list[list[list]], total: int, n_in: int, n_out: int) -> tuple[CounterexampleQuery, ...]:
    """Group the cases (common atoms + one conjunction of each disjunctive assert) by their input box."""
    base_lower, base_upper, base_rows = _apply(common, [-math.inf] * n_in, [math.inf] * n_in, [])
    base_box = None  # checked once, for the cases that add only output rows (the usual output disjunctions)
    boxes: dict[tuple, tuple[list, list]] = {}
    conjunctions: dict[tuple, list[HalfSpaces]] = {}
    first_contradiction = None
    for number, combination in enumerate(product(*alternatives)):
        atoms = list(chain.from_iterable(combination))
        if base_box is not None and all(atom[0] == "row" for atom in atoms):
            lower, upper, key = base_box
            rows = base_rows + atoms
        else:
            lower, upper, rows = _apply(atoms, list(base_lower), list(base_upper), list(base_rows))
            empty = next((i for i in range(n_in) if lower[i] > upper[i]), None)
            if empty is not None:  # an empty input box has no counterexample: the case is vacuous
                first_contradiction = first_contradiction or (empty, lower[empty], upper[empty])
                continue
            _check_bounded(reader, lower, upper, number, total)
            key = (tuple(lower), tuple(upper))
            if base_box is None and all(atom[0] == "row" for atom in atoms):
                base_box = (lower, upper, key)
        boxes.setdefault(key, (lower, upper))
        conjunctions.setdefault(key, []).append(_half_spaces(rows, n_out))
    if not boxes:
        index, low, high = first_contradiction
        raise reader.error(
            reader.declared_at[f"X_{index}"],
            f"X_{index} must be ≥ {low!r} and ≤ {high!r}, which no number is, so the file describes no counterexample; fix its bounds",
        )
    return tuple(
        CounterexampleQuery(Box(torch.tensor(lower, dtype=torch.float64), torch.tensor(upper, dtype=torch.float64)),
                            OutputSpec(tuple(conjunctions[key])))
        for key, (lower, upper) in boxes.items()
    )


# ---------------------------------------------------------------------------------------- bulk reading
# The layout that makes VNN-LIB files large (nn4sys: up to 120,000 cases and 1,000,000 bounds): one
# (assert (or (and A ...) ...)) whose atoms each compare one declared variable with a number. It is
# read in bulk, into arrays; anything else (and any malformed text) goes to the general reader,
# which also writes the error messages.
_FLAT_ASSERT = re.compile(r"\(\s*assert\s*\(\s*or(?=[\s()])(.*)\)\s*\)", re.S)
_BARE_COMMAND = re.compile(r"\(\s*(?:check-sat|get-model|exit)\s*\)")
# the whole body of the (or ...): one or more (and (op V_i number) ...), possessive (no backtracking)
_FLAT_BODY = re.compile(
    r"\s*+(?:\(\s*+and(?:\s*+\(\s*+(?:<=|>=|<|>)\s++[XY]_(?:0|[1-9]\d*+)\s++"
    r"[+-]?+(?:\d++\.?+\d*+|\.\d++)(?:[eE][+-]?+\d++)?+\s*+\))++\s*+\)\s*+)++"
)
_FLAT_CASE = re.compile(r"\(\s*and(?=[\s()])")
_FLAT_MAX_CELLS = 50_000_000  # cases × inputs beyond this: the general reader (memory)


def _read_flat_disjunction(reader: _Reader, simple: list[tuple], rest: str, num_inputs: int | None,
                           num_outputs: int | None) -> tuple[int, int, tuple[CounterexampleQuery, ...]] | None:
    """``(num_inputs, num_outputs, queries)`` read in bulk when the file has the flat layout above,
    else None (the general reader then reads it, and reports what is wrong).

    The result is the general reader's, query for query: the simple asserts are conjoined with every
    case; ``(<= X_i v)``/``(< X_i v)`` bounds X_i above by float(v) and ``>=``/``>`` below;
    ``(<= Y_j v)`` is the row −y_j + v ≥ 0 and ``(>= Y_j v)`` the row y_j − v ≥ 0; cases with an empty
    box are dropped; cases with the same box become one query (in order of first appearance) whose
    conjunctions are the cases' rows (in file order).
    """
    match = _FLAT_ASSERT.search(rest)
    if match is None or _BARE_COMMAND.sub("", rest[:match.start()] + rest[match.end():]).strip():
        return None
    try:  # a bad declaration: the general reader reports it where the file has it
        n_in = reader.count("X", num_inputs, "inputs", "num_inputs")
        n_out = reader.count("Y", num_outputs, "outputs", "num_outputs")
    except SpecError:
        return None
    body = match.group(1)
    if _FLAT_BODY.fullmatch(body) is None:
        return None
    # The body is (and atom ...) ... with each atom (op name number): one '(' per atom.
    per_case = [piece.count("(") for piece in _FLAT_CASE.split(body)[1:]]
    cases = len(per_case)
    if cases * n_in > _FLAT_MAX_CELLS:
        return None
    words = _FLAT_CASE.sub(" ", body).replace("(", " ").replace(")", " ").split()
    ops, names, numbers = words[0::3], words[1::3], words[2::3]
    atoms = len(ops)
    if not set(names) <= reader.variables.keys():
        return None  # an undeclared variable: the general reader says which
    index_of = {name: number for name, (_, number) in reader.variables.items()}
    input_names = {name for name, (kind, _) in reader.variables.items() if kind == "X"}
    case = np.repeat(np.arange(cases), per_case)
    upper = np.fromiter(map(("<=", "<").__contains__, ops), bool, atoms)
    is_input = np.fromiter(map(input_names.__contains__, names), bool, atoms)
    index = np.fromiter(map(index_of.__getitem__, names), np.int64, atoms)
    value = np.fromiter(map(float, numbers), np.float64, atoms)
    if not np.isfinite(value).all():
        return None  # a number outside the float64 range: the general reader says which

    base_lower, base_upper, base_rows = _apply(reader.simple_atoms(simple), [-math.inf] * n_in, [math.inf] * n_in, [])
    lower = np.tile(np.array(base_lower, dtype=np.float64), (cases, 1))
    high = np.tile(np.array(base_upper, dtype=np.float64), (cases, 1))
    below, above = is_input & ~upper, is_input & upper
    np.maximum.at(lower, (case[below], index[below]), value[below])
    np.minimum.at(high, (case[above], index[above]), value[above])
    kept = np.flatnonzero(~(lower > high).any(1))
    if not len(kept) or not (np.isfinite(lower[kept]).all() and np.isfinite(high[kept]).all()):
        return None  # no case has a counterexample, or some input lacks a bound: the general reader says which

    # Every case's conjunction Σ c·y + d ≥ 0: the simple asserts' rows, then its own (file
    # order); a case without rows gets the one all-zero row (every output). Built in one array,
    # then viewed case by case (the arrays are checked here: finite, one row at least).
    output = ~is_input
    own = np.bincount(case[output], minlength=cases)
    base_C, base_d = np.zeros((0, n_out)), np.zeros(0)
    if base_rows:
        common = _half_spaces(base_rows, n_out)
        base_C, base_d = common.C.numpy(), common.d.numpy()
    count = np.maximum(len(base_rows) + own, 1)
    offset = np.cumsum(count) - count
    C = np.zeros((int(count.sum()), n_out))
    d = np.zeros(int(count.sum()))
    for row in range(len(base_rows)):
        C[offset + row], d[offset + row] = base_C[row], base_d[row]
    row_case = case[output]
    starts = np.cumsum(own) - own
    slot = offset[row_case] + len(base_rows) + (np.arange(len(row_case)) - starts[row_case])
    C[slot, index[output]] = np.where(upper[output], -1.0, 1.0)
    d[slot] = np.where(upper[output], value[output], 0.0 - value[output])
    rows = torch.from_numpy(C).split(count.tolist())
    constants = torch.from_numpy(d).split(count.tolist())

    keys = np.ascontiguousarray(np.hstack([lower[kept], high[kept]]) + 0.0)
    _, first, group = np.unique(keys.view(np.dtype((np.void, keys.dtype.itemsize * keys.shape[1]))).reshape(-1),
                                return_index=True, return_inverse=True)
    order = np.argsort(first, kind="stable")
    conjunctions: list[list[HalfSpaces]] = [[] for _ in order]
    position = np.empty_like(order)
    position[order] = np.arange(len(order))
    for number, slot in zip(kept.tolist(), position[group.reshape(-1)].tolist()):
        conjunctions[slot].append(HalfSpaces.from_checked(rows[number], constants[number]))
    firsts = kept[first[order]]
    boxes = zip(torch.from_numpy(lower[firsts]).unbind(0), torch.from_numpy(high[firsts]).unbind(0))
    queries = tuple(CounterexampleQuery(Box.from_checked(low, top), OutputSpec.from_checked(tuple(parts)))
                    for (low, top), parts in zip(boxes, conjunctions))
    return n_in, n_out, queries


def _apply(atoms: list, lower: list, upper: list, rows: list) -> tuple[list, list, list]:
    """Tighten the bounds with the atoms' input bounds and collect their output rows (in place)."""
    for atom in atoms:
        kind, index, value = atom
        if kind == "lower":
            if value > lower[index]:
                lower[index] = value
        elif kind == "upper":
            if value < upper[index]:
                upper[index] = value
        else:
            rows.append(atom)
    return lower, upper, rows


def _check_bounded(reader: _Reader, lower: list, upper: list, number: int, total: int) -> None:
    for i, (low, high) in enumerate(zip(lower, upper)):
        missing = "lower" if low == -math.inf else "upper" if high == math.inf else None
        if missing:
            case = f" in case {number + 1} of {total} of the disjunctions" if total > 1 else ""
            example = f"(assert (>= X_{i} ...))" if missing == "lower" else f"(assert (<= X_{i} ...))"
            raise reader.error(
                reader.declared_at[f"X_{i}"],
                f"input X_{i} (declared here) has no {missing} bound{case}; every input needs both bounds: add {example}",
            )


def _half_spaces(rows: list, n_out: int) -> HalfSpaces:
    """The rows Σ c·y + constant ≥ 0 as HalfSpaces; no rows means every output (one all-zero row)."""
    if not rows:
        return HalfSpaces(torch.zeros(1, n_out, dtype=torch.float64), torch.zeros(1, dtype=torch.float64))
    C = np.zeros((len(rows), n_out))
    d = np.empty(len(rows))
    for r, (_, coefficients, constant) in enumerate(rows):
        for j, c in coefficients.items():
            C[r, j] = float(c)
        # Rounding the constant up only enlarges the unsafe region (sound for "holds").
        d[r] = _float_up(constant) if isinstance(constant, Fraction) else constant
    return HalfSpaces(torch.from_numpy(C), torch.from_numpy(d))


# ---------------------------------------------------------------------------------------- writing
def _as_queries(prop) -> tuple[CounterexampleQuery, ...]:
    if isinstance(prop, VnnlibProperty):
        return prop.queries
    if isinstance(prop, CounterexampleQuery):
        return (prop,)
    queries = tuple(prop)
    for number, query in enumerate(queries):
        if not isinstance(query, CounterexampleQuery):
            raise SpecError(f"write_vnnlib takes a VnnlibProperty or CounterexampleQuery values; item {number} is a {type(query).__name__}")
    return queries


def _number(value: float) -> str:
    """The shortest text that reads back to exactly this float (no "-0.0")."""
    return repr(value + 0.0)


def _row_atom(coefficients: list[float], constant: float, names: list[str]) -> str:
    """The comparison text of ``Σ c·y + constant ≥ 0``, in the simplest form VNN-COMP tools read."""
    nonzero = [(names[j], c) for j, c in enumerate(coefficients) if c != 0]
    threshold = _number(0.0 - constant)
    if not nonzero:
        return f"(>= {_number(constant)} 0.0)"
    if len(nonzero) == 1 and abs(nonzero[0][1]) == 1.0:
        name, c = nonzero[0]
        return f"(>= {name} {threshold})" if c > 0 else f"(<= {name} {_number(constant)})"
    if len(nonzero) == 2 and constant == 0 and sorted(c for _, c in nonzero) == [-1.0, 1.0]:
        (big, _), (small, _) = sorted(nonzero, key=lambda item: -item[1])
        return f"(>= {big} {small})"
    terms = [f"(* {_number(c)} {name})" for name, c in nonzero]
    total = terms[0] if len(terms) == 1 else f"(+ {' '.join(terms)})"
    return f"(>= {total} {threshold})"


def write_vnnlib(path, queries_or_property) -> None:
    """Write counterexample queries as a VNN-LIB file that :func:`read_vnnlib` reads back to the same property.

    Args:
        path: the file to write.
        queries_or_property: a :class:`VnnlibProperty`, one :class:`CounterexampleQuery` or a
            sequence of them; every input set is written flattened, every unsafe region as is.
    The file keeps the polarity: its asserts describe a COUNTEREXAMPLE. One query becomes one
    assert per bound plus the unsafe output region; several become one top-level
    ``(or (and X-bounds Y-constraints) ...)`` with one case per query and conjunction (the
    VNN-COMP layout). Floats are written with ``repr`` (exact round trip). Reading back merges
    queries with identical boxes into one query (the same property).
    """
    queries = _as_queries(queries_or_property)
    if not queries:
        raise SpecError("write_vnnlib needs at least one query: a property without queries has no counterexample to describe")
    n_in, n_out = queries[0].input_set.dim, queries[0].unsafe_outputs.num_outputs
    for number, query in enumerate(queries):
        if query.input_set.dim != n_in or query.unsafe_outputs.num_outputs != n_out:
            raise SpecError(f"query {number} has {query.input_set.dim} inputs and {query.unsafe_outputs.num_outputs} outputs, but query 0 has {n_in} and {n_out}")
        if not (torch.isfinite(query.input_set.lower).all() and torch.isfinite(query.input_set.upper).all()):
            raise SpecError(f"query {number}'s input box has infinite bounds; VNN-LIB needs finite bounds on every input")
    x_names, y_names = [f"X_{i}" for i in range(n_in)], [f"Y_{j}" for j in range(n_out)]
    lines = [
        "; written by assay. The asserts describe a COUNTEREXAMPLE:",
        "; the property holds iff no input and output satisfy all of them.",
        *(f"(declare-const {name} Real)" for name in x_names),
        *(f"(declare-const {name} Real)" for name in y_names),
    ]
    if len(queries) == 1:
        lines += [f"(assert {atom})" for atom in _box_atoms(queries[0].input_set, x_names)]
        lines += _single_query_outputs(queries[0].unsafe_outputs, y_names)
    else:
        cases = []
        for query in queries:
            bounds = " ".join(_box_atoms(query.input_set, x_names))
            for conjunction in query.unsafe_outputs.conjunctions:
                cases.append(f"    (and {bounds} {' '.join(_conjunction_atoms(conjunction, y_names))})")
        lines += ["(assert (or", *cases, "))"]
    try:
        Path(path).write_text("\n".join(lines) + "\n", encoding="utf-8")
    except OSError as exc:
        raise SpecError(f"cannot write the VNN-LIB file {path}: {exc.strerror or exc}") from exc


def _box_atoms(box: Box, x_names: list[str]) -> list[str]:
    lower, upper = box.lower.reshape(-1).tolist(), box.upper.reshape(-1).tolist()
    atoms = []
    for name, low, high in zip(x_names, lower, upper):
        atoms += [f"(>= {name} {_number(low)})", f"(<= {name} {_number(high)})"]
    return atoms


def _conjunction_atoms(conjunction: HalfSpaces, y_names: list[str]) -> list[str]:
    return [_row_atom(row, constant, y_names) for row, constant in zip(conjunction.C.tolist(), conjunction.d.tolist())]


def _single_query_outputs(unsafe: OutputSpec, y_names: list[str]) -> list[str]:
    if len(unsafe.conjunctions) == 1:
        return [f"(assert {atom})" for atom in _conjunction_atoms(unsafe.conjunctions[0], y_names)]
    cases = [f"    (and {' '.join(_conjunction_atoms(c, y_names))})" for c in unsafe.conjunctions]
    return ["(assert (or", *cases, "))"]
