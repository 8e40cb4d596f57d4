"""Patch-attack certification on 8×8 digits (PREMAP2's patch experiments, scaled to scikit-learn's digits).

Two classifiers trained reproducibly on scikit-learn's digits (pixels in [0, 1]): a fully connected
ReLU MLP (64 → 32 → 32 → 10, :func:`assay.demo.run_demo`'s network, scikit-learn ``MLPClassifier``,
seed 0) and a small CNN (:func:`assay.datasets.online_tasks.digits_task`, seed 0). For each model and
patch size (2×2, 3×3, 4×4), ``--instances`` random (correctly classified test image, patch position)
pairs (``numpy.random.default_rng(seed)``); each patch pixel may take any value in [0, 1] and
:func:`assay.preimage.approximate_preimage` under-approximates the colourings that keep the
image's class, up to ratio 0.9 (``stop_on="bound"``: the 95 % lower confidence bound) or the time
limit (the issue's 10 minutes by default; ``--time-limit`` to run shorter).

Reported per model and size: completion rate (ratio 0.9 reached within the limit), median and p90
of the time per instance, median and p10 of the ratio reached, and the median share of colourings
that keep the class (the preimage's share of the patch region). Soundness check: 20,000 fresh
random colourings per instance; a contained colouring that changes the class is a violation.

    python benchmarks/premap_patches.py --instances 5 --time-limit 60
    python benchmarks/premap_patches.py --models fc --name part_fc &   # parts in parallel, then merged:
    python benchmarks/premap_patches.py --models cnn --name part_cnn
    python benchmarks/premap_patches.py --combine part_fc,part_cnn --name premap_patches
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import RESULTS, add_run_options, machine, markdown_table, write_results  # noqa: E402

from assay.preimage import approximate_preimage  # noqa: E402
from assay.sets import argmax_is, patch_region  # noqa: E402
from assay.threads import set_threads  # noqa: E402

CHECK = 20_000


def models() -> dict:
    from assay.datasets.online_tasks import digits_task
    from assay.demo import _train

    fc, x_test, y_test, _, _ = _train((32, 32), 0)
    cnn = digits_task(0)
    return {"fc": (fc, x_test.reshape(-1, 1, 8, 8), y_test), "cnn": (cnn.network, cnn.test_images, cnn.test_labels)}


def percentile(values, q: float) -> float:
    return float(np.percentile(values, q)) if values else float("nan")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--instances", type=int, default=5, help="instances per model and patch size")
    parser.add_argument("--sizes", default="2,3,4")
    parser.add_argument("--models", default="fc,cnn")
    parser.add_argument("--method", default="alpha")
    parser.add_argument("--heuristic", default="premap2",
                        help="ReLU splitting's scores: a preset of assay.preimage.relu_refinement.HEURISTIC_PRESETS")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--resample", action="store_true",
                        help="ReLU splitting with adaptive resampling of the pieces' guide points (off by default)")
    parser.add_argument("--combine", default="",
                        help="comma-separated result names (parts run in parallel, e.g. one per model) to merge "
                             "into --name instead of running")
    add_run_options(parser, "premap_patches", 600.0)
    args = parser.parse_args()
    if args.combine:
        parts = [json.loads((RESULTS / f"{name}.json").read_text()) for name in args.combine.split(",")]
        runs = [run for part in parts for run in part["runs"]]
        settings = {key: parts[0]["args"][key] for key in ("time_limit", "method", "seed", "instances")}
        settings["heuristic"] = parts[0]["args"].get("heuristic", "sensitivity")
        table = _table(runs, settings, f"merged from {args.combine}")
        write_results(args.name, {"machine": machine(), "args": vars(args), "parts": args.combine.split(","),
                                  "runs": runs}, table)
        print(table)
        return 1 if any(r["violations"] for r in runs) else 0
    set_threads(args.threads)  # assay.threads: also for the small networks it would run on one thread
    runs, failures = [], 0
    trained = models()
    for model in args.models.split(","):
        network, images, labels = trained[model]
        predicted = network.forward(images.reshape(len(images), *network.input_shape)).argmax(1)
        correct = torch.nonzero(predicted == labels).flatten().tolist()
        for size in (int(s) for s in args.sizes.split(",")):
            rng = np.random.default_rng([args.seed, size])
            for _ in range(args.instances):
                index = int(rng.choice(correct))
                top, left = (int(v) for v in rng.integers(0, 8 - size + 1, 2))
                image = images[index].reshape(1, 8, 8)
                label = int(labels[index])
                region = patch_region(image, top, left, size, size)
                shape = network.input_shape
                started = time.perf_counter()
                result = approximate_preimage(network, (region.lower.reshape(shape), region.upper.reshape(shape)),
                                              argmax_is(label, network.output_size), kind="under", threshold=0.9,
                                              time_limit=args.time_limit, method=args.method,
                                              heuristic_weights=args.heuristic, resample=args.resample, rng=rng)
                seconds = time.perf_counter() - started
                points = np.repeat(image.reshape(1, -1).numpy(), CHECK, 0)
                free = result.region.free.numpy()
                points[:, free] = rng.random((CHECK, free.size))
                as_input = torch.as_tensor(points).reshape(CHECK, *shape)
                kept = (network.forward(as_input).argmax(1) == label).numpy()
                contained = result.contains(as_input.numpy())
                wrong = int((contained & ~kept).sum())
                failures += wrong > 0
                runs.append({"model": model, "size": size, "image": index, "top": top, "left": left, "label": label,
                             "status": result.status, "ratio": result.ratio,
                             "ratio_interval": list(result.ratio_interval), "seconds": seconds,
                             "pieces": len(result.pieces), "branching": result.stats["branching"],
                             "preimage_share": result.preimage_volume.value / result.region_volume,
                             "violations": wrong, "resampled": result.stats.get("resampled")})
                print(f"{model} {size}×{size} image {index:3d} at ({top},{left}): {result.status:10s} ratio {result.ratio:.3f} "
                      f"preimage {runs[-1]['preimage_share']:.3f} {len(result.pieces):5d} pieces {seconds:7.2f} s "
                      f"violations {wrong}", flush=True)
    settings = {"time_limit": args.time_limit, "method": args.method, "seed": args.seed, "instances": args.instances,
                "heuristic": args.heuristic, "resample": args.resample}
    table = _table(runs, settings, f"load average at the end {os.getloadavg()[0]:.1f}")
    write_results(args.name, {"machine": machine(), "args": vars(args), "runs": runs}, table)
    print(table)
    return 1 if failures else 0


def _table(runs: list[dict], settings: dict, note: str) -> str:
    """The summary per model and patch size, then every instance."""
    rows = []
    for model in dict.fromkeys(r["model"] for r in runs):
        for size in sorted({r["size"] for r in runs if r["model"] == model}):
            mine = [r for r in runs if r["model"] == model and r["size"] == size]
            done = sum(r["status"] == "reached" for r in mine)
            times = [r["seconds"] for r in mine]
            ratios = [r["ratio"] for r in mine]
            rows.append([model, f"{size}×{size}", f"{done}/{len(mine)}", f"{statistics.median(times):.2f}",
                         f"{percentile(times, 90):.2f}", f"{statistics.median(ratios):.3f}", f"{percentile(ratios, 10):.3f}",
                         f"{percentile(ratios, 90):.3f}", f"{statistics.median(r['preimage_share'] for r in mine):.3f}",
                         sum(r["violations"] for r in mine)])
    header = ["model", "patch", "reached 0.9", "median s", "p90 s", "median ratio", "p10 ratio", "p90 ratio",
              "median preimage share", "sample violations"]
    each = [[r["model"], f"{r['size']}×{r['size']}", r["image"], f"({r['top']},{r['left']})", r["status"],
             f"{r['ratio']:.3f}", f"{r['seconds']:.1f}", r["pieces"], f"{r['preimage_share']:.4f}"] for r in runs]
    return (f"# Patch certification on 8×8 digits (under-approximation, target ratio 0.9, {settings['time_limit']:g} s "
            f"limit)\n\n" + markdown_table(header, rows)
            + f"\nUp to {settings['instances']} random (image, patch position) pairs per row, seed {settings['seed']}, "
            f"method {settings['method']}, ReLU-split heuristic {settings['heuristic']}, adaptive resampling "
            f"{'on' if settings.get('resample') else 'off'}; 2 shared cores, one thread "
            f"per run; {note}.\n\n## Every instance\n\n"
            + markdown_table(["model", "patch", "image", "(top,left)", "status", "ratio", "seconds", "pieces",
                              "preimage share"], each))


if __name__ == "__main__":
    raise SystemExit(main())
