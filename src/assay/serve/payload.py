"""The JSON bodies of ``POST /api/monitors/{name}/decisions``, checked strictly and turned into arrays.

Three shapes, all giving the same decisions:

* one decision:            ``{"x": [0.1, 2.0], "y": "deny"}``
* a batch of decisions:    ``{"decisions": [{"x": [...], "y": ...}, ...]}``, where an item may
  also be a record ``{"age": 41, "income": 2.5, "prediction": "deny"}`` keyed by feature names
  and the monitor's decision column;
* a batch by columns:      ``{"X": [[...], [...]], "Y": ["deny", "approve"]}`` (the fastest).

The rules (each refusal is a :class:`~assay.errors.DataError` naming the field, e.g.
``X[3][1]`` or ``decisions[2].income``, and the rule; nothing of the post is recorded):

* **features** are JSON numbers — never strings, booleans or null — that are finite and within
  ±:data:`FEATURE_LIMIT`, and integers among them are ones a float64 holds exactly
  (:class:`~assay.serve.body.InexactInteger` marks the others);
* **decisions** are JSON strings, numbers (finite; integers held exactly) or booleans, and a
  monitor takes one of these :data:`DECISION_TYPES` only: the one it was created with
  (``decision_type``), else the type of its first decision. So ``true`` and ``1`` are never
  the same decision, and neither are ``1`` and ``"1"``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from itertools import chain

import numpy as np

from assay.errors import DataError
from assay.serve.body import InexactInteger

__all__ = ["parse_decisions", "Parsed", "decision_type_of", "SHAPES", "FEATURE_LIMIT", "DECISION_TYPES"]

SHAPES = ('{"x": [...], "y": label}', '{"decisions": [{"x": [...], "y": label} or a record, ...]}',
          '{"X": [[...], ...], "Y": [label, ...]}')

#: Largest magnitude of a feature. Distances between features this large stay finite in every
#: metric (squares of differences are ≤ 4e200), so no comparison of the monitor can overflow.
FEATURE_LIMIT = 1e100

#: The types a monitor's decisions may have (one per monitor).
DECISION_TYPES = ("string", "number", "boolean")

_NUMBER_RULE = f"features must be JSON numbers, finite and within ±{FEATURE_LIMIT:g} (integers a float64 holds exactly)"


@dataclass(frozen=True, eq=False)
class Parsed:
    """A checked post: ``rows`` float64 (n, d), ``outputs`` n decisions, feature names learned from a record
    (None unless this post taught them), and the type of its decisions (None when it has none)."""

    rows: np.ndarray
    outputs: list
    features: tuple[str, ...] | None
    decision_type: str | None


def decision_type_of(value) -> str | None:
    """``"string"``, ``"number"`` or ``"boolean"`` for a valid decision; None for anything else."""
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, InexactInteger):
        return None
    if isinstance(value, str):
        return "string"
    if isinstance(value, int) or (isinstance(value, float) and math.isfinite(value)):
        return "number"
    return None


def _describe(value) -> str:
    if isinstance(value, InexactInteger):
        return value.describe()
    text = "null" if value is None else repr(value)
    if isinstance(value, bool):
        text = "true" if value else "false"
    return text if len(text) <= 60 else text[:57] + "..."


def _kind(value) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, InexactInteger):
        return value.describe()
    if isinstance(value, str):
        return f"the string {_describe(value)}"
    if isinstance(value, (list, dict)):
        return "an array" if isinstance(value, list) else "an object"
    return _describe(value)


class _Decisions:
    """Checks decisions against the monitor's type (declared, or set by the first decision seen)."""

    def __init__(self, declared: str | None):
        self.type = declared
        self.learned = declared is None

    def check(self, value, where: str):
        kind = decision_type_of(value)
        if kind is None:
            raise DataError(f"{where} must be a decision: a JSON string, a finite number (integers a float64 holds "
                            f"exactly) or a boolean; got {_kind(value)}")
        if self.type is None:
            self.type = kind
        elif kind != self.type:
            raise DataError(f"{where} is a {kind}, but this monitor's decisions are {self.type}s: a monitor takes decisions "
                            "of one type (the `decision_type` it was created with, else its first decision's), so that "
                            "true, 1 and \"1\" are never mistaken for one another")
        return value


def _matrix(rows: list, field) -> np.ndarray:
    """``rows`` (lists of numbers) as float64 (n, d); ``field(row, column)`` names a value in messages."""
    for position, row in enumerate(rows):
        if type(row) is not list:
            raise DataError(f"{field(position, None)} must be a list of numbers; got {_kind(row)}")
    if not rows:
        raise DataError(f"{field(None, None)} has no decisions; post at least one row")
    types = set(map(type, chain.from_iterable(rows)))
    if not types <= {int, float}:
        for position, row in enumerate(rows):
            for column, value in enumerate(row):
                if type(value) not in (int, float):
                    raise DataError(f"{field(position, column)} is {_kind(value)}; {_NUMBER_RULE}")
    if int in types:  # bodies decoded by assay.serve.body hold no such integer; Python callers' bodies may
        for position, row in enumerate(rows):
            for column, value in enumerate(row):
                if type(value) is int and abs(value) > 2**53 and not _exact(value):
                    raise DataError(f"{field(position, column)} is {InexactInteger(str(value)).describe()}; {_NUMBER_RULE}")
    width = len(rows[0])
    for position, row in enumerate(rows):
        if len(row) != width:
            raise DataError(f"{field(position, None)} has {len(row)} features but {field(0, None)} has {width}; "
                            "every decision has the same features")
    if width == 0:
        raise DataError(f"{field(0, None)} has no features")
    matrix = np.asarray(rows, dtype=np.float64)
    bad = ~(np.abs(matrix) <= FEATURE_LIMIT)  # NaN compares False: caught too
    if bad.any():
        row, column = (int(i) for i in np.argwhere(bad)[0])
        value = matrix[row, column]
        what = "NaN or an infinite value" if not np.isfinite(value) else f"{value:g}, beyond ±{FEATURE_LIMIT:g}"
        raise DataError(f"{field(row, column)} is {what}; {_NUMBER_RULE}; nothing was recorded")
    return matrix


