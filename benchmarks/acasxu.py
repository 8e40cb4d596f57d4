"""ACAS Xu (VNN-COMP): assay's verifier and Marabou side by side, same instances, same timeouts.

By default runs all 186 instances with assay and a fixed stratified subset of 46 (every
instance of properties 5–10 and every fifth network of properties 1–4) with Marabou;
``--marabou all`` runs Marabou on all 186 (hours), ``--marabou none`` skips it. Writes
``benchmarks/results/acasxu.json`` and ``acasxu.md`` and exits non-zero on any disagreement
between decided verdicts (a disagreement is a bug).

    .venv/bin/python benchmarks/acasxu.py [--instances N] [--marabou subset|all|none] [--timeout-scale 1.0]
"""

from __future__ import annotations

import argparse
import csv
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import data_dir, machine, markdown_table, write_results  # noqa: E402

from assay.nn import load  # noqa: E402
from assay.sets import read_vnnlib  # noqa: E402
from assay.threads import set_threads  # noqa: E402
from assay.verify import verify_vnnlib  # noqa: E402


def stratified(instances: list[dict]) -> list[dict]:
    """Every instance of properties 5–10, and every fifth network of properties 1–4."""
    chosen = []
    for row in instances:
        prop = int(row["property"].split("_")[1].split(".")[0])
        network_number = int(row["network"].split("_")[2]) * 10 + int(row["network"].split("_")[3])
        if prop >= 5 or network_number % 5 == 1:
            chosen.append(row)
    return chosen


def run_marabou(onnx_path: Path, prop, timeout: float) -> tuple[str, float]:
    from assay.verify.marabou import solve_query

    started = time.perf_counter()
    verdict = "holds"
    for query in prop.queries:
        for conjunction in query.unsafe_outputs.conjunctions:
            remaining = timeout - (time.perf_counter() - started)
            if remaining <= 0:
                return "timeout", time.perf_counter() - started
            code, _, _ = solve_query(onnx_path, query.input_set.lower, query.input_set.upper,
                                     conjunction.C.numpy(), conjunction.d.numpy(), remaining)
            if code == "sat":
                return "violated", time.perf_counter() - started
            if code != "unsat":
                verdict = "timeout" if "timeout" in code else "unknown"
    return verdict, time.perf_counter() - started


def _write(name: str, records: list[dict], disagreements: list[dict], final: bool) -> str:
    """Write the JSON and markdown results so far (after every instance: a long run keeps its work)."""
    decided = ("holds", "violated")
    both = [r for r in records if r.get("marabou") in decided and r["assay"] in decided]
    ours_total = sum(r["assay_seconds"] for r in both)
    theirs_total = sum(r["marabou_seconds"] for r in both)
    summary = {
        "instances": len(records),
        "assay_decided": sum(r["assay"] in decided for r in records),
        "assay_holds": sum(r["assay"] == "holds" for r in records),
        "assay_violated": sum(r["assay"] == "violated" for r in records),
        "assay_total_seconds": sum(r["assay_seconds"] for r in records),
        "marabou_instances": sum("marabou" in r for r in records),
        "marabou_decided": sum(r.get("marabou") in decided for r in records),
        "both_decided": len(both),
        "assay_seconds_on_both": ours_total,
        "marabou_seconds_on_both": theirs_total,
        "speedup_on_both": (theirs_total / ours_total) if ours_total else None,
        "disagreements": len(disagreements),
    }
    rows = [[r["network"], r["property"], r["assay"], f"{r['assay_seconds']:.2f}", r.get("marabou", "–"),
             f"{r['marabou_seconds']:.2f}" if "marabou_seconds" in r else "–"] for r in records]
    status = "" if final else " — run in progress"
    table = (f"# ACAS Xu: assay vs Marabou ({len(records)} instances{status})\n\n"
             + markdown_table(list(summary), [[f"{v:.2f}" if isinstance(v, float) else v for v in summary.values()]])
             + "\n" + markdown_table(["network", "property", "assay", "assay s", "Marabou", "Marabou s"], rows)
             + f"\nMachine: {machine()}\n")
    write_results(name, {"machine": machine(), "summary": summary, "records": records, "complete": final}, table)
    return table


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--instances", type=int, default=None, help="run only the first N instances of the CSV")
    parser.add_argument("--only", default=None, help="comma-separated property files to run (e.g. prop_1.vnnlib)")
    parser.add_argument("--marabou", choices=("subset", "all", "none"), default="subset")
    parser.add_argument("--timeout-scale", type=float, default=1.0, help="multiply every instance timeout")
    parser.add_argument("--name", default="acasxu", help="name of the result files")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch threads for assay (default 1: Marabou runs on one core too, like for like)")
    args = parser.parse_args(argv)
    set_threads(args.threads)  # assay.threads: also for the small networks it would run on one thread

    folder = data_dir() / "acasxu"
    with open(folder / "acasxu_instances.csv") as handle:
        instances = [dict(zip(("network", "property", "timeout"), row)) for row in csv.reader(handle) if row]
    if args.only:
        keep = set(args.only.split(","))
        instances = [row for row in instances if row["property"] in keep]
    if args.instances:
        instances = instances[: args.instances]
    marabou_set = {id(r) for r in (instances if args.marabou == "all" else stratified(instances) if args.marabou == "subset" else [])}

    records, disagreements = [], []
    for number, row in enumerate(instances, 1):
        timeout = float(row["timeout"]) * args.timeout_scale
        onnx_path = folder / row["network"]
        network = load(onnx_path)
        prop = read_vnnlib(folder / row["property"], num_inputs=network.input_size, num_outputs=network.output_size)
        started = time.perf_counter()
        result = verify_vnnlib(network, prop, timeout=timeout, rng=np.random.default_rng(0))
        ours_seconds = time.perf_counter() - started
        record = {"network": row["network"], "property": row["property"], "timeout": timeout,
                  "assay": result.status.value, "assay_seconds": ours_seconds, "assay_domains": result.stats.domains}
        if id(row) in marabou_set:
            verdict, seconds = run_marabou(onnx_path, prop, timeout)
            record.update({"marabou": verdict, "marabou_seconds": seconds})
            decided = {"holds", "violated"}
            if record["assay"] in decided and verdict in decided and record["assay"] != verdict:
                disagreements.append(record)
        records.append(record)
        _write(args.name, records, disagreements, final=False)
        print(f"[{number}/{len(instances)}] {row['network']} {row['property']}: assay {record['assay']} "
              f"{ours_seconds:.2f}s" + (f", marabou {record['marabou']} {record['marabou_seconds']:.2f}s" if "marabou" in record else ""),
              flush=True)

    table = _write(args.name, records, disagreements, final=True)
    print(table)
    if disagreements:
        print(f"DISAGREEMENT between assay and Marabou on {len(disagreements)} instance(s): {disagreements}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
