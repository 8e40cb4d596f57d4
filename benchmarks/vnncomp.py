"""A VNN-COMP benchmark through ``assay verify --instances``, checked against the published consensus.

Runs the instances of ``$ASSAY_DATA/vnncomp/<BENCHMARK>/instances.csv`` (the 2021–22 benchmarks;
``--year 2024``: ``vnncomp2024/<BENCHMARK>``; or ``../shared/data`` for ``$ASSAY_DATA``; or
BENCHMARK given as the path of a folder with ``instances.csv`` and ``published_results/``) with the
competition's timeouts (times ``--timeout-scale``), compares every verdict with the consensus of the
published results (``published_results/per_instance_wide.csv``), and writes
``benchmarks/results/<COLLECTION>_<BENCHMARK>.json`` and ``.md`` (``vnncomp_mnist_fc``,
``vnncomp2024_safenlp``): assay's solved counts (holds / violated / timeout / unknown / error) and
times beside every published tool's, on the same instances (``--limit N`` picks N instances spread
evenly over the CSV, and the published counts are recomputed on those N), and the best and
second-best published tools' solved counts.

A verdict that contradicts the consensus (assay says holds where the consensus says violated,
or the reverse) is a FAILURE: it is named in the table and on stderr, and the script exits 1.
The 2024 consensus reads ``CONFLICT(hN/vM)`` where the published tools disagree (N said holds, M
violated): no verdict of assay can contradict it there, and the table says how assay sided.
Instances whose model assay cannot load (e.g. an operator it cannot bound soundly) have status
``error`` and count as unsolved, not as failures.

The instances run in chunks of ``--chunk`` through one ``assay verify --instances`` process each,
so a long run writes its results after every chunk (``"complete": false`` until the end). A chunk
gets ``min(--workers, --chunk)`` worker processes, and ``--workers`` // that many chunks run at
once: ``--chunk 1 --workers 2`` runs two instances side by side, each in its own process.

    .venv/bin/python benchmarks/vnncomp.py rl_benchmarks --limit 40 --workers 2
    .venv/bin/python benchmarks/vnncomp.py reach_prob_density --timeout-scale 0.5
    .venv/bin/python benchmarks/vnncomp.py --year 2024 safenlp --limit 40

``--all`` runs every benchmark of the year's collection in turn (each with ``--limit`` etc.), then
writes the summary table ``benchmarks/results/<COLLECTION>_summary.md`` (benchmark, instances run,
assay solved, best and second-best published tool solved on the same instances, contradictions);
``--summary`` only rebuilds that table from the per-benchmark results already written, prints it,
and with ``--readme`` writes it into README.md between its ``vnncomp2024-verify-table`` markers
(a benchmark with no results file on this machine keeps its row from there, marked "from an earlier run").
The summary merges every results file of a benchmark, whatever its ``--name`` (a long benchmark
run in pieces with ``--rows``): per instance, the verdict of the latest run that ran it.

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
import re
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path

# A counterexample cell of out.csv holds every input (cctsdb_yolo: 12,296 of them, past csv's
# default limit of 131,072 characters per field).
csv.field_size_limit(sys.maxsize)
sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import RESULTS, data_dir, machine, markdown_table, read_readme_block, write_readme_block, write_results  # noqa: E402

DECIDED = ("holds", "violated")
STATUSES = ("holds", "violated", "timeout", "unknown", "error")
# the data folder of each year's benchmarks (vnncomp/ holds those of 2021 and 2022)
COLLECTIONS = {"2022": "vnncomp", "2024": "vnncomp2024"}


# ------------------------------------------------------------------------------- published results
def consensus_of(text: str) -> str:
    """'holds', 'violated', 'conflict' or 'unknown' from a consensus cell (2021 cells read
    'holds(majority h5/v1)'; 2024 cells 'CONFLICT(h7/v1)' where the tools disagree: no verdict
    contradicts those)."""
    text = text.strip().lower()
    for verdict in (*DECIDED, "conflict"):
        if text.startswith(verdict):
            return verdict
    return "unknown"


def majority_of(text: str) -> str | None:
    """The larger side of a 2024 ``CONFLICT(hN/vM)`` cell ('holds' or 'violated'); None for a tie or
    any other cell."""
    match = re.fullmatch(r"conflict\(h(\d+)/v(\d+)\)", text.strip().lower())
    if not match or match[1] == match[2]:
        return None
    return "holds" if int(match[1]) > int(match[2]) else "violated"


def on_minority(consensus: str, majority: str | None, verdict: str) -> bool:
    """A verdict on the smaller side of a CONFLICT (either side of a tie): no contradiction, no credit."""
    return consensus == "conflict" and verdict in DECIDED and verdict != majority


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
        row["consensus_cell"] = row["consensus"].strip()
        row["majority"] = majority_of(row["consensus"])
        row["consensus"] = consensus_of(row["consensus"])
        row["key"] = (_normal(row["onnx"]), _normal(row["vnnlib"]))
    return rows, tools


def published_counts(rows: list[dict], tool: str) -> dict:
    """A published tool's counts on ``rows``. ``solved``: holds + violated, as tool_summary.csv counts
    them; ``wrong``: those contradicting the consensus; ``minority``: those on the smaller side of a
    CONFLICT (:func:`on_minority`); ``correct``: solved − wrong − minority."""
    counts = {status: 0 for status in STATUSES} | {"solved": 0, "wrong": 0, "minority": 0, "correct": 0}
    solved_times = []
    for row in rows:
        result = row[f"{tool}_result"].strip().lower() or "unknown"
        if result in DECIDED:
            counts[result] += 1
            counts["solved"] += 1
            if row["consensus"] in DECIDED and row["consensus"] != result:
                counts["wrong"] += 1
                continue
            if on_minority(row["consensus"], row["majority"], result):
                counts["minority"] += 1
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
        rows = []
        if out_csv.exists():
            with open(out_csv, newline="") as handle:
                rows = list(csv.DictReader(handle))
        if len(rows) < len(chunk):
            # The process died without (all) results (a crash in one instance stops its batch): run
            # the instances one by one so that the others still count, and record the failure.
            if len(chunk) > 1:
                return [row for single in chunk for row in run_chunk(folder, [single], scale, 1)]
            reason = (done.stderr.strip().splitlines() or [f"exit code {done.returncode}"])[-1]
            return [{"status": "error", "seconds": "0", "error": f"assay verify crashed: {reason}",
                     "counterexample": ""}]
        return rows


# ------------------------------------------------------------------------------- the published checker's test
CHECKER_TOLERANCE = 1e-4  # COUNTEREXAMPLE_TOL of the VNN-COMP 2022 scoring (SCORING/settings.py)


def check_counterexample(model: Path, prop: Path, x: list[float], y: list[float], query: int = 0) -> dict:
    """What the competition's checker (SCORING/counterexamples.py) tests, on the result file that
    `vnncomp/run_instance.sh` would write for counterexample X (float64 output ``y``, of ``query``):
    onnxruntime on X (in the model's input dtype) reproduces the file's Y within the tolerance in
    L∞, X lies in a box of the property and Y meets that box's unsafe condition (both within the
    tolerance). The 2022 scoring's absolute 1e-4 on Y is kept for the 2024 benchmarks too (their
    scoring allows a relative 1e-3), as the stricter test on outputs below 0.1."""
    import numpy as np

    from assay.nn import load
    from assay.nn.reference import file_outputs
    from assay.sets import read_vnnlib
    from assay.verify.competition import result_file_output

    x, y = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
    network = load(model)
    y = result_file_output(network, read_vnnlib(prop, num_inputs=x.size, num_outputs=y.size), x, y, query)
    output = file_outputs(model, x.reshape(1, -1), network.input_shape).reshape(-1)
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
    solved = [r for r in records if r["assay"] in DECIDED and not r["disagrees"] and not r["minority"]]
    times = [r["seconds"] for r in solved]
    return counts | {"solved": counts["holds"] + counts["violated"], "correct": len(solved),
                     "wrong": sum(r["disagrees"] for r in records), "minority": sum(r["minority"] for r in records),
                     "seconds_solved": sum(times), "median_seconds_solved": statistics.median(times) if times else None}


def ranked(published: list[dict], tools: list[str]) -> list[tuple[str, dict]]:
    """(tool, counts) on these instances, best first: most correct, then most solved."""
    theirs = {tool: published_counts(published, tool) for tool in tools}
    return sorted(theirs.items(), key=lambda item: (-item[1]["correct"], -item[1]["solved"]))


def _seconds(value) -> str:
    return "–" if value is None else f"{value:.1f}"


def _leader(ranking: list[tuple[str, dict]], place: int) -> dict | None:
    if len(ranking) <= place:
        return None
    tool, counts = ranking[place]
    return {"tool": tool, "correct": counts["correct"], "solved": counts["solved"]}


def report(benchmark: str, collection: str, args, total: int, records: list[dict], published: list[dict], tools: list[str],
           started: float, final: bool) -> tuple[str, dict]:
    ours = assay_counts(records)
    ranking = ranked(published, tools)
    best, second = _leader(ranking, 0), _leader(ranking, 1)
    disagreements = [r for r in records if r["disagrees"]]
    checked = [r["checker"] for r in records if r.get("checker")]
    rejected = [r for r in records if r.get("checker") and not r["checker"]["accepted"]]
    header = ["tool", "solved", "holds", "violated", "wrong", "minority", "correct", "timeout", "unknown", "error",
              "s on correct", "median s"]

    def line(name, counts):
        return [name, counts["solved"], counts["holds"], counts["violated"], counts["wrong"], counts["minority"],
                counts["correct"],
                counts["timeout"], counts["unknown"], counts["error"], _seconds(counts["seconds_solved"]),
                _seconds(counts["median_seconds_solved"])]

    consensus = {verdict: sum(r["consensus"] == verdict for r in records) for verdict in (*DECIDED, "conflict", "unknown")}
    on_conflicts = [r for r in records if r["consensus"] == "conflict"]
    title = (f"# VNN-COMP {benchmark}: assay beside the published tools ({len(records)} of {total} instances"
             f"{', --limit ' + str(args.limit) if args.limit else ''}{', --rows ' + args.rows if args.rows else ''}, timeout scale {args.timeout_scale:g}"
             f"{'' if final else ' — run in progress'})\n\n")
    conflict_line = ""
    if consensus["conflict"]:
        sided = {verdict: sum(r["assay"] == verdict for r in on_conflicts) for verdict in DECIDED}
        conflict_line = (f"CONFLICT (the published tools disagree; no verdict can contradict them there): "
                         f"{consensus['conflict']} instances, on which assay said holds {sided['holds']}, violated "
                         f"{sided['violated']}, {sum(r['minority'] for r in on_conflicts)} of them on the smaller side "
                         f"(per instance below, with the tools' split hN/vM).\n\n")
    leaders = "Best published tool on these instances: " + (
        f"{best['tool']} ({best['correct']} correct)" if best else "none") + "; second best: " + (
        f"{second['tool']} ({second['correct']} correct)" if second else "none") + \
        f". assay: {ours['correct']} correct.\n\n"
    table = (title
             + f"Consensus on these instances: {consensus['holds']} holds, {consensus['violated']} violated, "
               f"{consensus['conflict']} CONFLICT, {consensus['unknown']} unknown. "
               f"**Disagreements with the consensus: {len(disagreements)}**\n\n"
             + conflict_line + leaders
             + f"Counterexamples the published checker's test accepts (onnxruntime reproduces Y within "
               f"{CHECKER_TOLERANCE:g}, X in the box, Y unsafe): {len(checked) - len(rejected)} of {len(checked)}"
               + (f" (largest onnxruntime difference {max(c['onnxruntime_difference'] for c in checked):.1e})"
                  if checked else "") + "\n\n"
             + "solved = holds + violated (as the published tool_summary.csv counts them); wrong = contradicting the "
               "consensus (never on CONFLICT rows); minority = on the smaller side of a CONFLICT (either side of a "
               "tie): not a contradiction, not credited either; correct = solved − wrong − minority.\n\n"
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
        [[r["index"], r["network"], r["property"], f"{r['timeout']:g}", r["consensus_cell"],
          r["assay"] + (" ✗" if r["disagrees"] else " (minority)" if r["minority"] else ""), f"{r['seconds']:.1f}", _seconds(r["best_published_seconds"])]
         for r in records])
    errors = sorted({r["error"] for r in records if r["assay"] == "error" and r["error"]})
    if errors:
        table += "\nErrors (instances assay did not run):\n\n" + "".join(f"- {message}\n" for message in errors)
    reasons = sorted({r["reason"] for r in records if r.get("reason")})
    if reasons:
        table += "\nWhy some unknowns are no verdict:\n\n" + "".join(f"- {message}\n" for message in reasons)
    table += (f"\nassay's times: seconds per instance from `assay verify --instances` (loading and verifying) on "
              f"{args.workers} worker(s) of this machine; published times: the competition's machines, minus each "
              f"tool's start-up overhead, at least 1 s. Wall time {time.perf_counter() - started:.0f} s.\n\n"
              + (f"Note: {args.note}\n\n" if args.note else "")
              + f"Machine: {machine()}\n")
    payload = {"benchmark": benchmark, "collection": collection, "complete": final, "limit": args.limit, "timeout_scale": args.timeout_scale,
               "workers": args.workers, "note": args.note, "instances": len(records), "total_instances": total,
               "assay": ours, "published": dict(ranking), "best_published": best, "second_published": second,
               "consensus": consensus, "disagreements": disagreements, "errors": errors, "records": records,
               "wall_seconds": time.perf_counter() - started, "machine": machine()}
    return table, payload


# ------------------------------------------------------------------------------- one benchmark
def benchmark_folder(parser, benchmark: str, year: str) -> Path:
    """The folder of ``benchmark``: a path to a folder with instances.csv, or a name in the year's collection."""
    given = Path(benchmark)
    if (given / "instances.csv").is_file():
        return given.resolve()
    collection = data_dir() / COLLECTIONS[year]
    folder = collection / benchmark
    if not (folder / "instances.csv").is_file():
        available = sorted(p.name for p in collection.iterdir() if (p / "instances.csv").is_file())
        parser.error(f"no benchmark {benchmark!r} in {collection} (--year {year}); available: {', '.join(available)}")
    return folder


