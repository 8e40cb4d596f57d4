"""VNN-COMP's tool interface: the result file, and one instance run the way the competition counts it.

The competition (VNN-COMP 2022 and later) calls ``run_instance.sh v1 BENCHMARK ONNX VNNLIB
RESULT_FILE TIMEOUT`` and reads RESULT_FILE. Its first line is one word:

=========  =====================================================================
``unsat``  the property holds (no input of the property's region violates it)
``sat``    the property is violated; the counterexample follows
``timeout`` no verdict within TIMEOUT seconds
``unknown`` the tool stopped without a verdict
``error``  the tool could not run the instance (e.g. an operator it cannot bound)
=========  =====================================================================

After ``sat`` comes the counterexample, one parenthesised list of ``(X_i value)`` for every input
then ``(Y_j value)`` for every output, flat in row-major (C) order::

    sat
    ((X_0 0.25)
     (X_1 -0.5)
     (Y_0 1.75)
     (Y_1 0.125))

The published checker (``SCORING/counterexamples.py`` of the vnncomp2022_results repository)
runs X through onnxruntime, requires its output to match Y in the L∞ norm within a tolerance, and
requires X to lie in one of the property's input boxes and Y to violate that box's output
constraint. assay writes the input of its counterexample — re-checked by a plain float64
forward pass before the verifier reports it — and Y from a forward pass on it, each value with
``repr`` (the shortest text that reads back to the same float64).

The checker runs the model in its own precision (float32) and accepts a difference below 10⁻⁴;
networks with large outputs (collins_rul_cnn's remaining useful life, ~10²) differ by more than
that between float64 and float32 arithmetic (measured: 21 of 27 counterexamples off by
1.0–1.4·10⁻⁴). So X is always the verifier's point, and Y is the output of a float32 forward
pass of X cast to float32 — what the checker recomputes — when that output violates the property
too; otherwise Y is the float64 output of the verifier's re-check.

Time is counted as the competition counts it: from the start of the process (starting Python,
importing torch, loading the model and the property included) to the verdict; a verdict reached
after TIMEOUT is reported as ``timeout``.
"""

from __future__ import annotations

import math
import os
import re
import tempfile
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from assay.errors import AssayError, DataError, OptionError
from assay.verify.options import SMALL_NETWORK_PARAMETERS
from assay.verify.result import UNKNOWN_REASON, VerificationStatus

if TYPE_CHECKING:  # this module stays free of torch at import: the command line reads it
    from assay.verify.result import VerificationResult

__all__ = [
    "RESULT_WORDS",
    "WORD_FOR_STATUS",
    "SMALL_NETWORK_PARAMETERS",
    "CompetitionResult",
    "ResultFile",
    "format_result",
    "parse_result",
    "read_result_file",
    "write_result_file",
    "competition_result",
    "run_instance",
]

RESULT_WORDS = ("sat", "unsat", "timeout", "unknown", "error")
WORD_FOR_STATUS = {
    VerificationStatus.HOLDS: "unsat",
    VerificationStatus.VIOLATED: "sat",
    VerificationStatus.TIMEOUT: "timeout",
    VerificationStatus.UNKNOWN: "unknown",
    VerificationStatus.ERROR: "error",
}


@dataclass(frozen=True, eq=False)
class CompetitionResult:
    """One instance's answer in the competition's terms.

    Attributes:
        word: the result file's first line, one of :data:`RESULT_WORDS`.
        status: assay's verdict (``error`` when the instance could not be run).
        seconds: from the start of the run (the process start for the command line) to the verdict.
        timeout: the instance's timeout in seconds.
        input, output: for ``sat``: the counterexample's flat float64 input and the output of the
            forward pass that confirmed it; else None.
        reason: one line saying why there is no verdict (``error``, ``unknown``, ``timeout``), or None.
        verification: the verifier's full result (None when it did not run).
    """

    word: str
    status: VerificationStatus
    seconds: float
    timeout: float
    input: np.ndarray | None = None
    output: np.ndarray | None = None
    reason: str | None = None
    verification: VerificationResult | None = field(default=None, repr=False)

    def __post_init__(self):
        if self.word not in RESULT_WORDS:
            raise ValueError(f"word must be one of {RESULT_WORDS}; got {self.word!r}")
        if (self.word == "sat") != (self.input is not None and self.output is not None):
            raise ValueError("a sat result needs its counterexample (input and output), and only a sat result has one")

    def text(self) -> str:
        """The result file's content."""
        return format_result(self.word, self.input, self.output)

    def to_json(self) -> dict:
        return {
            "result": self.word,
            "status": self.status.value,
            "seconds": self.seconds,
            "timeout": self.timeout,
            "reason": self.reason,
            "counterexample": None if self.input is None else {"input": self.input.tolist(), "output": self.output.tolist()},
            "verification": None if self.verification is None else self.verification.to_json(),
        }


