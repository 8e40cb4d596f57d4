"""PREMAP2's Table III on the five control tasks: under- and over-approximation side by side with the paper.

For each task (network, input box and property of ../shared/data/README.md, section premap/),
each kind (under with target ≥ 0.90 for auto_park and vcas, ≥ 0.75 otherwise; over with ≤ 1.10 /
≤ 1.25) and each seed, :func:`assay.preimage.approximate_preimage` runs with the paper's
10-minute limit. Reported per task and kind: the ratio reached, rounds ("iterations") and wall
time, as medians over seeds (and means, which is what the paper reports over 10 seeds), beside
the published figures (4 Xeon 6252 cores; this machine: 2 cores shared with other work).

Two stopping rules are run: ``estimate`` (the paper's: the estimated ratio passes the target)
and ``bound`` (assay's default: the 95 % confidence bound of the ratio does), so that the time
comparison with the paper is like for like and the cost of the stronger guarantee is visible.

Soundness check: after every run, 10⁵ uniform samples of the box; an under-approximation that
contains a point outside the preimage, or an over-approximation that misses a preimage point,
is counted as a violation (the script exits non-zero if there is any).

    python benchmarks/premap_control.py                 # 3 seeds, both rules
    python benchmarks/premap_control.py --seeds 10 --tasks dubinsrejoin --kinds under
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import add_run_options, data_dir, machine, markdown_table, write_results  # noqa: E402

from assay.nn import load  # noqa: E402
from assay.preimage import approximate_preimage  # noqa: E402
from assay.sets import all_of, argmax_is  # noqa: E402
from assay.threads import set_threads  # noqa: E402

TASKS = {
    "auto_park": ("model_auto_park_auto_park_model_20.onnx", [-0.5, -0.5], [0.5, 0.5], [(0, 4, 0)], 0.90, 1.10),
    "vcas": ("VCAS_21_VertCAS_1.onnx", [-0.5, -0.5, 0.149, -0.5], [0.5, 0.5, 0.151, 0.5], [(0, 9, 0)], 0.90, 1.10),
    "lunarlander": ("lunarlander.onnx", [-1, 0, 0, -2, -1, -0.1, 0.9, 0.9], [0, 1, 2, 0, 0, 0.1, 1, 1], [(0, 4, 1)], 0.75, 1.25),
    "cartpole": ("cartpole.onnx", [-1, 0, -0.2, -2], [1, 2, 0, 0], [(0, 2, 0)], 0.75, 1.25),
    "dubinsrejoin": ("dubinsrejoin.onnx", [-0.2, 0, -1, 0, 0.4, -0.1, 0.2, -0.5], [0, 0.5, 0, 0.2, 0.6, 0.1, 0.5, 0.5],
                     [(0, 4, 0), (4, 4, 0)], 0.75, 1.25),
}
# PREMAP2 Table III (mean of 10 seeds, 4 CPU cores, 10-minute limit): (ratio, seconds) per kind.
PUBLISHED = {
    "auto_park": {"under": (1.000, 0.21), "over": (1.016, 0.20)},
    "vcas": {"under": (0.964, 0.80), "over": (1.058, 0.06)},
    "lunarlander": {"under": (0.750, 29.97), "over": (1.195, 1.55)},
    "cartpole": {"under": (0.776, 20.55), "over": (1.235, 3.08)},
    "dubinsrejoin": {"under": (0.465, 595.97), "over": (1.238, 2.12)},
}
CHECK_SAMPLES = 100_000


def spec_rows(num_outputs: int, heads):
    """argmax = winner within each head (start, size, winner): one conjunction of rows."""
    return all_of(*(argmax_is(start + winner, num_outputs, range(start, start + size)) for start, size, winner in heads))


def violations(result, network, lower, upper, seed: int) -> int:
    rng = np.random.default_rng(10_000 + seed)
    x = lower + rng.random((CHECK_SAMPLES, lower.size)) * (upper - lower)
    y = network.forward(torch.as_tensor(x))
    inside = ((y @ result.C.T + result.d) >= 0).all(1).numpy()
    contained = result.contains(x)
    wrong = contained & ~inside if result.kind == "under" else inside & ~contained
    return int(wrong.sum())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--tasks", default=",".join(TASKS))
    parser.add_argument("--kinds", default="under,over")
    parser.add_argument("--rules", default="estimate,bound", help="stopping rules to run: estimate, bound")
    parser.add_argument("--methods", default="alpha,crown", help="bound methods of the pieces: alpha (the default of "
                        "approximate_preimage, PREMAP's), crown")
    add_run_options(parser, "premap_control", 600.0)
    args = parser.parse_args()
    set_threads(args.threads)  # assay.threads: also for the small networks it would run on one thread
    folder = data_dir() / "premap"
    runs, failures = [], 0
    # The first α-CROWN call of a process pays one-off start-up costs: keep them out of the table.
    warm = load(folder / TASKS["auto_park"][0])
    approximate_preimage(warm, (-0.5 * torch.ones(2), 0.5 * torch.ones(2)), spec_rows(4, [(0, 4, 0)]), time_limit=5, rng=0)
    for task in args.tasks.split(","):
        name, lower, upper, heads, under, over = TASKS[task]
        network = load(folder / name)
        spec = spec_rows(network.output_size, heads)
        lower, upper = np.array(lower, dtype=np.float64), np.array(upper, dtype=np.float64)
        for kind in args.kinds.split(","):
            for rule, method in ((r, m) for r in args.rules.split(",") for m in args.methods.split(",")):
                for seed in range(args.seeds):
                    started = time.perf_counter()
                    result = approximate_preimage(network, (torch.as_tensor(lower), torch.as_tensor(upper)), spec, kind=kind,
                                                  threshold=under if kind == "under" else over, time_limit=args.time_limit,
                                                  stop_on=rule, method=method, rng=seed)
                    seconds = time.perf_counter() - started
                    wrong = violations(result, network, lower, upper, seed)
                    failures += wrong > 0
                    runs.append({"task": task, "kind": kind, "rule": rule, "method": method, "seed": seed, "status": result.status,
                                 "ratio": result.ratio, "ratio_interval": list(result.ratio_interval),
                                 "iterations": result.iterations, "pieces": len(result.pieces), "seconds": seconds,
                                 "violations": wrong})
                    print(f"{task:13s} {kind:5s} {rule:8s} {method:5s} seed {seed}: {result.status:10s} ratio {result.ratio:.4f} "
                          f"[{result.ratio_interval[0]:.4f}, {result.ratio_interval[1]:.4f}] {result.iterations:4d} rounds "
                          f"{seconds:8.2f} s  violations {wrong}", flush=True)
    rows = []
    for task in args.tasks.split(","):
        for kind in args.kinds.split(","):
            ratio_pub, seconds_pub = PUBLISHED[task][kind]
            for rule, method in ((r, m) for r in args.rules.split(",") for m in args.methods.split(",")):
                mine = [r for r in runs if (r["task"], r["kind"], r["rule"], r["method"]) == (task, kind, rule, method)]
                times = [r["seconds"] for r in mine]
                ratios = [r["ratio"] for r in mine]
                reached = sum(r["status"] == "reached" for r in mine)
                target = TASKS[task][4] if kind == "under" else TASKS[task][5]
                rows.append([task, kind, f"{'≥' if kind == 'under' else '≤'} {target:.2f}", rule, method,
                             f"{statistics.median(ratios):.3f} (mean {statistics.mean(ratios):.3f})",
                             f"{reached}/{len(mine)}", statistics.median([r["iterations"] for r in mine]),
                             f"{statistics.median(times):.2f} (mean {statistics.mean(times):.2f})",
                             f"{ratio_pub:.3f}", f"{seconds_pub:.2f}", f"{seconds_pub / statistics.median(times):.1f}×",
                             sum(r["violations"] for r in mine)])
    header = ["task", "kind", "target", "stop rule", "method", "ratio (median)", "reached", "rounds", "seconds (median)",
              "published ratio", "published s", "speed-up (published s / median s)", "sample violations"]
    table = (f"# PREMAP2 Table III: control tasks ({args.seeds} seeds, {args.time_limit:g} s limit)\n\n"
             + markdown_table(header, rows)
             + "\nPublished: PREMAP2 paper, Table III (mean of 10 seeds, 4 Xeon 6252 cores). Here: 2 cores, "
             "load average at the start {:.1f}. Sample violations: points of 10⁵ uniform samples per run that refute "
             "the approximation (must be 0).\n".format(__import__("os").getloadavg()[0]))
    write_results(args.name, {"machine": machine(), "args": vars(args), "runs": runs, "published": PUBLISHED}, table)
    print(table)
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
