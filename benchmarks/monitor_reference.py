"""Driver for the reference monitor ``clemont==0.1.0``, run by benchmarks/monitor.py in clemont's own venv.

Usage (normally only through benchmarks/monitor.py):
    /path/to/clemont-venv/bin/python benchmarks/monitor_reference.py SPEC_JSON OUT_JSON

SPEC_JSON: {"source": {"zip": path, "member": name} | {"csv": path} | {"synthetic": {"n", "d", "seed"}},
            "epsilon": float, "backend": "BruteForce" | "KdTree" | "BDD", "max_n": int | null, "max_time": float | null}
The BDD backend needs ``dd`` with CUDD in clemont's venv and an ε with 1/ε a whole number of bins
(its cells have width 1/n_bins; its runner then drops the false positives with d < ε). Column
names are replaced by c0, c1, ... for it (clemont's BDD refuses names with '_', '=', '-', ...).
Writes OUT_JSON: per-decision timings (mean, p50, p99), peak RSS, pairs, flagged, and the number of
witnesses of each monitored decision (to compare exactness with assay on the common prefix).
Imports only what clemont's environment has (clemont, pandas, numpy, psutil).
"""

from __future__ import annotations

import io
import json
import resource
import sys
import time
import zipfile

import numpy as np
import pandas as pd


def load(source: dict, limit=None) -> pd.DataFrame:
    if "csv" in source:  # a plain decision stream: feature columns and `prediction` (benchmarks/startup.py)
        return pd.read_csv(source["csv"])
    if "zip" in source:
        with zipfile.ZipFile(source["zip"]) as archive:
            frame = pd.read_csv(io.BytesIO(archive.read(source["member"])))
        return frame.drop(columns=["label"])
    spec = source["synthetic"]
    # The same draws as rng.random((n, d)) then rng.integers(0, 2, n), in chunks (numpy's Generator
    # fills arrays in order from one stream), keeping only the first `limit` rows in memory.
    n, d = spec["n"], spec["d"]
    keep = n if limit is None else min(n, limit)
    step = max(1, (1 << 24) // d)
    rng = np.random.default_rng(spec["seed"])
    X = np.empty((keep, d))
    for lo in range(0, n, step):
        rows = rng.random((min(step, n - lo), d))
        if lo < keep:
            X[lo : min(keep, lo + rows.shape[0])] = rows[: keep - lo]
    Y = rng.integers(0, 2, n)[:keep]
    frame = pd.DataFrame(X, columns=[f"x{i}" for i in range(spec["d"])])
    frame["prediction"] = Y.astype(np.float64)
    return frame


def main(spec_path: str, out_path: str) -> None:
    spec = json.loads(open(spec_path).read())
    from clemont import BruteForce, KdTree
    from clemont.runner import DataframeRunner

    frame = load(spec["source"], spec.get("max_n"))
    if spec.get("max_n"):
        frame = frame.iloc[: spec["max_n"]]
    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    if spec["backend"] == "BDD":
        from clemont import BDD

        bins = round(1.0 / spec["epsilon"])
        if abs(bins * spec["epsilon"] - 1.0) > 1e-9:
            raise SystemExit(f"clemont's BDD needs 1/ε to be a whole number of bins; ε = {spec['epsilon']}")
        frame.columns = [c if c == "prediction" else f"c{i}" for i, c in enumerate(frame.columns)]
        # 0/1 columns (one-hot blocks) as categorical, as the paper's experiments declare them: they
        # must match exactly (binned, they would get 0 bits and clemont's BDD fails to build).
        binary = [c for c in frame.columns if c != "prediction" and frame[c].nunique() <= 2]
        backend = BDD(frame, bins, "prediction", categorical_cols=binary)
    else:
        backend_class = {"BruteForce": BruteForce, "KdTree": KdTree}[spec["backend"]]
        backend = backend_class(frame, "prediction", spec["epsilon"], metric="infinity")
    runner = DataframeRunner(backend)
    counts = []
    started = time.perf_counter()
    for found in runner.run(frame, max_n=spec.get("max_n"), max_time=spec.get("max_time")):
        counts.append(len(found))
    wall = time.perf_counter() - started
    timings = np.asarray(runner.timings)
    result = {
        "backend": spec["backend"],
        "decisions": int(timings.size),
        "pairs": int(runner.n_true_positives),
        "flagged": int(runner.n_flagged),
        "mean_ms": float(timings.mean() * 1e3) if timings.size else None,
        "p50_ms": float(np.percentile(timings, 50) * 1e3) if timings.size else None,
        "p99_ms": float(np.percentile(timings, 99) * 1e3) if timings.size else None,
        "wall_s": wall,
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "rss_before_mb": rss_before,
        "counts": counts,
        "truncated_neighbour_lists": int(sum(1 for k in getattr(backend, "radius_query_ks", []) if k == -1)),
    }
    open(out_path, "w").write(json.dumps(result))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
