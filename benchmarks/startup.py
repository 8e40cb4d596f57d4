"""Whole-process wall time of the first command a user runs: cold (empty kernel cache) and warm.

Usage:
    python benchmarks/startup.py [--runs 10] [--cold-runs 10] [--cold-runs-compiling 10]
                                 [--reference-python PYTHON]
                                 [--only help,monitor-1k,monitor-100k,verify,serve,reference]

Each case starts a fresh process, ``--runs`` times, and reports the median, min and max wall time:

* ``assay --help``;
* ``assay monitor`` on a generated 1,000 × 5 CSV and a generated 100,000 × 12 CSV (uniform
  features, random 0/1 decisions, ε = 0.05, L∞);
* ``assay verify`` on ACAS Xu network 1_1 and property 1 (from ``../shared/data``);
* ``assay serve``: from starting the process to ``/health`` turning ready, and the first post (100
  decisions) after that — the time from seeing ready to its answer;
* the reference monitor ``clemont==0.1.0`` (faiss brute force, L∞) in its own virtual environment,
  on the same 1,000-row file, as a whole process (``monitor_reference.py``); the 1,000-row rows
  give their ratio to it. Its python is ``--reference-python``, else ``$ASSAY_REFERENCE_PYTHON``,
  else ``/tmp/clemont-venv/bin/python``; where there is none the row says it is absent. Make one
  with ``python3 -m venv /tmp/clemont-venv && /tmp/clemont-venv/bin/pip install clemont==0.1.0
  faiss-cpu==1.9.0.post1`` (newer faiss rejects clemont's calls; see ../shared/data/README.md).

**Cold** runs point ``NUMBA_CACHE_DIR`` at a new empty folder each time, so the monitor's kernels
are compiled if the job needs them; **warm** runs share one folder filled by ``assay warmup`` first
(what ``make demo`` / ``make test`` leave). Whether a run printed the "compiling the monitor's
kernels once" message is recorded. The machine is shared: the 1-minute load average before and
after each case is reported beside it; quote medians.

Writes benchmarks/results/startup.json and startup.md.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import REPO_ROOT, data_dir, markdown_table, write_results  # noqa: E402

EPSILON = 0.05
COMPILE_MARK = "compiling the monitor's kernels once"
ASSAY = [sys.executable, "-m", "assay.cli.main"]
DEFAULT_REFERENCE = os.environ.get("ASSAY_REFERENCE_PYTHON", "/tmp/clemont-venv/bin/python")
# CPU seconds (user + system) of each finished run, in order: on a loaded machine the wall time
# stretches with the load, the CPU time of a single-threaded process much less.
CPU: list[float] = []
CASES = ("help", "monitor-1k", "monitor-100k", "verify", "serve", "reference")


def write_stream(path: Path, rows: int, columns: int, seed: int) -> Path:
    """A CSV of ``rows`` uniform rows, feature columns x0.. and a 0/1 ``prediction`` column."""
    rng = np.random.default_rng(seed)
    X = rng.random((rows, columns))
    y = rng.integers(0, 2, rows)
    with open(path, "w") as handle:
        handle.write(",".join([f"x{i}" for i in range(columns)] + ["prediction"]) + "\n")
        for start in range(0, rows, 10_000):
            block = np.column_stack([X[start:start + 10_000], y[start:start + 10_000]])
            np.savetxt(handle, block, delimiter=",", fmt=["%.6f"] * columns + ["%d"])
    return path


def environment(cache: Path) -> dict:
    return dict(os.environ, NUMBA_CACHE_DIR=str(cache), PYTHONPATH=str(REPO_ROOT / "src"), OMP_NUM_THREADS="1")


def children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def timed(command: list[str], env: dict, ok=(0,)) -> tuple[float, str]:
    """Run ``command`` to its end; return the wall seconds and its stderr (its CPU seconds go to ``CPU``)."""
    started, cpu = time.perf_counter(), children_cpu()
    done = subprocess.run(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    seconds = time.perf_counter() - started
    CPU.append(children_cpu() - cpu)
    if done.returncode not in ok:
        raise SystemExit(f"{' '.join(command)} exited {done.returncode}: {done.stderr[-2000:]}")
    return seconds, done.stderr


def serve_once(env: dict, folder: Path) -> tuple[float, str, dict]:
    """Start ``assay serve`` on a new store; return seconds to ready, its stderr, and the first post's timings."""
    import socket

    import httpx

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    url = f"http://127.0.0.1:{port}"
    store = folder / f"store-{port}.db"
    command = [*ASSAY, "serve", "--store", f"sqlite:///{store}", "--port", str(port), "--epsilon", str(EPSILON)]
    rng = np.random.default_rng(0)
    body = json.dumps({"X": rng.random((100, 5)).round(4).tolist(), "Y": rng.integers(0, 2, 100).tolist()})
    started = time.perf_counter()
    process = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        starting_seen = False
        with httpx.Client(base_url=url, timeout=30.0) as http:
            while True:
                if process.poll() is not None:
                    raise SystemExit(f"assay serve exited: {process.stderr.read()}")
                if time.perf_counter() - started > 600:
                    raise SystemExit("assay serve was not ready within 600 s")
                try:
                    status = http.get("/health").status_code
                except httpx.HTTPError:
                    status = None
                if status == 503:
                    starting_seen = True
                if status == 200:
                    break
                time.sleep(0.01)
            ready = time.perf_counter()
            response = http.post("/api/monitors/default/decisions", content=body,
                                 headers={"content-type": "application/json"})
            answered = time.perf_counter()
            if response.status_code != 200:
                raise SystemExit(f"the first post answered {response.status_code}: {response.text[:500]}")
    finally:
        process.terminate()
        try:
            _, stderr = process.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            process.kill()
            _, stderr = process.communicate()
    return ready - started, stderr, {"post_after_ready_s": answered - ready, "first_post_answered_s": answered - started,
                                     "said_starting": starting_seen}


