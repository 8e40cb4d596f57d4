"""German credit (D1: UCI ``old_german.data``) against South German credit (D2: ``new_train.csv``).

Both are mapped onto one coding (every categorical value an integer from 0, as in the corrected
South German data), then encoded into 72 variables: 3 continuous (duration, amount, age; min-max
scaled, both files span the same ranges: 4–72, 250–18424, 19–75), 11 ordinal features as
thermometer codes (level v → v+1 leading ones) and 6 nominal features as one-hot codes. The label
is 1 for good credit. The feature spec carries the published runs' counterfactual cost: their MILP
minimises the mean over the 20 features of a per-feature change (a changed category 1, a level of an
ordinal feature 1/(k−1), a continuous value its change; robust-ce-inn ``optsolver.py``,
``set_objective_l1_l0``), which is :meth:`FeatureTypes.with_feature_cost` up to the factor 1/20.

D2 comes in two forms (``d2_rows``):

* ``"file"`` (the default): the file's 800 rows as they are.
* ``"published"``: the 799 rows the published runs (robust-ce-inn,
  ``expnns/credit.ipynb``) trained on. Their loader drops the file's header row, which leaves the
  table indexed from 1, and its encoder appends each categorical block indexed from 0; pandas
  aligns the blocks by index, so row k carries the continuous values and the label of file row k
  and the categorical codes of file row k+1, and the two half-filled rows at the ends are dropped.
  The notebook prints these rows (e.g. its first row: duration 18, amount 1049, age 21 from the
  file's first record, purpose 0 and employment 3 from its second), and with them the printed δ
  (0.054449288758308775) and M2 shift (1.5372448287620384) come out here to the last bit. The
  file is sorted by label, so only one row pairs codes with the other class's label. Only for
  reproducing the published figures (``benchmarks/cfx.py``): these rows mix two applicants each.
"""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np

from assay.cfx.features import FeatureTypes
from assay.errors import DataError, OptionError

COLUMNS = ["checking-status", "duration", "credit-history", "purpose", "amount", "savings", "employment", "rate",
           "sex-status", "guarantors", "residence", "property", "age", "installment", "housing", "num-credits", "job",
           "liable", "phone", "foreign"]
ORDINAL = {"checking-status": 4, "savings": 5, "employment": 5, "rate": 4, "guarantors": 3, "residence": 4,
           "property": 4, "housing": 3, "num-credits": 4, "job": 4, "liable": 2}
ONE_HOT = {"credit-history": 5, "purpose": 11, "sex-status": 4, "installment": 3, "phone": 2, "foreign": 2}
CONTINUOUS = ["duration", "amount", "age"]
D2_ROWS = ("published", "file")

# The UCI codes (A11 …) of the old file, mapped to the new file's 0-based values.
_OLD_CODES = {
    "checking-status": {"A14": 0, "A11": 1, "A12": 2, "A13": 3},
    "credit-history": {"A30": 2, "A31": 4, "A32": 3, "A33": 0, "A34": 1},
    "purpose": {"A410": 0, "A40": 1, "A41": 2, "A42": 3, "A43": 4, "A44": 5, "A45": 6, "A46": 7, "A47": 8, "A48": 9,
                "A49": 10},
    "savings": {"A65": 0, "A61": 1, "A62": 2, "A63": 3, "A64": 4},
    "employment": {"A71": 0, "A72": 1, "A73": 2, "A74": 3, "A75": 4},
    "sex-status": {"A91": 0, "A92": 1, "A93": 1, "A94": 2, "A95": 3},
    "guarantors": {"A101": 0, "A102": 1, "A103": 2},
    "property": {"A121": 3, "A122": 2, "A123": 1, "A124": 0},
    "installment": {"A141": 0, "A142": 1, "A143": 2},
    "housing": {"A151": 1, "A152": 2, "A153": 0},
    "job": {"A171": 0, "A172": 1, "A173": 2, "A174": 3},
    "phone": {"A191": 0, "A192": 1},
    "foreign": {"A201": 0, "A202": 1},
}
_OLD_MINUS_ONE = {"rate", "residence", "num-credits", "liable"}
_NEW_MINUS_ONE = {"checking-status", "savings", "employment", "rate", "sex-status", "guarantors", "residence",
                  "property", "installment", "housing", "num-credits", "job", "liable", "phone", "foreign"}


