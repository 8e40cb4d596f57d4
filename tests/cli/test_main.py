"""The assay command itself: version, help, registered subcommands, error and exit-code contract."""

from __future__ import annotations

import subprocess
import sys

import pytest

import assay
from assay.cli.main import app


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
