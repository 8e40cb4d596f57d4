"""assay.datasets: the tabular loader of `assay knn-fairness`, at its library home (cases of the CLI tests)."""

from __future__ import annotations

import inspect

import numpy as np
import pytest

import assay.datasets
from assay.datasets import TabularData, load_tabular, read_csv
from assay.errors import DataError, OptionError

PUBLIC = {"TabularData", "load_tabular", "read_csv",
          # the tasks of the online-verification benchmark (tests in test_online_tasks.py)
          "MotionTask", "motion_task", "sgd_updates", "motion_spec", "motion_reparametrisation", "motion_velocities",
          "DigitsTask", "digits_task"}


def test_all_is_pinned_and_documented():
    assert set(assay.datasets.__all__) == PUBLIC and len(assay.datasets.__all__) == len(PUBLIC)
    for name in PUBLIC:
        assert inspect.getdoc(getattr(assay.datasets, name)), name


@pytest.fixture
def train(tmp_path):
    path = tmp_path / "train.csv"
    path.write_text("sex,age,outcome\n1,3.5,yes\n0,1,no\n\n1,2,yes\n")
    return path


def test_csv_features_labels_and_test_rows(train, tmp_path):
    data = load_tabular(train, "outcome")
    assert isinstance(data, TabularData)
    assert data.feature_names == ("sex", "age") and data.label_names == ("no", "yes")
    assert data.train_X.dtype == np.float64 and data.train_X.tolist() == [[1, 3.5], [0, 1], [1, 2]]
    assert data.train_y.dtype == np.int64 and data.train_y.tolist() == [1, 0, 1]
    assert data.test_X is data.train_X  # no test file: certify the training rows
    test = tmp_path / "test.csv"
    test.write_text("age,id,sex\n4,a,0\n")  # by name, in any order, extra columns ignored
    assert load_tabular(train, "outcome", test).test_X.tolist() == [[0, 4]]


def test_numeric_labels_sort_as_numbers(tmp_path):
    path = tmp_path / "numbers.csv"
    path.write_text("x,y\n0,10\n1,2\n2,10\n")
    data = load_tabular(path, "y")
    assert data.label_names == ("2", "10") and data.train_y.tolist() == [1, 0, 1]


@pytest.mark.parametrize("text, words", [
    ("a,b,y\n1,2\n", "line 2: 2 fields, but the header has 3"),
    ("a,b,y\n1,two,0\n", "line 2: column 'b' has the non-numeric value 'two'"),
    ("a,b,y\n1,2,0\n\n1,nan,1\n", "line 4: column 'b' has 'nan'"),  # the blank line 3 still counts
    ("a,b,y\n1,2,0\n1,1e400,1\n", "line 3: column 'b' has '1e400', not a finite number"),
    ("a,b,y\n1,2,0\n\xe9,2,1\n", "line 3: not UTF-8 text"),
    ("a,b,y\n", "no data rows"),
    ("", "the file is empty"),
])
def test_bad_csv_names_file_line_and_column(tmp_path, text, words):
    path = tmp_path / "bad.csv"
    path.write_bytes(text.encode("latin-1"))  # \xe9 is one byte, not UTF-8
    with pytest.raises(DataError, match="bad.csv") as info:
        load_tabular(path, "y")
    assert words in str(info.value)


def test_missing_files_columns_and_label(train, tmp_path):
    with pytest.raises(DataError, match="no such file"):
        load_tabular(tmp_path / "absent.csv", "y")
    with pytest.raises(DataError, match="no column 'missing'"):
        load_tabular(train, "missing")
    with pytest.raises(OptionError, match="sex, age, outcome"):
        load_tabular(train)
    bad = tmp_path / "bad.csv"
    bad.write_text("sex\n1\n")
    with pytest.raises(DataError, match="bad.csv: missing feature column 'age'"):
        load_tabular(train, "outcome", bad)


def write_split(path, X_train, y_train, X_test, y_test):
    with path.open("wb") as handle:
        for array in (X_train, y_train, X_test, y_test):
            np.save(handle, array)
    return path


def test_authors_split(tmp_path, rng):
    X_train, X_test = rng.normal(size=(6, 3)).astype(np.float32), rng.normal(size=(2, 3)).astype(np.float32)
    split = write_split(tmp_path / "salary-10.npy", X_train, np.array([4, 7, 4, 4, 7, 7]), X_test, np.array([4, 7]))
    data = load_tabular(split, label="ignored")
    assert data.feature_names == ("0", "1", "2") and data.label_names == ("4", "7")
    assert data.train_y.tolist() == [0, 1, 0, 0, 1, 1] and data.train_y.dtype == np.int64
    assert data.train_X.dtype == data.test_X.dtype == np.float64
    assert data.train_X.tolist() == X_train.astype(np.float64).tolist() and data.test_X.tolist() == X_test.astype(np.float64).tolist()
    test = tmp_path / "test.csv"
    test.write_text("2,1,0\n0.5,1.5,2.5\n")
    assert load_tabular(split, test=test).test_X.tolist() == [[2.5, 1.5, 0.5]]
    test.write_text("0,1\n1,2\n")
    with pytest.raises(DataError, match="name the test columns 0..2"):
        load_tabular(split, test=test)


def test_not_a_split(tmp_path):
    path = tmp_path / "junk.npy"
    np.save(path, np.zeros(3))
    with pytest.raises(DataError, match="not an authors' split"):
        load_tabular(path)
    with pytest.raises(DataError, match="no such file"):
        load_tabular(tmp_path / "absent.npy")


def test_read_csv_skips_blank_rows_and_strips_the_header(tmp_path):
    path = tmp_path / "t.csv"
    path.write_text(" a , b\n1,2\n,\n3,4\n5\n")
    assert read_csv(path, header_only=True) == (["a", "b"], [])  # the rows are not read
    path.write_text(" a , b\n1,2\n,\n3,4\n")
    assert read_csv(path) == (["a", "b"], [["1", "2"], ["3", "4"]])
    path.write_text("")
    with pytest.raises(DataError, match="the file is empty"):
        read_csv(path, header_only=True)
