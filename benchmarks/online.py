"""Online verification (Wei & Liu): incremental re-verification against verifying every step from scratch.

Reproduces Table 1 of Wei & Liu, "Online Verification of Deep Neural Networks under Domain Shift
or Network Updates", on the regenerated robotics task (:func:`assay.datasets.online_tasks.motion_task`,
seed 0; a 9-input 4×100 ReLU MLP, the speed/jump specification), with the paper's leaf budget
(``max_leaves=250``) and T time steps:

* domain shift: the velocity bounds of the input box grow by 1e-3 per step (``task.box(step)``);
  rows None, BMI, BMI+LB, BMI+RSR, BMI+LB+RSR;
* network updates: one SGD step per time step (lr 1e-3, ``task.sgd_updates(T)``) on the fixed
  domain ``task.box(0)``; rows None, BMW, BMW+INN;
* fine-tuning: the same with only the last layer trained (``last_layer_only=True``); rows None,
  BMW, BMW+INN, BMW+IC, BMW+INN+IC.

Times are wall-clock seconds of ``OnlineVerifier.update`` for steps 1..T (step 0, the first
verification, is left out); "speed-up" is the median time per step of the scenario's None row
(every step verified from scratch, over ``--scratch-steps`` steps: speed-ups are per step) divided
by the row's median. Coverage is the verified fraction of the volume of X(t), averaged over the
steps; "HOLDS" is the fraction of steps that were proved.

Table 2 analogue: the digits task (:func:`~assay.datasets.online_tasks.digits_task`, a small CNN
on 8×8 images, 64 inputs): for each of ``--images`` default images, the image dimmed by 1/256 per
step in an ℓ∞ ball of radius 2/256 (``task.dimmed_box(i, step)``), rows None .. BMI+LB+RSR. The
leaves are ReLU-splitting leaves by default, as in the paper (``--digits-strategy input`` for boxes).

ACAS Xu network edits (the setting of IVAN, Ugare et al., PLDI 2023, which reports 3.8× on ACAS Xu;
the edits IVAN used are not published, so this script makes its own): for each network (default
1_1..1_9 and 2_1) and property 1–4 whose first verification HOLDS within the per-step timeout,
``--acas-steps`` fine-tuning steps of the last Linear layer. Each step adds to every weight and
bias of that layer an independent uniform draw from [−s, s] with s = ``--acas-scale`` (1e-3) ×
the largest |weight| of the original layer (a random-direction step of relative size 1e-3,
numpy ``default_rng([seed, a, b])`` for network a_b: the same edits for every property and row).
Rows: from scratch ("none"), "bmw,inn" and "bmw,inn,ic" (the full incremental method); the
ratio per pair is the ratio of median step times, summarised by the geometric mean over pairs.

Soundness check: every ``--check-every``-th step (0 included) whose online verdict is HOLDS or
VIOLATED is re-verified from scratch with :func:`assay.verify.verify` (cached per scenario and
step, shared by the rows); a HOLDS against VIOLATED (either way round) is a disagreement, counted
in the tables, printed, and makes the script exit non-zero. A row whose verifier raises keeps its
steps so far and shows the error.

Default accelerations (``--only defaults``): ACAS Xu 1_1 property 4 under two streams, each
verified with the default accelerations ("all") and from scratch ("none", over ``--scratch-steps``
steps), side by side: ``--acas-steps`` last-layer edits as above (domain fixed), and
``--drift-steps`` steps of a slow drift that moves every input's interval by ``--drift`` (5e-4)
of its width per step (network fixed). Target: a median per-step speed-up of at least 10× on the
edits and 5× on the drift.

Results: ``benchmarks/results/online.json`` and ``online.md`` (``--name``), written after every
row, so a killed run leaves what it finished. Torch runs on one thread.

    .venv/bin/python benchmarks/online.py [--quick] [--only table1,table2,acasxu] [--steps 100]
        [--scratch-steps 20] [--images 3] [--digits-steps 20] [--acas-networks 1_1,...]
        [--acas-steps 20] [--timeout 60]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
import traceback
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import RESULTS, data_dir, machine, markdown_table, write_results  # noqa: E402

from assay.datasets.online_tasks import digits_task, motion_task  # noqa: E402
from assay.nn import load  # noqa: E402
from assay.nn.layers import Linear  # noqa: E402
from assay.nn.network import Network  # noqa: E402
from assay.sets import read_vnnlib  # noqa: E402
from assay.verify import verify  # noqa: E402
from assay.verify.online import OnlineVerifier  # noqa: E402
from assay.verify.result import VerificationStatus  # noqa: E402

HOLDS, VIOLATED = VerificationStatus.HOLDS, VerificationStatus.VIOLATED

DOMAIN_ROWS = [("None", "none"), ("BMI", "bmi"), ("BMI+LB", "bmi,lb"), ("BMI+RSR", "bmi,rsr"),
               ("BMI+LB+RSR", "bmi,lb,rsr")]
# Not in the paper's table: RSR's default offset (1e-3) equals the growth per step, so a leaf
# bounded on its grown domain stays inside it for one step at most; this row shows a larger one.
EXTRA_DOMAIN_ROW = ("BMI+LB+RSR, rsr_offset 1e-2 (extra)", "bmi,lb,rsr", {"rsr_offset": 1e-2})
UPDATE_ROWS = [("None", "none"), ("BMW", "bmw"), ("BMW+INN", "bmw,inn")]
FINETUNE_ROWS = [("None", "none"), ("BMW", "bmw"), ("BMW+INN", "bmw,inn"), ("BMW+IC", "bmw,ic"),
                 ("BMW+INN+IC", "bmw,inn,ic")]
ACAS_ROWS = [("none", "none"), ("inn", "bmw,inn"), ("inn_ic", "bmw,inn,ic")]

# Wei & Liu, Table 1 (robotics task, 250 leaves), the figures quoted beside ours.
PUBLISHED = {
    ("domain shift", "None"): "11.2–11.6 s/step",
    ("domain shift", "BMI+LB+RSR"): "11.8× at 97.0 % coverage",
    ("network updates", "None"): "11.2–11.6 s/step",
    ("network updates", "BMW+INN"): "26.6×",
    ("fine-tuning", "None"): "11.2–11.6 s/step",
    ("fine-tuning", "BMW+INN+IC"): "94.2× (0.121 s/step) at 93.7 % coverage",
}
PUBLISHED_DIGITS = "0.954 s per step"
IVAN_ACAS = 3.8

TARGETS = [  # (scenario, row, least speed-up over our own None row)
    ("fine-tuning", "BMW+INN+IC", 100.0),
    ("domain shift", "BMI+LB+RSR", 12.0),
]
ACAS_TARGET = 4.0
DEFAULT_TARGETS = {"edits": 10.0, "drift": 5.0}


# ---------------------------------------------------------------------------------------------
# running rows
# ---------------------------------------------------------------------------------------------

class Checker:
    """Re-verifies decided online verdicts from scratch every ``every`` steps (cached per key)."""

    def __init__(self, every: int, timeout: float):
        self.every, self.timeout = every, timeout
        self.cache: dict = {}
        self.disagreements: list[dict] = []

    def __call__(self, key, step: int, status: VerificationStatus, network: Network, box, spec_kw: dict):
        """Returns None (not checked) or a dict describing the check."""
        if self.every <= 0 or step % self.every or status not in (HOLDS, VIOLATED):
            return None
        if (key, step) not in self.cache:
            started = time.perf_counter()
            result = verify(network, box, timeout=self.timeout, rng=np.random.default_rng(0), **spec_kw)
            self.cache[key, step] = (result.status, time.perf_counter() - started)
        reference, seconds = self.cache[key, step]
        bad = (status is HOLDS and reference is VIOLATED) or (status is VIOLATED and reference is HOLDS)
        check = {"step": step, "online": status.value, "scratch": reference.value, "scratch_seconds": seconds,
                 "disagree": bad}
        if bad:
            self.disagreements.append({"key": str(key), **check})
            print(f"  DISAGREEMENT {key} step {step}: online {status.value}, from scratch {reference.value}",
                  file=sys.stderr, flush=True)
        return check


def run_row(key, label: str, accelerations: str, problems: list, spec_kw: dict, options: dict,
            checker: Checker, require_holds: bool = False) -> dict:
    """One row: an OnlineVerifier on ``problems[0]`` then one update per later problem.

    ``problems``: [(network, box), ...] for steps 0, 1, ...; ``spec_kw``: ``{"spec": ...}`` or
    ``{"unsafe": ...}``. Never raises: an exception ends the row and is recorded. With
    ``require_holds`` the row stops after step 0 unless step 0 HOLDS.
    """
    record = {"row": label, "accelerations": accelerations, "options": dict(options), "step0": None,
              "steps": [], "checks": [], "error": None}
    step = 0
    try:
        network, box = problems[0]
        started = time.perf_counter()
        verifier = OnlineVerifier(network, box, accelerations=accelerations, **spec_kw, **options)
        first = verifier.steps[0]
        record["step0"] = {**_step_json(first), "wall": time.perf_counter() - started}
        _check(record, checker, key, 0, first.status, network, box, spec_kw)
        if require_holds and first.status is not HOLDS:
            problems = problems[:1]
        for step, (network, box) in enumerate(problems[1:], 1):
            started = time.perf_counter()
            result = verifier.update(input_set=box, network=network)
            wall = time.perf_counter() - started
            record["steps"].append({**_step_json(result), "wall": wall})
            _check(record, checker, key, step, result.status, network, box, spec_kw)
    except Exception as error:  # noqa: BLE001 - a crashing row is a result, not the end of the run
        record["error"] = f"step {step}: {type(error).__name__}: {error}"
        record["traceback"] = traceback.format_exc()
        print(f"  ERROR in {key} {label} at step {step}: {type(error).__name__}: {error}", file=sys.stderr, flush=True)
    record["summary"] = summarise(record)
    return record


def _step_json(step) -> dict:
    data = step.to_json()
    data.pop("counterexample", None)
    return data


def _check(record, checker, key, step, status, network, box, spec_kw):
    check = checker(key, step, status, network, box, spec_kw)
    if check is not None:
        record["checks"].append(check)


def summarise(record: dict) -> dict:
    steps = record["steps"]
    if not steps:
        return {"steps": 0}
    times = np.array([s["wall"] for s in steps])
    mean = lambda values: float(np.mean(values))  # noqa: E731
    return {
        "steps": len(steps),
        "median_s": float(np.median(times)),
        "p95_s": float(np.percentile(times, 95)),
        "mean_s": float(times.mean()),
        "max_s": float(times.max()),
        "coverage": mean([s["coverage"] for s in steps]),
        "min_coverage": float(min(s["coverage"] for s in steps)),
        "holds": mean([s["status"] == "holds" for s in steps]),
        "statuses": {v: sum(s["status"] == v for s in steps) for v in sorted({s["status"] for s in steps})},
        "recomputed": mean([s["recomputed"] for s in steps]),
        "reused": mean([s["reused"] for s in steps]),
        "skipped_lb": mean([s["skipped"]["lb"] for s in steps]),
        "skipped_inn": mean([s["skipped"]["inn"] for s in steps]),
        "resplit": mean([s["resplit"] for s in steps]),
        "domains": mean([s["domains"] for s in steps]),
        "rebuilds": sum(bool(s["rebuilt"]) for s in steps),
        "leaves_last": steps[-1]["leaves"],
        "checked": len(record["checks"]),
        "disagreements": sum(c["disagree"] for c in record["checks"]),
    }


def speedups(rows: list[dict]) -> None:
    """Fill ``speedup`` (None row's median / the row's median) and ``speedup_mean`` (the same with
    means: rows that bound on some steps only have two-humped step times, whose median can fall
    anywhere between the humps) in each row's summary."""
    none = rows[0]["summary"] if rows and rows[0]["accelerations"] == "none" else {}
    for row in rows:
        for key, field in (("speedup", "median_s"), ("speedup_mean", "mean_s")):
            base, ours = none.get(field), row["summary"].get(field)
            row["summary"][key] = base / ours if base and ours else None


