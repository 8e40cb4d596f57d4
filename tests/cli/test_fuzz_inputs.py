"""Every file the command line reads, fuzzed through the real commands (issue 33).

Each reader gets a seeded, bounded hypothesis test that writes a hostile variant of a valid file —
truncated, mis-encoded, random bytes, empty, a number replaced by a huge one, NaN or a word, a
line dropped, doubled or reshaped, deep nesting — and runs the command that reads it, in process
(typer's CliRunner). The contract: never a traceback; the exit code is the command's own (0, or 10/20
for a verdict) or 2, and with 2 every line on stderr is an ``error:`` line naming the file (a
whole-file problem is exactly one line; a batch reports one line per bad row, with its line).
The whole module runs in well under a minute (``derandomize=True``: the same examples every run);
``ASSAY_FUZZ_EXAMPLES=N`` runs N fresh random examples per reader instead.
"""

from __future__ import annotations

import json
import os
import re
import traceback
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from tests.cli.models import holding_property, write_logit_onnx, write_tiny_onnx

# ASSAY_FUZZ_EXAMPLES=500 fuzzes harder (and with fresh random examples) on a developer's machine.
_DEEP = int(os.environ.get("ASSAY_FUZZ_EXAMPLES", "0"))
FUZZ = settings(max_examples=_DEEP or 20, deadline=None, derandomize=not _DEEP, database=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])

# Replacements for one number of a valid file: huge, tiny, not finite, not a number, empty.
HOSTILE_NUMBERS = ["1e400", "-1e400", "9" * 400, "1e-400", "NaN", "nan", "inf", "-Infinity", "abc", "", "0x10", "1,5",
                   "\"0.5\"", "true", "null", "[0.5]", "1e308"]
_NUMBER = re.compile(rb"-?\d+(?:\.\d+)?(?:[eE][+-]?\d+)?")


def _replace_number(valid: bytes, index: int, replacement: str) -> bytes:
    spans = [m.span() for m in _NUMBER.finditer(valid)]
    if not spans:
        return valid + replacement.encode()
    start, end = spans[index % len(spans)]
    return valid[:start] + replacement.encode() + valid[end:]


def _reshape_line(valid: bytes, index: int, how: str) -> bytes:
    lines = valid.split(b"\n")
    i = index % len(lines)
    if how == "drop":
        del lines[i]
    elif how == "double":
        lines.insert(i, lines[i])
    elif how == "extra field":
        lines[i] += b",0.5"
    elif how == "lose a field":
        lines[i] = lines[i].rsplit(b",", 1)[0]
    elif how == "unclosed quote":
        lines[i] = b'"' + lines[i]
    return b"\n".join(lines)


def hostile_text(valid: bytes):
    """Variants of a valid text file, as bytes."""
    return st.one_of(
        st.integers(0, len(valid) - 1).map(lambda n: valid[:n]),  # truncated (the empty file included)
        st.binary(max_size=400),  # random bytes
        st.text(max_size=200).map(lambda t: t.encode("utf-8")),  # random text
        st.just(valid.decode().encode("utf-16")),  # mis-encoded: UTF-16 (NUL bytes, a BOM)
        st.integers(0, len(valid)).map(lambda n: valid[:n] + "é".encode("latin-1") + valid[n:]),  # latin-1
        st.tuples(st.integers(0, 10_000), st.sampled_from(HOSTILE_NUMBERS)).map(lambda a: _replace_number(valid, *a)),
        st.tuples(st.integers(0, 10_000), st.sampled_from(["drop", "double", "extra field", "lose a field",
                                                          "unclosed quote"])).map(lambda a: _reshape_line(valid, *a)),
        st.just(b"\n\n\n"),  # blank
    )


def hostile_binary(valid: bytes):
    """Variants of a valid binary file."""
    flips = st.lists(st.tuples(st.integers(0, len(valid) - 1), st.integers(1, 255)), min_size=1, max_size=8)
    return st.one_of(
        st.integers(0, len(valid) - 1).map(lambda n: valid[:n]),  # truncated
        st.binary(max_size=400),  # random bytes
        flips.map(lambda changes: _flip(valid, changes)),  # a few bytes changed
        st.just(valid + valid),  # two files in one
    )


