"""The assay command itself: version, help, registered subcommands, error and exit-code contract."""

from __future__ import annotations

import inspect
import os
import subprocess
import sys
from pathlib import Path

import pytest
import typer.main

import assay
from assay.cli.commands import APP_HELP, COMMANDS, OPTIONS, top_level_help
from assay.cli.main import app

SRC = Path(__file__).resolve().parents[2] / "src"


def test_version(invoke):
    result = invoke("--version")
    assert result.exit_code == 0
    assert result.stdout.strip() == f"assay {assay.__version__}" == "assay 0.1.0"


def test_help_lists_the_subcommands_and_exit_codes(invoke):
    result = invoke("--help")
    assert result.exit_code == 0
    for command in ("info", "bounds", "verify", "monitor", "demo"):
        assert command in result.stdout
    text = " ".join(result.stdout.split())
    assert "10 violated" in text and "20 unknown" in text


def test_every_expected_command_is_registered():
    names = {command.name for command in app.registered_commands}
    assert {"info", "bounds", "verify", "monitor", "demo"} <= names
    try:
        import assay.cli.knn_cmd  # noqa: F401
    except ModuleNotFoundError:
        pass
    else:
        assert "knn-fairness" in names


def one_line(text: str) -> str:
    return " ".join(text.split())


def test_the_command_table_lists_the_apps_commands_in_order_with_their_summaries():
    # `assay --help` is printed from the table without typer: it must say what typer would say.
    group = typer.main.get_command(app)
    context = group.make_context("assay", ["info"], resilient_parsing=True)
    # typer lists a command with the first paragraph of its help
    listed = [(name, one_line(inspect.cleandoc(group.get_command(context, name).help or "").split("\n\n")[0]))
              for name in group.list_commands(context)]
    assert listed == [(name, one_line(summary)) for name, _, summary in COMMANDS]
    options = [(", ".join(sorted(param.opts, key=len)), param.help) for param in group.get_params(context)]
    assert options == list(OPTIONS)
    assert group.help == APP_HELP


def run_script(*argv: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(SRC), "COLUMNS": "100"}
    return subprocess.run([sys.executable, "-m", "assay.cli.main", *argv], capture_output=True, text=True, env=env)


@pytest.mark.parametrize(("argv", "code"), [(["--help"], 0), (["-h"], 0), ([], 2)])
def test_the_top_level_help_lists_every_command_and_option(argv, code):
    done = run_script(*argv)
    assert (done.returncode, done.stderr) == (code, "")
    assert done.stdout == top_level_help(width=100)
    text = one_line(done.stdout)
    assert one_line(APP_HELP) in text
    for name, _, summary in COMMANDS:
        assert f"{name} {one_line(summary)}" in text
    for spelling, help_text in OPTIONS:
        assert f"{spelling} {help_text}" in text


def test_a_subcommand_runs_in_the_app_built_with_it_alone():
    done = run_script("monitor", "--help")
    assert done.returncode == 0
    assert "--epsilon" in done.stdout and "--decision-column" in done.stdout
    done = run_script("monitr")
    assert done.returncode == 2 and "monitor" in done.stderr  # an unknown command goes to the whole app


def test_version_does_not_import_torch():
    # The CLI starts instantly: heavy modules are imported by the subcommands that use them.
    code = "import sys; from assay.cli.main import app; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


@pytest.mark.parametrize(("argv", "code", "stream", "text"), [
    (["--version"], 0, "stdout", "assay "),
    (["info", "nope.onnx"], 2, "stderr", "error: nope.onnx"),
])
def test_the_console_script_flushes_its_output_and_keeps_the_exit_code(argv, code, stream, text, tmp_path):
    # `run` leaves with os._exit (no interpreter teardown): nothing printed may be lost.
    script = f"import sys; sys.argv = ['assay', *{argv!r}]; from assay.cli.main import run; run()"
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=tmp_path)
    assert done.returncode == code
    assert text in getattr(done, stream)


def test_missing_model_file_is_an_error_with_exit_code_2(invoke, tmp_path):
    result = invoke("info", tmp_path / "nope.onnx")
    assert result.exit_code == 2
    assert result.stderr.startswith("error: ")
    assert "nope.onnx" in result.stderr and "Traceback" not in result.output


def test_unknown_model_format_is_an_error(invoke, tmp_path):
    path = tmp_path / "model.h5"
    path.write_bytes(b"\x89HDF")
    result = invoke("info", path)
    assert result.exit_code == 2
    assert "error: " in result.stderr and "unknown model format" in result.stderr


def test_keyboard_interrupt_exits_130(invoke, monkeypatch, tmp_path):
    import assay.cli.info_cmd as info_cmd

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(info_cmd, "load_network", interrupted)
    result = invoke("info", tmp_path / "any.onnx")
    assert result.exit_code == 130