def warm_up(network, box, spec_kw, timeout, **options):
    """One throwaway verification and update, so that the first timed row pays no first-call costs."""
    verifier = OnlineVerifier(network, box, accelerations="none", max_leaves=250, timeout=timeout, **spec_kw, **options)
    verifier.update(input_set=box)


# ---------------------------------------------------------------------------------------------
# the three benchmarks
# ---------------------------------------------------------------------------------------------

def table1(args, checker: Checker, save, section: dict) -> None:
    task = motion_task(0)
    spec_kw = {"spec": task.spec}
    options = {"max_leaves": 250, "timeout": args.timeout}
    warm_up(task.network, task.box(0), spec_kw, args.timeout)
    T = args.steps
    full = task.sgd_updates(T, lr=1e-3)
    last = task.sgd_updates(T, lr=1e-3, last_layer_only=True)
    scenarios = [
        ("domain shift", DOMAIN_ROWS, [(task.network, task.box(t)) for t in range(T + 1)]),
        ("network updates", UPDATE_ROWS, [(task.network, task.box(0))] + [(n, task.box(0)) for n in full]),
        ("fine-tuning", FINETUNE_ROWS, [(task.network, task.box(0))] + [(n, task.box(0)) for n in last]),
    ]
    section.update({"task": "motion_task(0)", "train_seconds": task.train_seconds, "T": T,
                    "scratch_steps": args.scratch_steps, "scenarios": {}})
    for name, rows, problems in scenarios:
        records = []
        section["scenarios"][name] = records
        if name == "domain shift":
            rows = [*rows, EXTRA_DOMAIN_ROW]
        for label, acc, *extra in rows:
            steps = min(T, args.scratch_steps) if acc == "none" else T
            row_options = {**options, **(extra[0] if extra else {})}
            record = run_row(name, label, acc, problems[:steps + 1], spec_kw, row_options, checker)
            records.append(record)
            speedups(records)
            _report(f"[table 1] {name} {label}", record)
            save()


