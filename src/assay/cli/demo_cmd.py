"""``assay demo``: a short tour in which every capability of assay shows itself in a few lines.

The tour is :data:`DEMO_SECTIONS`, run in order. Each section is a library function that needs no
data files and returns a JSON-able dict (``--json`` prints them all, keyed by section name), and a
printer here that turns that dict into a few readable lines. The first section certifies a digits
classifier trained on the spot (:mod:`assay.demo`); its result is the top level of the JSON output.
"""

from __future__ import annotations

import importlib
import json
import math
from collections.abc import Callable
from dataclasses import dataclass

import typer

from assay.cli._common import console, show_progress
from assay.cli.cfx_cmd import print_cfx_section
from assay.cli.serve_cmd import print_serve_section
from assay.errors import OptionError

__all__ = ["demo", "DemoSection", "DEMO_SECTIONS"]

_METHOD_NAMES = {"ibp": "IBP", "crown": "CROWN", "alpha": "α-CROWN", "beta": "β-CROWN", "pgd": "PGD attack"}


@dataclass(frozen=True)
class DemoSection:
    """One stop of the tour.

    ``name`` selects it (``--sections``) and keys its JSON; ``run`` is ``"module:function"`` of the
    library function ``function(progress=callable, **options) -> dict`` (imported only when the
    section runs, so ``assay demo --help`` stays fast); ``show(out, data)`` prints its dict.
    """

    name: str
    run: str
    show: Callable


def _floats(text: str, option: str) -> tuple[float, ...]:
    try:
        values = tuple(float(part) for part in text.split(",") if part.strip())
    except ValueError:
        values = ()
    if not values:
        raise OptionError(f"{option} takes comma-separated numbers, e.g. 0.01,0.05; got {text!r}")
    return values


def _run_verify(progress, epsilons, images, methods) -> dict:
    from assay.demo import run_demo

    return run_demo(epsilons=epsilons, images=images, methods=methods, progress=progress).to_json()


def demo(
    epsilons: str = typer.Option("0.01,0.03,0.05,0.1", "--epsilons", help="verify section: L∞ radii on [0, 1] pixels, comma-separated."),
    images: int = typer.Option(100, "--images", help="verify section: correctly classified test images to certify."),
    methods: str = typer.Option("ibp,crown,alpha", "--methods", help="verify section: bound methods (ibp, crown, alpha, beta)."),
    online_steps: int = typer.Option(5, "--online-steps", help="online section: steps of a growing L∞ ball re-verified "
                                     "with and without reuse; 0 skips the section."),
    sections: str = typer.Option("all", "--sections", help="Sections of the tour to run, comma-separated, in tour order "
                                 "(default all; `--sections list` names them)."),
    json_output: bool = typer.Option(False, "--json", help="Print the full result as JSON."),
) -> None:
    """A short tour of assay on built-in data (needs no files): certify a digits classifier, verify a growing ball online, monitor a decision stream, certify KNN decisions against biased labels, and more."""  # noqa: E501
    names = [section.name for section in DEMO_SECTIONS]
    if sections.strip() == "list":
        typer.echo("\n".join(names))
        return
    chosen = names if sections.strip() == "all" else [part.strip() for part in sections.split(",") if part.strip()]
    unknown = [name for name in chosen if name not in names]
    if unknown or not chosen:
        raise OptionError(f"--sections names unknown sections {unknown or sections!r}; choose from {', '.join(names)} (or all)")
    if online_steps < 0:
        raise OptionError(f"--online-steps must be ≥ 0 (0 skips the section); got {online_steps}")
    options = {
        "verify": dict(epsilons=_floats(epsilons, "--epsilons"), images=images,
                       methods=tuple(m.strip() for m in methods.split(",") if m.strip())),
        "online": dict(steps=online_steps),
    }
    if not online_steps and "online" in chosen:
        chosen.remove("online")
    run = [section for section in DEMO_SECTIONS if section.name in chosen]
    results: dict[str, dict] = {}

    def run_all(progress) -> None:
        for section in run:
            module, function = section.run.split(":")
            results[section.name] = getattr(importlib.import_module(module), function)(
                progress=progress, **options.get(section.name, {}))

    if show_progress(json_output):
        from rich.console import Console

        with Console(stderr=True).status("starting") as status:
            run_all(lambda stage: status.update(stage))
    else:
        run_all(lambda stage: None)
    if json_output:
        payload = dict(results.pop("verify", {}))
        payload.update(results)
        typer.echo(json.dumps(payload, indent=2))
        return
    out = console()
    for number, section in enumerate(run):
        if number:
            out.print()
        section.show(out, results[section.name])