def summary(times: list[float]) -> dict:
    return {"median_s": statistics.median(times), "min_s": min(times), "max_s": max(times), "runs": len(times),
            "times_s": times}


def run_case(name: str, mode: str, runs: int, files: dict, warm_cache: Path, scratch: Path, reference: str | None) -> dict:
    load_before = os.getloadavg()[0]
    times, extra, compiled = [], [], 0
    del CPU[:]
    for run in range(runs):
        cache = warm_cache if mode == "warm" else Path(tempfile.mkdtemp(prefix="numba-cold-", dir=scratch))
        env = environment(cache)
        if name == "help":
            seconds, stderr = timed([*ASSAY, "--help"], env)
        elif name.startswith("monitor"):
            seconds, stderr = timed([*ASSAY, "monitor", str(files[name]), "--epsilon", str(EPSILON)], env)
        elif name == "verify":
            acas = data_dir() / "acasxu"
            seconds, stderr = timed([*ASSAY, "verify", str(acas / "ACASXU_run2a_1_1_batch_2000.onnx"),
                                     str(acas / "prop_1.vnnlib"), "--timeout", "300"], env, ok=(0, 10, 20))
        elif name == "serve":
            seconds, stderr, post = serve_once(env, scratch)
            extra.append(post)
        else:  # the reference monitor, in its own environment
            spec = scratch / "reference-spec.json"
            spec.write_text(json.dumps({"source": {"csv": str(files["monitor-1k"])}, "epsilon": EPSILON,
                                        "backend": "BruteForce", "max_n": None, "max_time": None}))
            seconds, stderr = timed([reference, str(REPO_ROOT / "benchmarks" / "monitor_reference.py"), str(spec),
                                     str(scratch / "reference-out.json")], dict(os.environ, OMP_NUM_THREADS="1"))
        compiled += COMPILE_MARK in stderr
        times.append(seconds)
        print(f"  {name} {mode} run {run + 1}: {seconds:.3f} s" + (" (compiled)" if COMPILE_MARK in stderr else ""),
              flush=True)
    result = {"case": name, "mode": mode, **summary(times), "runs_that_compiled": compiled,
              "cpu": summary(list(CPU)) if len(CPU) == runs else None,
              "load_before": load_before, "load_after": os.getloadavg()[0]}
    if extra:
        for key in ("post_after_ready_s", "first_post_answered_s"):
            result[key] = summary([item[key] for item in extra])
        result["said_starting_runs"] = sum(item["said_starting"] for item in extra)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=10, help="warm runs per case")
    parser.add_argument("--cold-runs", type=int, default=10, help="cold runs per case")
    parser.add_argument("--cold-runs-compiling", type=int, default=10,
                        help="cold runs of the cases that compile the kernels (monitor-100k, serve: a minute or more each)")
    parser.add_argument("--reference-python", default=DEFAULT_REFERENCE,
                        help="the reference monitor's python: of a venv made by `python3 -m venv DIR; DIR/bin/pip "
                             "install clemont==0.1.0 faiss-cpu==1.9.0.post1` (default: $ASSAY_REFERENCE_PYTHON, else "
                             f"/tmp/clemont-venv/bin/python; now {DEFAULT_REFERENCE})")
    parser.add_argument("--only", default=",".join(CASES), help=f"comma-separated cases among {', '.join(CASES)}")
    parser.add_argument("--name", default="startup", help="results/<name>.json and .md")
    parser.add_argument("--warm-cache", default=None, help="use this NUMBA_CACHE_DIR as the warm cache (default: a new one)")
    args = parser.parse_args()
    chosen = [case.strip() for case in args.only.split(",") if case.strip()]
    reference = args.reference_python if Path(args.reference_python).exists() else None
    payload = {"machine": {"cpus": os.cpu_count(), "python": sys.version.split()[0]}, "epsilon": EPSILON, "results": []}
    with tempfile.TemporaryDirectory(prefix="assay-startup-") as folder:
        scratch = Path(folder)
        files = {}
        if "monitor-1k" in chosen or "reference" in chosen:
            files["monitor-1k"] = write_stream(scratch / "stream-1000x5.csv", 1000, 5, 0)
        if "monitor-100k" in chosen:
            files["monitor-100k"] = write_stream(scratch / "stream-100000x12.csv", 100_000, 12, 1)
        warm_cache = Path(args.warm_cache) if args.warm_cache else scratch / "numba-warm"
        warm_cache.mkdir(exist_ok=True)
        seconds, _ = timed([*ASSAY, "warmup"], environment(warm_cache))
        payload["warmup_seconds"] = seconds
        print(f"assay warmup into the warm cache: {seconds:.1f} s", flush=True)
        for name in chosen:
            if name == "reference":
                if reference is None:
                    print(f"reference: {args.reference_python} not found; skipped", flush=True)
                    payload["results"].append({"case": "reference", "mode": "absent", "python": args.reference_python})
                    continue
                payload["results"].append(run_case(name, "warm", args.runs, files, warm_cache, scratch, reference))
                continue
            cold_runs = args.cold_runs_compiling if name in ("monitor-100k", "serve") else args.cold_runs
            for mode, runs in (("cold", cold_runs), ("warm", args.runs)):
                if runs:
                    payload["results"].append(run_case(name, mode, runs, files, warm_cache, scratch, reference))
    render(payload, args.name)