def table2(args, checker: Checker, save, section: dict) -> None:
    task = digits_task(0)
    images = list(task.default_images[: args.images])
    options = {"max_leaves": 250, "timeout": args.timeout, "strategy": args.digits_strategy}
    section.update({"task": "digits_task(0)", "train_seconds": task.train_seconds,
                    "test_accuracy": task.test_accuracy, "steps": args.digits_steps,
                    "strategy": args.digits_strategy, "images": {}})
    warm_up(task.network, task.dimmed_box(images[0], 0), {"spec": task.spec(images[0])}, args.timeout,
            strategy=args.digits_strategy)
    for index in images:
        spec_kw = {"spec": task.spec(index)}
        problems = [(task.network, task.dimmed_box(index, t)) for t in range(args.digits_steps + 1)]
        records = []
        section["images"][str(index)] = records
        for label, acc in DOMAIN_ROWS:
            record = run_row(f"digits {index}", label, acc, problems, spec_kw, options, checker)
            records.append(record)
            speedups(records)
            _report(f"[table 2] image {index} {label}", record)
            save()


def acas_edits(network: Network, steps: int, scale: float, seed) -> list[Network]:
    """``steps`` networks, each a random-direction step away from the last (last Linear layer only)."""
    index = max(i for i, layer in enumerate(network.layers) if isinstance(layer, Linear))
    layer = network.layers[index]
    size = scale * float(layer.weight.abs().max())
    rng = np.random.default_rng(seed)
    weight, bias = layer.weight.clone(), layer.bias.clone()
    edited = []
    for k in range(1, steps + 1):
        weight = weight + torch.as_tensor(rng.uniform(-size, size, tuple(weight.shape)))
        bias = bias + torch.as_tensor(rng.uniform(-size, size, tuple(bias.shape)))
        layers = list(network.layers)
        layers[index] = replace(layer, weight=weight, bias=bias)
        edited.append(Network(tuple(layers), network.input_shape, network.input_name, network.output_name,
                              f"{network.source}, edit {k}"))
    return edited