# ------------------------------------------------------------------------------- certification
def _print_verify(out, result: dict) -> None:
    from rich.table import Table

    widths = "×".join(str(w) for w in result['hidden_layers'])
    out.print(f"A ReLU MLP (64 → {widths} → 10, {result['parameters']:,} parameters) trained on scikit-learn's 8×8 digits "
              f"in {result['train_seconds']:.1f} s; test accuracy {result['test_accuracy']:.1%}.")
    out.print(f"L∞ robustness of the first {result['images']} correctly classified test images (pixels in [0, 1]):")
    table = Table(show_edge=False)
    for column, justify in (("ε", "right"), ("method", "left"), ("certified", "right"), ("falsified", "right"),
                            ("seconds", "right")):
        table.add_column(column, justify=justify)
    previous = None
    for row in result['rows']:
        if previous is not None and row['epsilon'] != previous:
            table.add_section()
        previous = row['epsilon']
        table.add_row(
            f"{row['epsilon']:g}",
            _METHOD_NAMES.get(row['method'], row['method']),
            "–" if row['certified'] is None else f"{row['certified'] / row['images']:.0%}",
            "–" if row['falsified'] is None else f"{row['falsified'] / row['images']:.0%}",
            f"{row['seconds']:.2f}",
        )
    out.print(table)
    out.print("certified: sound bounds prove no input in the ball changes the prediction. falsified: a point of the "
              "ball, re-checked by a forward pass, changes it. The rest is undecided by these methods "
              "(`assay verify` decides single cases by branch and bound).")
    out.print(f"total {result['total_seconds']:.1f} s")


# ------------------------------------------------------------------------------- online verification
def _print_online(out, online: dict) -> None:
    from rich import box
    from rich.table import Table

    out.print(f"Online verification (Wei & Liu): the L∞ ball around test image {online['image']} (a {online['label']}) "
              f"grows from ε = {online['epsilon']:g} by {online['growth']:g} per step. Each step is verified reusing "
              "the last step's leaves (all accelerations) and from scratch:")
    table = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False)
    for column, justify in (("step", "right"), ("ε", "right"), ("status", "left"), ("coverage", "right"),
                            ("leaves", "right"), ("reused", "right"), ("seconds", "right"), ("from scratch", "right")):
        table.add_column(column, justify=justify, no_wrap=True)
    for row in online["steps"]:
        reuse, scratch = row["online"], row["scratch"]
        status = reuse["status"] + ("" if scratch["status"] == reuse["status"] else f" ({scratch['status']})")
        table.add_row(str(row["step"]), f"{row['epsilon']:.4f}", status, f"{math.floor(reuse['coverage'] * 100)}%",
                      str(reuse["leaves"]), str(reuse["reused"] + sum(reuse["skipped"].values())),
                      f"{reuse['seconds']:.3f}", f"{scratch['seconds']:.3f}")
    out.print(table)
    speedup = online["speedup"]
    out.print(f"updates 1–{len(online['steps']) - 1}: {online['online_update_seconds']:.2f} s reusing leaves vs "
              f"{online['scratch_update_seconds']:.2f} s from scratch"
              + ("." if speedup is None else f" ({speedup:.1f}× faster)." if speedup >= 1 else
                 f" ({1 / speedup:.1f}× slower: too little to reuse at these sizes).")
              + " reused: leaves (here the split histories of ReLU-splitting searches: the network has 64 inputs) "
              "whose verdict carried over because the new ball lies in a box they were verified on, instead of being "
              "bounded again. `assay verify-online` does this for any model and sequence of boxes.")


def _one_off(data: dict) -> str:
    """`` (plus X s loading ... once)`` when a section's figure leaves out one-off kernel loading or compiling."""
    seconds = data.get("one_off_seconds", 0.0)
    if seconds < 0.05:
        return ""
    return f" (plus {seconds:.1f} s of one-off kernel loading or compiling, not counted as work)"


# ------------------------------------------------------------------------------- monitoring
def _print_monitor(out, data: dict) -> None:
    from rich import box
    from rich.table import Table

    out.print(f"Monitoring (Clemont): {data['decisions']:,} loan decisions of a deployed model watched for similar "
              f"applicants treated differently (L∞ distance ≤ ε = {data['epsilon']:g} on features scaled to [0, 1]), "
              f"in {data['seconds']:.2f} s{_one_off(data)}: {data['flagged']} decisions had a witness, {data['pairs']} pairs in all.")
    pair = data["closest_pair"]
    if pair is None:
        return
    out.print(f"The closest pair, decisions {pair['ids'][0]} and {pair['ids'][1]} (distance {pair['distance']:.3f}):")
    table = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False)
    table.add_column("")
    for name in data["features"]:
        table.add_column(name, justify="right")
    table.add_column("decision")
    for i in range(2):
        table.add_row(f"#{pair['ids'][i]}", *(f"{value:.3f}" for value in pair["inputs"][i]), pair["decisions"][i])
    out.print(table)
    out.print("`assay monitor` watches a whole CSV, Parquet or JSON-lines stream of decisions the same way, exactly.")


