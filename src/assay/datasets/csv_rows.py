"""The checked CSV reader behind every CSV of inputs assay reads (cfx batches, knn tables and test rows).

A file is UTF-8 text (a byte-order mark is allowed), comma-separated, with a header row; blank
lines are skipped. Problems of the file as a whole — missing, empty, not UTF-8, not CSV — are a
:class:`~assay.errors.DataError` naming the file, the line and the fix: the one boundary where
``UnicodeDecodeError`` and ``csv.Error`` become assay's errors.

Problems of one row are the caller's to judge, so :func:`numeric_rows` does not raise for them: it
returns the good rows and a :class:`BadRow` (file, line, row number, reason) for each bad one. A
training table refuses the whole file at its first bad row; a batch of inputs (``assay cfx
--inputs``, ``assay knn-fairness --test``) reports each bad row and goes on with the others.
"""

from __future__ import annotations

import csv
import io
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from assay.errors import DataError

__all__ = ["CsvTable", "BadRow", "NumericRows", "read_csv_table", "numeric_rows", "read_utf8_text"]


@dataclass(frozen=True, eq=False)
class CsvTable:
    """A CSV file's header (names stripped of spaces) and its non-blank rows, as text.

    ``lines[i]`` is the line of the file where ``rows[i]`` starts (the header is line 1).
    """

    path: Path
    header: tuple[str, ...]
    rows: tuple[tuple[str, ...], ...]
    lines: tuple[int, ...]


@dataclass(frozen=True)
class BadRow:
    """A row that could not be used: its file, its line (header = line 1), its number among the data
    rows (1-based, blank lines not counted) and why, ending with what to fix."""

    path: str
    line: int
    row: int
    reason: str

    def __str__(self) -> str:
        return f"{self.path}, line {self.line}: {self.reason}"

    def to_json(self) -> dict:
        return {"row": self.row, "line": self.line, "error": self.reason}


@dataclass(frozen=True, eq=False)
class NumericRows:
    """The rows of a batch that parsed as finite numbers, and the ones that did not.

    Attributes:
        values: float64 (n, k), the good rows' values of the chosen columns, in file order.
        rows: the good rows' numbers among the data rows (1-based).
        lines: the good rows' lines in the file.
        bad: the refused rows, in file order.
    """

    values: np.ndarray
    rows: tuple[int, ...]
    lines: tuple[int, ...]
    bad: tuple[BadRow, ...]


def read_utf8_text(path: Path, what: str = "a CSV file with a header row") -> str:
    """The text of ``path``; a missing or unreadable file, or bytes that are not UTF-8, are a DataError
    naming the file (and the line of the first bad byte). ``what`` says what the file should be."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise DataError(f"{path}: no such file; pass the path of {what}") from None
    except IsADirectoryError:
        raise DataError(f"{path}: is a folder; pass the path of {what}") from None
    except OSError as exc:
        raise DataError(f"{path}: cannot be read ({exc.strerror or exc}); check the path and its permissions") from exc
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise DataError(f"{path}, line {line}: not UTF-8 text (byte 0x{data[exc.start]:02x}); save the file as "
                        f"UTF-8 (e.g. `iconv -f latin1 -t utf-8 {path.name}`), or check that it is {what}") from exc


def read_csv_table(path, header_only: bool = False) -> CsvTable:
    """Read ``path`` (see the module docstring). With ``header_only``, only the header is parsed.

    Raises:
        DataError: the file is missing, empty, not UTF-8 or not CSV (an unclosed quote, a field
            beyond the csv module's size limit), naming the file and the line.
    """
    path = Path(path)
    text = read_utf8_text(path)
    if "\x00" in text:
        line = text.count("\n", 0, text.index("\x00")) + 1
        raise DataError(f"{path}, line {line}: a NUL byte; this is a binary file, not a CSV text file")
    reader = csv.reader(io.StringIO(text, newline=""))
    header, rows, lines = None, [], []
    try:
        start = 1
        for row in reader:
            if header is None and not any(cell.strip() for cell in row):
                pass  # blank lines before the header
            elif header is None:
                header = tuple(name.strip() for name in row)
                if header_only:
                    break
            elif any(cell.strip() for cell in row):
                rows.append(tuple(row))
                lines.append(start)
            start = reader.line_num + 1
    except csv.Error as exc:
        raise DataError(f"{path}, line {reader.line_num}: not valid CSV ({exc}); fix the quoting of that line") from exc
    if header is None:
        raise DataError(f"{path}: the file is empty; it needs a header row and at least one data row")
    return CsvTable(path, header, tuple(rows), tuple(lines))


def numeric_rows(table: CsvTable, columns: list[int]) -> NumericRows:
    """The values of ``columns`` (indices into the header) of every row, as finite float64.

    A row is bad when its number of fields differs from the header's, or a chosen cell is not a
    number, or is NaN or infinite (also a number too large for a float64, such as ``1e400``).
    """
    values, good_rows, good_lines, bad = [], [], [], []
    width = len(table.header)
    for number, (row, line) in enumerate(zip(table.rows, table.lines), start=1):
        problem = None
        if len(row) != width:
            problem = (f"{len(row)} fields, but the header has {width}; fix the row or quote the fields that "
                       "contain commas")
        else:
            parsed = []
            for c in columns:
                try:
                    value = float(row[c])
                except ValueError:
                    problem = (f"column {table.header[c]!r} has the non-numeric value {row[c][:40]!r}; encode "
                               "categories as numbers")
                    break
                if not np.isfinite(value):
                    problem = (f"column {table.header[c]!r} has {row[c][:40]!r}, not a finite number; impute or "
                               "drop that row")
                    break
                parsed.append(value)
        if problem is None:
            values.append(parsed)
            good_rows.append(number)
            good_lines.append(line)
        else:
            bad.append(BadRow(str(table.path), line, number, problem))
    array = np.array(values, dtype=np.float64).reshape(len(values), len(columns))
    return NumericRows(array, tuple(good_rows), tuple(good_lines), tuple(bad))