def acasxu(args, checker: Checker, save, section: dict) -> None:
    folder = data_dir() / "acasxu"
    options = {"max_leaves": args.acas_leaves, "timeout": args.timeout}
    section.update({"networks": args.acas_networks, "properties": args.acas_properties, "steps": args.acas_steps,
                    "scale": args.acas_scale, "max_leaves": args.acas_leaves, "pairs": []})
    warmed = False
    for name in args.acas_networks.split(","):
        a, b = (int(part) for part in name.split("_"))
        network = load(folder / f"ACASXU_run2a_{name}_batch_2000.onnx")
        edits = acas_edits(network, args.acas_steps, args.acas_scale, [args.seed, a, b])
        for prop_number in args.acas_properties.split(","):
            prop = read_vnnlib(folder / f"prop_{prop_number}.vnnlib", num_inputs=5, num_outputs=5)
            if len(prop.queries) != 1:
                raise SystemExit(f"prop_{prop_number} has {len(prop.queries)} queries; expected one")
            query = prop.queries[0]
            spec_kw = {"unsafe": query.unsafe_outputs}
            if not warmed:
                warm_up(network, query.input_set, spec_kw, args.timeout)
                warmed = True
            problems = [(network, query.input_set)] + [(n, query.input_set) for n in edits]
            pair = {"network": name, "property": int(prop_number), "rows": {}, "skipped": None}
            section["pairs"].append(pair)
            for key, acc in ACAS_ROWS:
                record = run_row(f"acas {name} p{prop_number}", key, acc, problems, spec_kw, options, checker,
                                 require_holds=key == "none")
                pair["rows"][key] = record
                first = record["step0"]
                if key == "none" and (first is None or first["status"] != "holds"):
                    why = record["error"] or f"step 0 {first['status']} ({first['wall']:.1f} s)"
                    pair["skipped"] = why
                    print(f"[acas] {name} prop {prop_number}: skipped: {why}", flush=True)
                    break
                _report(f"[acas] {name} prop {prop_number} {acc}", record)
            _acas_ratios(pair)
            save()


def defaults(args, checker: Checker, save, section: dict) -> None:
    """ACAS Xu 1_1 prop 4: default accelerations against from scratch, under edits and under a drift."""
    folder = data_dir() / "acasxu"
    network = load(folder / "ACASXU_run2a_1_1_batch_2000.onnx")
    query = read_vnnlib(folder / "prop_4.vnnlib", num_inputs=5, num_outputs=5).queries[0]
    spec_kw = {"unsafe": query.unsafe_outputs}
    options = {"max_leaves": args.acas_leaves, "timeout": args.timeout}
    warm_up(network, query.input_set, spec_kw, args.timeout)
    box = query.input_set
    lower, upper = box.lower.reshape(-1), box.upper.reshape(-1)
    width = upper - lower
    drifted = [(network, type(box)((lower + k * args.drift * width).reshape(box.lower.shape),
                                   (upper + k * args.drift * width).reshape(box.upper.shape)))
               for k in range(args.drift_steps + 1)]
    edits = [(network, box)] + [(n, box) for n in acas_edits(network, args.acas_steps, args.acas_scale, [args.seed, 1, 1])]
    section.update({"drift": args.drift, "drift_steps": args.drift_steps, "edit_steps": args.acas_steps,
                    "scale": args.acas_scale, "scratch_steps": args.scratch_steps, "streams": {}})
    for stream, problems in (("edits", edits), ("drift", drifted)):
        rows = []
        section["streams"][stream] = rows
        for label, acc in (("from scratch", "none"), ("default (all)", "all")):
            steps = problems[: args.scratch_steps + 1] if acc == "none" else problems
            record = run_row(f"defaults {stream}", label, acc, steps, spec_kw, options, checker)
            rows.append(record)
            speedups(rows)
            _report(f"[defaults] {stream} {label}", record)
            save()


