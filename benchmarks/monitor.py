"""assay.monitor side by side with the reference implementation clemont==0.1.0 (Clemont, KDD 2025, Table 1).

Usage:
    python benchmarks/monitor.py [--reference-python /tmp/clemont-venv/bin/python]
                                 [--suites certifair,large,dims] [--quick]

The reference lives in its own virtual environment (it needs faiss-cpu==1.9.0.post1; dd==0.6.0
with CUDD for its BDD backend)::

    python3 -m venv /tmp/clemont-venv
    /tmp/clemont-venv/bin/pip install clemont==0.1.0 faiss-cpu==1.9.0.post1 dd==0.6.0

Configurations (the issue's list): the CertiFair adult/compas/german base-model streams at
ε ∈ {0.0025, …, 0.32}; synthetic uniform streams of 10⁶ decisions at d = 12 and 24 (ε 0.01,
0.025, 0.05); 10⁴ decisions at d = 4 … 65,536 (ε 0.05). ``--quick`` runs a short smoke subset.

Each measurement runs in a fresh subprocess (peak memory = that process's peak RSS): the reference
through benchmarks/monitor_reference.py (its BruteForce (faiss), KdTree and — where 1/ε is a whole
number of bins, on CertiFair — BDD backends, L∞, through its own DataframeRunner, one decision at
a time: its timer covers ``backend.observe`` and its false-positive filter, not pandas' row
iteration), assay through this file's ``--worker`` mode in two clearly separate modes:

* **1-by-1**: ``Monitor.observe(x, y)`` per decision, timed per call — like for like with the reference;
* **batch**: ``Monitor.observe_batch`` of ``--batch-size`` decisions (exactly the same answers),
  the batch time divided by its size.

The reference may stop at ``--reference-max-n`` decisions or ``--reference-budget`` seconds (its
per-decision time grows with the history); ratios are taken on the common prefix (assay's mean
over the same first decisions). Exactness: the per-decision witness counts of both are compared
on that prefix — the reference's brute force keeps at most 128 neighbours per query and uses
d < ε, not ≤ ε, so where it differs from assay (which equals the O(n²) oracle, see tests/monitor)
the table says on how many decisions. Writes benchmarks/results/monitor.json and monitor.md.
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
_CHUNK_VALUES = 1 << 24  # synthetic rows are drawn in chunks of about this many numbers


# -- the assay worker (runs in its own process) ------------------------------------------------
def _synthetic_chunks(spec: dict, limit: int | None = None):
    """The synthetic stream ``rng.random((n, d))``, ``rng.integers(0, 2, n)`` in chunks of rows, never all in memory.

    numpy's Generator fills arrays in order from one bit stream, so chunks equal one big draw;
    the labels come after all inputs in that stream, so a first pass skips the inputs.
    """
    n, d = spec["n"], spec["d"]
    step = max(1, _CHUNK_VALUES // d)
    skip = np.random.default_rng(spec["seed"])
    for lo in range(0, n, step):
        skip.random((min(step, n - lo), d))
    labels = skip.integers(0, 2, n).astype(np.float64)
    rng = np.random.default_rng(spec["seed"])
    stop = n if limit is None else min(n, limit)
    for lo in range(0, n, step):
        rows = rng.random((min(step, n - lo), d))
        if lo >= stop:
            return
        take = min(rows.shape[0], stop - lo)
        yield rows[:take], labels[lo : lo + take]


def _chunks(source: dict, limit: int | None):
    if "zip" in source:
        with zipfile.ZipFile(source["zip"]) as archive:
            rows = list(csv.reader(io.StringIO(archive.read(source["member"]).decode())))
        header, body = rows[0], np.array(rows[1:], dtype=np.float64)
        features = [i for i, c in enumerate(header) if c not in ("prediction", "label")]
        X, Y = np.ascontiguousarray(body[:, features]), body[:, header.index("prediction")]
        if limit:
            X, Y = X[:limit], Y[:limit]
        yield X, Y
        return
    yield from _synthetic_chunks(source["synthetic"], limit)


def _summary(times: np.ndarray) -> dict:
    if not times.size:
        return {"mean_ms": None, "p50_ms": None, "p99_ms": None}
    return {"mean_ms": float(times.mean() * 1e3), "p50_ms": float(np.percentile(times, 50) * 1e3), "p99_ms": float(np.percentile(times, 99) * 1e3)}


def worker(spec_path: str, out_path: str) -> None:
    from assay.monitor import Monitor
    from assay.monitor.frnn import warm_up

    spec = json.loads(Path(spec_path).read_text())
    source = spec["source"]
    n = source["synthetic"]["n"] if "synthetic" in source else None
    chunks = _chunks(source, spec.get("max_n"))
    first = next(chunks)
    warm_up("linf", first[0].shape[1])  # compile / load the kernels before timing
    Monitor(spec["epsilon"], "linf", index=spec["index"]).observe_batch(first[0][:3], first[1][:3])
    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    total = n if n is not None else first[0].shape[0]
    monitor = Monitor(spec["epsilon"], "linf", index=spec["index"], count_only=True, reserve=total)
    budget = spec.get("max_time") or float("inf")
    counts = np.zeros(total, dtype=np.int64)
    times = np.zeros(total)
    done = 0
    started = time.perf_counter()
    out_of_time = False
    for X, Y in [first] if n is None else _prepend(first, chunks):
        if spec["mode"] == "single":
            labels = Y.tolist()
            observe = monitor.observe
            for i in range(X.shape[0]):
                row = X[i]
                tic = time.perf_counter()
                witnesses = observe(row, labels[i])
                toc = time.perf_counter()
                counts[done] = witnesses.count
                times[done] = toc - tic
                done += 1
                if toc - started > budget:
                    out_of_time = True
                    break
        else:
            step = spec["batch_size"]
            for lo in range(0, X.shape[0], step):
                tic = time.perf_counter()
                found = monitor.observe_batch(X[lo : lo + step], Y[lo : lo + step])
                elapsed = time.perf_counter() - tic
                counts[done : done + len(found)] = [w.count for w in found]
                times[done : done + len(found)] = elapsed / len(found)
                done += len(found)
                if tic - started > budget:
                    out_of_time = True
                    break
        if out_of_time:
            break
    times, counts = times[:done], counts[:done]
    prefix = min(spec.get("prefix") or done, done)
    # The same statistics on each reference backend's prefix (its own number of decisions), so
    # that each ratio compares the same decisions.
    on_prefix = {}
    for backend, length in (spec.get("prefixes") or {}).items():
        length = min(int(length), done)
        on_prefix[backend] = {"decisions": length, "pairs": int(counts[:length].sum()), **_summary(times[:length])}
    index = monitor.index
    result = {
        "index": type(index).name,
        "hashed_columns": list(getattr(index, "hashed", ())),
        "decisions": int(done),
        "pairs": int(counts.sum()),
        "flagged": int(np.count_nonzero(counts)),
        **_summary(times),
        "prefix": int(prefix),
        "prefix_pairs": int(counts[:prefix].sum()),
        "prefix_flagged": int(np.count_nonzero(counts[:prefix])),
        "prefix_mean_ms": _summary(times[:prefix])["mean_ms"],
        "prefix_p99_ms": _summary(times[:prefix])["p99_ms"],
        "prefix_counts": counts[:prefix].tolist() if spec.get("want_counts") else None,
        "on_prefix": on_prefix,
        "wall_s": time.perf_counter() - started,
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "rss_before_mb": rss_before,
    }
    Path(out_path).write_text(json.dumps(result))


def _prepend(first, rest):
    yield first
    yield from rest


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
            lines = (done.stderr or done.stdout).strip().splitlines()
            return {"error": (lines[-1] if lines else f"exit code {done.returncode}")[:300]}
        return json.loads(out_path.read_text())


def configurations(suites: list[str], quick: bool) -> list[dict]:
    configs = []
    zip_path = str(data_dir() / "monitor" / "certifair_predictions.zip")
    if "certifair" in suites:
        for dataset in ("german", "compas", "adult"):
            for epsilon in (0.01, 0.16) if quick else EPSILONS:
                configs.append({"suite": "certifair", "name": f"{dataset}-base-P1", "epsilon": epsilon,
                                "source": {"zip": zip_path, "member": f"predictions/{dataset}-base-P1-combined.csv"}})
    if "large" in suites:
        n = 10**5 if quick else 10**6
        for d in (12,) if quick else (12, 24):
            for epsilon in (0.05,) if quick else (0.01, 0.025, 0.05):
                configs.append({"suite": "large", "name": f"uniform-{n:.0e}x{d}".replace("+0", ""), "epsilon": epsilon,
                                "source": {"synthetic": {"n": n, "d": d, "seed": d}}})
    if "dims" in suites:
        for d in (4, 1024) if quick else (4, 16, 64, 256, 1024, 4096, 16384, 65536):
            configs.append({"suite": "dims", "name": f"uniform-1e4x{d}", "epsilon": 0.05,
                            "source": {"synthetic": {"n": 10**4, "d": d, "seed": d}}})
    return configs


def _reference_backends(config: dict, requested: list[str]) -> list[str]:
    backends = [b for b in requested if b != "BDD"]
    bins = 1.0 / config["epsilon"]
    if "BDD" in requested and config["suite"] == "certifair" and abs(bins - round(bins)) < 1e-9:
        backends.append("BDD")  # clemont's BDD has cells of width 1/n_bins: only for whole numbers of bins
    return backends


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--worker", nargs=2, metavar=("SPEC", "OUT"), help=argparse.SUPPRESS)
    parser.add_argument("--reference-python", default=None, help="python of the venv with clemont==0.1.0 (omit to run assay only)")
    parser.add_argument("--reference-backends", default="BruteForce,KdTree,BDD")
    parser.add_argument("--reference-max-n", type=int, default=100_000)
    parser.add_argument("--reference-max-values", type=float, default=2e8,
                        help="the reference loads its whole stream as a DataFrame: cap n·d of its prefix")
    parser.add_argument("--reference-budget", type=float, default=None, help="seconds per reference run (default 60, quick 15)")
    parser.add_argument("--assay-budget", type=float, default=600.0, help="seconds per assay run")
    parser.add_argument("--index", default="auto")
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--suites", default="certifair,large,dims")
    parser.add_argument("--quick", action="store_true", help="smoke run: two ε per data set, one 10⁵ stream, two dims")
    parser.add_argument("--name", default=None, help="results file name (default monitor, or monitor_quick)")
    args = parser.parse_args()
    if args.worker:
        worker(*args.worker)
        return
    reference_budget = args.reference_budget or (15.0 if args.quick else 60.0)
    name = args.name or ("monitor_quick" if args.quick else "monitor")

    rows, payload = [], {"machine": machine(), "reference": args.reference_python, "batch_size": args.batch_size, "configs": []}
    for config in configurations(args.suites.split(","), args.quick):
        entry = dict(config)
        reference = {}
        prefix = None
        prefixes = {}
        if args.reference_python:
            d = config["source"]["synthetic"]["d"] if "synthetic" in config["source"] else 1
            max_n = int(min(args.reference_max_n, args.reference_max_values // d))
            for backend in _reference_backends(config, args.reference_backends.split(",")):
                spec = {"source": config["source"], "epsilon": config["epsilon"], "backend": backend, "max_n": max_n, "max_time": reference_budget}
                reference[backend] = _subprocess(args.reference_python, HERE / "monitor_reference.py", spec, reference_budget * 3 + 600)
                print(config["name"], config["epsilon"], backend, {k: v for k, v in reference[backend].items() if k != "counts"}, flush=True)
            finished = {k: r for k, r in reference.items() if r.get("decisions")}
            prefix = max((r["decisions"] for r in finished.values()), default=None)  # counts to compare, up to the longest
            prefixes = {k: r["decisions"] for k, r in finished.items()}
        assay = {}
        for mode in ("single", "batch"):
            spec = {"source": config["source"], "epsilon": config["epsilon"], "index": args.index, "mode": mode,
                    "batch_size": args.batch_size, "prefix": prefix, "prefixes": prefixes, "max_time": args.assay_budget,
                    "want_counts": prefix is not None}
            assay[mode] = _subprocess(sys.executable, Path(__file__), spec, args.assay_budget * 3 + 300, extra=("--worker",))
            print(config["name"], config["epsilon"], "assay", mode, {k: v for k, v in assay[mode].items() if k != "prefix_counts"}, flush=True)
        counts = assay["single"].pop("prefix_counts", None)
        batch_counts = assay["batch"].pop("prefix_counts", None)
        if counts is not None and batch_counts is not None:
            entry["single_and_batch_agree"] = counts == batch_counts
        for result in reference.values():
            ref_counts = result.pop("counts", None)
            if counts is not None and ref_counts is not None:
                common = min(len(counts), len(ref_counts))
                result["decisions_with_other_count_than_assay"] = int(np.count_nonzero(np.asarray(counts[:common]) != np.asarray(ref_counts[:common])))
                result["prefix_pairs_assay"] = int(np.sum(counts[:common]))
        entry["assay"], entry["reference"] = assay, reference
        payload["configs"].append(entry)
        rows.append(_row(entry))
        _write(name, payload, rows)  # after every configuration: a cut-short run still leaves its table
    table = _write(name, payload, rows)
    print(table)


def _write(name: str, payload: dict, rows: list) -> str:
    header = ["stream", "ε", "n assay / ref", "assay 1-by-1 mean / p99 ms", "assay batch mean / p99 ms",
              "ref best (backend) mean / p99 ms", "ratio ref/assay 1-by-1", "ratio ref/assay batch",
              "pairs assay (on ref prefix) / ref", "ref decisions ≠ exact", "peak MB assay / ref"]
    table = markdown_table(header, rows)
    notes = _targets(payload)
    text = ("# assay.monitor vs clemont 0.1.0\n\n" + _preamble(payload) + table + "\n" + notes)
    write_results(name, payload, text)
    return table + "\n" + notes


def _preamble(payload: dict) -> str:
    return ("Per-decision times in ms. *1-by-1*: `Monitor.observe` per decision (like the reference, which observes "
            f"one decision at a time); *batch*: `observe_batch` of {payload.get('batch_size')} decisions (the same answers), "
            "batch time / batch size. Ratios use the reference's best backend and assay's mean "
            "over the same decisions (the best backend may stop early: n ref). The reference is not exact where the last columns say so "
            "(its brute force keeps ≤ 128 neighbours and uses d < ε; assay equals the O(n²) oracle).\n\n")


def _best(entry: dict):
    finished = {k: v for k, v in entry["reference"].items() if v.get("mean_ms") is not None}
    if not finished:
        return None, {}
    name = min(finished, key=lambda k: finished[k]["mean_ms"])
    return name, finished[name]


def _on_best_prefix(entry: dict, mode: str) -> dict:
    """assay's statistics over the decisions the best reference backend monitored."""
    name, _ = _best(entry)
    return entry["assay"].get(mode, {}).get("on_prefix", {}).get(name, {}) if name else {}


