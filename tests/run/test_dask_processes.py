"""assay.run on a real Dask cluster: a ``dask scheduler`` process and two ``dask worker`` processes on loopback.

The cluster runs a small verification batch (:func:`assay.run.vnncomp.verify_instance`); its
results must equal those of the same jobs run locally, item by item, and both workers must have taken jobs.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from assay.run import run_tasks
from assay.run.vnncomp import read_instances, verify_instance
from tests.cli.models import holding_property, violated_property, write_tiny_onnx
from tests.requirements import require
from tests.run import jobs
from tests.serve.servers import free_port

REPO_ROOT = Path(__file__).resolve().parents[2]


def _dask_command() -> list[str]:
    found = shutil.which("dask", path=str(Path(sys.executable).parent)) or shutil.which("dask")
    return [found] if found else [sys.executable, "-m", "distributed.cli.dask_spec"]


@pytest.fixture(scope="module")
def cluster():
    distributed = require("distributed")
    port = free_port()
    address = f"tcp://127.0.0.1:{port}"
    environment = dict(os.environ, OMP_NUM_THREADS="1",
                       PYTHONPATH=os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH", "")])))
    dask = _dask_command()
    processes = [subprocess.Popen([*dask, "scheduler", "--host", "127.0.0.1", "--port", str(port), "--no-dashboard"],
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=environment, cwd=REPO_ROOT)]
    try:
        for _ in range(2):
            processes.append(subprocess.Popen(
                [*dask, "worker", address, "--nthreads", "1", "--no-nanny", "--no-dashboard", "--host", "127.0.0.1"],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=environment, cwd=REPO_ROOT))
        deadline = time.monotonic() + 60
        while True:  # the scheduler takes a moment to listen
            try:
                client = distributed.Client(address, timeout="5s", set_as_default=False)
                break
            except (OSError, TimeoutError):
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
        try:
            client.wait_for_workers(2, timeout=90)
        finally:
            client.close()
        yield address
    finally:
        # Throw-away processes: the workers are killed outright (a graceful close waits on the
        # scheduler for many seconds), then the scheduler is asked to stop.
        for process in reversed(processes):
            if process is processes[0]:
                process.terminate()
            else:
                process.kill()
        for process in processes:
            try:
                process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=10)


def test_a_verification_batch_on_the_cluster_equals_running_it_locally(cluster, tmp_path):
    write_tiny_onnx(tmp_path / "tiny.onnx")
    holding_property(tmp_path / "holds.vnnlib")
    violated_property(tmp_path / "violated.vnnlib")
    (tmp_path / "instances.csv").write_text("tiny.onnx,holds.vnnlib,30\ntiny.onnx,violated.vnnlib,30\n" * 2)
    instances = read_instances(tmp_path / "instances.csv")
    on_cluster = run_tasks(verify_instance, instances, scheduler=cluster, progress=False)
    # The reference runs in this process (workers=1): the same jobs without a pool's start-up
    # (the local pool itself is tested in tests/run/test_tasks.py).
    local = run_tasks(verify_instance, instances, workers=1, progress=False)
    keep = ("network", "property", "status", "counterexample", "error")
    assert [{k: row[k] for k in keep} for row in on_cluster] == [{k: row[k] for k in keep} for row in local]
    assert [row["status"] for row in on_cluster] == ["holds", "violated"] * 2
    for row in on_cluster[1::2]:  # every counterexample re-checked: y0 = relu(x0) + relu(x1) ≥ 1.5
        x = row["counterexample"]["input"]
        assert sum(max(v, 0.0) for v in x) >= 1.5 - 1e-6 and all(-1e-9 <= v <= 1 + 1e-9 for v in x)


def test_both_worker_processes_take_jobs(cluster):
    seen = run_tasks(jobs.torch_threads, range(16), scheduler=cluster, progress=False)
    assert len({pid for _, pid in seen}) == 2 and os.getpid() not in {pid for _, pid in seen}
