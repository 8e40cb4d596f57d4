"""A VNN-COMP benchmark through ``assay verify --instances``, checked against the published consensus.

Runs the instances of ``$ASSAY_DATA/vnncomp/<BENCHMARK>/instances.csv`` (or ``../shared/data``)
with the competition's timeouts (times ``--timeout-scale``), compares every verdict with the
consensus of the published results (``published_results/per_instance_wide.csv``), and writes
``benchmarks/results/vnncomp_<BENCHMARK>.json`` and ``.md``: assay's solved counts (holds /
violated / timeout / unknown / error) and times beside every published tool's, on the same
instances (``--limit N`` picks N instances spread evenly over the CSV, and the published counts
are recomputed on those N).

A verdict that contradicts the consensus (assay says holds where the consensus says violated,
or the reverse) is a FAILURE: it is named in the table and on stderr, and the script exits 1.
Instances whose model assay cannot load (e.g. an operator it cannot bound soundly) have status
``error`` and count as unsolved, not as failures.

The instances run in chunks of ``--chunk`` through one ``assay verify --instances`` process each,
so a long run writes its results after every chunk (``"complete": false`` until the end). A chunk
gets ``min(--workers, --chunk)`` worker processes, and ``--workers`` // that many chunks run at
once: ``--chunk 1 --workers 2`` runs two instances side by side, each in its own process.

    .venv/bin/python benchmarks/vnncomp.py rl_benchmarks --limit 40 --workers 2
    .venv/bin/python benchmarks/vnncomp.py reach_prob_density --timeout-scale 0.5

Published times are those of the competition's machines (a GPU or many cores), minus each
tool's start-up overhead and floored at 1 s, as the official scoring computes them; assay's
``seconds`` count loading the model and property and verifying, in the worker process.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import data_dir, machine, markdown_table, write_results  # noqa: E402

DECIDED = ("holds", "violated")
STATUSES = ("holds", "violated", "timeout", "unknown", "error")


# ------------------------------------------------------------------------------- published results
def consensus_of(text: str) -> str:
    """'holds', 'violated' or 'unknown' from a consensus cell (2021 cells read 'holds(majority h5/v1)')."""
    text = text.strip().lower()
    for verdict in DECIDED:
        if text.startswith(verdict):
            return verdict
    return "unknown"


def _normal(path: str) -> str:
    return os.path.normpath(path.strip())


def read_published(folder: Path) -> tuple[list[dict], list[str]]:
    """Rows of per_instance_wide.csv (with ``consensus`` normalised) and the tool names, in file order."""
    with open(folder / "published_results" / "per_instance_wide.csv", newline="") as handle:
        rows = list(csv.DictReader(handle))
    tools = [column[: -len("_result")] for column in rows[0] if column.endswith("_result")]
    summary = folder / "published_results" / "tool_summary.csv"
    if summary.is_file():  # tools with a column but no entry in the category are left out
        with open(summary, newline="") as handle:
            entered = {row["tool"] for row in csv.DictReader(handle)}
        tools = [tool for tool in tools if tool in entered]
    for row in rows:
        row["consensus"] = consensus_of(row["consensus"])
        row["key"] = (_normal(row["onnx"]), _normal(row["vnnlib"]))
    return rows, tools


def published_counts(rows: list[dict], tool: str) -> dict:
    """A published tool's counts on ``rows``. ``solved``: holds + violated, as tool_summary.csv counts
    them; ``wrong``: those contradicting the consensus; ``correct``: solved − wrong."""
    counts = {status: 0 for status in STATUSES} | {"solved": 0, "wrong": 0, "correct": 0}
    solved_times = []
    for row in rows:
        result = row[f"{tool}_result"].strip().lower() or "unknown"
        if result in DECIDED:
            counts[result] += 1
            counts["solved"] += 1
            if row["consensus"] in DECIDED and row["consensus"] != result:
                counts["wrong"] += 1
                continue
            counts["correct"] += 1
            solved_times.append(float(row[f"{tool}_time_s"]))
        elif result in STATUSES:
            counts[result] += 1
        else:  # e.g. 'incorrect', 'missing': nothing to credit
            counts["error"] += 1
    counts["seconds_solved"] = sum(solved_times)
    counts["median_seconds_solved"] = statistics.median(solved_times) if solved_times else None
    return counts


# ------------------------------------------------------------------------------- instances
def read_instances(folder: Path) -> list[dict]:
    with open(folder / "instances.csv", newline="") as handle:
        rows = [row for row in csv.reader(handle) if row and row[0].strip()]
    return [{"index": i, "network": row[0].strip(), "property": row[1].strip(), "timeout": float(row[2])}
            for i, row in enumerate(rows)]


def pick(instances: list[dict], limit: int | None) -> list[dict]:
    """``limit`` instances spread evenly over the list (all of them without a limit)."""
    if not limit or limit >= len(instances):
        return list(instances)
    step = len(instances) / limit
    return [instances[int(math.floor(i * step))] for i in range(limit)]


def assay_command() -> list[str]:
    """The ``assay`` console script of this interpreter's environment (``python -c`` as a fallback)."""
    script = Path(sys.executable).parent / "assay"
    if script.exists():
        return [str(script)]
    return [sys.executable, "-c", "from assay.cli.main import run; run()"]


