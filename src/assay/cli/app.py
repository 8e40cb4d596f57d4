"""The typer app of the ``assay`` command, built from the command table (:mod:`assay.cli.commands`).

Every subcommand is wrapped by :func:`assay.cli._common.handle_errors`: an
:class:`~assay.errors.AssayError` prints ``error: <message>`` on stderr and exits 2 (no
traceback); Ctrl-C exits 130. Subcommand modules import their heavy dependencies lazily.
"""

from __future__ import annotations

import importlib

import typer

import assay
from assay.cli._common import handle_errors
from assay.cli.commands import APP_HELP, COMMANDS, OPTIONS

__all__ = ["build_app"]


def _version(value: bool) -> None:
    if value:
        typer.echo(f"assay {assay.__version__}")
        raise typer.Exit()


def _main(
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True, help=dict(OPTIONS)["--version"]),
) -> None:
    """Certify and monitor the robustness and fairness of machine-learning models."""


def build_app(only: str | None = None) -> typer.Typer:
    """The assay app with every subcommand, or with the subcommand ``only`` alone.

    The console script builds the app with the one subcommand it was asked to run, so that the
    other subcommands' modules are not imported (parsing, help and errors of that subcommand are
    the same as in the whole app).
    """
    app = typer.Typer(
        name="assay",
        help=APP_HELP,
        no_args_is_help=True,
        add_completion=False,
        pretty_exceptions_enable=False,
        context_settings={"help_option_names": ["-h", "--help"]},
    )
    app.callback()(_main)
    for name, target, _ in COMMANDS:
        if only is None or name == only:
            module, function = target.split(":")
            app.command(name)(handle_errors(getattr(importlib.import_module(module), function)))
    return app
