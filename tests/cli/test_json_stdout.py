"""``--json`` prints JSON and nothing else on stdout, also when an LP solver runs: HiGHS prints a
banner from C++ when a process builds its first solver, which used to open `assay verify --json`'s
output. Each command runs in a fresh process (the banner comes once per process), through a small
wrapper that counts the HiGHS solvers built, so the test knows the LP really ran."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch

from assay.verify.marabou import export_onnx
from tests.verify.networks import random_relu_network

REPO = Path(__file__).resolve().parents[2]

COUNTING_RUN = textwrap.dedent("""
    import sys, highspy
    built = [0]
    construct = highspy.Highs.__init__
    def counting(self, *args, **kwargs):
        built[0] += 1
        construct(self, *args, **kwargs)
    highspy.Highs.__init__ = counting
    from assay.cli.main import app
    try:
        app(sys.argv[2:])
    except SystemExit:
        pass
    finally:
        with open(sys.argv[1], "w") as out:
            out.write(str(built[0]))
""")


@pytest.fixture(scope="module")
def lp_case(tmp_path_factory) -> dict:
    """A 20→20→20→2 ReLU network on inputs ±0.1 with "Y0 − Y1 ≥ sampled maximum + 0.3" unsafe:
    it holds, ReLU splitting runs (20 inputs), and the root stays open, so the LP refinement runs."""
    folder = tmp_path_factory.mktemp("lp")
    network = random_relu_network(0, (20, 20, 20, 2))
    export_onnx(network, folder / "net.onnx")
    x = torch.as_tensor(np.random.default_rng(0).uniform(-0.1, 0.1, (200_000, 20)))
    y = network.forward(x)
    threshold = float((y[:, 0] - y[:, 1]).max()) + 0.3
    lines = [f"(declare-const X_{i} Real)" for i in range(20)] + ["(declare-const Y_0 Real)", "(declare-const Y_1 Real)"]
    lines += [f"(assert (>= X_{i} -0.1))\n(assert (<= X_{i} 0.1))" for i in range(20)]
    lines.append(f"(assert (>= (- Y_0 Y_1) {threshold!r}))")
    (folder / "prop.vnnlib").write_text("\n".join(lines) + "\n")
    (folder / "steps.jsonl").write_text(json.dumps({"model": "net.onnx"}) + "\n")
    return {"folder": folder}


def run_counting(folder: Path, *args: str) -> tuple[subprocess.CompletedProcess, int]:
    count_file = folder / "highs_count.txt"
    env = {**os.environ, "PYTHONPATH": str(REPO / "src") + os.pathsep + os.environ.get("PYTHONPATH", "")}
    done = subprocess.run([sys.executable, "-c", COUNTING_RUN, str(count_file), *args], cwd=folder, env=env,
                          capture_output=True, text=True, timeout=600)
    return done, int(count_file.read_text())


def test_verify_json_is_pure_json_when_the_lp_refinement_runs(lp_case):
    done, solvers = run_counting(lp_case["folder"], "verify", "net.onnx", "prop.vnnlib", "--json", "--timeout", "120")
    assert solvers > 0, "the case should make the LP refinement run"
    payload = json.loads(done.stdout)  # fails on any banner before or after the JSON
    assert payload["status"] == "holds", done.stderr
    assert "HiGHS" not in done.stdout + done.stderr


def test_verify_online_json_is_pure_json(lp_case):
    done, _ = run_counting(lp_case["folder"], "verify-online", "net.onnx", "prop.vnnlib", "--steps", "steps.jsonl",
                           "--json", "--timeout", "60")
    payload = json.loads(done.stdout)
    assert len(payload["steps"]) == 2, done.stderr
    assert "HiGHS" not in done.stdout + done.stderr