def _flip(valid: bytes, changes) -> bytes:
    data = bytearray(valid)
    for position, mask in changes:
        data[position] ^= mask
    return bytes(data)


def check(result, path: Path, allowed=(0,), batch: bool = False, also: tuple[Path, ...] = ()) -> None:
    """The contract of the module docstring; an error line may name ``path`` or one of ``also`` (files read
    with it: a valid feature spec whose names the CSV lacks is the CSV's error)."""
    shown = f"{path.name} = {path.read_bytes()[:300]!r}\nstderr = {result.stderr!r}"
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise AssertionError(f"a traceback for {shown}:\n" + "".join(traceback.format_exception(result.exception)))
    assert result.exit_code in (*allowed, 2), (result.exit_code, result.output, shown)
    if result.exit_code != 2:
        return
    lines = result.stderr.splitlines()
    assert lines, f"exit code 2 without an error line: {shown}"
    assert all(line.startswith("error: ") for line in lines), shown
    assert all(any(p.name in line for p in (path, *also)) for line in lines), shown
    if not batch:
        assert len(lines) == 1, shown


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """Models and properties the fuzzed files are read against (written once)."""
    root = tmp_path_factory.mktemp("fuzz")
    write_tiny_onnx(root / "tiny.onnx")
    write_logit_onnx(root / "logit.onnx")
    holding_property(root / "holds.vnnlib")
    return root


@pytest.fixture(scope="module")
def invoke_module():
    from typer.testing import CliRunner

    from assay.cli.main import app

    runner = CliRunner()
    return lambda *args: runner.invoke(app, [str(a) for a in args])


def _write(folder: Path, name: str, data: bytes) -> Path:
    path = folder / name
    path.write_bytes(data)
    return path


# ------------------------------------------------------------------ CSV: cfx --inputs, knn-fairness
CFX_CSV = b"a,b\n0.2,0.3\n0.1,0.4\n"


@FUZZ
@given(data=hostile_text(CFX_CSV))
def test_cfx_inputs_csv(folder, invoke_module, data):
    path = _write(folder, "inputs.csv", data)
    check(invoke_module("cfx", folder / "logit.onnx", "--inputs", path), path, batch=True)


SPEC = b'{"size": 2, "names": ["a", "b"], "lower": [0, 0], "upper": [1, 1], "immutable": [], "cost": [1, 2]}'


@FUZZ
@given(data=hostile_text(SPEC))
@example(data=b'{"size": 1' + b"0" * 400 + b"}")
@example(data=b'{"size": 2, "lower": "x"}')
@example(data=b'{"size": 2, "immutable": 5}')
@example(data=b'{"size": 2, "one_hot": [[0, "a"]]}')
@example(data=b'{"size": 2, "names": ' + b"[" * 100_000 + b"]" * 100_000 + b"}")
def test_cfx_feature_spec(folder, invoke_module, data):
    path, rows = _write(folder, "spec.json", data), _write(folder, "two.csv", CFX_CSV)
    check(invoke_module("cfx", folder / "logit.onnx", "--inputs", rows, "--features", path), path, batch=True,
          also=(rows,))


@FUZZ
@given(data=hostile_text(b'{"x": [0.2, 0.3]}'))
@example(data=b"[" * 100_000 + b"]" * 100_000)
@example(data=b"[1" + b"0" * 400 + b", 0]")
@example(data=b'{"x":[0,10]}')  # found by ASSAY_FUZZ_EXAMPLES=300: outside the spec, the error did not name the file
def test_cfx_input_json(folder, invoke_module, data):
    path = _write(folder, "x.json", data)
    check(invoke_module("cfx", folder / "logit.onnx", "--input", path), path)


KNN_CSV = b"a,b,y\n" + b"".join(f"{i % 4},{i % 3},{int(i % 4 + i % 3 > 3)}\n".encode() for i in range(12))