def results_name(folder: Path) -> str:
    """``<collection>_<benchmark>``: vnncomp_mnist_fc, vnncomp2024_safenlp."""
    return f"{folder.parent.name}_{folder.name}"


def run_benchmark(parser, folder: Path, args) -> dict:
    """Run the chosen instances of ``folder``, write its results after every chunk; the final payload."""
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
    name = args.name or results_name(folder)

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
                        if reference["consensus"] in DECIDED
                        and reference[f"{t}_result"].strip().lower() == reference["consensus"]]
                record = {"index": row["index"], "network": row["network"], "property": row["property"],
                          "timeout": row["timeout"] * args.timeout_scale, "consensus": reference["consensus"],
                          "consensus_cell": reference["consensus_cell"],
                          "assay": status, "seconds": float(out["seconds"] or 0.0), "error": out.get("error") or None,
                          "reason": out.get("reason") or None,
                          "counterexample": json.loads(out["counterexample"]) if out.get("counterexample") else None,
                          "best_published_seconds": min(best) if best else None}
                record["disagrees"] = status in DECIDED and reference["consensus"] in DECIDED and status != reference["consensus"]
                record["minority"] = on_minority(reference["consensus"], reference["majority"], status)
                if record["counterexample"] is not None:
                    found = record["counterexample"]
                    record["checker"] = check_counterexample(folder / row["network"], folder / row["property"],
                                                             found["input"], found["output"], found.get("query", 0))
                records.append(record)
                published.append(reference)
                print(f"[{len(records)}/{len(chosen)}] #{row['index']} {row['network']} {row['property']}: {status} "
                      f"{record['seconds']:.1f}s (consensus {reference['consensus_cell']})"
                      + ("  DISAGREES WITH THE CONSENSUS" if record["disagrees"] else ""), flush=True)
            table, payload = report(folder.name, folder.parent.name, args, len(instances), records, published, tools, started, final=False)
            write_results(name, payload, table)

    table, payload = report(folder.name, folder.parent.name, args, len(instances), records, published, tools, started, final=True)
    write_results(name, payload, table)
    print(table)
    for r in payload["disagreements"]:
        print(f"FAILURE: {folder.name} #{r['index']} {r['network']} {r['property']}: assay says {r['assay']}, the "
              f"published consensus {r['consensus']}", file=sys.stderr)
    return payload


