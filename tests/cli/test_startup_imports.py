"""The light commands load only what their job needs: each runs in a fresh interpreter and its ``sys.modules`` is checked.

``assay --help``, ``assay --version``, a small ``assay monitor`` job and ``assay serve`` (up to
the point where it would listen, compiled kernels loaded) must not import torch, scipy.optimize,
networkx, dd or the k-d tree, BDD, partition and faiss backends. The help and the version load no
CLI framework (typer, click, rich, pydantic) either; a small monitor job loads neither numba (it
runs in the numpy scan index) nor the other subcommands' modules. (Timings are measured by benchmarks/startup.py, never asserted.)
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from assay.cli.commands import COMMANDS

SRC = Path(__file__).resolve().parents[2] / "src"

# Heavy modules that none of these commands needs (each costs from 0.1 s to seconds to import).
HEAVY = ("torch", "scipy.optimize", "scipy.spatial", "networkx", "dd", "faiss", "sklearn", "onnx", "onnxruntime",
         "assay.monitor.frnn.kdtree", "assay.monitor.frnn.bdd", "assay.monitor.frnn.partition",
         "assay.monitor.frnn.faiss_flat", "assay.nn", "assay.bounds.crown", "assay.verify.verifier")

# Runs the command line as the console script does (assay.cli.main.dispatch), in-process, then
# writes the names of the loaded modules to a file. `assay serve` stops where it would start
# listening (uvicorn's run is replaced), after its kernel warm-up thread has finished.
DRIVER = """
import json, sys, threading
out, argv = sys.argv[1], sys.argv[2:]
if argv[:1] == ["serve"]:
    import uvicorn
    uvicorn.Server.run = lambda self, sockets=None: None
from assay.cli.main import dispatch
code = dispatch(argv)
if code != 0:
    raise SystemExit(f"exit code {code}")
for thread in threading.enumerate():
    if thread.name == "assay-warmup":
        thread.join()
json.dump(sorted(sys.modules), open(out, "w"))
"""


def loaded_modules(tmp_path: Path, *argv: str) -> set[str]:
    out = tmp_path / "modules.json"
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    done = subprocess.run([sys.executable, "-c", DRIVER, str(out), *argv], env=env, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr
    return set(json.loads(out.read_text()))


def heavy_in(modules: set[str], extra: tuple[str, ...] = ()) -> list[str]:
    return sorted(name for name in HEAVY + extra if name in modules)


# The top-level help and the version are printed from the command table: not even typer is loaded.
CLI_FRAMEWORK = ("typer", "click", "rich", "pydantic", "numpy", "numba")


@pytest.mark.parametrize("argv", [["--help"], ["--version"]])
def test_help_and_version_load_no_cli_framework_nor_heavy_modules(tmp_path, argv):
    modules = loaded_modules(tmp_path, *argv)
    assert "assay.cli.commands" in modules  # the command ran
    assert heavy_in(modules, CLI_FRAMEWORK) == []


# A command loads its own module only, not the other subcommands'.
OTHER_COMMANDS = tuple(target.split(":")[0] for _, target, _ in COMMANDS if not target.startswith("assay.cli.monitor_cmd"))


def test_small_monitor_job_loads_no_compiled_kernels(tmp_path):
    rng = np.random.default_rng(0)
    rows = rng.random((300, 5))
    stream = tmp_path / "stream.csv"
    stream.write_text("a,b,c,d,e,prediction\n" + "".join(",".join(f"{v:.4f}" for v in row) + f",{i % 2}\n"
                                                           for i, row in enumerate(rows)))
    modules = loaded_modules(tmp_path, "monitor", str(stream), "--epsilon", "0.05")
    assert "assay.monitor.frnn.scan" in modules  # the job ran
    assert heavy_in(modules, ("numba", "llvmlite", "assay.monitor._kernels", *OTHER_COMMANDS)) == []


@pytest.mark.requires("fastapi", "uvicorn")
def test_serve_loads_the_grid_kernels_and_nothing_heavy(tmp_path):
    modules = loaded_modules(tmp_path, "serve", "--epsilon", "0.1", "--store", f"sqlite:///{tmp_path / 'store.db'}",
                             "--port", "8765")
    assert "assay.monitor.frnn._cells" in modules  # the warm-up ran before serving
    assert heavy_in(modules) == []


def test_shapes_of_general_operators_do_not_import_torch_dynamo():
    """The loader asks every operator its output shape; on meta tensors that ran torch's Python
    decompositions, whose first use imports torch._dynamo: ~2 s of every process loading such a network."""
    code = ("import sys, torch\n"
            "from assay.nn.ops import Affine, Binary, Sigmoid\n"
            "Affine(torch.ones(3), torch.zeros(3)).output_shape((3,))\n"
            "Binary('Mul').output_shape((3,), (3,))\n"
            "Sigmoid().output_shape((2, 3))\n")
    assert not _imports_dynamo(code)


def _imports_dynamo(code: str) -> bool:
    """Whether running ``code`` in a fresh interpreter leaves torch._dynamo imported."""
    done = subprocess.run([sys.executable, "-c", code + "import sys\nprint('torch._dynamo' in sys.modules)\n"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip() == "True"


def test_bounding_through_a_linear_general_operator_does_not_import_torch_dynamo():
    """Transposing an affine operator without a direct transpose (here a mean) is a
    vector-Jacobian product; torch.func.vjp imported torch._dynamo on its first use (~4 s of the
    first bound of every network with such an operator). Plain autograd does not."""
    code = ("import sys, torch\n"
            "from assay.bounds import compute_bounds\n"
            "from assay.nn import Linear, Network, ReLU, ops\n"
            "net = Network((Linear(torch.ones(4, 3, dtype=torch.float64), torch.zeros(4, dtype=torch.float64)), ReLU(),\n"
            "               ops.Slice((0,), (1,), (3,), (1,)), ops.Sigmoid(), ops.Reduce('mean', (0,), True)), (3,))\n"
            "low = -torch.ones(1, 3, dtype=torch.float64)\n"
            "compute_bounds(net, (low, -low), method='alpha')\n")
    assert not _imports_dynamo(code)