@FUZZ
@given(data=hostile_text(KNN_CSV))
def test_knn_training_csv(folder, invoke_module, data):
    path = _write(folder, "train.csv", data)
    check(invoke_module("knn-fairness", path, "--label", "y", "--flips", 1, "--k", "3", "--folds", 3, "--first", 2,
                        "--no-falsify"), path)


@FUZZ
@given(data=hostile_text(b"a,b\n1,2\n0,3\n"))
def test_knn_test_csv(folder, invoke_module, data):
    train = _write(folder, "knn-train.csv", KNN_CSV)
    path = _write(folder, "test.csv", data)
    check(invoke_module("knn-fairness", train, "--label", "y", "--flips", 1, "--k", "3", "--folds", 3, "--test", path,
                        "--no-falsify"), path, batch=True)


# ------------------------------------------------------------------ streams: JSON lines, Parquet, CSV
JSONL = b'{"prediction": 1, "a": 0.0, "b": 0.1}\n{"prediction": 0, "a": 0.05, "b": 0.1}\n{"prediction": 1, "a": 0.9, "b": 0.2}\n'


def _deeply_nested(depth: int) -> bytes:
    return b'{"prediction": 1, "a": ' + b"[" * depth + b"]" * depth + b', "b": 0}\n'


@FUZZ
@given(data=hostile_text(JSONL))
@example(data=_deeply_nested(100_000))
@example(data=JSONL + _deeply_nested(50_000))
@example(data=JSONL.replace(b"0.05", b"1" + b"0" * 400))
@example(data=JSONL.replace(b"0.05", b"NaN"))
def test_monitor_jsonl(folder, invoke_module, data):
    path = _write(folder, "stream.jsonl", data)
    check(invoke_module("monitor", path, "--epsilon", 0.1), path, batch=True)


@FUZZ
@given(data=hostile_text(b"prediction,a,b\n1,0.0,0.1\n0,0.05,0.1\n1,0.9,0.2\n"))
@example(data=b"prediction,\nNaN,0")  # found by ASSAY_FUZZ_EXAMPLES=300: a NaN decision, written as text
def test_monitor_csv(folder, invoke_module, data):
    path = _write(folder, "stream.csv", data)
    check(invoke_module("monitor", path, "--epsilon", 0.1), path, batch=True)


def _parquet(columns: dict) -> bytes:
    import io

    import pyarrow as pa
    import pyarrow.parquet as pq

    sink = io.BytesIO()
    pq.write_table(pa.table(columns), sink)
    return sink.getvalue()


ODD_TABLES = [
    {"prediction": [1, 0], "a": [0.0, float("nan")]},
    {"prediction": [1, 0], "a": [0.0, None]},
    {"prediction": [1, None], "a": [0.0, 0.5]},
    {"prediction": [1, 0], "a": ["0.1", "high"]},
    {"prediction": [1, 0], "a": [[0.1], [0.2]]},
    {"prediction": [1, 0], "b": [0.1, 0.2]},
    {"prediction": [], "a": []},
    {"prediction": [1, 0], "a": [1e308, float("inf")]},
    {"prediction": [1, 0], "a": [10**18, -(10**18)]},
    {"prediction": [1, 0]},
]


@pytest.mark.requires("pyarrow")
@pytest.mark.parametrize("columns", ODD_TABLES, ids=range(len(ODD_TABLES)))
def test_monitor_parquet_odd_tables(folder, invoke_module, columns):
    path = _write(folder, "odd.parquet", _parquet(columns))
    check(invoke_module("monitor", path, "--epsilon", 0.1), path, batch=True)


@pytest.mark.requires("pyarrow")
def test_monitor_parquet_damaged(folder, invoke_module):
    valid = _parquet({"prediction": [1, 0, 1], "a": [0.0, 0.05, 0.9]})

    @FUZZ
    @given(data=hostile_binary(valid))
    def run(data):
        path = _write(folder, "stream.parquet", data)
        check(invoke_module("monitor", path, "--epsilon", 0.1), path, batch=True)

    run()