# ------------------------------------------------------------------------------- the summary over a year
def summary(collection: Path, earlier: dict[str, list[str]] | None = None) -> tuple[str, dict]:
    """One row per benchmark of ``collection`` from the results files written so far.

    ``earlier``: rows of a table written before (:func:`readme_rows`), by benchmark. A benchmark
    with no results file here keeps its earlier row (results files are not part of the
    repository: a fresh checkout has none, and its README must not forget the runs behind it).
    """
    rows, benchmarks = [], {}
    for folder in sorted(p for p in collection.iterdir() if (p / "instances.csv").is_file()):
        run = merged_run(folder)
        if run is None:
            kept = (earlier or {}).get(folder.name)
            if kept is not None and kept[1] != "not run":
                note = kept[-1] if EARLIER_RUN in kept[-1] else f"{EARLIER_RUN}; {kept[-1]}".removesuffix("; –")
                rows.append([*kept[:-1], note])
            else:
                rows.append([folder.name, "not run", "–", "–", "–", "–", "–"])
            continue
        best, second, ours = run["best_published"], run["second_published"], run["assay"]
        errors = run["errors"]
        benchmarks[folder.name] = {key: run.get(key) for key in (
            "complete", "instances", "total_instances", "timeout_scales", "runs", "assay", "best_published",
            "second_published", "errors")} | {"contradictions": len(run["disagreements"])}
        note = "" if run["complete"] else "a run stopped or in progress; "
        if len(run["runs"]) > 1:
            note += f"{len(run['runs'])} runs merged, the latest verdict per instance; "
        scales = run["timeout_scales"]
        if scales != [1.0]:
            note += "timeouts × " + " / ".join(f"{scale:g}" for scale in scales) + " of the published; "
        if ours.get("minority"):
            note += f"{ours['minority']} on the smaller side of a CONFLICT; "
        if errors:
            first = errors[0].replace(f"{folder}/", "")  # the model's path inside the benchmark
            note += f"{ours['error']} not run: {first[:160]}" + (f" (+{len(errors) - 1} more)"
                                                                    if len(errors) > 1 else "")
        note = note.removesuffix("; ")
        rows.append([folder.name, f"{run['instances']} / {run['total_instances']}",
                     f"{ours['solved']} ({ours['holds']} h, {ours['violated']} v)",
                     f"{best['correct']} ({best['tool']})" if best else "–",
                     f"{second['correct']} ({second['tool']})" if second else "–",
                     f"**{len(run['disagreements'])}**" if run["disagreements"] else "0", note or "–"])
    table = markdown_table(["benchmark", "instances run", "assay solved", "best published", "second best",
                            "contradictions", "notes"], rows)
    table += ("\nOn the instances run (the published counts are recomputed on those); solved = holds + violated; "
              "published: correct answers (an answer on the smaller side of a CONFLICT, where the tools disagree, "
              "is neither a contradiction nor credited); "
              "contradictions: assay's verdicts against the published consensus. Per benchmark: "
              "`benchmarks/results/<collection>_<benchmark>.md`.\n")
    return table, {"collection": collection.name, "benchmarks": benchmarks, "machine": machine()}