def _ratios(entry: dict):
    _, best = _best(entry)
    single, batch = _on_best_prefix(entry, "single"), _on_best_prefix(entry, "batch")
    ratio_single = best["mean_ms"] / single["mean_ms"] if best and single.get("mean_ms") else None
    ratio_batch = best["mean_ms"] / batch["mean_ms"] if best and batch.get("mean_ms") else None
    return ratio_single, ratio_batch


def _targets(payload: dict) -> str:
    lines = ["## Targets", ""]
    ratios = [(entry, *_ratios(entry)) for entry in payload["configs"]]
    singles = [(r, e) for e, r, _ in ratios if r is not None]
    batches = [(r, e) for e, _, r in ratios if r is not None]
    if singles:
        worst, entry = min(singles, key=lambda item: item[0])
        met = sum(r >= 10 for r, _ in singles)
        lines.append(f"- ≥ 10× less time per decision than the reference's best backend, 1-by-1: {met} of {len(singles)} configurations; "
                     f"smallest ratio {worst:.1f}× ({entry['name']}, ε = {entry['epsilon']}).")
    if batches:
        worst, entry = min(batches, key=lambda item: item[0])
        met = sum(r >= 10 for r, _ in batches)
        lines.append(f"- the same with batches: {met} of {len(batches)}; smallest ratio {worst:.1f}× ({entry['name']}, ε = {entry['epsilon']}).")
    for entry in payload["configs"]:
        if entry["suite"] == "large" and entry["source"]["synthetic"]["d"] == 12 and entry["source"]["synthetic"]["n"] >= 10**6:
            single, batch = entry["assay"].get("single", {}), entry["assay"].get("batch", {})
            lines.append(f"- < 0.1 ms per decision at 10⁶ × 12, ε = {entry['epsilon']}: 1-by-1 mean {_fmt(single.get('mean_ms'))} ms "
                         f"(p99 {_fmt(single.get('p99_ms'))}), batch {_fmt(batch.get('mean_ms'))} ms over {single.get('decisions', '—')} decisions.")
    inexact = [entry for entry in payload["configs"] if any(r.get("decisions_with_other_count_than_assay") for r in entry["reference"].values())]
    if inexact:
        lines.append("- the reference's answers differ from the exact ones on: " + "; ".join(
            f"{e['name']} ε={e['epsilon']} (" + ", ".join(f"{k}: {v.get('decisions_with_other_count_than_assay')} decisions"
                                                     for k, v in e['reference'].items() if v.get('decisions_with_other_count_than_assay')) + ")"
            for e in inexact) + ".")
    disagree = [e for e in payload["configs"] if e.get("single_and_batch_agree") is False]
    if disagree:
        lines.append("- WARNING: assay's 1-by-1 and batch counts differ on " + ", ".join(f"{e['name']} ε={e['epsilon']}" for e in disagree))
    return "\n".join(lines) + "\n"


