"""The table of assay's subcommands and the top-level help printed from it, without typer or rich.

``assay``, ``assay --help`` and ``assay --version`` are answered from here by the console script
(:func:`assay.cli.main.run`) before typer, click, rich and pydantic are imported (together about
0.3 s); the typer app (:mod:`assay.cli.app`) is built from the same table, and
tests/cli/test_main.py fails when the app and the table disagree (a command, its one-line summary,
a top-level option). Only the standard library is imported here.
"""

from __future__ import annotations

import os
import sys

__all__ = ["APP_HELP", "COMMANDS", "OPTIONS", "command_names", "top_level_help"]

APP_HELP = (
    "Certify and monitor the robustness and fairness of machine-learning models.\n\n"
    "Exit codes: 0 success (for verify: the property holds), 10 violated, 20 unknown or timeout, "
    "2 error (bad file, bad option), 130 interrupted."
)

# (name, "module:function" of the typer command, summary = the first paragraph of its docstring),
# in the order `assay --help` lists them.
COMMANDS: tuple[tuple[str, str, str], ...] = (
    ("info", "assay.cli.info_cmd:info",
     "Show the layers, shapes, parameter count and input/output names of a model."),
    ("bounds", "assay.cli.bounds_cmd:bounds",
     "Sound bounds of every output over each input region of a VNN-LIB property."),
    ("verify", "assay.cli.verify_cmd:verify",
     "Decide whether MODEL satisfies PROPERTY, or run every instance of an --instances CSV."),
    ("verify-online", "assay.cli.verify_online_cmd:verify_online",
     "Verify PROPERTY on MODEL, then again after every step of --steps, reusing the last step's work."),
    ("monitor", "assay.cli.monitor_cmd:monitor",
     "Monitor a stream of decisions for pairs of close inputs with different decisions."),
    ("demo", "assay.cli.demo_cmd:demo",
     "A short tour of assay on built-in data (needs no files): certify a digits classifier, verify a growing "
     "ball online, monitor a decision stream, certify KNN decisions against biased labels, and more."),
    ("knn-fairness", "assay.cli.knn_cmd:knn_fairness",
     "Certify that KNN decisions survive biased training labels (label-flipping, individual and ε-fairness)."),
    ("preimage", "assay.cli.preimage_cmd:preimage",
     "Approximate the inputs of a box or an image patch that the model maps to class K, with volume guarantees."),
    ("serve", "assay.cli.serve_cmd:serve",
     "Serve the monitor over HTTP: post decisions, list violations, and watch them in a browser dashboard."),
    ("cfx", "assay.cli.cfx_cmd:cfx",
     "Explain rejected inputs with counterfactuals, optionally robust to model retraining."),
    ("warmup", "assay.cli.warmup_cmd:warmup",
     "Compile the monitor's and the KNN certifier's kernels now (once; later runs load them in about a second)."),
)

# The top-level options: (how they are spelled in the help, help text).
OPTIONS: tuple[tuple[str, str], ...] = (
    ("--version", "Print the version and exit."),
    ("-h, --help", "Show this message and exit."),
)


def command_names() -> tuple[str, ...]:
    """The subcommands' names, in help order."""
    return tuple(name for name, _, _ in COMMANDS)


def _width() -> int:
    """The terminal's width (``COLUMNS`` first, as click does), 80 when unknown, at most 100."""
    try:
        width = int(os.environ["COLUMNS"])
    except (KeyError, ValueError):
        try:
            width = os.get_terminal_size(sys.stdout.fileno()).columns
        except (OSError, ValueError, AttributeError):  # not a terminal, no fileno (a captured stream)
            width = 80
    return max(40, min(width, 100))


def _rows(rows: list[tuple[str, str]], width: int) -> list[str]:
    """Two columns: the terms, then their texts wrapped into the rest of the width."""
    import textwrap

    indent = 2 + max(len(term) for term, _ in rows) + 2
    lines = []
    for term, text in rows:
        wrapped = textwrap.wrap(text, max(20, width - indent), break_on_hyphens=False) or [""]
        lines.append(f"  {term.ljust(indent - 4)}  {wrapped[0]}")
        lines.extend(" " * indent + more for more in wrapped[1:])
    return lines


def top_level_help(prog: str = "assay", width: int | None = None) -> str:
    """The text of ``assay --help``: usage, what assay does, exit codes, options and commands."""
    import textwrap

    width = _width() if width is None else width
    lines = [f"Usage: {prog} [OPTIONS] COMMAND [ARGS]...", ""]
    for paragraph in APP_HELP.split("\n\n"):
        lines += textwrap.wrap(paragraph, width - 2, initial_indent="  ", subsequent_indent="  ", break_on_hyphens=False) + [""]
    lines += ["Options:", *_rows(list(OPTIONS), width), "", "Commands:",
              *_rows([(name, summary) for name, _, summary in COMMANDS], width)]
    lines += ["", f"Run '{prog} COMMAND --help' for a command's arguments and options."]
    return "\n".join(lines) + "\n"
