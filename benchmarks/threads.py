"""The library's thread default against torch's: many small bound calls, as a user's script makes them.

`compute_bounds` and `verify` run a small network on one torch thread (:mod:`assay.threads`);
before, the Python API ran on torch's default (one thread per core) while only the command line
chose one. This bounds ``--boxes`` sub-boxes of a property's input box one call at a time with
CROWN on two small networks (an ACAS Xu network and the 2024 lsnc state network), once on
torch's default threads (``use_threads(default)``) and once on assay's default, alternating
``--repeats`` times, and writes ``benchmarks/results/<name>.json`` and ``.md`` with the median
seconds per call and their ratio. On a machine whose cores are busy the gap is widest; run it
beside another job to see what a user on a shared machine sees.

    .venv/bin/python benchmarks/threads.py --boxes 300 --repeats 3
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import data_dir, machine, markdown_table, write_results  # noqa: E402

from assay.bounds import compute_bounds  # noqa: E402
from assay.nn import load  # noqa: E402
from assay.sets import read_vnnlib  # noqa: E402
from assay.threads import threads_for, use_threads  # noqa: E402

NETWORKS = {
    "acasxu_1_1": ("acasxu/ACASXU_run2a_1_1_batch_2000.onnx", "acasxu/prop_1.vnnlib"),
    "lsnc_state": ("vnncomp2024/lsnc/onnx/quadrotor2d_state.onnx.gz", None),
}


def boxes_of(network, property_file: Path | None, count: int, seed: int = 0):
    """``count`` sub-boxes (a tenth of the width, at random places) of the property's input box
    (or of [-1, 1]^n)."""
    if property_file is not None:
        query = read_vnnlib(property_file, network.input_size, network.output_size).queries[0]
        box = query.input_set
        lower, upper = box.lower.reshape(-1).double(), box.upper.reshape(-1).double()
    else:
        lower, upper = -torch.ones(network.input_size, dtype=torch.float64), torch.ones(network.input_size,
                                                                                        dtype=torch.float64)
    generator = torch.Generator().manual_seed(seed)
    width = (upper - lower) / 10
    corners = lower + torch.rand(count, network.input_size, generator=generator, dtype=torch.float64) * (
        upper - lower - width)
    return [(corner, corner + width) for corner in corners]


def seconds_per_call(network, boxes, threads: int | None) -> float:
    def run():
        for box in boxes:
            compute_bounds(network, box, method="crown")

    started = time.perf_counter()
    if threads is None:
        run()
    else:
        with use_threads(threads):
            run()
    return (time.perf_counter() - started) / len(boxes)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--boxes", type=int, default=300, help="bound calls per timing")
    parser.add_argument("--repeats", type=int, default=3, help="timings per setting (median reported)")
    parser.add_argument("--name", default="threads", help="results file name in benchmarks/results/")
    args = parser.parse_args(argv)
    default_threads = torch.get_num_threads()
    rows, records = [], []
    for name, (network_file, property_file) in NETWORKS.items():
        network = load(data_dir() / network_file)
        boxes = boxes_of(network, data_dir() / property_file if property_file else None, args.boxes)
        seconds_per_call(network, boxes[:5], None)  # torch's one-off start-up costs
        torch_default, assay_default = [], []
        for _ in range(args.repeats):  # alternating, so that a change of load hits both
            torch_default.append(seconds_per_call(network, boxes, default_threads))
            assay_default.append(seconds_per_call(network, boxes, None))
        record = {"network": name, "torch_threads": default_threads, "assay_threads": threads_for(network) or
                  default_threads, "torch_default_ms": [1e3 * s for s in torch_default],
                  "assay_default_ms": [1e3 * s for s in assay_default]}
        ratio = statistics.median(torch_default) / statistics.median(assay_default)
        records.append(record | {"ratio": ratio})
        rows.append([name, f"{default_threads}", f"{statistics.median(torch_default) * 1e3:.2f}",
                     f"{record['assay_threads']}", f"{statistics.median(assay_default) * 1e3:.2f}", f"{ratio:.1f}×"])
        print(rows[-1], flush=True)
    load_average = ", ".join(f"{value:.1f}" for value in __import__("os").getloadavg())
    table = markdown_table(["network", "torch threads", "ms per call", "assay threads", "ms per call",
                            "torch's / assay's"], rows) + (
        f"\nCROWN bounds of {args.boxes} sub-boxes, one call each; median of {args.repeats} alternating timings. "
        f"Machine: {machine()}; load average before the table: {load_average}.\n")
    write_results(args.name, {"machine": machine(), "args": vars(args), "records": records}, table)
    print(table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