def defaults_markdown(table: dict) -> str:
    out = [f"\n## Default accelerations: ACAS Xu 1_1 prop 4 ({table['edit_steps']} last-layer edits of relative size "
           f"{table['scale']:g}; {table['drift_steps']} drift steps of {table['drift']:g} × each input's width)\n\n"
           f"From-scratch rows over the first {table['scratch_steps']} steps; speed-up = median from-scratch step / "
           "median default step. Targets: ≥ 10× on the edits, ≥ 5× on the drift.\n"]
    for stream, rows in table["streams"].items():
        out.append(f"\n### {stream}\n\n")
        out.append(markdown_table(ROW_HEADER, [_row_cells(r) for r in rows]))
        out.extend(line + "\n" for line in _errors(rows))
        ours = rows[-1]["summary"].get("speedup") if len(rows) == 2 else None
        target = DEFAULT_TARGETS[stream]
        out.append(f"\nTarget ≥ {target:g}×: {_x(ours)} ({'met' if ours and ours >= target else 'not met'}).\n")
    return "".join(out)


def _acas_ratios(pair: dict) -> None:
    rows = pair["rows"]
    pair["ratio"], pair["ratio_mean"] = {}, {}
    for key in ("inn", "inn_ic"):
        if key not in rows:
            continue
        summary = rows[key]["summary"]
        complete = rows[key]["error"] is None and summary.get("steps") == rows["none"]["summary"].get("steps")
        for out, field in (("ratio", "median_s"), ("ratio_mean", "mean_s")):
            base = rows["none"]["summary"].get(field)
            pair[out][key] = base / summary[field] if base and complete and summary.get(field) else None


def _report(title: str, record: dict) -> None:
    s = record["summary"]
    if not s.get("steps"):
        print(f"{title}: no steps ({record['error']})", flush=True)
        return
    speed = f", {s['speedup']:.1f}×" if s.get("speedup") else ""
    print(f"{title}: {s['steps']} steps, median {s['median_s'] * 1e3:.1f} ms, p95 {s['p95_s'] * 1e3:.1f} ms{speed}, "
          f"coverage {100 * s['coverage']:.2f} %, holds {100 * s['holds']:.0f} %, recomputed {s['recomputed']:.1f}, "
          f"rebuilds {s['rebuilds']}" + (f", ERROR {record['error']}" if record["error"] else ""), flush=True)


# ---------------------------------------------------------------------------------------------
# markdown
# ---------------------------------------------------------------------------------------------

def _ms(value) -> str:
    return "–" if value is None else f"{value * 1e3:.1f}"


def _x(value) -> str:
    return "–" if value is None else f"{value:.1f}×"


def _pct(value) -> str:
    return "–" if value is None else f"{100 * value:.1f}"


ROW_HEADER = ["row", "steps", "median ms/step", "p95 ms", "speed-up", "mean ms", "speed-up (means)",
              "coverage %", "HOLDS %",
              "recomputed/step", "resplit/step", "reused/step", "lb skip/step", "inn skip/step", "rebuilds",
              "checked (disagree)"]


def _row_cells(record: dict) -> list:
    s = record["summary"]
    label = record["row"] + (f" **ERROR at {record['error'].split(':')[0]}**" if record["error"] else "")
    if not s.get("steps"):
        return [label, 0] + ["–"] * (len(ROW_HEADER) - 3) + [f"{len(record['checks'])}"]
    return [label, s["steps"], _ms(s["median_s"]), _ms(s["p95_s"]), _x(s.get("speedup")), _ms(s["mean_s"]),
            _x(s.get("speedup_mean")), f"{100 * s['coverage']:.2f}",
            f"{100 * s['holds']:.0f}", f"{s['recomputed']:.1f}", f"{s['resplit']:.1f}", f"{s['reused']:.1f}",
            f"{s['skipped_lb']:.1f}", f"{s['skipped_inn']:.1f}", s["rebuilds"],
            f"{s['checked']} ({s['disagreements']})"]


def _errors(records) -> list[str]:
    return [f"- {r['row']}: `{r['error']}`" for r in records if r["error"]]


