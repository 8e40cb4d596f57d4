"""Shared helpers for the CLI tests: the app, a runner, tiny model files."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from assay.cli.main import app
from tests.cli.models import holding_property, violated_property, write_tiny_onnx


@pytest.fixture
def invoke():
    runner = CliRunner()

    def run(*args, **kwargs):
        return runner.invoke(app, [str(a) for a in args], **kwargs)

    return run


@pytest.fixture
def tiny(tmp_path):
    """Paths of a tiny ONNX model and two properties (one holds, one violated) in tmp_path."""
    return {
        "model": write_tiny_onnx(tmp_path / "tiny.onnx"),
        "holds": holding_property(tmp_path / "holds.vnnlib"),
        "violated": violated_property(tmp_path / "violated.vnnlib"),
    }


@pytest.fixture
def acasxu(data_dir):
    folder = data_dir / "acasxu"
    return lambda net, prop: (folder / f"ACASXU_run2a_{net}_batch_2000.onnx", folder / f"prop_{prop}.vnnlib")