# ------------------------------------------------------------------ models: ONNX, NNet
@FUZZ
@given(data=st.data())
def test_onnx_models(folder, invoke_module, data):
    valid = (folder / "tiny.onnx").read_bytes()
    path = _write(folder, "fuzzed.onnx", data.draw(hostile_binary(valid)))
    check(invoke_module("info", path), path)


NNET = b"""// a 2-2-1 network
2,2,1,2,
2,2,1,
0,
0.0,0.0,
1.0,1.0,
0.0,0.0,0.0,
1.0,1.0,1.0,
1.0,0.5,
-0.5,1.0,
0.0,
0.1,
1.0,-1.0,
0.2,
"""


@FUZZ
@given(data=hostile_text(NNET))
def test_nnet_models(folder, invoke_module, data):
    path = _write(folder, "fuzzed.nnet", data)
    check(invoke_module("info", path), path)


# ------------------------------------------------------------------ properties, steps, instances
VNNLIB = (b"(declare-const X_0 Real)\n(declare-const X_1 Real)\n(declare-const Y_0 Real)\n(declare-const Y_1 Real)\n"
          b"(assert (>= X_0 0.0))\n(assert (<= X_0 1.0))\n(assert (>= X_1 0.0))\n(assert (<= X_1 1.0))\n"
          b"(assert (<= Y_0 -0.5))\n")


@FUZZ
@given(data=hostile_text(VNNLIB))
@example(data=b"(assert " * 50_000)
@example(data=VNNLIB + b"(assert " + b"(or " * 50_000 + b"(<= Y_0 0)" + b")" * 50_001 + b"\n")
@example(data=VNNLIB.replace(b"-0.5", b"-" + b"9" * 400))
@example(data=VNNLIB.replace(b"1.0", b"NaN"))
def test_vnnlib_properties(folder, invoke_module, data):
    path = _write(folder, "fuzzed.vnnlib", data)
    check(invoke_module("verify", folder / "tiny.onnx", path, "--timeout", 5), path, allowed=(0, 10, 20))


STEPS = b'{"lower": [0.0, 0.0], "upper": [0.5, 0.5]}\n{}\n{"lower": [0.1, 0.1], "upper": [0.6, 0.6]}\n'


@FUZZ
@given(data=hostile_text(STEPS))
@example(data=b'{"lower": ' + b"[" * 100_000 + b"]" * 100_000 + b', "upper": [1, 1]}\n')
@example(data=b'{"lower": ' + b"[" * 900 + b"0, 0" + b"]" * 900 + b', "upper": [1, 1]}\n')
@example(data=b'{"lower": [1' + b"0" * 400 + b', 0], "upper": [1, 1]}\n')
@example(data=b'{"lower": [0, 0], "upper": [1e400, 1]}\n')
@example(data=b'{"model": ' + json.dumps("\x00").encode() + b"}\n")
@example(data=b'{"model": "' + b"a" * 5000 + b'.onnx"}\n')
def test_verify_online_steps(folder, invoke_module, data):
    path = _write(folder, "steps.jsonl", data)
    check(invoke_module("verify-online", folder / "tiny.onnx", folder / "holds.vnnlib", "--steps", path, "--timeout", 5),
          path, allowed=(0, 10, 20))


@FUZZ
@given(data=hostile_text(b"tiny.onnx,holds.vnnlib,30\nmissing.onnx,holds.vnnlib,30\n"))
def test_verify_instances_csv(folder, invoke_module, data):
    path = _write(folder, "instances.csv", data)
    check(invoke_module("verify", "--instances", path, "--workers", 1), path, batch=True)


def test_the_hostile_numbers_are_hostile():
    """The fuzzer's replacements do reach the files (a test of the test)."""
    assert _replace_number(CFX_CSV, 1, "1e400") == b"a,b\n0.2,1e400\n0.1,0.4\n"
    assert _reshape_line(CFX_CSV, 1, "lose a field") == b"a,b\n0.2\n0.1,0.4\n"
    assert np.isinf(float("1e400"))