LABELS = {
    "help": "`assay --help`",
    "monitor-1k": "`assay monitor`, 1,000 × 5",
    "monitor-100k": "`assay monitor`, 100,000 × 12",
    "verify": "`assay verify` ACAS Xu 1_1 prop 1",
    "serve": "`assay serve` start → /health ready",
    "reference": "reference: clemont 0.1.0 + faiss, 1,000 × 5",
}


def render(payload: dict, name: str = "startup") -> None:
    rows = []
    reference = next((result["median_s"] for result in payload["results"]
                      if result["case"] == "reference" and result["mode"] != "absent"), None)
    for result in payload["results"]:
        label = LABELS[result["case"]]
        if result["mode"] == "absent":
            rows.append([label, "—", "absent", "", "", "", "", f"no python at {result['python']}"])
            continue
        note = f"{result['runs_that_compiled']} of {result['runs']} printed the compile message"
        if result["case"] == "monitor-1k" and reference:
            note += f"; median {result['median_s'] / reference:.2f} × the reference's"
        if "post_after_ready_s" in result:
            post = result["post_after_ready_s"]
            note += (f"; first post answered {post['median_s'] * 1e3:.0f} ms after ready "
                     f"(min {post['min_s'] * 1e3:.0f}, max {post['max_s'] * 1e3:.0f}); "
                     f"/health said starting in {result['said_starting_runs']} runs")
        cpu = result.get("cpu")
        rows.append([label, result["mode"], result["runs"], f"{result['median_s']:.3f}", f"{result['min_s']:.3f}",
                     f"{result['max_s']:.3f}", f"{cpu['median_s']:.3f}" if cpu else "—",
                     f"{result['load_before']:.1f} → {result['load_after']:.1f}", note])
    table = ("# Start-up: whole-process wall time (benchmarks/startup.py)\n\n"
             f"{payload['machine']['cpus']} CPUs, Python {payload['machine']['python']}; ε = {payload['epsilon']}, L∞. "
             f"`assay warmup` into the warm cache took {payload['warmup_seconds']:.1f} s. Cold: a new empty "
             "NUMBA_CACHE_DIR per run; warm: one cache filled by `assay warmup`. Seconds.\n\n"
             "CPU: the median user + system seconds of the process (serve: the client's side only, so none).\n\n"
             + markdown_table(["command", "cache", "runs", "median", "min", "max", "CPU median", "load (1 min)", "notes"],
                              rows))
    json_path, md_path = write_results(name, payload, table)
    print(table)
    print(f"wrote {json_path} and {md_path}")


if __name__ == "__main__":
    main()
