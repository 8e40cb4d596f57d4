"""The JSON bodies of ``POST /api/monitors/{name}/decisions``, checked and turned into arrays.

Three shapes, all giving the same decisions:

* one decision:            ``{"x": [0.1, 2.0], "y": "deny"}``
* a batch of decisions:    ``{"decisions": [{"x": [...], "y": ...}, ...]}``, where an item may
  also be a record ``{"age": 41, "income": 2.5, "prediction": "deny"}`` keyed by feature names
  and the monitor's decision column;
* a batch by columns:      ``{"X": [[...], [...]], "Y": ["deny", "approve"]}`` (the fastest).

Decisions (``y``) are JSON numbers, strings or booleans. Anything else is a
:class:`~assay.errors.DataError` that names the place (``decisions[3].x``) and says what was
expected; the monitor then checks widths and finiteness before it records anything.
"""

from __future__ import annotations

import numpy as np

from assay.errors import DataError

__all__ = ["parse_decisions", "SHAPES"]

SHAPES = ('{"x": [...], "y": label}', '{"decisions": [{"x": [...], "y": label} or a record, ...]}',
          '{"X": [[...], ...], "Y": [label, ...]}')


def _label(value, where: str):
    if isinstance(value, (str, bool, int, float)) and not (isinstance(value, float) and value != value):
        return value
    raise DataError(f"{where} must be a decision: a JSON number, string or boolean; got {_short(value)}")


def _short(value) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _matrix(rows, where: str) -> np.ndarray:
    try:
        matrix = np.asarray(rows, dtype=np.float64)
    except (TypeError, ValueError):
        for position, row in enumerate(rows):
            if not isinstance(row, list):
                raise DataError(f"{where}[{position}] must be a list of numbers; got {_short(row)}") from None
            for column, value in enumerate(row):
                if isinstance(value, bool) or not isinstance(value, (int, float)):
                    raise DataError(f"{where}[{position}][{column}] must be a number; got {_short(value)}") from None
        raise DataError(f"{where} must be rows of numbers of equal length") from None
    if matrix.ndim != 2:
        raise DataError(f"{where} must be a list of rows (lists of numbers) of equal length; got shape {matrix.shape}")
    if matrix.shape[1] == 0:
        raise DataError(f"{where} has rows without features")
    return matrix


def parse_decisions(body, spec, dim: int | None) -> tuple[np.ndarray, list, tuple[str, ...] | None]:
    """``(rows float64 (n, d), outputs (n,) JSON values, feature names learned or None)`` from ``body``.

    ``spec`` is the monitor's :class:`~assay.serve.hub.MonitorSpec` (its decision column and
    feature names); ``dim`` its width so far (None before the first decision).
    """
    if not isinstance(body, dict):
        raise DataError(f"the body must be a JSON object of one of the shapes {' | '.join(SHAPES)}; got {type(body).__name__}")
    keys = set(body)
    if keys == {"x", "y"}:
        if not isinstance(body["x"], list):
            raise DataError(f"x must be a list of numbers; got {_short(body['x'])}")
        rows = _matrix([body["x"]], "x")
        return _checked(rows, [_label(body["y"], "y")], dim, "x"), [body["y"]], None
    if keys == {"X", "Y"}:
        X, Y = body["X"], body["Y"]
        if not isinstance(X, list) or not isinstance(Y, list):
            raise DataError("X must be a list of rows and Y a list of decisions")
        if len(X) != len(Y):
            raise DataError(f"X has {len(X)} rows but Y has {len(Y)} decisions")
        outputs = [_label(value, f"Y[{i}]") for i, value in enumerate(Y)]
        return _checked(_matrix(X, "X"), outputs, dim, "X"), outputs, None
    if keys == {"decisions"}:
        return _items(body["decisions"], spec, dim)
    raise DataError(f"the body has the keys {sorted(keys)}; expected one of the shapes {' | '.join(SHAPES)}")


def _items(items, spec, dim):
    if not isinstance(items, list):
        raise DataError(f"decisions must be a list; got {_short(items)}")
    if not items:
        return np.empty((0, dim or 1)), [], None
    column = spec.decision_column
    features = spec.features
    learned = None
    vectors, outputs = [], []
    for position, item in enumerate(items):
        where = f"decisions[{position}]"
        if not isinstance(item, dict):
            raise DataError(f"{where} must be an object {{\"x\": [...], \"y\": ...}} or a record; got {_short(item)}")
        if "x" in item and set(item) == {"x", "y"}:
            if not isinstance(item["x"], list):
                raise DataError(f"{where}.x must be a list of numbers; got {_short(item['x'])}")
            vectors.append(item["x"])
            outputs.append(_label(item["y"], f"{where}.y"))
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
        row = []
        for name in names:
            value = item[name]
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise DataError(f"{where}.{name} must be a number; got {_short(value)}")
            row.append(value)
        vectors.append(row)
        outputs.append(_label(item[column], f"{where}.{column}"))
    rows = _matrix(vectors, "decisions")
    return _checked(rows, outputs, dim, "decisions"), outputs, learned


def _checked(rows: np.ndarray, outputs: list, dim: int | None, where: str) -> np.ndarray:
    if dim is not None and rows.shape[1] != dim:
        raise DataError(f"{where} has {rows.shape[1]} features per decision, but the monitor was built on {dim}")
    finite = np.isfinite(rows)
    if not finite.all():
        row, column = np.argwhere(~finite)[0]
        raise DataError(f"{where}: decision {row} has NaN or an infinite value at feature {column}; nothing was recorded")
    return rows