@dataclass(frozen=True, eq=False)
class ResultFile:
    """A result file read back: its word and, for ``sat``, the flat X and Y values (float64)."""

    word: str
    input: np.ndarray | None = None
    output: np.ndarray | None = None


# ------------------------------------------------------------------------------- the file format
def format_result(word: str, x=None, y=None) -> str:
    """The text of a result file: ``word`` on the first line; for ``sat`` the counterexample after it.

    ``x`` and ``y`` are flattened in row-major order. Values are written with ``repr`` so that they
    read back to the same float64; NaN or infinite values are refused (no checker can use them).
    """
    if word not in RESULT_WORDS:
        raise OptionError(f"the result word must be one of {', '.join(RESULT_WORDS)}; got {word!r}")
    if word != "sat":
        if x is not None or y is not None:
            raise OptionError(f"only a sat result carries a counterexample; got one with {word!r}")
        return word + "\n"
    if x is None or y is None:
        raise OptionError("a sat result needs the counterexample's input x and output y")
    x = np.asarray(x, dtype=np.float64).reshape(-1)
    y = np.asarray(y, dtype=np.float64).reshape(-1)
    if not (np.isfinite(x).all() and np.isfinite(y).all()):
        raise DataError("the counterexample has NaN or infinite values; it cannot be written as a result")
    entries = [f"(X_{i} {float(v)!r})" for i, v in enumerate(x)] + [f"(Y_{j} {float(v)!r})" for j, v in enumerate(y)]
    return "sat\n(" + "\n ".join(entries) + ")\n"


_ENTRY = re.compile(r"\(\s*([XY])_(\d+)\s+([^()\s]+)\s*\)")


def parse_result(text: str, source: str = "the result") -> ResultFile:
    """Read a result file's text (as the published checker reads it: X_i and Y_j numbered in order).

    Raises:
        DataError naming ``source`` when the first word is not a result word, or a ``sat``
        counterexample is malformed (unbalanced parentheses, numbering out of order, a bad number).
    """
    lines = text.strip().splitlines()
    word = lines[0].strip().lower() if lines else ""
    if word not in RESULT_WORDS:
        raise DataError(f"{source}: the first line must be one of {', '.join(RESULT_WORDS)}; got {word!r}")
    body = " ".join(lines[1:]).strip()
    if word != "sat":
        return ResultFile(word)
    if not (body.startswith("(") and body.endswith(")")) or body.count("(") != body.count(")"):
        raise DataError(f"{source}: after 'sat' comes the counterexample as ((X_0 v) ... (Y_0 v) ...)")
    inner = body[1:-1]
    values = {"X": [], "Y": []}
    for match in _ENTRY.finditer(inner):
        name, number, text_value = match.group(1), int(match.group(2)), match.group(3)
        if number != len(values[name]):
            raise DataError(f"{source}: {name}_{number} is out of order (expected {name}_{len(values[name])})")
        try:
            values[name].append(float(text_value))
        except ValueError:
            raise DataError(f"{source}: {name}_{number} has the value {text_value!r}, which is not a number") from None
    leftover = _ENTRY.sub("", inner).strip()
    if leftover:
        raise DataError(f"{source}: unexpected text {leftover[:40]!r} in the counterexample")
    if not values["X"] or not values["Y"]:
        raise DataError(f"{source}: the counterexample needs X_0 ... and Y_0 ... values")
    return ResultFile(word, np.array(values["X"]), np.array(values["Y"]))


