"""What every subcommand shares: error handling and exit codes, consoles, model and property files.

Heavy modules (torch, the bound engine, the verifier) are imported inside the functions that need
them, so that ``assay --version`` and ``assay --help`` start instantly.
"""

from __future__ import annotations

import functools
import sys

import typer

from assay.errors import AssayError, OptionError

# Set by the `assay` console script (assay.cli.main.run) to the time.monotonic() at which the
# process began loading; commands whose deadline counts loading read it (None: not the script).
COMMAND_STARTED: float | None = None

# Exit codes of the assay command (documented in `assay --help` and the README).
EXIT_OK = 0
EXIT_ERROR = 2  # an AssayError (bad file, bad option) or a usage error
EXIT_VIOLATED = 10  # assay verify: the property is violated (counterexample found)
EXIT_UNDECIDED = 20  # assay verify: unknown or timeout
EXIT_INTERRUPTED = 130  # Ctrl-C


def handle_errors(command):
    """Wrap a command so that an AssayError prints ``error: <message>`` and exits 2, Ctrl-C exits 130."""

    @functools.wraps(command)
    def wrapper(*args, **kwargs):
        try:
            return command(*args, **kwargs)
        except AssayError as exc:
            typer.echo(f"error: {one_line(str(exc))}", err=True)
            raise typer.Exit(EXIT_ERROR) from None
        except KeyboardInterrupt:
            typer.echo("interrupted", err=True)
            raise typer.Exit(EXIT_INTERRUPTED) from None

    return wrapper


def console():
    """A rich console on stdout (plain text when stdout is not a terminal)."""
    from rich.console import Console

    return Console(highlight=False)


def show_progress(json_output: bool = False) -> bool:
    """Progress bars go to stderr, only on a terminal, and never alongside --json."""
    try:
        return not json_output and sys.stderr.isatty()
    except (AttributeError, ValueError):
        return False


def parse_shape(text: str | None) -> tuple[int, ...] | None:
    """``"1,5"`` → ``(1, 5)``; None stays None."""
    if text is None:
        return None
    try:
        shape = tuple(int(part) for part in text.replace("x", ",").split(",") if part.strip())
    except ValueError:
        shape = ()
    if not shape or any(d < 1 for d in shape):
        raise OptionError(f"--input-shape must be comma-separated positive ints without the batch dimension, "
                          f"e.g. 1,28,28 or 5; got {text!r}")
    return shape


def load_network(path, input_shape=None):
    """Load a model file (``.onnx``, ``.nnet``, or either gzipped) into a Network (:func:`assay.nn.load`)."""
    from assay.nn import load

    return load(path, input_shape=input_shape)


def read_property(path, network):
    """Read a VNN-LIB file (or ``.vnnlib.gz``) sized for ``network``'s inputs and outputs."""
    from assay.sets import read_vnnlib

    return read_vnnlib(path, num_inputs=network.input_size, num_outputs=network.output_size)


def report_bad_row(problem) -> None:
    """One ``error: FILE, line N: reason`` line on stderr for a bad row of a batch (the batch goes on)."""
    typer.echo(f"error: {one_line(str(problem))}", err=True)


def one_line(message: str) -> str:
    """``message`` with line breaks and other control characters escaped (``\\n``, ``\\x1c``), so that
    an error quoting a file's bytes or a foreign library's text stays one line on stderr."""
    if message.isprintable():
        return message
    return "".join(c if c.isprintable() or c == " " else ascii(c)[1:-1] for c in message)
