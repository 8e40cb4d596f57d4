"""The ``assay`` command: one typer app, one module per subcommand.

Every subcommand is wrapped by :func:`assay.cli._common.handle_errors`: an
:class:`~assay.errors.AssayError` prints ``error: <message>`` on stderr and exits 2 (no
traceback); Ctrl-C exits 130. Subcommand modules import their heavy dependencies lazily, so
``assay --version`` and ``assay --help`` answer at once.
"""

from __future__ import annotations

import typer

import assay
from assay.cli import bounds_cmd, demo_cmd, info_cmd, knn_cmd, monitor_cmd, verify_cmd, verify_online_cmd
from assay.cli._common import handle_errors

__all__ = ["app"]

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


if __name__ == "__main__":
    app()