def runs_of(folder: Path) -> list[tuple[float, str, dict]]:
    """Every results file of ``folder``'s benchmark in ``benchmarks/results`` (whatever its ``--name``),
    oldest first, as (modification time, file name, payload).

    A file counts only if it names this benchmark and each of its records is the row of this
    benchmark's instances.csv it claims to be (index, network and property): a file of another
    collection with the same benchmark name, or of an older instances.csv, is left out.
    """
    instances = read_instances(folder)
    runs = []
    for path in sorted(RESULTS.glob("*.json")):
        try:
            payload = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if not isinstance(payload, dict) or payload.get("benchmark") != folder.name:
            continue
        if payload.get("collection", folder.parent.name) != folder.parent.name:
            continue
        records = payload.get("records") or []
        if not records or not all(
                isinstance(r, dict) and 0 <= r.get("index", -1) < len(instances)
                and (instances[r["index"]]["network"], instances[r["index"]]["property"]) == (r["network"], r["property"])
                for r in records):
            continue
        runs.append((path.stat().st_mtime, path.name, payload))
    return sorted(runs, key=lambda run: run[0])


def merged_run(folder: Path) -> dict | None:
    """The benchmark's results over all its runs (:func:`runs_of`): per instance the verdict of the
    latest run that ran it, and the published tools' counts recomputed on those instances; None if
    it was never run here."""
    runs = runs_of(folder)
    if not runs:
        return None
    latest = {}
    for _, _, payload in runs:  # oldest first: a later run's record replaces an earlier one
        for record in payload["records"]:
            latest[record["index"]] = record
    records = [latest[index] for index in sorted(latest)]
    published_rows, tools = read_published(folder)
    ranking = ranked([published_rows[r["index"]] for r in records], tools)
    used = {name for _, name, payload in runs if any(latest[r["index"]] is r for r in payload["records"])}
    kept = [(name, payload) for _, name, payload in runs if name in used]
    return {"complete": all(payload["complete"] for _, payload in kept),
            "instances": len(records), "total_instances": kept[-1][1]["total_instances"],
            "timeout_scales": sorted({float(payload.get("timeout_scale", 1.0)) for _, payload in kept}),
            "runs": [name for name, _ in kept], "assay": assay_counts(records),
            "best_published": _leader(ranking, 0), "second_published": _leader(ranking, 1),
            "disagreements": [r for r in records if r["disagrees"]],
            "errors": sorted({r["error"] for r in records if r["assay"] == "error" and r["error"]})}


