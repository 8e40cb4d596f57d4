"""Two commits of assay side by side on the same ACAS Xu instances, in one run.

A refactor must leave verdicts and speed alone; on a shared 2-core machine wall-clock times
of back-to-back runs drift by 15–20 %, more than the effect being measured. This script puts
each commit in its own git worktree and either

* ``--measure wall``: runs the two commits interleaved (A B B A A B …) ``--repeats`` times and
  reports, per instance, the median verifier seconds of each and their ratio, so drift hits both
  sides alike; or
* ``--measure instructions``: runs each commit once under ``valgrind --tool=callgrind`` (one
  thread) and compares instruction counts, which do not depend on what else the machine is doing.
  An import-only run of each commit is subtracted, leaving the instructions of the verifier.

Verdicts and domain counts of the two commits must agree instance by instance; the script exits
non-zero when they do not. Writes ``results/<name>.json`` and ``.md``.

    .venv/bin/python benchmarks/compare_commits.py --base 0f172f0 --head HEAD \\
        --instances 3_3:prop_9,1_5:prop_2 --measure instructions
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import REPO_ROOT, data_dir, markdown_table, write_results  # noqa: E402


def worker(instances: list[tuple[str, str, float]], timeout_scale: float = 1.0) -> None:
    """Run inside one worktree's interpreter: verify each instance, print one JSON line."""
    import numpy as np
    import torch

    import assay
    from assay.nn import load
    from assay.sets import read_vnnlib
    from assay.verify import verify_vnnlib

    torch.set_num_threads(1)
    folder = data_dir() / "acasxu"
    records = []
    for network_file, property_file, timeout in instances:
        network = load(folder / network_file)
        prop = read_vnnlib(folder / property_file, num_inputs=network.input_size, num_outputs=network.output_size)
        started = time.perf_counter()
        result = verify_vnnlib(network, prop, timeout=timeout * timeout_scale, rng=np.random.default_rng(0))
        seconds = time.perf_counter() - started
        stats = result.stats
        domains = stats["domains"] if isinstance(stats, dict) else stats.domains
        records.append({"network": network_file, "property": property_file, "verdict": result.status.value,
                        "domains": int(domains), "seconds": seconds})
    print("RESULT " + json.dumps({"assay": assay.__file__, "records": records}), flush=True)


def all_instances() -> list[tuple[str, str, float]]:
    with open(data_dir() / "acasxu" / "acasxu_instances.csv") as handle:
        return [(row[0], row[1], float(row[2])) for row in csv.reader(handle) if row]


def pick(spec: str | None) -> list[tuple[str, str, float]]:
    """``3_3:prop_9,1_5:prop_2`` → matching CSV rows; None → all 186."""
    rows = all_instances()
    if not spec:
        return rows
    chosen = []
    for item in spec.split(","):
        net, prop = item.split(":")
        match = [r for r in rows if f"_{net}_batch" in r[0] and r[1] == f"{prop}.vnnlib"]
        if not match:
            raise SystemExit(f"no ACAS Xu instance {item!r} (expected e.g. 3_3:prop_9)")
        chosen += match
    return chosen


def worktree(rev: str, root: Path) -> Path:
    path = root / rev.replace("/", "_")
    subprocess.run(["git", "-C", str(REPO_ROOT), "worktree", "add", "--detach", str(path), rev],
                   check=True, capture_output=True)
    return path


def run_worker(tree: Path, spec: str, callgrind: Path | None = None) -> dict:
    env = dict(os.environ, PYTHONPATH=str(tree / "src"), OMP_NUM_THREADS="1", MKL_NUM_THREADS="1",
               OPENBLAS_NUM_THREADS="1")
    command = [sys.executable, str(Path(__file__).resolve()), "--worker", "--instances", spec]
    if callgrind is not None:
        # valgrind slows the verifier ~50×: without more time every instance would time out,
        # and a search cut by its deadline does an amount of work that depends on the clock.
        command = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={callgrind}"] + command + [
            "--timeout-scale", "1000"]
    done = subprocess.run(command, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"worker for {tree} failed:\n{done.stderr[-3000:]}")
    line = next(x for x in done.stdout.splitlines() if x.startswith("RESULT "))
    payload = json.loads(line[len("RESULT "):])
    if not payload["assay"].startswith(str(tree)):
        raise SystemExit(f"worker imported {payload['assay']}, not the worktree {tree}")
    if callgrind is not None:
        payload["instructions"] = instructions(callgrind, done.stderr)
    return payload


def instructions(out_file: Path, stderr: str) -> int:
    match = re.search(r"Collected\s*:\s*([\d,]+)", stderr)
    if match:
        return int(match.group(1).replace(",", ""))
    for line in out_file.read_text().splitlines():  # fall back on the summary line of the profile
        if line.startswith(("summary:", "totals:")):
            return int(line.split()[1])
    raise SystemExit(f"no instruction count in {out_file}")


