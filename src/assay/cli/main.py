"""The ``assay`` command: one typer app, one module per subcommand.

Every subcommand is wrapped by :func:`assay.cli._common.handle_errors`: an
:class:`~assay.errors.AssayError` prints ``error: <message>`` on stderr and exits 2 (no
traceback); Ctrl-C exits 130. Subcommand modules import their heavy dependencies lazily, so
``assay --version`` and ``assay --help`` answer at once.
"""

from __future__ import annotations

import time

# When the command started, as near the process start as this module gets: a verification's
# --timeout counts from here (the imports below and loading torch included).
_LOADING_STARTED = time.monotonic()

import os  # noqa: E402
import sys  # noqa: E402

import typer  # noqa: E402

import assay
from assay.cli import (
    _common,
    bounds_cmd,
    cfx_cmd,
    demo_cmd,
    info_cmd,
    knn_cmd,
    monitor_cmd,
    preimage_cmd,
    serve_cmd,
    verify_cmd,
    verify_online_cmd,
    warmup_cmd,
)
from assay.cli._common import handle_errors

__all__ = ["app", "run"]

app = typer.Typer(
    name="assay",
    help=(
        "Certify and monitor the robustness and fairness of machine-learning models.\n\n"
        "Exit codes: 0 success (for verify: the property holds), 10 violated, 20 unknown or timeout, "
        "2 error (bad file, bad option), 130 interrupted."
    ),
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"assay {assay.__version__}")
        raise typer.Exit()


@app.callback()
def main(
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True, help="Print the version and exit."),
) -> None:
    """Certify and monitor the robustness and fairness of machine-learning models."""


def _register(function, name: str) -> None:
    app.command(name)(handle_errors(function))


_register(info_cmd.info, "info")
_register(bounds_cmd.bounds, "bounds")
_register(verify_cmd.verify, "verify")
_register(verify_online_cmd.verify_online, "verify-online")
_register(monitor_cmd.monitor, "monitor")
_register(demo_cmd.demo, "demo")
_register(knn_cmd.knn_fairness, "knn-fairness")
_register(preimage_cmd.preimage, "preimage")
_register(serve_cmd.serve, "serve")
_register(cfx_cmd.cfx, "cfx")
_register(warmup_cmd.warmup, "warmup")


def run() -> None:
    """The ``assay`` console script: run the app, flush its output, and leave at once.

    Unloading torch and the other native libraries takes 0.5–1 s at interpreter exit: every
    command would pay it, and ``assay verify --timeout T`` promises an answer T seconds after
    it started. Everything a command writes is written and closed by the command itself (files
    through ``with`` blocks), so only the standard streams are left to flush. A Python
    exception that escapes the app (a bug) still ends the normal way, with its traceback.
    """
    _common.COMMAND_STARTED = _LOADING_STARTED
    try:
        app()
        code = 0
    except SystemExit as exit_:
        code = exit_.code if isinstance(exit_.code, int) else (0 if exit_.code is None else 1)
        if isinstance(exit_.code, str):
            print(exit_.code, file=sys.stderr)
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (BrokenPipeError, ValueError):  # a reader that went away (`| head`), a closed stream
            pass
    os._exit(code)


if __name__ == "__main__":
    run()