# The note of a row kept from the README's earlier table.
EARLIER_RUN = "from an earlier run"


def readme_rows(block: str) -> dict[str, list[str]]:
    """The rows of README.md's table between the ``block`` markers, by their first cell (benchmark)."""
    rows = {}
    for line in read_readme_block(block).splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if line.startswith("|") and len(cells) == 7 and cells[0] not in ("benchmark", "---"):
            rows[cells[0]] = cells
    return rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("benchmark", nargs="?", help="a benchmark folder of the year's collection, e.g. rl_benchmarks "
                        "or (--year 2024) safenlp, or the path of a folder with instances.csv and published_results/")
    parser.add_argument("--year", choices=sorted(COLLECTIONS), default="2022",
                        help="2022: the vnncomp/ benchmarks (2021–22); 2024: vnncomp2024/")
    parser.add_argument("--all", action="store_true", help="run every benchmark of the year's collection in turn, "
                        "then write the summary")
    parser.add_argument("--summary", action="store_true", help="only rebuild the summary of the year's collection "
                        "from the results written so far, and print it")
    parser.add_argument("--readme", action="store_true", help="with --all or --summary (--year 2024): write the "
                        "summary into README.md")
    parser.add_argument("--limit", type=int, default=None, help="run N instances spread evenly over instances.csv")
    parser.add_argument("--rows", default=None, help="run only these rows of instances.csv (0-based, comma-separated, "
                        "e.g. the ones an earlier run left open); with --limit, the limit applies to them")
    parser.add_argument("--timeout-scale", type=float, default=1.0, help="multiply every instance's timeout")
    parser.add_argument("--workers", type=int, default=1, help="worker processes of assay verify --instances")
    parser.add_argument("--chunk", type=int, default=8, help="instances per assay verify process (results are "
                        "written after each)")
    parser.add_argument("--name", default=None, help="results file name (default <collection>_<BENCHMARK>)")
    parser.add_argument("--note", default=None, help="a line for the results, e.g. the commit measured")
    args = parser.parse_args(argv)
    if args.limit is not None and args.limit < 1:
        parser.error("--limit must be ≥ 1")
    if not args.timeout_scale > 0:
        parser.error("--timeout-scale must be > 0")
    whole = args.all or args.summary
    if whole == (args.benchmark is not None):
        parser.error("give one BENCHMARK, or --all / --summary for every benchmark of the year")
    if whole and (args.rows or args.name):
        parser.error("--rows and --name apply to one benchmark, not to --all / --summary")
    if args.readme and not (whole and args.year == "2024"):
        parser.error("--readme writes the 2024 summary: use it with --year 2024 and --all or --summary")

    if not whole:
        payload = run_benchmark(parser, benchmark_folder(parser, args.benchmark, args.year), args)
        return 1 if payload["disagreements"] else 0
    collection = data_dir() / COLLECTIONS[args.year]
    if args.all:
        for folder in sorted(p for p in collection.iterdir() if (p / "instances.csv").is_file()):
            run_benchmark(parser, folder, args)
    table, payload = summary(collection, readme_rows("vnncomp2024-verify-table") if args.readme else None)
    write_results(f"{collection.name}_summary", payload, table)
    print(table)
    if args.readme:
        write_readme_block("vnncomp2024-verify-table", "vnncomp.py", table)
    contradictions = sum(b["contradictions"] for b in payload["benchmarks"].values())
    return 1 if contradictions else 0


if __name__ == "__main__":
    raise SystemExit(main())
