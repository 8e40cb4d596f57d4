"""Driver for the reference monitor ``clemont==0.1.0``, run by benchmarks/monitor.py in clemont's own venv.

Usage (normally only through benchmarks/monitor.py):
    /path/to/clemont-venv/bin/python benchmarks/monitor_reference.py SPEC_JSON OUT_JSON

SPEC_JSON: {"source": {"zip": path, "member": name} | {"synthetic": {"n", "d", "seed"}},
            "epsilon": float, "backend": "BruteForce" | "KdTree", "max_n": int | null, "max_time": float | null}
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


def load(source: dict) -> pd.DataFrame:
    if "zip" in source:
        with zipfile.ZipFile(source["zip"]) as archive:
            frame = pd.read_csv(io.BytesIO(archive.read(source["member"])))
        return frame.drop(columns=["label"])
    spec = source["synthetic"]
    rng = np.random.default_rng(spec["seed"])
    X = rng.random((spec["n"], spec["d"]))
    Y = rng.integers(0, 2, spec["n"])
    frame = pd.DataFrame(X, columns=[f"x{i}" for i in range(spec["d"])])
    frame["prediction"] = Y.astype(np.float64)
    return frame


def main(spec_path: str, out_path: str) -> None:
    spec = json.loads(open(spec_path).read())
    from clemont import BruteForce, KdTree
    from clemont.runner import DataframeRunner

    frame = load(spec["source"])
    if spec.get("max_n"):
        frame = frame.iloc[: spec["max_n"]]
    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
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
