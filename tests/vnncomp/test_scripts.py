"""The competition's tool scripts (vnncomp/*.sh) end to end, as the competition calls them.

``$ASSAY`` points the scripts at the ``assay`` command of the interpreter running the tests, so
that they test this checkout (its ``PYTHONPATH`` included).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from assay.sets import read_vnnlib
from assay.verify.competition import read_result_file
from tests.cli.models import violated_property
from tests.verify.test_competition import onnx_output, write_round_onnx

SCRIPTS = Path(__file__).resolve().parents[2] / "vnncomp"


def script(name: str, *args, check_code: int | None = 0) -> subprocess.CompletedProcess:
    command = Path(sys.executable).parent / "assay"
    if not command.exists():
        pytest.skip(f"no assay command beside {sys.executable} (install assay: make install)")
    env = os.environ | {"ASSAY": str(command), "OMP_NUM_THREADS": "1"}
    done = subprocess.run(["bash", str(SCRIPTS / name), *map(str, args)], capture_output=True, text=True, env=env,
                          timeout=300)
    if check_code is not None:
        assert done.returncode == check_code, done.stdout + done.stderr
    return done


def test_scripts_parse_as_bash_and_refuse_wrong_versions_and_arguments(tmp_path):
    for name in ("install_tool.sh", "prepare_instance.sh", "run_instance.sh"):
        assert subprocess.run(["bash", "-n", str(SCRIPTS / name)]).returncode == 0
        done = subprocess.run(["bash", str(SCRIPTS / name), "v2", "b", "m", "p", "r", "1"], capture_output=True, text=True)
        assert done.returncode == 1 and "Expected first argument (version string) 'v1', got 'v2'" in done.stderr
    assert "got 3 arguments" in script("run_instance.sh", "v1", "bench", "model.onnx", check_code=1).stderr
    missing = script("prepare_instance.sh", "v1", "bench", tmp_path / "missing.onnx", tmp_path / "p.vnnlib", check_code=1)
    assert "no such file" in missing.stderr


@pytest.mark.data
def test_prepare_and_run_on_a_real_violated_instance(data_dir, tmp_path):
    folder = data_dir / "vnncomp" / "rl_benchmarks"
    model, prop = folder / "onnx" / "cartpole.onnx", folder / "vnnlib" / "cartpole_case_unsafe_29.vnnlib"  # consensus: violated
    script("prepare_instance.sh", "v1", "rl_benchmarks", model, prop)
    out = tmp_path / "result.txt"
    out.write_text("stale\n")  # a result left from an earlier run must not survive
    done = script("run_instance.sh", "v1", "rl_benchmarks", model, prop, out, 30)
    assert "Result: sat" in done.stdout
    parsed = read_result_file(out)
    assert parsed.word == "sat"
    # As the published checker does: onnxruntime on X reproduces Y, X lies in a box of the
    # property, and Y meets that box's unsafe condition.
    assert np.abs(onnx_output(model, parsed.input) - parsed.output).max() <= 1e-4
    spec = read_vnnlib(prop, num_inputs=parsed.input.size, num_outputs=parsed.output.size)
    violated = False
    for query in spec.queries:
        lower, upper = query.input_set.lower.numpy().reshape(-1), query.input_set.upper.numpy().reshape(-1)
        if ((lower <= parsed.input) & (parsed.input <= upper)).all():
            for conjunction in query.unsafe_outputs.conjunctions:
                values = conjunction.C.numpy() @ parsed.output + conjunction.d.numpy()
                violated |= bool((values >= 0).all())
    assert violated


def test_run_instance_writes_error_for_a_model_assay_cannot_bound(tmp_path):
    model = write_round_onnx(tmp_path / "round.onnx")
    out = tmp_path / "result.txt"
    done = script("run_instance.sh", "v1", "test", model, violated_property(tmp_path / "v.vnnlib"), out, 30)
    assert out.read_text() == "error\n"
    reasons = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert len(reasons) == 1 and "'Round'" in reasons[0]


def fake_assay(tmp_path, body: str) -> dict:
    """An environment whose $ASSAY is a shell script (to drive run_instance.sh's own safety nets)."""
    command = tmp_path / "fake-assay"
    command.write_text("#!/usr/bin/env bash\n" + body + "\n")
    command.chmod(0o755)
    return os.environ | {"ASSAY": str(command), "ASSAY_TIMEOUT_GRACE": "1"}


@pytest.mark.timeout(60)
@pytest.mark.parametrize("body, word, message", [
    ("sleep 30", "timeout", "did not stop within 3 s"),  # hangs past TIMEOUT + grace: stopped, counted as timeout
    ("echo 'Traceback: boom' >&2; exit 1", "error", "exit code 1"),  # dies without a result
])
def test_run_instance_records_a_run_that_hangs_or_dies(tmp_path, body, word, message):
    out = tmp_path / "result.txt"
    done = subprocess.run(["bash", str(SCRIPTS / "run_instance.sh"), "v1", "test", "m.onnx", "p.vnnlib", str(out), "1"],
                          capture_output=True, text=True, env=fake_assay(tmp_path, body), timeout=60)
    assert done.returncode == 0, done.stderr
    assert out.read_text() == word + "\n" and message in done.stderr
