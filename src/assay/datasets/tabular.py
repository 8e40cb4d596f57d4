"""Tabular data for the KNN fairness certifier: a CSV with a header, or one of the authors' ``.npy`` splits.

Two sources, one result (:class:`TabularData`):

* **CSV** (UTF-8, a header row, comma-separated, blank lines skipped): one column is the label,
  every other column a numeric feature, in the file's order. Labels are any text; they are
  mapped to ``0 … C−1`` in sorted order (numerically when every label parses as a number, e.g.
  ``"2" < "10"``, else as text). Categorical features must already be encoded as numbers (the
  paper's splits are ordinal-encoded); NaN, infinite and empty values are refused.
* **An authors' split** (``.npy``, CAV 2023 artifact): four arrays stored one after another with
  ``numpy.save`` — ``X_train, y_train, X_test, y_test``. Features are named ``"0" … "d−1"``;
  ``y_test`` is not used.

A separate test CSV (optional) must hold every feature column by name (with a ``.npy`` split:
columns ``0 … d−1``); other columns (the label, ids) are ignored. Without one, the test inputs are
the split's ``X_test``, or the training rows of a CSV.

Features are used as given (standardise them beforehand, as the authors' splits are). Every
problem is a :class:`~assay.errors.DataError` (an :class:`~assay.errors.OptionError` for a
missing label name) naming the file, the line and the column, and what to fix.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from itertools import islice
from pathlib import Path

import numpy as np

from assay.errors import DataError, OptionError

__all__ = ["TabularData", "load_tabular", "read_csv"]


@dataclass(frozen=True, eq=False)
class TabularData:
    """A training table and the inputs to certify.

    Attributes:
        train_X: float64 (n, d) training features.
        train_y: int64 (n,) training labels, codes ``0 … C−1`` into ``label_names``.
        test_X: float64 (m, d) inputs to certify, with the same columns as ``train_X``.
        feature_names: the d feature column names, in column order.
        label_names: the C label values as text, in code order (sorted).
    """

    train_X: np.ndarray
    train_y: np.ndarray
    test_X: np.ndarray
    feature_names: tuple[str, ...]
    label_names: tuple[str, ...]


def read_csv(path, header_only: bool = False) -> tuple[list[str], list[list[str]]]:
    """The header (names stripped of spaces) and the non-blank rows of a CSV file, as text.

    With ``header_only``, only the first line is read and the rows are ``[]``. Raises DataError
    when the file is missing or empty, or a row has a different number of fields than the header
    (the message names the line).
    """
    path = Path(path)
    if not path.is_file():
        raise DataError(f"{path}: no such file; pass the path of a CSV file with a header row")
    with path.open(newline="", encoding="utf-8") as handle:
        rows = list(islice(csv.reader(handle), 1 if header_only else None))
    if not rows:
        raise DataError(f"{path}: the file is empty; it needs a header row and at least one data row")
    header = [name.strip() for name in rows[0]]
    body = [row for row in rows[1:] if any(cell.strip() for cell in row)]
    for number, row in enumerate(body, start=2):
        if len(row) != len(header):
            raise DataError(f"{path}: line {number} has {len(row)} fields, but the header has {len(header)}; "
                            f"fix the row or quote fields that contain commas")
    return header, body


def _numeric(path: Path, header: list[str], body: list[list[str]], columns) -> np.ndarray:
    index = {name: i for i, name in enumerate(header)}
    out = np.empty((len(body), len(columns)))
    for c, name in enumerate(columns):
        i = index[name]
        for r, row in enumerate(body):
            try:
                out[r, c] = float(row[i])
            except ValueError:
                raise DataError(f"{path}: column {name!r} has the non-numeric value {row[i]!r} on line {r + 2}; "
                                f"encode categorical columns as numbers (the paper's splits are ordinal-encoded)") from None
            if not np.isfinite(out[r, c]):
                raise DataError(f"{path}: column {name!r} has {row[i]!r} on line {r + 2}; impute or drop that row")
    return out


def _test_inputs(test: Path, names, fix: str) -> np.ndarray:
    """The feature columns ``names`` of the test CSV, by name; ``fix`` ends the missing-column message."""
    header, body = read_csv(test)
    missing = [n for n in names if n not in header]
    if missing:
        raise DataError(f"{test}: missing feature column {missing[0]!r}{fix}")
    return _numeric(test, header, body, names)


def _load_split(train: Path, test: Path | None) -> TabularData:
    if not train.is_file():
        raise DataError(f"{train}: no such file")
    try:
        with train.open("rb") as handle:
            X_train, y_train, X_test, _ = (np.load(handle) for _ in range(4))
    except (ValueError, OSError, EOFError) as exc:
        raise DataError(f"{train}: not an authors' split (four arrays X_train, y_train, X_test, y_test "
                        f"stored one after another with numpy.save)") from exc
    names = tuple(str(i) for i in range(X_train.shape[1]))
    if test is not None:
        X_test = _test_inputs(test, names, f"; with a .npy training split, name the test columns 0..{len(names) - 1}")
    classes = np.unique(y_train)
    return TabularData(X_train.astype(np.float64), np.searchsorted(classes, y_train).astype(np.int64),
                       np.asarray(X_test, dtype=np.float64), names, tuple(str(c) for c in classes))


def load_tabular(train, label: str | None = None, test=None) -> TabularData:
    """Read a training table (CSV or an authors' ``.npy`` split) and the inputs to certify.

    Args:
        train: a CSV file with a header, or an authors' ``.npy`` split (the suffix decides).
        label: the label column of a CSV (required for a CSV; ignored for a ``.npy`` split).
        test: an optional CSV of inputs holding every feature column by name. None: the split's
            ``X_test``, or for a CSV the training rows themselves.

    Returns:
        a :class:`TabularData` (see the module docstring for how labels are coded).

    Raises:
        DataError: a missing, empty, ragged or non-numeric file, a missing column (the message
            names the file, the line and the column).
        OptionError: ``label`` is None for a CSV training file.
    """
    train = Path(train)
    test = None if test is None else Path(test)
    if train.suffix == ".npy":
        return _load_split(train, test)
    header, body = read_csv(train)
    if label is None:
        raise OptionError(f"a CSV training file needs its label column named; {train} has the columns {', '.join(header)}")
    if label not in header:
        raise DataError(f"{train}: no column {label!r} (the label); the columns are {', '.join(header)}; "
                        f"name one of them as the label column")
    names = tuple(n for n in header if n != label)
    X_train = _numeric(train, header, body, names)
    raw = [row[header.index(label)].strip() for row in body]
    try:
        keys = sorted(set(raw), key=float)
    except ValueError:
        keys = sorted(set(raw))
    code = {key: i for i, key in enumerate(keys)}
    y_train = np.array([code[v] for v in raw], dtype=np.int64)
    if test is None:
        X_test = X_train
    else:
        X_test = _test_inputs(test, names, f" (present in {train}); the test file needs every feature column of the "
                                           f"training file (the label is optional)")
    return TabularData(X_train, y_train, X_test, names, tuple(keys))