def targets(table: dict) -> list[dict]:
    verdicts = []
    for scenario, row, least in TARGETS:
        records = table["scenarios"].get(scenario, [])
        base = next((r for r in records if r["accelerations"] == "none"), None)
        ours = next((r for r in records if r["row"] == row), None)
        entry = {"scenario": scenario, "row": row, "least_speedup": least, "met": False}
        if base and ours and ours["summary"].get("steps") and base["summary"].get("steps"):
            speed = ours["summary"].get("speedup")
            gap = abs(ours["summary"]["coverage"] - base["summary"]["coverage"])
            entry.update(speedup=speed, coverage_gap_points=100 * gap, error=ours["error"],
                         met=bool(speed and speed >= least and gap <= 0.01 and not ours["error"]))
        verdicts.append(entry)
    return verdicts


def markdown(payload: dict) -> str:
    sections = payload["sections"]
    args = payload["args"]
    out = [f"# Online verification (Wei & Liu){'' if payload['complete'] else ' — run in progress'}\n",
           f"Command: `{payload['command']}`  \nMachine: {payload['machine']}  \n"
           f"Commit: {payload['git']['commit']}; uncommitted changes under src/: "
           f"{payload['git']['src_changes'] or 'none'}  \n"
           f"Load average at start: {payload['load_average_start']}; total run time "
           f"{payload.get('total_seconds', 0):.0f} s\n"]
    table = sections.get("table1")
    if table:
        out.append(f"\n## Table 1: robotics task (motion_task(0)), 250 leaves, T = {table['T']}\n\n"
                   f"Times are per step (steps 1..T; None rows: steps 1..{min(table['T'], table['scratch_steps'])}); "
                   "speed-up = median of the scenario's None row / the row's median; coverage = mean verified "
                   "volume fraction over the steps. Published: Wei & Liu, Table 1 (their robotics network; "
                   "their from-scratch steps take 11.2–11.6 s).\n")
        for scenario, records in table["scenarios"].items():
            out.append(f"\n### {scenario}\n\n")
            rows = [_row_cells(r) + [PUBLISHED.get((scenario, r["row"]), "–")] for r in records]
            out.append(markdown_table(ROW_HEADER + ["published"], rows))
            out.extend(line + "\n" for line in _errors(records))
        out.append("\n### Targets (speed-up over our own None row, coverage within 1 point of it)\n\n")
        rows = []
        for t in targets(table):
            rows.append([t["scenario"], t["row"], f"≥ {t['least_speedup']:.0f}×", _x(t.get("speedup")),
                         "–" if "coverage_gap_points" not in t else f"{t['coverage_gap_points']:.2f}",
                         "yes" if t["met"] else "no" + (" (error)" if t.get("error") else "")])
        out.append(markdown_table(["scenario", "row", "target", "ours", "coverage gap (points)", "met"], rows))
    table = sections.get("table2")
    if table:
        out.append(f"\n## Table 2 analogue: digits CNN (64 inputs), dimmed 1/256 per step, ℓ∞ radius 2/256, "
                   f"{table['steps']} steps\n\n"
                   + _digits_note(table.get("strategy", "input")) +
                   f"Published per-step time (Wei & Liu, Table 2): {PUBLISHED_DIGITS}.\n")
        for index, records in table["images"].items():
            out.append(f"\n### image {index}\n\n")
            out.append(markdown_table(ROW_HEADER, [_row_cells(r) for r in records]))
            out.extend(line + "\n" for line in _errors(records))
    table = sections.get("acasxu")
    if table:
        out.append(f"\n## ACAS Xu: last-layer edits, {table['steps']} steps, relative step {table['scale']:g}, "
                   f"max_leaves {table['max_leaves']}, per-step timeout {args['timeout']:g} s\n\n"
                   "Ratio = median from-scratch step / median incremental step. IVAN (PLDI 2023) reports "
                   f"{IVAN_ACAS}× on ACAS Xu network edits; target ≥ {ACAS_TARGET:g}× (bmw,inn,ic).\n\n")
        rows, notes = [], []
        for pair in table["pairs"]:
            name = f"{pair['network']} p{pair['property']}"
            if pair["skipped"]:
                rows.append([pair["network"], pair["property"], "skipped: " + pair["skipped"][:90]] + ["–"] * 8)
                continue
            r = pair["rows"]
            cell = lambda key, field="median_s", rows=r: _acas_cell(rows.get(key), field)  # noqa: E731
            checks = sum(rec["summary"].get("checked", 0) for rec in r.values())
            bad = sum(rec["summary"].get("disagreements", 0) for rec in r.values())
            rows.append([pair["network"], pair["property"], f"{r['none']['step0']['wall']:.2f}", cell("none"),
                         cell("inn"), cell("inn_ic"), _x(pair["ratio"].get("inn")), _x(pair["ratio"].get("inn_ic")),
                         cell("inn", "coverage"), cell("inn_ic", "coverage"), f"{checks} ({bad})"])
            for record in r.values():
                if record["error"]:
                    notes.append(f"- {name} {record['accelerations']}: `{record['error']}`")
        out.append(markdown_table(["network", "property", "step 0 s", "scratch ms", "bmw,inn ms", "bmw,inn,ic ms",
                                   "ratio inn", "ratio inn,ic", "coverage inn %", "coverage inn,ic %",
                                   "checked (disagree)"], rows))
        summary = acas_summary(table)
        out.append(f"\nGeometric mean of the ratios: bmw,inn {_x(summary['geomean_inn'])} over "
                   f"{summary['pairs_inn']} pairs; bmw,inn,ic {_x(summary['geomean_inn_ic'])} over "
                   f"{summary['pairs_inn_ic']} pairs (target ≥ {ACAS_TARGET:g}×: "
                   f"{'met' if summary['met'] else 'not met'}); {summary['skipped']} pair(s) skipped. "
                   f"With mean step times instead of medians: bmw,inn {_x(summary['geomean_of_means_inn'])}, "
                   f"bmw,inn,ic {_x(summary['geomean_of_means_inn_ic'])}.\n")
        if notes:
            out.append("\nErrors:\n\n" + "\n".join(notes) + "\n")
    table = sections.get("defaults")
    if table:
        out.append(defaults_markdown(table))
    checks = payload["soundness"]
    out.append(f"\n## Soundness check\n\n{checks['checked']} decided verdicts re-verified from scratch "
               f"({checks['distinct']} distinct problems); disagreements: {checks['disagreements']}.\n")
    return "".join(out)