def spec_of(rows) -> str:
    pattern = re.compile(r"_(\d_\d)_batch")
    return ",".join(pattern.search(n).group(1) + ":" + p.removesuffix(".vnnlib") for n, p, _ in rows)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base", help="the earlier commit (required)")
    parser.add_argument("--head", default="HEAD", help="the later commit (default HEAD)")
    parser.add_argument("--instances", default=None, help="e.g. 3_3:prop_9,1_5:prop_2 (default: all 186)")
    parser.add_argument("--measure", choices=("wall", "instructions"), default="wall")
    parser.add_argument("--repeats", type=int, default=3, help="interleaved rounds for --measure wall")
    parser.add_argument("--name", default="compare_commits")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--timeout-scale", type=float, default=1.0, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    rows = pick(args.instances)
    if args.worker:
        worker(rows, args.timeout_scale)
        return 0

    if not args.base:
        parser.error("--base is required: the commit to compare against")
    spec = spec_of(rows)
    with tempfile.TemporaryDirectory(prefix="assay-ab-") as scratch:
        root = Path(scratch)
        trees = {"base": worktree(args.base, root), "head": worktree(args.head, root)}
        try:
            if args.measure == "instructions":
                # Instruction counts do not depend on load: run both commits at once, one per core.
                with ThreadPoolExecutor(2) as pool:
                    jobs = {side: pool.submit(run_worker, tree, spec, root / f"{side}.out") for side, tree in trees.items()}
                    runs = {side: job.result() for side, job in jobs.items()}
                    jobs = {side: pool.submit(import_instructions, tree, root / f"{side}.import.out")
                            for side, tree in trees.items()}
                    imports = {side: job.result() for side, job in jobs.items()}
                rounds = {side: [runs[side]] for side in trees}
            else:
                rounds = {"base": [], "head": []}
                for index in range(args.repeats):
                    order = ("base", "head") if index % 2 == 0 else ("head", "base")
                    for side in order:
                        rounds[side].append(run_worker(trees[side], spec))
                        print(f"round {index + 1}/{args.repeats} {side} done", flush=True)
                imports = None
        finally:
            for tree in trees.values():
                subprocess.run(["git", "-C", str(REPO_ROOT), "worktree", "remove", "--force", str(tree)],
                               capture_output=True)

    return report(args, rows, rounds, imports)


def import_instructions(tree: Path, out_file: Path) -> int:
    env = dict(os.environ, PYTHONPATH=str(tree / "src"), OMP_NUM_THREADS="1")
    code = "import torch, numpy, assay.nn, assay.sets, assay.verify; torch.set_num_threads(1)"
    done = subprocess.run(["valgrind", "--tool=callgrind", f"--callgrind-out-file={out_file}",
                           sys.executable, "-c", code], env=env, capture_output=True, text=True)
    return instructions(out_file, done.stderr)


def report(args, rows, rounds, imports) -> int:
    table_rows, records, mismatches = [], [], []
    for index, (network, prop, _) in enumerate(rows):
        base = [r["records"][index] for r in rounds["base"]]
        head = [r["records"][index] for r in rounds["head"]]
        verdicts = {r["verdict"] for r in base + head}
        domains = {r["domains"] for r in base + head}
        if len(verdicts) > 1 or len(domains) > 1:
            mismatches.append(f"{network} {prop}: verdicts {sorted(verdicts)}, domains {sorted(domains)}")
        b = statistics.median(r["seconds"] for r in base)
        h = statistics.median(r["seconds"] for r in head)
        records.append({"network": network, "property": prop, "verdict": base[0]["verdict"], "domains": base[0]["domains"],
                        "base_seconds": [r["seconds"] for r in base], "head_seconds": [r["seconds"] for r in head],
                        "base_median": b, "head_median": h, "ratio": h / b})
        table_rows.append([network.split("run2a_")[1].split("_batch")[0], prop.removesuffix(".vnnlib"), base[0]["verdict"],
                           base[0]["domains"], f"{b:.2f}", f"{h:.2f}", f"{h / b:.3f}"])
    total_base = sum(r["base_median"] for r in records)
    total_head = sum(r["head_median"] for r in records)
    ratios = [r["ratio"] for r in records]
    payload = {"base": args.base, "head": args.head, "measure": args.measure, "repeats": args.repeats,
               "records": records, "total_base_seconds": total_base, "total_head_seconds": total_head,
               "total_ratio": total_head / total_base, "median_ratio": statistics.median(ratios),
               "mismatches": mismatches}
    lines = [f"# {args.head} against {args.base} on {len(rows)} ACAS Xu instances ({args.measure})\n"]
    if imports is not None:
        verifier = {side: rounds[side][0]["instructions"] - imports[side] for side in ("base", "head")}
        payload["instructions"] = {side: rounds[side][0]["instructions"] for side in ("base", "head")}
        payload["import_instructions"] = imports
        payload["verifier_instructions"] = verifier
        payload["instruction_ratio"] = verifier["head"] / verifier["base"]
        lines.append(f"Instructions of the verifier (import-only run subtracted): base {verifier['base']:,}, "
                     f"head {verifier['head']:,}, ratio **{payload['instruction_ratio']:.4f}**.\n")
        lines.append("Seconds below are wall time under valgrind (slowed ~50×), shown for the verdicts only.\n")
    else:
        lines.append(f"Interleaved rounds: {args.repeats}. Sum of per-instance medians: base {total_base:.1f} s, "
                     f"head {total_head:.1f} s, ratio **{total_head / total_base:.3f}**; "
                     f"median per-instance ratio {statistics.median(ratios):.3f}.\n")
    lines.append(markdown_table(["network", "property", "verdict", "domains", "base s", "head s", "head/base"], table_rows))
    if mismatches:
        lines.append("\n**Mismatches:**\n\n" + "\n".join(f"- {m}" for m in mismatches))
    json_path, md_path = write_results(args.name, payload, "\n".join(lines) + "\n")
    print("\n".join(lines))
    print(f"wrote {json_path} and {md_path}")
    return 1 if mismatches else 0


if __name__ == "__main__":
    raise SystemExit(main())