def run_chunk(folder: Path, chunk: list[dict], scale: float, workers: int) -> list[dict]:
    """Run ``chunk`` through one ``assay verify --instances`` process; rows of its --out CSV."""
    with tempfile.TemporaryDirectory(prefix="assay-vnncomp-") as scratch:
        instances_csv = Path(scratch) / "instances.csv"
        out_csv = Path(scratch) / "out.csv"
        with open(instances_csv, "w", newline="") as handle:
            writer = csv.writer(handle)
            for row in chunk:
                writer.writerow([folder / row["network"], folder / row["property"], f"{row['timeout'] * scale:g}"])
        command = assay_command() + ["verify", "--instances", str(instances_csv), "--out", str(out_csv),
                                     "--workers", str(min(workers, len(chunk)))]
        done = subprocess.run(command, capture_output=True, text=True)
        if not out_csv.exists():
            # The process died without results (a crash in one instance stops its batch): run the
            # instances one by one so that the others still count, and record the failure.
            if len(chunk) > 1:
                return [row for single in chunk for row in run_chunk(folder, [single], scale, 1)]
            reason = (done.stderr.strip().splitlines() or [f"exit code {done.returncode}"])[-1]
            return [{"status": "error", "seconds": "0", "error": f"assay verify crashed: {reason}",
                     "counterexample": ""}]
        with open(out_csv, newline="") as handle:
            return list(csv.DictReader(handle))


# ------------------------------------------------------------------------------- the published checker's test
CHECKER_TOLERANCE = 1e-4  # COUNTEREXAMPLE_TOL of the VNN-COMP 2022 scoring (SCORING/settings.py)


def check_counterexample(model: Path, prop: Path, x: list[float], y: list[float], query: int = 0) -> dict:
    """What the competition's checker (SCORING/counterexamples.py) tests, on the result file that
    `vnncomp/run_instance.sh` would write for counterexample X (float64 output ``y``, of ``query``):
    onnxruntime on X (in the model's input dtype) reproduces the file's Y within the tolerance in
    L∞, X lies in a box of the property and Y meets that box's unsafe condition (both within the
    tolerance)."""
    import numpy as np
    import onnxruntime

    from assay.nn import load
    from assay.sets import read_vnnlib
    from assay.verify.competition import result_file_output

    session = onnxruntime.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    declared = session.get_inputs()[0]
    shape = [d if isinstance(d, int) and d > 0 else 1 for d in declared.shape]
    dtype = np.float64 if "double" in declared.type else np.float32
    x, y = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
    network = load(model)
    y = result_file_output(network, read_vnnlib(prop, num_inputs=x.size, num_outputs=y.size), x, y, query)
    output = session.run(None, {declared.name: x.astype(dtype).reshape(shape)})[0].reshape(-1)
    difference = float(np.abs(output.astype(np.float64) - y).max())
    spec = read_vnnlib(prop, num_inputs=x.size, num_outputs=y.size)
    violates = False
    for query in spec.queries:
        lower = query.input_set.lower.numpy().reshape(-1)
        upper = query.input_set.upper.numpy().reshape(-1)
        if ((lower - CHECKER_TOLERANCE <= x) & (x <= upper + CHECKER_TOLERANCE)).all():
            violates |= any(bool((c.C.numpy() @ y + c.d.numpy() >= -CHECKER_TOLERANCE).all())
                            for c in query.unsafe_outputs.conjunctions)
    return {"onnxruntime_difference": difference, "violates": violates,
            "accepted": difference < CHECKER_TOLERANCE and violates}


# ------------------------------------------------------------------------------- report
def assay_counts(records: list[dict]) -> dict:
    counts = {status: sum(r["assay"] == status for r in records) for status in STATUSES}
    solved = [r for r in records if r["assay"] in DECIDED and not r["disagrees"]]
    times = [r["seconds"] for r in solved]
    return counts | {"solved": counts["holds"] + counts["violated"], "correct": len(solved),
                     "wrong": sum(r["disagrees"] for r in records),
                     "seconds_solved": sum(times), "median_seconds_solved": statistics.median(times) if times else None}


def _seconds(value) -> str:
    return "–" if value is None else f"{value:.1f}"