def _fmt(value, digits=4):
    return "—" if value is None else f"{value:.{digits}f}"


def _row(entry: dict) -> list:
    single, batch = entry["assay"].get("single", {}), entry["assay"].get("batch", {})
    best_name, best = _best(entry)
    ratio_single, ratio_batch = _ratios(entry)
    errors = "; ".join(f"{k}: {v['error']}" for k, v in {**entry["reference"], **entry["assay"]}.items() if "error" in v)
    inexact = ", ".join(f"{k} {v['decisions_with_other_count_than_assay']}" for k, v in entry["reference"].items()
                        if v.get("decisions_with_other_count_than_assay") is not None)
    return [
        entry["name"], entry["epsilon"],
        f"{single.get('decisions', '—')} / {best.get('decisions', '—')}",
        f"{_fmt(single.get('mean_ms'))} / {_fmt(single.get('p99_ms'))}",
        f"{_fmt(batch.get('mean_ms'))} / {_fmt(batch.get('p99_ms'))}",
        f"{_fmt(best.get('mean_ms'))} / {_fmt(best.get('p99_ms'))} ({best_name})" if best else ("— " + errors if errors else "—"),
        _fmt(ratio_single, 1), _fmt(ratio_batch, 1),
        f"{_on_best_prefix(entry, 'single').get('pairs', '—')} / {best.get('pairs', '—')}" if best else f"{single.get('pairs', '—')} / —",
        inexact or "—",
        f"{_fmt(single.get('peak_rss_mb'), 0)} / {_fmt(best.get('peak_rss_mb'), 0)}",
    ]


if __name__ == "__main__":
    main()
