"""The steps file of ``assay verify-online``: one step per line, read and checked before anything runs.

JSON lines (UTF-8; blank lines skipped). Each line is one step: ``{"lower": [...], "upper": [...]}``
moves the input box (one finite number per input; nested lists are read in row-major order),
``{"model": "net_1.onnx"}`` updates the network (a relative path is resolved against the steps
file's folder), both together do both, and ``{}`` re-checks unchanged. A malformed line is a
:class:`~assay.errors.DataError` naming the file, the line and the fix (a missing model file: a
:class:`~assay.errors.ModelLoadError`); foreign exceptions (JSON nesting beyond the parser's depth,
integers beyond float64, paths the system refuses) are translated here.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

from assay.errors import DataError, ModelLoadError

__all__ = ["Step", "read_steps"]

_KEYS = ("lower", "upper", "model")
_EXAMPLE = '{"lower": [0.0, 0.1], "upper": [0.5, 0.6]} or {"model": "net_1.onnx"}'


@dataclass(frozen=True)
class Step:
    """One line of a steps file: the new input box and/or the new model (None: unchanged)."""

    line: int
    lower: tuple[float, ...] | None = None
    upper: tuple[float, ...] | None = None
    model: Path | None = None


def read_steps(path: Path, input_size: int, network_name: str = "the network") -> list[Step]:
    """Read and check a steps file (JSON lines; blank lines are skipped).

    Raises:
        DataError naming the file, the line and the fix: unreadable file, malformed JSON, unknown
        keys, one bound without the other, wrong lengths, non-numbers, NaN or infinite values,
        lower > upper, no steps at all. ModelLoadError: a ``"model"`` file that does not exist.
    """
    from assay.datasets.csv_rows import read_utf8_text

    path = Path(path)
    if not path.exists():
        raise DataError(f"steps file {path} not found; give a JSON-lines file with one step per line, e.g. "
                        f"{_EXAMPLE}")
    text = read_utf8_text(path, f"a JSON-lines steps file, one step per line, e.g. {_EXAMPLE}")
    steps = []
    for number, raw in enumerate(text.split("\n"), start=1):  # "\n" only: the lines an editor shows
        if raw.strip():
            steps.append(_parse_step(raw, number, path, input_size, network_name))
    if not steps:
        raise DataError(f"the steps file {path} has no steps; write one JSON object per line, e.g. {_EXAMPLE}")
    return steps


def _parse_step(raw: str, number: int, path: Path, input_size: int, network_name: str) -> Step:
    where = f"{path}, line {number}"
    try:
        entry = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise DataError(f"{where}: not valid JSON ({exc.msg} at column {exc.colno}); write one JSON object per "
                        f"line, e.g. {_EXAMPLE}") from None
    except RecursionError:
        raise DataError(f"{where}: the JSON nests too deeply to read; a bound is a list of numbers, e.g. "
                        f"{_EXAMPLE}") from None
    if not isinstance(entry, dict):
        raise DataError(f"{where}: expected a JSON object, got {type(entry).__name__} {raw.strip()[:40]}; write e.g. "
                        f"{_EXAMPLE}")
    unknown = [key for key in entry if key not in _KEYS]
    if unknown:
        raise DataError(f"{where}: unknown key(s) {', '.join(repr(k) for k in unknown)}; a step takes \"lower\" and "
                        "\"upper\" (the new input box) and/or \"model\" (a model file)")
    if ("lower" in entry) != ("upper" in entry):
        given, missing = ("lower", "upper") if "lower" in entry else ("upper", "lower")
        raise DataError(f"{where}: \"{given}\" without \"{missing}\"; give both bounds of the new input box, or "
                        "neither to keep the last one")
    lower = upper = model = None
    if "lower" in entry:
        lower = _vector(entry["lower"], "lower", where, input_size, network_name)
        upper = _vector(entry["upper"], "upper", where, input_size, network_name)
        for index, (low, high) in enumerate(zip(lower, upper)):
            if low > high:
                raise DataError(f"{where}: lower[{index}] = {low:g} > upper[{index}] = {high:g}; each lower bound "
                                "must be ≤ its upper bound")
    if "model" in entry:
        model = _model_path(entry["model"], where, path)
    return Step(number, lower, upper, model)


def _vector(value, name: str, where: str, size: int, network_name: str) -> tuple[float, ...]:
    if not isinstance(value, list):
        raise DataError(f"{where}: \"{name}\" must be a list of {size} numbers; got {json.dumps(value)[:40]}")
    flat = _flatten(value)
    if len(flat) != size:
        raise DataError(f"{where}: \"{name}\" has {len(flat)} number{'' if len(flat) == 1 else 's'}, but "
                        f"{network_name} takes {size} inputs; give one bound per input")
    numbers = []
    for index, item in enumerate(flat):
        if isinstance(item, bool) or not isinstance(item, (int, float)):
            raise DataError(f"{where}: {name}[{index}] is {json.dumps(item)[:40]}, not a number")
        number = float(item) if isinstance(item, float) or abs(item) < 2 ** 1023 else math.inf  # ints beyond float64
        if not math.isfinite(number):
            raise DataError(f"{where}: {name}[{index}] is {str(item)[:40]}; the input box needs finite numbers within the float64 range")
        numbers.append(number)
    return tuple(numbers)


def _flatten(value: list) -> list:
    """Nested lists (an input's shape, e.g. [[...], [...]]) in row-major order (without recursion: any depth)."""
    flat, stack = [], [iter(value)]
    while stack:
        item = next(stack[-1], _END)
        if item is _END:
            stack.pop()
        elif isinstance(item, list):
            stack.append(iter(item))
        else:
            flat.append(item)
    return flat


_END = object()


def _model_path(value, where: str, steps_path: Path) -> Path:
    if not isinstance(value, str) or not value.strip():
        raise DataError(f"{where}: \"model\" must be the path of a model file (a string); got {json.dumps(value)[:40]}")
    model = Path(value)
    if not model.is_absolute():
        model = steps_path.parent / model
    try:
        found = model.is_file()
    except OSError as exc:  # a name longer than the system allows, ...
        raise DataError(f"{where}: \"model\" is not a usable path ({exc.strerror or exc}); give the path of a model "
                        "file") from exc
    if not found:
        raise ModelLoadError(f"{where}: model file {model} not found (a relative path is resolved against the steps "
                             f"file's folder, {steps_path.parent.resolve()}); fix the path or copy the model there")
    return model