def _digits_note(strategy: str) -> str:
    if strategy == "input":
        return ("These rows use input-splitting leaves (boxes) over the 64 inputs; the paper's Table 2 uses "
                "ReLU splitting (the default, ``--digits-strategy relu``). ")
    return f"Leaf strategy: {strategy} (OnlineVerifier's ``strategy`` option; the paper splits ReLUs). "


def _acas_cell(record, field: str) -> str:
    if record is None or not record["summary"].get("steps"):
        return "–" if record is None or not record["error"] else "ERROR"
    value = record["summary"][field]
    text = _ms(value) if field == "median_s" else f"{100 * value:.1f}"
    return text + (" (error)" if record["error"] else "")


def acas_summary(table: dict) -> dict:
    summary = {"skipped": sum(bool(p["skipped"]) for p in table["pairs"])}
    for key in ("inn", "inn_ic"):
        for out, field in (("geomean", "ratio"), ("geomean_of_means", "ratio_mean")):
            ratios = [p.get(field, {}).get(key) for p in table["pairs"] if not p["skipped"]]
            ratios = [r for r in ratios if r]
            summary[f"pairs_{key}"] = len(ratios)
            summary[f"{out}_{key}"] = math.exp(sum(map(math.log, ratios)) / len(ratios)) if ratios else None
    summary["met"] = bool(summary["geomean_inn_ic"] and summary["geomean_inn_ic"] >= ACAS_TARGET)
    return summary


# ---------------------------------------------------------------------------------------------
# main
# ---------------------------------------------------------------------------------------------

