"""ReLU-splitting throughput on open VNN-COMP queries: domains bounded and volume settled in a fixed time.

Solved counts move only when a search finishes; a change to branch and bound (a dtype, a
heuristic, a bound pass) shows earlier in how many domains a search bounds in a fixed time and
how much of the input volume it settles. This runs ``assay.verify.verify_vnnlib`` (ReLU
splitting) for ``--seconds`` on each query of a fixed list of VNN-COMP instances that the
published tools needed seconds to minutes for, and writes ``benchmarks/results/<name>.json`` and
``.md``: status, domains, domains per second, bound calls, and the settled weight of each
conjunction's search (1 = refuted). Compare two commits by running it on each, on a quiet
machine, or both at once with one process per core.

    .venv/bin/python benchmarks/bab_throughput.py --seconds 120 --name bab_head
    .venv/bin/python benchmarks/bab_throughput.py --queries mnist_45,verivital_34 --seconds 60
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import REPO_ROOT, data_dir, machine, markdown_table, write_results  # noqa: E402

# name: (benchmark, network, property) — open rows of earlier runs (see the README's VNN-COMP table)
QUERIES = {
    "mnist_45": ("mnist_fc", "onnx/mnist-net_256x4.onnx", "vnnlib/prop_0_0.05.vnnlib"),
    "mnist_67": ("mnist_fc", "onnx/mnist-net_256x6.onnx", "vnnlib/prop_7_0.03.vnnlib"),
    "mnist_25": ("mnist_fc", "onnx/mnist-net_256x2.onnx", "vnnlib/prop_10_0.05.vnnlib"),
    "cifar_resnet_14": ("cifar10_resnet", "onnx/resnet_2b.onnx",
                        "vnnlib_properties_pgd_filtered/resnet2b_pgd_filtered/prop_14_eps_0.008.vnnlib"),
    "verivital_34": ("verivital", "Convnet_avgpool.onnx", "specs/avgpool_specs/prop_14_0.04.vnnlib"),
    "oval21_12": ("oval21", "onnx/cifar_wide_kw.onnx", "vnnlib/cifar_wide_kw-img8517-eps0.006928104575163399.vnnlib"),
    "oval21_19": ("oval21", "onnx/cifar_wide_kw.onnx", "vnnlib/cifar_wide_kw-img3458-eps0.022875816993464054.vnnlib"),
    "cifar_resnet_48": ("cifar10_resnet", "onnx/resnet_4b.onnx",
                        "vnnlib_properties_pgd_filtered/resnet4b_pgd_filtered/prop_0_eps_0.004.vnnlib"),
}


def run_query(name: str, seconds: float, threads: int) -> dict:

    import assay.nn as nn
    from assay.sets import read_vnnlib
    from assay.threads import set_threads
    from assay.verify import verify_vnnlib

    set_threads(threads)  # assay.threads: also for the small networks it would run on one thread
    benchmark, network_file, property_file = QUERIES[name]
    folder = data_dir() / "vnncomp" / benchmark
    network = nn.load(folder / network_file)
    prop = read_vnnlib(folder / property_file, network.input_size, network.output_size)
    started = time.monotonic()
    result = verify_vnnlib(network, prop, timeout=seconds, strategy="relu")
    elapsed = time.monotonic() - started
    return {"query": name, "benchmark": benchmark, "network": network_file, "property": property_file,
            "status": result.status.value, "seconds": round(elapsed, 2), "domains": result.stats.domains,
            "bound_calls": result.stats.bound_calls, "domains_per_second": round(result.stats.domains / elapsed, 1),
            "settled": [round(search.settled, 4) for search in result.searches],
            "pending": [search.pending_count for search in result.searches]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--queries", default=",".join(QUERIES), help=f"comma-separated, of: {', '.join(QUERIES)}")
    parser.add_argument("--seconds", type=float, default=120.0, help="time per query (the verifier's timeout)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads per query")
    parser.add_argument("--name", default="bab_throughput", help="results file name in benchmarks/results/")
    parser.add_argument("--one", help=argparse.SUPPRESS)  # internal: run one query in this process
    args = parser.parse_args()
    if args.one:
        print(json.dumps(run_query(args.one, args.seconds, args.threads)))
        return
    names = [name.strip() for name in args.queries.split(",") if name.strip()]
    unknown = [name for name in names if name not in QUERIES]
    if unknown:
        raise SystemExit(f"unknown queries {unknown}; known: {', '.join(QUERIES)}")
    rows = []
    for name in names:
        # one process per query: every query starts with the same cold caches
        command = [sys.executable, __file__, "--one", name, "--seconds", str(args.seconds), "--threads", str(args.threads)]
        output = subprocess.run(command, capture_output=True, text=True, cwd=REPO_ROOT, check=True).stdout
        rows.append(json.loads(output.strip().splitlines()[-1]))
        print(f"{name}: {rows[-1]['status']}, {rows[-1]['domains']} domains, settled {rows[-1]['settled']}", flush=True)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=REPO_ROOT).stdout.strip()
    table = (f"# ReLU-splitting throughput ({args.seconds:g} s per query, commit {commit})\n\n"
             + markdown_table(["query", "status", "domains", "domains/s", "bound calls", "settled per conjunction"],
                              [[r["query"], r["status"], r["domains"], r["domains_per_second"], r["bound_calls"],
                                " ".join(str(v) for v in r["settled"])] for r in rows])
             + f"\nMachine: {machine()}\n")
    json_path, md_path = write_results(args.name, {"commit": commit, "seconds": args.seconds, "rows": rows,
                                                   "machine": machine()}, table)
    print(f"wrote {json_path} and {md_path}")


if __name__ == "__main__":
    main()
