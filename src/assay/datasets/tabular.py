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
the split's ``X_test``, or the training rows of a CSV. The test rows are a batch: a bad one
(ragged, non-numeric, NaN) is left out and returned in :attr:`TabularData.test_bad` for the
caller to report, while a bad training row refuses the whole file (leaving it out would change
the model).

Features are used as given (standardise them beforehand, as the authors' splits are). Every
other problem is a :class:`~assay.errors.DataError` (an :class:`~assay.errors.OptionError` for a
missing label name) naming the file, the line and the column, and what to fix. CSV files are read
by :mod:`assay.datasets.csv_rows`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from assay.datasets.csv_rows import BadRow, CsvTable, NumericRows, numeric_rows, read_csv_table
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
        test_lines: with a test CSV, the line of the file each row of ``test_X`` comes from
            (else empty).
        test_bad: with a test CSV, its rows that were left out (ragged, non-numeric, NaN), in file
            order; the caller reports them.
    """

    train_X: np.ndarray
    train_y: np.ndarray
    test_X: np.ndarray
    feature_names: tuple[str, ...]
    label_names: tuple[str, ...]
    test_lines: tuple[int, ...] = ()
    test_bad: tuple[BadRow, ...] = ()


def read_csv(path, header_only: bool = False) -> tuple[list[str], list[list[str]]]:
    """The header (names stripped of spaces) and the non-blank rows of a CSV file, as text.

    With ``header_only``, only the first line is read and the rows are ``[]``. Raises DataError
    when the file is missing, empty, not UTF-8 or not CSV, or a row has a different number of
    fields than the header (the message names the line). :func:`~assay.datasets.csv_rows.read_csv_table`
    keeps each row's line instead.
    """
    table = read_csv_table(path, header_only)
    for row, line in zip(table.rows, table.lines):
        if len(row) != len(table.header):
            raise DataError(f"{table.path}: line {line} has {len(row)} fields, but the header has {len(table.header)}; "
                            f"fix the row or quote fields that contain commas")
    return list(table.header), [list(row) for row in table.rows]


def _columns(table: CsvTable, names) -> list[int]:
    return [table.header.index(name) for name in names]


def _training_features(table: CsvTable, names) -> np.ndarray:
    """Every training row's features: the first bad row refuses the file (a skipped row would change the model)."""
    found = numeric_rows(table, _columns(table, names))
    if found.bad:
        raise DataError(f"{found.bad[0]}; every training row must be complete and numeric (the paper's splits are "
                        f"ordinal-encoded)")
    return found.values


def _test_inputs(test: Path, names, fix: str) -> NumericRows:
    """The feature columns ``names`` of the test CSV, by name; ``fix`` ends the missing-column message.

    Bad rows are returned, not raised: the inputs to certify are a batch.
    """
    table = read_csv_table(test)
    missing = [n for n in names if n not in table.header]
    if missing:
        raise DataError(f"{test}: missing feature column {missing[0]!r}{fix}")
    return numeric_rows(table, _columns(table, names))


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
    lines, bad = (), ()
    if test is not None:
        found = _test_inputs(test, names, f"; with a .npy training split, name the test columns 0..{len(names) - 1}")
        X_test, lines, bad = found.values, found.lines, found.bad
    classes = np.unique(y_train)
    return TabularData(X_train.astype(np.float64), np.searchsorted(classes, y_train).astype(np.int64),
                       np.asarray(X_test, dtype=np.float64), names, tuple(str(c) for c in classes), lines, bad)


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
    table = read_csv_table(train)
    header = table.header
    if label is None:
        raise OptionError(f"a CSV training file needs its label column named; {train} has the columns {', '.join(header)}")
    if label not in header:
        raise DataError(f"{train}: no column {label!r} (the label); the columns are {', '.join(header)}; "
                        f"name one of them as the label column")
    if not table.rows:
        raise DataError(f"{train}: no data rows after the header; add the training rows")
    names = tuple(n for n in header if n != label)
    X_train = _training_features(table, names)
    raw = [row[header.index(label)].strip() for row in table.rows]
    try:
        keys = sorted(set(raw), key=float)
    except ValueError:
        keys = sorted(set(raw))
    code = {key: i for i, key in enumerate(keys)}
    y_train = np.array([code[v] for v in raw], dtype=np.int64)
    if test is None:
        return TabularData(X_train, y_train, X_train, names, tuple(keys))
    found = _test_inputs(test, names, f" (present in {train}); the test file needs every feature column of the "
                                      f"training file (the label is optional)")
    return TabularData(X_train, y_train, found.values, names, tuple(keys), found.lines, found.bad)