def report(benchmark: str, args, records: list[dict], published: list[dict], tools: list[str], started: float,
           final: bool) -> tuple[str, dict]:
    ours = assay_counts(records)
    theirs = {tool: published_counts(published, tool) for tool in tools}
    ranking = sorted(theirs.items(), key=lambda item: (-item[1]["correct"], -item[1]["solved"]))
    disagreements = [r for r in records if r["disagrees"]]
    checked = [r["checker"] for r in records if r.get("checker")]
    rejected = [r for r in records if r.get("checker") and not r["checker"]["accepted"]]
    header = ["tool", "solved", "holds", "violated", "wrong", "correct", "timeout", "unknown", "error",
              "s on correct", "median s"]

    def line(name, counts):
        return [name, counts["solved"], counts["holds"], counts["violated"], counts["wrong"], counts["correct"],
                counts["timeout"], counts["unknown"], counts["error"], _seconds(counts["seconds_solved"]),
                _seconds(counts["median_seconds_solved"])]

    consensus = {verdict: sum(r["consensus"] == verdict for r in records) for verdict in (*DECIDED, "unknown")}
    title = (f"# VNN-COMP {benchmark}: assay beside the published tools ({len(records)} of {args.total} instances"
             f"{', --limit ' + str(args.limit) if args.limit else ''}{', --rows ' + args.rows if args.rows else ''}, timeout scale {args.timeout_scale:g}"
             f"{'' if final else ' — run in progress'})\n\n")
    table = (title
             + f"Consensus on these instances: {consensus['holds']} holds, {consensus['violated']} violated, "
               f"{consensus['unknown']} unknown. **Disagreements with the consensus: {len(disagreements)}**\n\n"
             + f"Counterexamples the published checker's test accepts (onnxruntime reproduces Y within "
               f"{CHECKER_TOLERANCE:g}, X in the box, Y unsafe): {len(checked) - len(rejected)} of {len(checked)}"
               + (f" (largest onnxruntime difference {max(c['onnxruntime_difference'] for c in checked):.1e})"
                  if checked else "") + "\n\n"
             + "solved = holds + violated (as the published tool_summary.csv counts them); wrong = contradicting the "
               "consensus; correct = solved − wrong.\n\n"
             + markdown_table(header, [line("**assay**", ours)] + [line(tool, counts) for tool, counts in ranking]))
    if rejected:
        table += "\n## Counterexamples the checker would reject\n\n" + markdown_table(
            ["#", "network", "property", "onnxruntime difference", "violates"],
            [[r["index"], r["network"], r["property"], f"{r['checker']['onnxruntime_difference']:.2e}",
              r["checker"]["violates"]] for r in rejected])
    if disagreements:
        table += "\n## FAILURES: verdicts contradicting the published consensus\n\n" + markdown_table(
            ["#", "network", "property", "assay", "consensus"],
            [[r["index"], r["network"], r["property"], r["assay"], r["consensus"]] for r in disagreements])
    table += "\n## Per instance\n\n" + markdown_table(
        ["#", "network", "property", "timeout s", "consensus", "assay", "assay s", "best published s"],
        [[r["index"], r["network"], r["property"], f"{r['timeout']:g}", r["consensus"],
          r["assay"] + (" ✗" if r["disagrees"] else ""), f"{r['seconds']:.1f}", _seconds(r["best_published_seconds"])]
         for r in records])
    errors = sorted({r["error"] for r in records if r["assay"] == "error" and r["error"]})
    if errors:
        table += "\nErrors (instances assay did not run):\n\n" + "".join(f"- {message}\n" for message in errors)
    table += (f"\nassay's times: seconds per instance from `assay verify --instances` (loading and verifying) on "
              f"{args.workers} worker(s) of this machine; published times: the competition's machines, minus each "
              f"tool's start-up overhead, at least 1 s. Wall time {time.perf_counter() - started:.0f} s.\n\n"
              + (f"Note: {args.note}\n\n" if args.note else "")
              + f"Machine: {machine()}\n")
    payload = {"benchmark": benchmark, "complete": final, "limit": args.limit, "timeout_scale": args.timeout_scale,
               "workers": args.workers, "note": args.note, "instances": len(records), "total_instances": args.total,
               "assay": ours, "published": theirs, "disagreements": disagreements, "records": records,
               "wall_seconds": time.perf_counter() - started, "machine": machine()}
    return table, payload


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("benchmark", help="a folder of vnncomp/ in the data folder, e.g. rl_benchmarks")
    parser.add_argument("--limit", type=int, default=None, help="run N instances spread evenly over instances.csv")
    parser.add_argument("--rows", default=None, help="run only these rows of instances.csv (0-based, comma-separated, "
                        "e.g. the ones an earlier run left open); with --limit, the limit applies to them")
    parser.add_argument("--timeout-scale", type=float, default=1.0, help="multiply every instance's timeout")
    parser.add_argument("--workers", type=int, default=1, help="worker processes of assay verify --instances")
    parser.add_argument("--chunk", type=int, default=8, help="instances per assay verify process (results are "
                        "written after each)")
    parser.add_argument("--name", default=None, help="results file name (default vnncomp_<BENCHMARK>)")
    parser.add_argument("--note", default=None, help="a line for the results, e.g. the commit measured")
    args = parser.parse_args(argv)
    if args.limit is not None and args.limit < 1:
        parser.error("--limit must be ≥ 1")
    if not args.timeout_scale > 0:
        parser.error("--timeout-scale must be > 0")

    folder = data_dir() / "vnncomp" / args.benchmark
    if not (folder / "instances.csv").is_file():
        available = sorted(p.name for p in (data_dir() / "vnncomp").iterdir() if (p / "instances.csv").is_file())
        parser.error(f"no benchmark {args.benchmark!r} in {folder.parent}; available: {', '.join(available)}")
    instances = read_instances(folder)
    published_rows, tools = read_published(folder)
    if len(published_rows) != len(instances):
        raise SystemExit(f"{folder}: instances.csv has {len(instances)} rows, per_instance_wide.csv {len(published_rows)}")
    if args.rows:
        try:
            # In the order given (long rows first, say), each row once.
            wanted = list(dict.fromkeys(int(part) for part in args.rows.split(",") if part.strip()))
        except ValueError:
            parser.error(f"--rows takes comma-separated row numbers, e.g. 3,17,40; got {args.rows!r}")
        outside = [r for r in wanted if not 0 <= r < len(instances)]
        if outside:
            parser.error(f"--rows {outside} outside instances.csv's rows 0..{len(instances) - 1}")
        instances_to_pick = [instances[r] for r in wanted]
    else:
        instances_to_pick = instances
    chosen = pick(instances_to_pick, args.limit)
    args.total = len(instances)
    name = args.name or f"vnncomp_{args.benchmark}"

    started = time.perf_counter()
    records, published = [], []
    chunks = [chosen[start: start + args.chunk] for start in range(0, len(chosen), args.chunk)]
    per_chunk = max(1, min(args.workers, args.chunk))
    with ThreadPoolExecutor(max_workers=max(1, args.workers // per_chunk)) as pool:
        running = {pool.submit(run_chunk, folder, chunk, args.timeout_scale, per_chunk): chunk for chunk in chunks}
        for finished in as_completed(running):
            chunk = running[finished]
            for row, out in zip(chunk, finished.result()):
                reference = published_rows[row["index"]]
                if reference["key"] != (_normal(row["network"]), _normal(row["property"])):
                    raise SystemExit(f"row {row['index']} of instances.csv ({row['network']}, {row['property']}) is not row "
                                     f"{row['index']} of per_instance_wide.csv ({reference['onnx']}, {reference['vnnlib']})")
                status = out["status"]
                best = [float(reference[f"{t}_time_s"]) for t in tools
                        if reference[f"{t}_result"].strip().lower() == reference["consensus"] != "unknown"]
                record = {"index": row["index"], "network": row["network"], "property": row["property"],
                          "timeout": row["timeout"] * args.timeout_scale, "consensus": reference["consensus"],
                          "assay": status, "seconds": float(out["seconds"] or 0.0), "error": out.get("error") or None,
                          "counterexample": json.loads(out["counterexample"]) if out.get("counterexample") else None,
                          "best_published_seconds": min(best) if best else None}
                record["disagrees"] = status in DECIDED and reference["consensus"] in DECIDED and status != reference["consensus"]
                if record["counterexample"] is not None:
                    found = record["counterexample"]
                    record["checker"] = check_counterexample(folder / row["network"], folder / row["property"],
                                                             found["input"], found["output"], found.get("query", 0))
                records.append(record)
                published.append(reference)
                print(f"[{len(records)}/{len(chosen)}] #{row['index']} {row['network']} {row['property']}: {status} "
                      f"{record['seconds']:.1f}s (consensus {reference['consensus']})"
                      + ("  DISAGREES WITH THE CONSENSUS" if record["disagrees"] else ""), flush=True)
            table, payload = report(args.benchmark, args, records, published, tools, started, final=False)
            write_results(name, payload, table)

    table, payload = report(args.benchmark, args, records, published, tools, started, final=True)
    write_results(name, payload, table)
    print(table)
    if payload["disagreements"]:
        for r in payload["disagreements"]:
            print(f"FAILURE: #{r['index']} {r['network']} {r['property']}: assay says {r['assay']}, the published "
                  f"consensus {r['consensus']}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
