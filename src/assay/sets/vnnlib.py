"""VNN-LIB 1.0 reader and writer (the VNN-COMP subset).

A VNN-LIB file describes a **counterexample**: inputs ``X_i`` and outputs ``Y_j`` satisfying
every assert. The property it encodes HOLDS iff no such (X, Y = f(X)) exists. The reader keeps
that polarity in its names: a :class:`VnnlibProperty` is a tuple of
:class:`CounterexampleQuery` (an input box and the *unsafe* output region); the property holds
iff every query is infeasible.

Supported: ``(declare-const X_i Real)``, ``(declare-const Y_j Real)``, ``(assert F)`` where F is
built from ``and``, ``or``, ``<=``, ``>=`` (and ``<``, ``>``, read as their closures) over linear
terms: variables, numbers, ``(+ ...)``, ``(- a b)``, ``(- a)`` and ``(* number term)``. Input
constraints must be bounds on single inputs; every input needs both bounds.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from itertools import product
from pathlib import Path

import torch

from assay.errors import SpecError
from assay.sets.box import Box
from assay.sets.spec import HalfSpaces, OutputSpec

__all__ = ["CounterexampleQuery", "VnnlibProperty", "read_vnnlib", "write_vnnlib"]

_TOKEN = re.compile(r"\s+|;[^\n]*|\(|\)|[^\s()]+")
_VARIABLE = re.compile(r"([XY])_(\d+)$")


@dataclass(frozen=True, eq=False)
class CounterexampleQuery:
    """A counterexample is an x in ``input_set`` whose output f(x) lies in ``unsafe_outputs``."""

    input_set: Box
    unsafe_outputs: OutputSpec


@dataclass(frozen=True, eq=False)
class VnnlibProperty:
    """The property holds iff no query has a counterexample."""

    path: str
    num_inputs: int
    num_outputs: int
    queries: tuple[CounterexampleQuery, ...]


@dataclass(frozen=True)
class _Token:
    text: str
    line: int
    column: int


class _Parser:
    def __init__(self, text: str, path: str):
        self.path = path
        self.tokens: list[_Token] = []
        line, line_start = 1, 0
        for match in _TOKEN.finditer(text):
            piece = match.group()
            if piece[0].isspace() or piece[0] == ";":
                newlines = piece.count("\n")
                if newlines:
                    line += newlines
                    line_start = match.start() + piece.rfind("\n") + 1
                continue
            self.tokens.append(_Token(piece, line, match.start() - line_start + 1))
        self.position = 0

    def error(self, token: _Token | None, message: str) -> SpecError:
        where = f"{self.path}:{token.line}:{token.column}" if token else f"{self.path}: at the end of the file"
        return SpecError(f"{where}: {message}")

    def parse_all(self) -> list:
        """The file as nested lists of tokens."""
        expressions, stack = [], []
        for token in self.tokens:
            if token.text == "(":
                stack.append([token])
            elif token.text == ")":
                if not stack:
                    raise self.error(token, "unbalanced ')': remove it or add the matching '('")
                done = stack.pop()
                (stack[-1] if stack else expressions).append(done)
            else:
                if not stack:
                    raise self.error(token, f"'{token.text}' outside any parenthesised command")
                stack[-1].append(token)
        if stack:
            raise self.error(stack[-1][0], "this '(' is never closed: add the missing ')'")
        return expressions


def _linear(parser: _Parser, node, variables: dict) -> tuple[dict, float]:
    """A term as ({variable: coefficient}, constant)."""
    if isinstance(node, _Token):
        if node.text in variables:
            return {node.text: 1.0}, 0.0
        if _VARIABLE.match(node.text):
            raise parser.error(node, f"{node.text} is used but not declared: add (declare-const {node.text} Real)")
        try:
            return {}, float(node.text)
        except ValueError:
            raise parser.error(node, f"expected a number or a declared variable, found '{node.text}'") from None
    head, args = node[1] if len(node) > 1 else None, node[2:]
    if not isinstance(head, _Token):
        raise parser.error(node[0], "expected an operator after '('")
    terms = [_linear(parser, a, variables) for a in args]
    if head.text == "+" and terms:
        return _sum(terms, [1.0] * len(terms))
    if head.text == "-" and len(terms) == 1:
        return _sum(terms, [-1.0])
    if head.text == "-" and terms:
        return _sum(terms, [1.0] + [-1.0] * (len(terms) - 1))
    if head.text == "*" and len(terms) == 2:
        (a_vars, a_const), (b_vars, b_const) = terms
        if a_vars and b_vars:
            raise parser.error(head, "a product of two variables is not linear")
        scale, (other_vars, other_const) = (a_const, terms[1]) if not a_vars else (b_const, terms[0])
        return {k: scale * v for k, v in other_vars.items()}, scale * other_const
    raise parser.error(head, f"unsupported term operator '{head.text}' (supported: +, -, * by a number)")


def _sum(terms, signs):
    coefficients: dict = {}
    constant = 0.0
    for (variables, value), sign in zip(terms, signs):
        for name, c in variables.items():
            coefficients[name] = coefficients.get(name, 0.0) + sign * c
        constant += sign * value
    return coefficients, constant


def _dnf(parser: _Parser, node, variables: dict) -> list[list]:
    """A formula in disjunctive normal form: a list of conjunctions of atoms (coefficients, constant ≥ 0)."""
    if isinstance(node, _Token) or len(node) < 2 or not isinstance(node[1], _Token):
        raise parser.error(node if isinstance(node, _Token) else node[0], "expected a formula such as (<= X_0 1.0)")
    head, args = node[1], node[2:]
    if head.text in ("and", "or"):
        if not args:
            raise parser.error(head, f"({head.text}) needs at least one argument")
        parts = [_dnf(parser, a, variables) for a in args]
        if head.text == "or":
            return [conjunction for part in parts for conjunction in part]
        if len(parts) > 1 and max(len(p) for p in parts) > 1:
            total = 1
            for p in parts:
                total *= len(p)
            if total > 100_000:
                raise parser.error(head, f"this (and ...) of disjunctions expands to {total} cases; simplify the property")
        return [[atom for conjunction in combo for atom in conjunction] for combo in product(*parts)]
    if head.text in ("<=", ">=", "<", ">"):
        if len(args) != 2:
            raise parser.error(head, f"({head.text} a b) takes two terms, got {len(args)}")
        left, right = (_linear(parser, a, variables) for a in args)
        big, small = (left, right) if head.text in (">=", ">") else (right, left)
        coefficients, constant = _sum([big, small], [1.0, -1.0])
        return [[(coefficients, constant, head)]]
    raise parser.error(head, f"unsupported operator '{head.text}' (supported: and, or, <=, >=, <, >)")


def read_vnnlib(path, num_inputs: int | None = None, num_outputs: int | None = None) -> VnnlibProperty:
    """Read a VNN-LIB file into counterexample queries (see the module docstring for polarity).

    Args:
        path: the .vnnlib file.
        num_inputs, num_outputs: expected numbers of X and Y variables (e.g. the network's);
            a mismatch raises SpecError. Default: what the file declares.
    Raises:
        SpecError naming the file, line and column for malformed or unsupported content.
    """
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise SpecError(f"cannot read the VNN-LIB file {path}: {exc.strerror or exc}") from exc
    parser = _Parser(text, str(path))
    variables: dict[str, tuple[str, int]] = {}
    asserts = []
    for expression in parser.parse_all():
        head = expression[1] if len(expression) > 1 else None
        if not isinstance(head, _Token):
            raise parser.error(expression[0], "expected a command such as (declare-const X_0 Real) or (assert ...)")
        if head.text == "declare-const":
            if len(expression) != 4 or not isinstance(expression[2], _Token) or not isinstance(expression[3], _Token):
                raise parser.error(head, "expected (declare-const NAME Real)")
            name = expression[2].text
            match = _VARIABLE.match(name)
            if not match:
                raise parser.error(expression[2], f"variables must be named X_i (inputs) or Y_j (outputs), not '{name}'")
            if expression[3].text != "Real":
                raise parser.error(expression[3], f"only Real variables are supported, not '{expression[3].text}'")
            variables[name] = (match.group(1), int(match.group(2)))
        elif head.text == "assert":
            if len(expression) != 3:
                raise parser.error(head, "(assert F) takes exactly one formula")
            asserts.append(expression[2])
        else:
            raise parser.error(head, f"unsupported command '{head.text}' (supported: declare-const, assert)")
    n_in = _count(parser, variables, "X", num_inputs, "inputs")
    n_out = _count(parser, variables, "Y", num_outputs, "outputs")
    if not asserts:
        raise SpecError(f"{path}: the file has no (assert ...): it describes no counterexample")
    disjuncts = [[]]
    for node in asserts:
        part = _dnf(parser, node, variables)
        if len(part) == 1:
            for conjunction in disjuncts:
                conjunction.extend(part[0])
        else:
            disjuncts = [a + b for a in disjuncts for b in part]
            if len(disjuncts) > 100_000:
                raise parser.error(node[0], "the property expands to more than 100,000 cases; simplify it")
    queries = _group_queries(parser, disjuncts, variables, n_in, n_out)
    return VnnlibProperty(str(path), n_in, n_out, queries)


def _count(parser, variables, kind, expected, what) -> int:
    indices = sorted(i for k, i in variables.values() if k == kind)
    if indices != list(range(len(indices))):
        raise SpecError(f"{parser.path}: the {what} must be declared as {kind}_0 … {kind}_{len(indices) - 1} without gaps")
    if expected is not None and len(indices) != expected:
        raise SpecError(f"{parser.path}: the file declares {len(indices)} {what}, but the network has {expected}")
    if not indices:
        raise SpecError(f"{parser.path}: no {what} are declared (expected (declare-const {kind}_0 Real) …)")
    return len(indices)


def _group_queries(parser, disjuncts, variables, n_in, n_out) -> tuple[CounterexampleQuery, ...]:
    by_box: dict[tuple, list[HalfSpaces]] = {}
    boxes: dict[tuple, Box] = {}
    for conjunction in disjuncts:
        lower, upper = [-float("inf")] * n_in, [float("inf")] * n_in
        rows, offsets, feasible = [], [], True
        for coefficients, constant, token in conjunction:
            kinds = {variables[name][0] for name in coefficients if coefficients[name] != 0}
            if not kinds:
                feasible &= constant >= 0
            elif kinds == {"X"}:
                (name, c), = [(k, v) for k, v in coefficients.items() if v != 0] if len(
                    [v for v in coefficients.values() if v != 0]) == 1 else [(None, None)]
                if name is None:
                    raise parser.error(token, "input constraints must bound one input at a time, e.g. (<= X_0 0.5)")
                index = variables[name][1]
                bound = -constant / c  # c·x + constant ≥ 0
                if c > 0:
                    lower[index] = max(lower[index], bound)
                else:
                    upper[index] = min(upper[index], bound)
            elif kinds == {"Y"}:
                row = [0.0] * n_out
                for name, c in coefficients.items():
                    row[variables[name][1]] += c
                rows.append(row)
                offsets.append(constant)
            else:
                raise parser.error(token, "a constraint mixes inputs and outputs; assay supports input bounds and output constraints")
        if not feasible or any(l > u for l, u in zip(lower, upper)):
            continue
        missing = [i for i in range(n_in) if lower[i] == -float("inf") or upper[i] == float("inf")]
        if missing:
            raise SpecError(f"{parser.path}: input X_{missing[0]} needs both a lower and an upper bound (add (>= X_{missing[0]} …) and (<= X_{missing[0]} …))")
        key = (tuple(lower), tuple(upper))
        boxes.setdefault(key, Box(torch.tensor(lower, dtype=torch.float64), torch.tensor(upper, dtype=torch.float64)))
        if not rows:  # no output constraint: every output is a counterexample
            rows, offsets = [[0.0] * n_out], [0.0]
        by_box.setdefault(key, []).append(HalfSpaces(torch.tensor(rows, dtype=torch.float64), torch.tensor(offsets, dtype=torch.float64)))
    if not by_box:
        raise SpecError(f"{parser.path}: every case of the property is contradictory: it describes no counterexample")
    return tuple(CounterexampleQuery(boxes[key], OutputSpec(tuple(conjunctions))) for key, conjunctions in by_box.items())


def _term(row, names) -> str:
    parts = [f"(* {c!r} {name})" for c, name in zip(row, names) if c != 0]
    if not parts:
        return "0.0"
    return parts[0] if len(parts) == 1 else f"(+ {' '.join(parts)})"


def write_vnnlib(path, prop) -> None:
    """Write a :class:`VnnlibProperty` (or a sequence of CounterexampleQuery) that read_vnnlib reads back."""
    queries = tuple(prop.queries if isinstance(prop, VnnlibProperty) else prop)
    if not queries:
        raise SpecError("write_vnnlib needs at least one query")
    n_in, n_out = queries[0].input_set.dim, queries[0].unsafe_outputs.num_outputs
    x_names, y_names = [f"X_{i}" for i in range(n_in)], [f"Y_{j}" for j in range(n_out)]
    lines = ["; written by assay: a counterexample is an input and output satisfying every assert"]
    lines += [f"(declare-const {name} Real)" for name in x_names + y_names]

    def box_atoms(box):
        lo, hi = box.lower.reshape(-1).tolist(), box.upper.reshape(-1).tolist()
        return [f"(>= {x} {l!r})" for x, l in zip(x_names, lo)] + [f"(<= {x} {h!r})" for x, h in zip(x_names, hi)]

    def output_formula(spec):
        conjunctions = []
        for c in spec.conjunctions:
            atoms = [f"(>= {_term(row, y_names)} {-offset!r})" for row, offset in zip(c.C.tolist(), c.d.tolist())]
            conjunctions.append(f"(and {' '.join(atoms)})")
        return conjunctions[0] if len(conjunctions) == 1 else f"(or {' '.join(conjunctions)})"

    if len(queries) == 1:
        lines += [f"(assert {atom})" for atom in box_atoms(queries[0].input_set)]
        lines.append(f"(assert {output_formula(queries[0].unsafe_outputs)})")
    else:
        cases = [f"(and {' '.join(box_atoms(q.input_set))} {output_formula(q.unsafe_outputs)})" for q in queries]
        lines.append(f"(assert (or {' '.join(cases)}))")
    Path(path).write_text("\n".join(lines) + "\n")
