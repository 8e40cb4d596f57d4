"""assay.monitor side by side with the reference implementation clemont==0.1.0 (Clemont, KDD 2025, Table 1).

Usage:
    python benchmarks/monitor.py [--reference-python /tmp/clemont-venv/bin/python]
                                 [--suites certifair,large,dims] [--quick]

The reference lives in its own virtual environment (it needs faiss-cpu==1.9.0.post1)::

    python3 -m venv /tmp/clemont-venv
    /tmp/clemont-venv/bin/pip install clemont==0.1.0 faiss-cpu==1.9.0.post1

Each measurement runs in a fresh subprocess (peak memory = that process's peak RSS): the reference
through benchmarks/monitor_reference.py (its BruteForce (faiss) and KdTree backends, L∞, through
its own DataframeRunner, one decision at a time), assay through this file's ``--worker`` mode,
both one decision at a time (``observe``) and in batches (``observe_batch``). The reference may
stop at ``--reference-max-n`` decisions or ``--reference-budget`` seconds; ratios are taken on the
common prefix. Exactness: the per-decision witness counts of both are compared on that prefix
(the reference's brute force keeps at most 128 neighbours per query and uses d < ε, not ≤ ε).
Writes benchmarks/results/monitor.json and monitor.md.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import resource
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import data_dir, machine, markdown_table, write_results  # noqa: E402

EPSILONS = (0.0025, 0.005, 0.01, 0.02, 0.04, 0.08, 0.16, 0.32)
HERE = Path(__file__).resolve().parent


# -- the assay worker (runs in its own process) ------------------------------------------------
def _load(source: dict) -> tuple[np.ndarray, np.ndarray]:
    if "zip" in source:
        with zipfile.ZipFile(source["zip"]) as archive:
            rows = list(csv.reader(io.StringIO(archive.read(source["member"]).decode())))
        header, body = rows[0], np.array(rows[1:], dtype=np.float64)
        features = [i for i, c in enumerate(header) if c not in ("prediction", "label")]
        return np.ascontiguousarray(body[:, features]), body[:, header.index("prediction")]
    spec = source["synthetic"]
    rng = np.random.default_rng(spec["seed"])  # the same draws as monitor_reference.py
    X = rng.random((spec["n"], spec["d"]))
    return X, rng.integers(0, 2, spec["n"]).astype(np.float64)


def _summary(times: np.ndarray) -> dict:
    if not times.size:
        return {"mean_ms": None, "p50_ms": None, "p99_ms": None}
    return {"mean_ms": float(times.mean() * 1e3), "p50_ms": float(np.percentile(times, 50) * 1e3), "p99_ms": float(np.percentile(times, 99) * 1e3)}


def worker(spec_path: str, out_path: str) -> None:
    from assay.monitor import Monitor

    spec = json.loads(Path(spec_path).read_text())
    X, Y = _load(spec["source"])
    if spec.get("max_n"):
        X, Y = X[: spec["max_n"]], Y[: spec["max_n"]]
    Monitor(spec["epsilon"], "linf", index=spec["index"]).observe_batch(X[:3], Y[:3])  # load compiled kernels
    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    monitor = Monitor(spec["epsilon"], "linf", index=spec["index"], count_only=True)
    budget = spec.get("max_time") or float("inf")
    counts = np.zeros(X.shape[0], dtype=np.int64)
    times = []
    started = time.perf_counter()
    if spec["mode"] == "single":
        for i in range(X.shape[0]):
            tic = time.perf_counter()
            counts[i] = monitor.observe(X[i], Y[i]).count
            times.append(time.perf_counter() - tic)
            if tic - started > budget:
                break
        times = np.asarray(times)
    else:
        step = spec["batch_size"]
        for lo in range(0, X.shape[0], step):
            tic = time.perf_counter()
            found = monitor.observe_batch(X[lo : lo + step], Y[lo : lo + step])
            elapsed = time.perf_counter() - tic
            counts[lo : lo + len(found)] = [w.count for w in found]
            times.append(np.full(len(found), elapsed / len(found)))
            if tic - started > budget:
                break
        times = np.concatenate(times)
    done = times.size
    prefix = min(spec.get("prefix") or done, done)
    result = {
        "index": type(monitor.index).name,
        "decisions": int(done),
        "pairs": int(counts[:done].sum()),
        "flagged": int(np.count_nonzero(counts[:done])),
        **_summary(times),
        "prefix": int(prefix),
        "prefix_pairs": int(counts[:prefix].sum()),
        "prefix_flagged": int(np.count_nonzero(counts[:prefix])),
        "prefix_mean_ms": _summary(times[:prefix])["mean_ms"],
        "prefix_counts": counts[:prefix].tolist() if spec.get("want_counts") else None,
        "wall_s": time.perf_counter() - started,
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "rss_before_mb": rss_before,
    }
    Path(out_path).write_text(json.dumps(result))


# -- the driver ---------------------------------------------------------------------------------
def _subprocess(python: str, script: Path, spec: dict, timeout: float, extra: tuple = ()) -> dict:
    with tempfile.TemporaryDirectory() as folder:
        spec_path, out_path = Path(folder) / "spec.json", Path(folder) / "out.json"
        spec_path.write_text(json.dumps(spec))
        try:
            done = subprocess.run([python, str(script), *extra, str(spec_path), str(out_path)], capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            return {"error": f"timed out after {timeout:.0f} s"}
        if done.returncode != 0 or not out_path.exists():
            return {"error": (done.stderr or done.stdout).strip().splitlines()[-1:] or ["failed"]}
        return json.loads(out_path.read_text())


def configurations(suites: list[str], quick: bool) -> list[dict]:
    configs = []
    zip_path = str(data_dir() / "monitor" / "certifair_predictions.zip")
    if "certifair" in suites:
        for dataset in ("german", "compas", "adult"):
            for epsilon in (EPSILONS[2], EPSILONS[6]) if quick else EPSILONS:
                configs.append({"name": f"{dataset}-base-P1", "epsilon": epsilon,
                                "source": {"zip": zip_path, "member": f"predictions/{dataset}-base-P1-combined.csv"}})
    if "large" in suites:
        for d in (12, 24):
            for epsilon in (0.05,) if quick else (0.01, 0.025, 0.05):
                configs.append({"name": f"uniform-1e6x{d}", "epsilon": epsilon, "source": {"synthetic": {"n": 10**6, "d": d, "seed": d}}})
    if "dims" in suites:
        for d in (4, 64, 1024, 16384) if quick else (4, 16, 64, 256, 1024, 4096, 16384, 65536):
            configs.append({"name": f"uniform-1e4x{d}", "epsilon": 0.05, "source": {"synthetic": {"n": 10**4, "d": d, "seed": d}}})
    return configs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--worker", nargs=2, metavar=("SPEC", "OUT"), help=argparse.SUPPRESS)
    parser.add_argument("--reference-python", default=None, help="python of the venv with clemont==0.1.0 (omit to run assay only)")
    parser.add_argument("--reference-backends", default="BruteForce,KdTree")
    parser.add_argument("--reference-max-n", type=int, default=100_000)
    parser.add_argument("--reference-budget", type=float, default=120.0, help="seconds per reference run")
    parser.add_argument("--assay-budget", type=float, default=600.0, help="seconds per assay run")
    parser.add_argument("--index", default="auto")
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--suites", default="certifair,large,dims")
    parser.add_argument("--quick", action="store_true", help="two ε per data set, one ε per large stream, four dims")
    parser.add_argument("--name", default="monitor", help="results file name")
    args = parser.parse_args()
    if args.worker:
        worker(*args.worker)
        return

    rows, payload = [], {"machine": machine(), "reference": args.reference_python, "configs": []}
    for config in configurations(args.suites.split(","), args.quick):
        entry = dict(config)
        reference = {}
        prefix = None
        if args.reference_python:
            for backend in args.reference_backends.split(","):
                spec = {"source": config["source"], "epsilon": config["epsilon"], "backend": backend,
                        "max_n": args.reference_max_n, "max_time": args.reference_budget}
                reference[backend] = _subprocess(args.reference_python, HERE / "monitor_reference.py", spec, args.reference_budget * 3 + 300)
                print(config["name"], config["epsilon"], backend, {k: v for k, v in reference[backend].items() if k != "counts"}, flush=True)
            finished = [r for r in reference.values() if "decisions" in r]
            prefix = min((r["decisions"] for r in finished), default=None)
        assay = {}
        for mode in ("single", "batch"):
            spec = {"source": config["source"], "epsilon": config["epsilon"], "index": args.index, "mode": mode,
                    "batch_size": args.batch_size, "prefix": prefix, "max_time": args.assay_budget, "want_counts": prefix is not None}
            assay[mode] = _subprocess(sys.executable, Path(__file__), spec, args.assay_budget * 3 + 300, extra=("--worker",))
            print(config["name"], config["epsilon"], "assay", mode, {k: v for k, v in assay[mode].items() if k != "prefix_counts"}, flush=True)
        counts = assay["single"].pop("prefix_counts", None)
        assay["batch"].pop("prefix_counts", None)
        for result in reference.values():
            ref_counts = result.pop("counts", None)
            if counts is not None and ref_counts is not None:
                n = min(len(counts), len(ref_counts))
                result["decisions_with_other_count_than_assay"] = int(np.count_nonzero(np.asarray(counts[:n]) != np.asarray(ref_counts[:n])))
                result["prefix_pairs_assay"] = int(np.sum(counts[:n]))
        entry["assay"], entry["reference"] = assay, reference
        payload["configs"].append(entry)
        rows.append(_row(entry))
    header = ["stream", "ε", "n (assay / ref)", "assay 1-by-1 mean / p99 ms", "assay batch mean ms", "ref best (backend) mean / p99 ms",
              "ratio ref/assay 1-by-1 (prefix)", "ratio ref/assay batch", "pairs assay (prefix) / ref", "ref decisions ≠ exact", "peak MB assay / ref"]
    table = markdown_table(header, rows)
    json_path, md_path = write_results(args.name, payload, "# assay.monitor vs clemont 0.1.0\n\n" + table)
    print(table)
    print(f"wrote {json_path} and {md_path}")


def _fmt(value, digits=4):
    return "—" if value is None else f"{value:.{digits}f}"


def _row(entry: dict) -> list:
    single, batch = entry["assay"].get("single", {}), entry["assay"].get("batch", {})
    finished = {k: v for k, v in entry["reference"].items() if v.get("mean_ms") is not None}
    best_name = min(finished, key=lambda k: finished[k]["mean_ms"]) if finished else None
    best = finished.get(best_name, {})
    ratio_single = ratio_batch = None
    if best and single.get("prefix_mean_ms"):
        ratio_single = best["mean_ms"] / single["prefix_mean_ms"]
    if best and batch.get("prefix_mean_ms"):
        ratio_batch = best["mean_ms"] / batch["prefix_mean_ms"]
    return [
        entry["name"], entry["epsilon"],
        f"{single.get('decisions', '—')} / {best.get('decisions', '—')}",
        f"{_fmt(single.get('mean_ms'))} / {_fmt(single.get('p99_ms'))}",
        _fmt(batch.get("mean_ms")),
        f"{_fmt(best.get('mean_ms'))} / {_fmt(best.get('p99_ms'))} ({best_name})" if best else "—",
        _fmt(ratio_single, 1), _fmt(ratio_batch, 1),
        f"{single.get('prefix_pairs', '—')} / {best.get('pairs', '—')}",
        best.get("decisions_with_other_count_than_assay", "—"),
        f"{_fmt(single.get('peak_rss_mb'), 0)} / {_fmt(best.get('peak_rss_mb'), 0)}",
    ]


if __name__ == "__main__":
    main()
