"""The ``assay`` console script, and the typer app as ``assay.cli.main.app``.

:func:`run` answers ``assay``, ``assay --help`` and ``assay --version`` from the command table
(:mod:`assay.cli.commands`) without importing typer, click, rich or pydantic, and runs any other
command line in the typer app (:mod:`assay.cli.app`) built with the one subcommand it names, so
that the other subcommands' modules are not imported either. ``app`` (the whole app, for tests
and for embedding) is built when first asked for.
"""

from __future__ import annotations

import time

# When the command started, as near the process start as this module gets: a verification's
# --timeout counts from here (the imports below and loading torch included).
_LOADING_STARTED = time.monotonic()

import os  # noqa: E402
import sys  # noqa: E402

from assay.cli.commands import command_names, top_level_help  # noqa: E402

__all__ = ["app", "dispatch", "run"]  # noqa: F822 (app: built on first use, by __getattr__)


def __getattr__(name: str):
    """``app``: the typer app with every subcommand, built on first use (PEP 562)."""
    if name == "app":
        from assay.cli.app import build_app

        globals()["app"] = built = build_app()
        return built
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _answer_at_once(argv: list[str]) -> int | None:
    """Print the top-level help or the version for these arguments and return the exit code; None otherwise."""
    if argv in ([], ["--help"], ["-h"]):
        sys.stdout.write(top_level_help())
        return 2 if not argv else 0  # no command at all is a usage error (as typer's no_args_is_help)
    if argv == ["--version"]:
        import assay

        sys.stdout.write(f"assay {assay.__version__}\n")
        return 0
    return None


def dispatch(argv: list[str]) -> int:
    """Run the command line ``argv`` (without the program's name) as ``assay`` does; return its exit code."""
    code = _answer_at_once(argv)
    return _run_app(argv) if code is None else code


def _run_app(argv: list[str]) -> int:
    from assay.cli import _common
    from assay.cli.app import build_app

    _common.COMMAND_STARTED = _LOADING_STARTED
    chosen = argv[0] if argv and argv[0] in command_names() else None
    try:
        build_app(only=chosen)(args=argv)
        return 0
    except SystemExit as exit_:
        if isinstance(exit_.code, str):
            print(exit_.code, file=sys.stderr)
        return exit_.code if isinstance(exit_.code, int) else (0 if exit_.code is None else 1)


def run() -> None:
    """The ``assay`` console script: run the command line, flush its output, and leave at once.

    Unloading torch and the other native libraries takes 0.5–1 s at interpreter exit: every
    command would pay it, and ``assay verify --timeout T`` promises an answer T seconds after
    it started. Everything a command writes is written and closed by the command itself (files
    through ``with`` blocks), so only the standard streams are left to flush. A Python
    exception that escapes the app (a bug) still ends the normal way, with its traceback.
    """
    code = dispatch(sys.argv[1:])
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (BrokenPipeError, ValueError):  # a reader that went away (`| head`), a closed stream
            pass
    os._exit(code)


if __name__ == "__main__":
    run()