# ------------------------------------------------------------------------------- KNN fairness
def _print_knn(out, data: dict) -> None:
    counts = data["counts"]
    out.print(f"KNN fairness (CAV 2023): a KNN classifier (K by cross-validation among "
              f"{', '.join(map(str, data['k_candidates']))}) trained on {data['train']} applicants. For {data['inputs']} new "
              f"applicants: is the decision the same if up to {data['flips']} training labels were biased, whatever the "
              f"protected attribute? {counts['certified']} certified (proved), {counts['falsified']} falsified, "
              f"{counts['unknown']} unknown, in {data['seconds']:.2f} s{_one_off(data)}.")
    example = data["counterexample"]
    if example is not None:
        rows = ", ".join(map(str, example["flipped_rows"]))
        out.print(f"For example, applicant {example['row']} gets {example['prediction']}, but flipping the label of "
                  f"training row(s) {rows} makes the learner (K = {example['k']}) answer {example['decision']} "
                  "(re-checked by re-running it). `assay knn-fairness` certifies a whole test file.")


# ------------------------------------------------------------------------------- general networks
def _print_general(out, data: dict) -> None:
    sampled = data["sampled"]
    low, high = data["box"]["lower"], data["box"]["upper"]
    box_text = " × ".join(f"[{a:g}, {b:g}]" for a, b in zip(low, high))
    out.print(f"General networks: a control policy built from {', '.join(data['operators'])} layers, over the states "
              f"{box_text}. Sampled outputs span [{sampled['min']:.4f}, {sampled['max']:.4f}]; sound bounds, each "
              "operator relaxed by its own rule: "
              + "; ".join(f"{_METHOD_NAMES[name]} [{b['lower']:.4f}, {b['upper']:.4f}]"
                          for name, b in data["bounds"].items()) + ".")
    for verdict in data["verdicts"]:
        domains = verdict["domains"]
        line = (f"y < {verdict['threshold']:.4f} on every state: {verdict['status']} in {verdict['seconds']:.2f} s "
                f"({verdict['strategy']} splitting, {domains} domain{'' if domains == 1 else 's'})")
        example = verdict["counterexample"]
        if example is not None:
            point = ", ".join(f"{v:.4f}" for v in example["input"])
            line += f", e.g. at ({point}) y = {example['output']:.4f}, re-checked by a float64 forward pass"
        out.print(line + ".")
    out.print("`assay verify` and `assay bounds` take any ONNX graph of these operators (`assay info` lists them).")


# ------------------------------------------------------------------------------- preimage
def _print_preimage(out, data: dict) -> None:
    patch = data["patch"]
    size = f"{patch['size']}×{patch['size']}"
    out.print(f"Preimage approximation (PREMAP2): a {size} sticker on test image {data['image']} (a {data['label']}) may take "
              f"any colouring. {data['preimage_share']:.0%} of the colourings keep the class {data['label']} (estimated); "
              f"{data['pieces']} polytopes prove that {data['covered_share']:.1%} do: an under-approximation with ratio "
              f"{data['ratio']:.3f} (target {data['threshold']:g}, {data['status']}) in {data['seconds']:.1f} s.")
    out.print(f"Attacking the certificate: of {data['checked']:,} fresh random stickers, {data['checked_contained']:,} lie in "
              f"the polytopes and {data['checked_violations']} of those change the class. `assay preimage` does this for "
              "any box, patch or patch grid.")


DEMO_SECTIONS: tuple[DemoSection, ...] = (
    DemoSection("verify", "assay.cli.demo_cmd:_run_verify", _print_verify),
    DemoSection("general", "assay.verify.general_demo:demo_section", _print_general),
    DemoSection("online", "assay.verify.online.demo:demo_section", _print_online),
    DemoSection("preimage", "assay.preimage.demo:demo_section", _print_preimage),
    DemoSection("cfx", "assay.cfx.demo:demo_section", print_cfx_section),
    DemoSection("monitor", "assay.monitor.demo:demo_section", _print_monitor),
    DemoSection("serve", "assay.serve.demo:demo_section", print_serve_section),
    DemoSection("knn", "assay.fairness.demo:demo_section", _print_knn),
)