def parse_decisions(body, spec, dim: int | None) -> Parsed:
    """The checked decisions of ``body`` (see the module docstring for the rules).

    ``spec`` is the monitor's :class:`~assay.serve.hub.MonitorSpec` (its decision column, feature
    names and decision type); ``dim`` its width so far (None before the first decision).
    """
    if not isinstance(body, dict):
        raise DataError(f"the body must be a JSON object of one of the shapes {' | '.join(SHAPES)}; got {_kind(body)}")
    decisions = _Decisions(spec.decision_type)
    keys = set(body)
    if keys == {"x", "y"}:
        if not isinstance(body["x"], list):
            raise DataError(f"x must be a list of numbers; got {_kind(body['x'])}")
        rows = _matrix([body["x"]], lambda _row, column: "x" if column is None else f"x[{column}]")
        outputs = [decisions.check(body["y"], "y")]
        return _checked(Parsed(rows, outputs, None, decisions.type), dim, "x")
    if keys == {"X", "Y"}:
        X, Y = body["X"], body["Y"]
        if not isinstance(X, list) or not isinstance(Y, list):
            raise DataError(f"X must be a list of rows and Y a list of decisions; got {_kind(X)} and {_kind(Y)}")
        if len(X) != len(Y):
            raise DataError(f"X has {len(X)} rows but Y has {len(Y)} decisions")
        outputs = [decisions.check(value, f"Y[{i}]") for i, value in enumerate(Y)]
        rows = _matrix(X, lambda row, column: "X" if row is None else f"X[{row}]" if column is None else f"X[{row}][{column}]")
        return _checked(Parsed(rows, outputs, None, decisions.type), dim, "X")
    if keys == {"decisions"}:
        return _items(body["decisions"], spec, dim, decisions)
    raise DataError(f"the body has the keys {sorted(keys)}; expected one of the shapes {' | '.join(SHAPES)}")


def _items(items, spec, dim, decisions: _Decisions) -> Parsed:
    if not isinstance(items, list):
        raise DataError(f"decisions must be a list; got {_kind(items)}")
    if not items:
        return Parsed(np.empty((0, dim or 1)), [], None, None)
    column = spec.decision_column
    features = spec.features
    learned = None
    vectors, outputs, names_of = [], [], []  # names_of[i]: the feature names of item i, or None for an x list
    for position, item in enumerate(items):
        where = f"decisions[{position}]"
        if not isinstance(item, dict):
            raise DataError(f"{where} must be an object {{\"x\": [...], \"y\": ...}} or a record; got {_kind(item)}")
        if "x" in item and set(item) == {"x", "y"}:
            if not isinstance(item["x"], list):
                raise DataError(f"{where}.x must be a list of numbers; got {_kind(item['x'])}")
            vectors.append(item["x"])
            names_of.append(None)
            outputs.append(decisions.check(item["y"], f"{where}.y"))
            continue
        if column not in item:
            raise DataError(f"{where} is a record without the decision column {column!r} (keys: {', '.join(map(str, item))}); "
                            f"post {{\"x\": [...], \"y\": ...}} or name the decision column when creating the monitor")
        names = features or learned
        if names is None:
            learned = names = tuple(key for key in item if key != column)
            if not names:
                raise DataError(f"{where} has no feature besides the decision column {column!r}")
        missing = [name for name in names if name not in item]
        extra = [key for key in item if key != column and key not in names]
        if missing or extra:
            problem = f"has no value for the feature {missing[0]!r}" if missing else f"has the unknown feature {extra[0]!r}"
            raise DataError(f"{where} {problem}; the monitor's features are {', '.join(names)}")
        vectors.append([item[name] for name in names])
        names_of.append(names)
        outputs.append(decisions.check(item[column], f"{where}.{column}"))

    def field(row, feature):
        if row is None:
            return "decisions"
        if feature is None:
            return f"decisions[{row}]" if names_of[row] is None else f"decisions[{row}] (a record)"
        return f"decisions[{row}].x[{feature}]" if names_of[row] is None else f"decisions[{row}].{names_of[row][feature]}"

    rows = _matrix(vectors, field)
    return _checked(Parsed(rows, outputs, learned, decisions.type), dim, "decisions")


def _checked(parsed: Parsed, dim: int | None, where: str) -> Parsed:
    if dim is not None and parsed.rows.shape[1] != dim:
        raise DataError(f"{where} has {parsed.rows.shape[1]} features per decision, but the monitor was built on {dim}")
    return parsed


def _exact(value: int) -> bool:
    try:
        return float(value) == value
    except OverflowError:
        return False