def read_result_file(path) -> ResultFile:
    """:func:`parse_result` of a file."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise DataError(f"{path}: cannot read the result file ({exc})") from exc
    return parse_result(text, str(path))


def write_result_file(path, result: CompetitionResult) -> Path:
    """Write ``result`` to ``path`` at once (a temporary file renamed over it: never half written)."""
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        handle, scratch = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
        with os.fdopen(handle, "w", encoding="utf-8") as stream:
            stream.write(result.text())
        os.replace(scratch, path)
    except OSError as exc:
        raise DataError(f"{path}: cannot write the result file ({exc}); check the folder exists and is writable") from exc
    return path


# ------------------------------------------------------------------------------- one instance
def competition_result(verification: VerificationResult, seconds: float, timeout: float) -> CompetitionResult:
    """The competition's answer for a verifier's result reached after ``seconds`` (counted from the start).

    A holds or violated verdict that arrives after ``timeout`` counts as ``timeout``.
    """
    status = verification.status
    reason = None
    if status in (VerificationStatus.HOLDS, VerificationStatus.VIOLATED) and seconds > timeout:
        return CompetitionResult("timeout", VerificationStatus.TIMEOUT, seconds, timeout,
                                 reason=f"the verdict ({status.value}) came after {seconds:.2f} s, beyond the "
                                        f"timeout of {timeout:g} s", verification=verification)
    if status is VerificationStatus.TIMEOUT:
        reason = f"no verdict within the timeout of {timeout:g} s"
    elif status is VerificationStatus.UNKNOWN:
        reason = verification.reason or UNKNOWN_REASON
    x = y = None
    if verification.counterexample is not None:
        x = verification.counterexample.input.detach().to("cpu").double().reshape(-1).numpy().copy()
        y = verification.counterexample.output.detach().to("cpu").double().reshape(-1).numpy().copy()
    return CompetitionResult(WORD_FOR_STATUS[status], status, seconds, timeout, x, y, reason, verification)


def run_instance(model, property_file, timeout: float, *, started: float | None = None, method: str = "alpha",
                 threads: int | None = None, progress=None, strategy: str = "auto") -> CompetitionResult:
    """Load ``model`` and ``property_file``, verify within ``timeout`` seconds, and answer as the competition asks.

    Args:
        model: an ONNX or .nnet file (optionally gzipped).
        property_file: a VNN-LIB file (optionally gzipped).
        timeout: seconds (> 0) from ``started`` to the verdict.
        started: the ``time.monotonic()`` instant the clock started (the process start for the
            command line); default: now.
        method: the bound method of input splitting (:class:`~assay.verify.VerifyOptions`).
        strategy: the branching strategy (:class:`~assay.verify.VerifyOptions`; default auto).
        threads: torch threads; default 1 for small networks
            (:func:`~assay.threads.threads_for`), torch's setting otherwise. Restored
            afterwards.
        progress: optional ``(fraction, pending)`` callable, as for :func:`~assay.verify.verify`.

    Returns:
        a :class:`CompetitionResult`. A model or property assay cannot read or bound soundly
        (an :class:`~assay.errors.AssayError`, e.g. an unsupported operator) gives ``error`` with
        the message as ``reason``; so does running out of memory (Python's MemoryError or torch's
        failed allocation). ``sat`` carries the counterexample re-checked by the verifier's
        float64 forward pass, in the precision the competition's checker runs (module docstring).
    """
    if not (isinstance(timeout, int | float) and math.isfinite(timeout) and timeout > 0):
        raise OptionError(f"the timeout must be a positive number of seconds; got {timeout!r}")
    started = time.monotonic() if started is None else started

    def failed(reason: str) -> CompetitionResult:
        return CompetitionResult("error", VerificationStatus.ERROR, time.monotonic() - started, timeout,
                                 reason=" ".join(reason.split()))

    try:
        from assay.nn import load
        from assay.sets import read_vnnlib
        from assay.verify import verify_vnnlib

        network = load(model)
        prop = read_vnnlib(property_file, num_inputs=network.input_size, num_outputs=network.output_size)
    except AssayError as exc:
        return failed(str(exc))
    except MemoryError:
        return failed(f"{model}: out of memory while loading the model")
    try:
        # What loading left of the timeout (a tiny positive rest makes the verifier answer TIMEOUT at once).
        left = max(timeout - (time.monotonic() - started), 1e-9)
        # threads None: one for a small network, torch's setting otherwise (restored on return)
        verification = verify_vnnlib(network, prop, timeout=left, method=method, progress=progress, strategy=strategy,
                                     threads=threads)
    except AssayError as exc:
        return failed(str(exc))
    except MemoryError:
        return failed(f"{model}: out of memory while verifying")
    except RuntimeError as exc:  # torch reports a failed CPU allocation as a RuntimeError
        if "allocate memory" not in str(exc):
            raise
        return failed(f"{model}: out of memory while verifying ({str(exc).splitlines()[0][-120:]})")
    answer = competition_result(verification, time.monotonic() - started, timeout)
    if answer.word == "sat":
        answer = replace(answer, output=result_file_output(network, prop, answer.input, answer.output,
                                                                        verification.counterexample.query))
    return answer


def result_file_output(network, prop, x: np.ndarray, y: np.ndarray, query_index: int) -> np.ndarray:
    """Y for the result file of counterexample ``x`` (whose float64 re-check gave ``y``) of query
    ``query_index`` of ``prop``: the float32 forward pass of x cast to float32 when that output
    violates the query too, else ``y``."""
    import torch

    query = prop.queries[query_index]
    point = torch.as_tensor(x.astype(np.float32)).reshape(1, *network.input_shape)
    output = network.forward(point, dtype="float32").reshape(-1).to(torch.float64).numpy()
    violates = any(bool((c.C.to(torch.float64).numpy() @ output + c.d.to(torch.float64).numpy() >= 0).all())
                   for c in query.unsafe_outputs.conjunctions)
    return output if violates else y
