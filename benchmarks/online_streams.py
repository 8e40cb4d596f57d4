"""Soundness of online verification over long seeded runs of random streams.

Runs the stream test of ``tests/verify/test_online_streams.py`` (box moves, network swaps and
weight updates; disjunctive and conjunctive unsafe regions; ReLU-splitting leaves on 20- and
18-input networks and with ``strategy="relu"`` on 2- and 3-input ones, input-splitting leaves on
2 inputs) for ``--examples`` streams per family, each step compared with verifying it from scratch,
every HOLDS attacked by sampling and (on networks with at most 3 inputs, unless ``--no-marabou``)
checked by Marabou. Counts the steps and verdicts per family; any unsound HOLDS stops the run
with the failing stream (hypothesis's report) and exit code 1.

Results: ``benchmarks/results/online_streams.json`` and ``.md``.

    PYTHONPATH=. .venv/bin/python benchmarks/online_streams.py --examples 60 [--seed 31] [--no-marabou]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import torch
from hypothesis import HealthCheck, given, seed, settings
from hypothesis import strategies as st

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import machine, markdown_table, write_results  # noqa: E402

from tests.verify import test_online_streams as streams  # noqa: E402

FAMILIES = [("two_sided", 20, "auto"), ("random", 18, "auto"), ("two_sided", 2, "relu"), ("random", 3, "relu"),
            ("two_sided", 2, "input")]


def run_family(family: str, inputs: int, strategy: str, examples: int, seed_value: int) -> streams.Tally:
    tally = streams.Tally()

    @seed(seed_value)
    @settings(max_examples=examples, deadline=None, database=None,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    @given(accelerations=st.sampled_from(streams.ACCELERATIONS), net_seed=st.integers(0, 50), data=st.data())
    def one_stream(accelerations, net_seed, data):
        kind = data.draw(streams.KINDS[family])
        events = data.draw(streams.EVENTS[family])
        t0, t1 = data.draw(streams.THRESHOLDS[family]), data.draw(streams.THRESHOLDS[family])
        streams.run_stream(family=family, inputs=inputs, strategy=strategy, kind=kind, accelerations=accelerations,
                           events=events, net_seed=net_seed, t0=t0, t1=t1, tally=tally)

    one_stream()
    return tally


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--examples", type=int, default=60, help="streams per family")
    parser.add_argument("--seed", type=int, default=31)
    parser.add_argument("--no-marabou", action="store_true", help="skip the Marabou check of small networks")
    parser.add_argument("--name", default="online_streams")
    parser.add_argument("--families", default=",".join(f"{f}:{i}:{s}" for f, i, s in FAMILIES),
                        help="comma-separated FAMILY:INPUTS:STRATEGY (default: all five)")
    args = parser.parse_args(argv)
    if args.no_marabou:
        os.environ["ASSAY_STREAM_MARABOU"] = "0"
    torch.set_num_threads(1)
    started = time.perf_counter()
    rows, failure = [], None
    chosen = [(f, int(i), s) for f, i, s in (part.split(":") for part in args.families.split(","))]
    for family, inputs, strategy in chosen:
        begun = time.perf_counter()
        try:
            tally = run_family(family, inputs, strategy, args.examples, args.seed)
        except AssertionError as error:  # hypothesis re-raises the shrunk failing stream
            failure = f"{family}, {inputs} inputs, {strategy}: {error}"
            print(f"UNSOUND: {failure}", file=sys.stderr, flush=True)
            break
        rows.append({"family": family, "inputs": inputs, "strategy": strategy, "streams": args.examples,
                     "steps": tally.steps, "holds": tally.holds, "violated": tally.violated,
                     "seconds": time.perf_counter() - begun})
        print(rows[-1], flush=True)
    total = {key: sum(r[key] for r in rows) for key in ("steps", "holds", "violated")}
    payload = {"machine": machine(), "args": vars(args), "rows": rows, "total": total, "failure": failure,
               "seconds": time.perf_counter() - started}
    table = (f"# Online verification: seeded random streams (seed {args.seed}, {args.examples} streams per family)\n\n"
             + markdown_table(["family", "inputs", "leaves", "streams", "steps", "HOLDS", "VIOLATED", "seconds"],
                              [[r["family"], r["inputs"], "input boxes" if r["strategy"] == "input" else "ReLU splits",
                                r["streams"], r["steps"], r["holds"], r["violated"], f"{r['seconds']:.0f}"] for r in rows])
             + f"\nTotal: {total['steps']} steps ({total['holds']} HOLDS, each checked from scratch, by sampling"
             + ("" if args.no_marabou else " and, on ≤ 3 inputs, by Marabou") + "); unsound HOLDS: "
             + ("none" if failure is None else f"**{failure}**") + "\n")
    write_results(args.name, payload, table)
    print(table)
    return 1 if failure else 0


if __name__ == "__main__":
    raise SystemExit(main())