def _old(path: Path):
    rows = [line.split(",") if "," in line else line.split() for line in path.read_text().splitlines() if line.strip()]
    values, labels = [], []
    for number, row in enumerate(rows, 1):
        if len(row) != 21:
            raise DataError(f"{path}: line {number} has {len(row)} fields; the UCI German credit file has 21")
        record = []
        for name, text in zip(COLUMNS, row):
            text = text.strip()
            if name in _OLD_CODES:
                if text not in _OLD_CODES[name]:
                    raise DataError(f"{path}: line {number}: unknown code {text!r} for {name}")
                record.append(_OLD_CODES[name][text])
            else:
                record.append(float(text) - (1 if name in _OLD_MINUS_ONE else 0))
        values.append(record)
        labels.append(1 if row[20].strip() == "1" else 0)
    return np.array(values, float), np.array(labels)


def _new(path: Path):
    with path.open(newline="") as handle:
        rows = [row for row in csv.reader(handle) if row]
    values, labels = [], []
    for number, row in enumerate(rows[1:], 2):
        if len(row) != 22:
            raise DataError(f"{path}: line {number} has {len(row)} fields; expected Id, 20 features and kredit")
        record = [float(text) - (1 if name in _NEW_MINUS_ONE else 0) for name, text in zip(COLUMNS, row[1:21])]
        values.append(record)
        labels.append(int(float(row[21])))
    return np.array(values, float), np.array(labels)


def _encode(raw: np.ndarray, low: np.ndarray, span: np.ndarray) -> np.ndarray:
    blocks = []
    for j, name in enumerate(COLUMNS):
        column = raw[:, j]
        if name in ORDINAL:
            levels = ORDINAL[name]
            blocks.append((np.arange(levels)[None, :] <= column[:, None]).astype(float))
        elif name in ONE_HOT:
            blocks.append((np.arange(ONE_HOT[name])[None, :] == column[:, None]).astype(float))
        else:
            k = CONTINUOUS.index(name)
            blocks.append(((column - low[k]) / span[k])[:, None])
    return np.hstack(blocks)


def _features() -> FeatureTypes:
    names, one_hot, ordinal, position = [], [], [], 0
    for name in COLUMNS:
        width = ORDINAL.get(name) or ONE_HOT.get(name) or 1
        group = list(range(position, position + width))
        if name in ORDINAL:
            ordinal.append(group)
        elif name in ONE_HOT:
            one_hot.append(group)
        names.extend([name] if width == 1 else [f"{name}_{k}" for k in range(width)])
        position += width
    # the published runs' counterfactual cost: each of the 20 features counts once (FeatureTypes.with_feature_cost)
    return FeatureTypes(position, one_hot=one_hot, ordinal=ordinal, names=names).with_feature_cost()


def continuous_positions() -> list[int]:
    """Where the continuous variables (duration, amount, age) sit among the 72 encoded ones."""
    positions, position = [], 0
    for name in COLUMNS:
        if name in CONTINUOUS:
            positions.append(position)
        position += ORDINAL.get(name) or ONE_HOT.get(name) or 1
    return positions


def published_rows(X: np.ndarray, y: np.ndarray, continuous: list[int]) -> tuple[np.ndarray, np.ndarray]:
    """The rows the published credit runs built from the encoded rows ``X, y`` (module docstring):
    row k keeps the ``continuous`` variables and the label of row k and takes every other variable
    from row k+1; the last row has no successor and is dropped."""
    shifted = X[1:].copy()
    shifted[:, continuous] = X[:-1, continuous]
    return shifted, y[:-1].copy()


def load_credit(folder: Path, d2_rows: str = "file"):
    """(X1, y1, X2, y2, features) for the credit experiment; ``d2_rows`` as in the module docstring."""
    if d2_rows not in D2_ROWS:
        raise OptionError(f"d2_rows must be one of {', '.join(D2_ROWS)}; got {d2_rows!r}")
    old_path, new_path = folder / "old_german.data", folder / "new_train.csv"
    for path in (old_path, new_path):
        if not path.is_file():
            raise DataError(f"{path}: missing; the cfx data sets live in <data>/cfx (see ../shared/data/README.md)")
    raw1, y1 = _old(old_path)
    raw2, y2 = _new(new_path)
    cont = [COLUMNS.index(c) for c in CONTINUOUS]
    # One range over both files; the published runs scale each file by its own, which is the same
    # here (both span the same ranges), and one scaler keeps the two in one space whatever the files.
    both = np.vstack([raw1, raw2])[:, cont]
    low, high = both.min(0), both.max(0)
    span = np.where(high > low, high - low, 1.0)
    features = _features()
    X1, X2 = _encode(raw1, low, span), _encode(raw2, low, span)
    for X, path in ((X1, old_path), (X2, new_path)):
        bad = [i for i in range(len(X)) if features.violations(X[i])]
        if bad:
            raise DataError(f"{path}: row {bad[0] + 1} has a value outside its coding: {features.violations(X[bad[0]])[0]}")
    if d2_rows == "published":
        X2, y2 = published_rows(X2, y2, continuous_positions())
    return X1, y1, X2, y2, features
