"""assay.datasets.csv_rows: lines that match the file, bad rows returned (not raised), whole-file errors."""

from __future__ import annotations

import numpy as np
import pytest

from assay.datasets.csv_rows import BadRow, numeric_rows, read_csv_table
from assay.errors import DataError


def test_rows_keep_the_line_they_start_on(tmp_path):
    path = tmp_path / "t.csv"
    path.write_bytes('\ufeff\n a ,b\n1,2\n\n"3\n",4\n5,6\n'.encode())  # a BOM, a blank line, a quoted line break
    table = read_csv_table(path)
    assert table.header == ("a", "b") and table.lines == (3, 5, 7)
    assert table.rows == (("1", "2"), ("3\n", "4"), ("5", "6"))


def test_numeric_rows_return_the_bad_rows_with_their_lines(tmp_path):
    path = tmp_path / "t.csv"
    path.write_text("a,b,c\n1,2,x\n1,two,0\n\n1e400,0,0\n4,5\n7,8,9\n")
    found = numeric_rows(read_csv_table(path), [0, 1])  # column c is not read: its 'x' is no problem
    assert found.values.tolist() == [[1, 2], [7, 8]] and found.rows == (1, 5) and found.lines == (2, 7)
    assert [(bad.row, bad.line) for bad in found.bad] == [(2, 3), (3, 5), (4, 6)]
    assert str(found.bad[0]) == f"{path}, line 3: column 'b' has the non-numeric value 'two'; encode categories as numbers"
    assert "not a finite number" in found.bad[1].reason and "2 fields, but the header has 3" in found.bad[2].reason
    assert found.bad[0].to_json() == {"row": 2, "line": 3, "error": found.bad[0].reason}
    assert isinstance(found.bad[0], BadRow) and found.values.dtype == np.float64


@pytest.mark.parametrize("data, words", [
    (b"", "the file is empty"),
    (b"\n \n", "the file is empty"),
    (b"a,b\n1,2\n\xe9,3\n", "line 3: not UTF-8 text (byte 0xe9)"),
    (b"a,b\n1,\x002\n", "line 2: a NUL byte"),
    (b"a,b\n\"1," + b"x" * 200_000 + b"\n", "not valid CSV"),
])
def test_whole_file_problems_name_the_file_and_the_line(tmp_path, data, words):
    path = tmp_path / "bad.csv"
    path.write_bytes(data)
    with pytest.raises(DataError, match="bad.csv") as info:
        read_csv_table(path)
    assert words in str(info.value)


def test_missing_file_and_folder(tmp_path):
    with pytest.raises(DataError, match="no such file"):
        read_csv_table(tmp_path / "absent.csv")
    with pytest.raises(DataError, match="is a folder"):
        read_csv_table(tmp_path)
