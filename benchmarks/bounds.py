"""Time IBP, CROWN and α-CROWN on the 45 ACAS Xu networks over property 1's input box.

For each network: one domain (the whole box) and 1,024 domains (the box cut into a 4×4×4×4×4
grid), in float64 (assay's default) and float32. Reports the median time of each call and the
mean width of the output bounds (tightness). Writes ``benchmarks/results/bounds.json`` and
``bounds.md``.

    .venv/bin/python benchmarks/bounds.py [--repeats 3] [--networks 45] [--dtypes float64,float32]
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import data_dir, machine, markdown_table, median_seconds, write_results  # noqa: E402

from assay.bounds import compute_bounds  # noqa: E402
from assay.nn import load  # noqa: E402
from assay.sets import read_vnnlib  # noqa: E402
from assay.threads import set_threads  # noqa: E402

METHODS = ("ibp", "crown", "alpha")


def grid_domains(lower: torch.Tensor, upper: torch.Tensor, parts: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Cut a box of shape (n,) into parts**n equal sub-boxes: (parts**n, n) each."""
    n = lower.numel()
    steps = torch.arange(parts + 1, dtype=torch.float64) / parts
    edges = lower.reshape(n, 1) + (upper - lower).reshape(n, 1) * steps  # (n, parts + 1)
    index = torch.cartesian_prod(*[torch.arange(parts)] * n).reshape(-1, n)
    cols = torch.arange(n)
    return edges[cols, index], edges[cols, index + 1]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=3, help="timed repetitions per call (median reported)")
    parser.add_argument("--networks", type=int, default=45, help="how many of the 45 networks to run")
    parser.add_argument("--dtypes", default="float64,float32", help="comma-separated dtypes")
    parser.add_argument("--threads", type=int, default=None,
                        help="torch threads (default: torch's choice; 1 is steadier on a shared machine)")
    args = parser.parse_args(argv)
    if args.threads:
        set_threads(args.threads)

    folder = data_dir() / "acasxu"
    prop = read_vnnlib(folder / "prop_1.vnnlib", num_inputs=5, num_outputs=5)
    box = prop.queries[0].input_set
    flat_lower, flat_upper = box.lower.reshape(-1), box.upper.reshape(-1)
    grid_lower, grid_upper = grid_domains(flat_lower, flat_upper, 4)
    paths = sorted(folder.glob("ACASXU_run2a_*_batch_2000.onnx"))[: args.networks]
    records = []
    for path in paths:
        network = load(path)
        shape = network.input_shape
        batches = {
            1: (flat_lower.reshape(1, *shape), flat_upper.reshape(1, *shape)),
            1024: (grid_lower.reshape(-1, *shape), grid_upper.reshape(-1, *shape)),
        }
        for dtype in args.dtypes.split(","):
            for batch, domains in batches.items():
                for method in METHODS:
                    result = compute_bounds(network, domains, method=method, dtype=dtype)
                    seconds, times = median_seconds(
                        lambda network=network, domains=domains, method=method, dtype=dtype: compute_bounds(
                            network, domains, method=method, dtype=dtype), args.repeats
                    )
                    width = (result.upper - result.lower).mean().item()
                    records.append({"network": path.name, "dtype": dtype, "domains": batch, "method": method,
                                    "median_seconds": seconds, "times": times, "mean_width": width})
                    print(f"{path.name} {dtype} B={batch} {method}: {seconds * 1000:.1f} ms, mean width {width:.4g}", flush=True)

    rows = []
    for dtype in args.dtypes.split(","):
        for batch in (1, 1024):
            for method in METHODS:
                picked = [r for r in records if r["dtype"] == dtype and r["domains"] == batch and r["method"] == method]
                times = [r["median_seconds"] for r in picked]
                widths = [r["mean_width"] for r in picked]
                rows.append([dtype, batch, method, f"{statistics.median(times) * 1000:.1f}",
                             f"{max(times) * 1000:.1f}", f"{sum(times):.2f}",
                             f"{statistics.median(times) / batch * 1e6:.0f}", f"{statistics.median(widths):.4g}"])
    header = ["dtype", "domains", "method", "median ms / call", "max ms / call", "total s (all nets)",
              "median µs / domain", "median mean width"]
    table = (f"# Bound propagation on ACAS Xu, property 1 input box ({len(paths)} networks)\n\n"
             + markdown_table(header, rows)
             + f"\nMachine: {machine()}; torch threads: {torch.get_num_threads()}; repeats per call: {args.repeats} (median).\n")
    json_path, md_path = write_results("bounds", {"machine": machine(), "records": records}, table)
    print(table)
    print(f"wrote {json_path} and {md_path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