def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", default="table1,table2,acasxu,defaults",
                        help="comma-separated: table1, table2, acasxu, defaults")
    parser.add_argument("--quick", action="store_true", help="a smoke run: few steps, one image, one ACAS Xu network")
    parser.add_argument("--steps", type=int, default=100, help="T: time steps of Table 1")
    parser.add_argument("--scratch-steps", type=int, default=20, help="steps of the from-scratch (None) rows")
    parser.add_argument("--images", type=int, default=3, help="digits images (the first of task.default_images)")
    parser.add_argument("--digits-steps", type=int, default=20)
    parser.add_argument("--digits-strategy", choices=("input", "relu", "auto"), default="relu",
                        help="leaves of the digits rows: ReLU splitting (default, as in the paper) or input boxes")
    parser.add_argument("--acas-networks", default="1_1,1_2,1_3,1_4,1_5,1_6,1_7,1_8,1_9,2_1")
    parser.add_argument("--acas-properties", default="1,2,3,4")
    parser.add_argument("--acas-steps", type=int, default=20)
    parser.add_argument("--acas-scale", type=float, default=1e-3, help="relative size of one ACAS Xu edit")
    parser.add_argument("--acas-leaves", type=int, default=4096, help="leaf budget for ACAS Xu")
    parser.add_argument("--timeout", type=float, default=60.0, help="seconds per step (and per check)")
    parser.add_argument("--check-every", type=int, default=10, help="re-verify every k-th decided step (0: never)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the ACAS Xu edits")
    parser.add_argument("--drift", type=float, default=5e-4, help="drift per step, as a share of each input's width")
    parser.add_argument("--drift-steps", type=int, default=100, help="steps of the drift stream (defaults)")
    parser.add_argument("--name", default=None, help="result files (default online; online_quick with --quick)")
    parser.add_argument("--render", action="store_true", help="only rewrite the markdown from the JSON of --name")
    args = parser.parse_args(argv)
    if args.render:
        return render(args.name or "online")
    if args.quick:
        args.steps, args.scratch_steps, args.images, args.digits_steps = 6, 3, 1, 3
        args.acas_networks, args.acas_properties, args.acas_steps, args.check_every = "1_1", "1,2", 3, 2
    name = args.name or ("online_quick" if args.quick else "online")
    only = [part.strip() for part in args.only.split(",") if part.strip()]
    parts = ("table1", "table2", "acasxu", "defaults")
    unknown = set(only) - set(parts)
    if unknown:
        parser.error(f"--only takes {', '.join(parts)}; got {sorted(unknown)}")
    torch.set_num_threads(1)

    # With --only, keep the other tables of an earlier run of the same name.
    sections: dict = {}
    previous = RESULTS / f"{name}.json"
    if set(only) != set(parts) and previous.exists():
        try:
            sections = {k: v for k, v in json.loads(previous.read_text()).get("sections", {}).items() if k not in only}
        except (OSError, ValueError):
            sections = {}
    checker = Checker(args.check_every, args.timeout)
    started = time.perf_counter()
    payload = {"machine": machine(), "command": " ".join([Path(sys.argv[0]).name, *(argv or sys.argv[1:])]),
               "args": vars(args), "git": _git_state(), "load_average_start": [round(x, 2) for x in os.getloadavg()],
               "sections": sections, "complete": False}

    def save(final: bool = False):
        payload["total_seconds"] = time.perf_counter() - started
        payload["complete"] = final
        payload["load_average_now"] = [round(x, 2) for x in os.getloadavg()]
        payload["soundness"] = {"checked": sum(len(r["checks"]) for r in _all_records(sections)),
                                "distinct": len(checker.cache), "disagreements": len(checker.disagreements),
                                "details": checker.disagreements}
        return write_tables(name, payload)

    runners = {"table1": table1, "table2": table2, "acasxu": acasxu, "defaults": defaults}
    for part in parts:
        if part in only:
            sections[part] = {}
            runners[part](args, checker, save, sections[part])
            save()
    table = save(final=True)
    print(table)
    print(f"total {time.perf_counter() - started:.0f} s", flush=True)
    if checker.disagreements:
        print(f"SOUNDNESS: {len(checker.disagreements)} disagreement(s): {checker.disagreements}", file=sys.stderr)
        return 1
    return 0


def render(name: str) -> int:
    """Rewrite ``<name>.md`` from ``<name>.json`` (summaries and speed-ups recomputed)."""
    payload = json.loads((RESULTS / f"{name}.json").read_text())
    sections = payload["sections"]
    for group in (*sections.get("table1", {}).get("scenarios", {}).values(),
                  *sections.get("table2", {}).get("images", {}).values()):
        for record in group:
            record["summary"] = summarise(record)
        speedups(group)
    for pair in sections.get("acasxu", {}).get("pairs", []):
        for record in pair["rows"].values():
            record["summary"] = summarise(record)
        _acas_ratios(pair)
    for rows in sections.get("defaults", {}).get("streams", {}).values():
        for record in rows:
            record["summary"] = summarise(record)
        speedups(rows)
    print(write_tables(name, payload))
    return 0


def write_tables(name: str, payload: dict) -> str:
    """Recompute the targets and the ACAS Xu summary, write ``<name>.json`` and ``.md``; return the markdown."""
    sections = payload["sections"]
    if "table1" in sections:
        sections["table1"]["targets"] = targets(sections["table1"])
    if "acasxu" in sections:
        sections["acasxu"]["summary"] = acas_summary(sections["acasxu"])
    table = markdown(payload)
    write_results(name, payload, table)
    return table


def _git_state() -> dict:
    """Where the measured ``assay`` came from: its commit and uncommitted changes under src/ (the
    tree may be edited while this runs), or the ``COMMIT`` file of an exported snapshot (run with
    ``PYTHONPATH=<snapshot>/src``)."""
    import subprocess

    import assay

    root = Path(assay.__file__).resolve().parents[2]

    def git(*command):
        try:
            done = subprocess.run(["git", *command], cwd=root, capture_output=True, text=True, timeout=30)
            return done.stdout.strip() if done.returncode == 0 else None
        except (OSError, subprocess.SubprocessError):
            return None

    snapshot = root / "COMMIT"
    commit = git("rev-parse", "HEAD")
    if commit is None and snapshot.exists():
        commit = f"{snapshot.read_text().strip()} (snapshot at {root})"
    return {"assay": str(root), "commit": commit, "src_changes": git("status", "--short", "src"),
            "src_diff": git("diff", "src")}


def _all_records(sections: dict):
    table = sections.get("table1") or {}
    for records in table.get("scenarios", {}).values():
        yield from records
    table = sections.get("table2") or {}
    for records in table.get("images", {}).values():
        yield from records
    table = sections.get("acasxu") or {}
    for pair in table.get("pairs", []):
        yield from pair["rows"].values()
    for rows in (sections.get("defaults") or {}).get("streams", {}).values():
        yield from rows


if __name__ == "__main__":
    raise SystemExit(main())
