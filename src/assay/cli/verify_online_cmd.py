"""``assay verify-online``: re-verify one property at every step of a moving input box or model.

MODEL and PROPERTY give f_0 and X(0) (a VNN-LIB file with one query; its unsafe output region is
the forbidden one). Each line of the steps file (JSON lines) is one step: ``{"lower": [...],
"upper": [...]}`` moves the input box, ``{"model": "net_1.onnx"}`` updates the network (same
layers and shapes; relative paths are resolved against the steps file's folder), both together
do both, and ``{}`` re-checks unchanged. :class:`assay.verify.online.OnlineVerifier` verifies
step 0 from scratch and every later step reusing the last step's leaves (``--accelerations``).

The whole steps file is read and checked (:mod:`assay.verify.online.steps`) before anything is
verified: a malformed line is an :class:`~assay.errors.AssayError` naming the file, the line and
the fix (exit code 2).
Exit codes: 0 every step holds, 10 some step is violated (its counterexample, re-checked by a
forward pass, is printed), 20 some step is unknown or timed out (and none is violated), 2 error,
130 Ctrl-C (the finished steps are still printed and written to ``--out``).
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path

import typer

from assay.cli._common import EXIT_INTERRUPTED, console, load_network, read_property, show_progress
from assay.cli.verify_cmd import _EXIT_FOR_STATUS, DEFAULT_TIMEOUT, _numbers
from assay.errors import AssayError, DataError, OptionError, SpecError
from assay.verify.options import INPUT_SPLIT_METHODS

__all__ = ["verify_online"]

# Counterexamples printed in the text output (all of them are in --json and --out).
_SHOWN_COUNTEREXAMPLES = 5
_STATUS_STYLE = {"holds": "green", "violated": "bold red", "unknown": "yellow", "timeout": "yellow"}


def verify_online(
    model: Path = typer.Argument(..., metavar="MODEL", help="Model file f_0: .onnx or .nnet (optionally .gz)."),
    property_file: Path = typer.Argument(..., metavar="PROPERTY", help="VNN-LIB property with one query: its input "
                                         "box is X(0), its unsafe output region must stay unreachable at every step."),
    steps_file: Path = typer.Option(..., "--steps", "-s", help="JSON lines, one step each: "
                                    '{"lower": [...], "upper": [...]} (the new input box) and/or {"model": PATH} '
                                    "(updated weights, same architecture; relative to the steps file's folder)."),
    accelerations: str = typer.Option("all", "--accelerations", "-a", help="Reuse from step to step: all, none "
                                      "(every step from scratch) or a comma-separated subset of bmi, rsr, lb "
                                      "(domain shift; rsr and lb need bmi), bmw, inn, ic (model updates; inn "
                                      "and ic need bmw)."),
    max_leaves: int = typer.Option(1024, "--max-leaves", help="Leaf budget of the split tree; a step whose open "
                                   "leaves would exceed it is unknown."),
    timeout: float = typer.Option(None, "--timeout", "-t", help=f"Seconds per step before giving up on it (status "
                                  f"timeout); default {DEFAULT_TIMEOUT:g}."),
    method: str = typer.Option("alpha", "--method", "-m", help="Bound method of the leaves: alpha (CROWN, then "
                               "α-CROWN on leaves left open), or crown."),
    json_output: bool = typer.Option(False, "--json", help="Print every step and a summary as one JSON document."),
    out: Path = typer.Option(None, "--out", "-o", help="Write one JSON line per step here as it finishes."),
) -> None:
    """Verify PROPERTY on MODEL, then again after every step of --steps, reusing the last step's work.

    Exit codes: 0 every step holds, 10 some step is violated (its counterexample, re-checked by a forward pass, is printed), 20 some step is unknown or timed out, 2 error, 130 interrupted (finished steps are still printed and written to --out).
    """  # noqa: E501 (typer keeps a docstring's line breaks in --help)
    if method not in INPUT_SPLIT_METHODS:
        raise OptionError(f"--method must be one of {', '.join(INPUT_SPLIT_METHODS)}; got {method!r}")
    if timeout is not None and not timeout > 0:
        raise OptionError(f"--timeout must be a positive number of seconds; got {timeout}")
    if max_leaves < 1:
        raise OptionError(f"--max-leaves must be ≥ 1; got {max_leaves}")
    from assay.threads import threads_for, torch_threads
    from assay.verify.online import OnlineOptions
    from assay.verify.online.steps import read_steps

    try:
        options = OnlineOptions.build(accelerations=accelerations, max_leaves=max_leaves, method=method,
                                      timeout=timeout if timeout is not None else DEFAULT_TIMEOUT)
    except OptionError as exc:
        raise OptionError(f"--accelerations: {exc}") from None

    network = load_network(model)
    prop = read_property(property_file, network)
    if len(prop.queries) != 1:
        raise SpecError(f"{property_file} has {len(prop.queries)} queries (input regions); verify-online follows "
                        "one input box: write one property file per query")
    steps = read_steps(steps_file, network.input_size, str(network.source))
    sink = _open_out(out)
    try:
        with torch_threads(threads_for(network)):  # small tensors gain nothing from threads (as in `assay verify`)
            results, interrupted, wall = _run(network, prop.queries[0], steps, steps_file, options, sink,
                                              show_progress(json_output))
    finally:
        if sink is not None:
            sink.close()
    summary = _summary(results, len(steps) + 1, interrupted, wall)
    if json_output:
        payload = {"network": str(model), "property": str(property_file), "steps_file": str(steps_file),
                   "accelerations": sorted(options.accelerations), "max_leaves": max_leaves,
                   "timeout": options.verify.timeout, "method": method, "summary": summary,
                   "steps": [_step_json(line, step) for line, step in results]}
        typer.echo(json.dumps(payload, indent=2))
    else:
        _print(results, summary, options, out)
    code = EXIT_INTERRUPTED if interrupted else _EXIT_FOR_STATUS[summary["status"]]
    if code:
        raise typer.Exit(code)


def _open_out(out: Path | None):
    if out is None:
        return None
    try:
        return out.open("w", encoding="utf-8")
    except OSError as exc:
        raise DataError(f"cannot write --out {out}: {exc}") from exc


# ------------------------------------------------------------------------------- running
def _run(network, query, steps: list, steps_file: Path, options, sink, progress: bool):
    """Step 0 and every step of the file (:class:`assay.verify.online.steps.Step`); returns ([(line, OnlineStep)], interrupted, wall seconds)."""
    import contextlib

    import torch

    from assay.sets import Box
    from assay.verify.online import OnlineVerifier

    results: list = []
    models: dict[Path, object] = {}
    started = time.perf_counter()

    def record(line, step):
        results.append((line, step))
        if sink is not None:
            sink.write(json.dumps(_step_json(line, step)) + "\n")
            sink.flush()

    with contextlib.ExitStack() as stack:
        advance = _progress_bar(stack, len(steps) + 1) if progress else (lambda step: None)
        try:
            verifier = OnlineVerifier(network, query.input_set, unsafe=query.unsafe_outputs, options=options)
            record(None, verifier.steps[0])
            advance(verifier.steps[0])
            for step in steps:
                where = f"{steps_file}, line {step.line}"
                try:
                    updated = None
                    if step.model is not None:
                        if step.model not in models:
                            models[step.model] = load_network(step.model)
                        updated = models[step.model]
                    box = None
                    if step.lower is not None:
                        box = Box(torch.tensor(step.lower, dtype=torch.float64),
                                  torch.tensor(step.upper, dtype=torch.float64))
                    result = verifier.update(box, network=updated)
                except AssayError as exc:
                    raise type(exc)(f"{where}: {exc}") from exc
                record(step.line, result)
                advance(result)
        except KeyboardInterrupt:
            if not results:
                raise
            return results, True, time.perf_counter() - started
    return results, False, time.perf_counter() - started


def _progress_bar(stack, total: int):
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    bar = stack.enter_context(Progress(TextColumn("verifying online"), BarColumn(), MofNCompleteColumn(),
                                       TextColumn("steps, last {task.fields[last]}"), TimeElapsedColumn(),
                                       console=Console(stderr=True), transient=True))
    task = bar.add_task("online", total=total, last="–")
    return lambda step: bar.update(task, advance=1, last=step.status.value)


# ------------------------------------------------------------------------------- reporting
def _step_json(line, step) -> dict:
    return {"line": line} | step.to_json()


def _summary(results: list, planned: int, interrupted: bool, wall: float) -> dict:
    counts = {"holds": 0, "violated": 0, "unknown": 0, "timeout": 0}
    for _, step in results:
        counts[step.status.value] += 1
    if counts["violated"]:
        status = "violated"
    elif counts["unknown"] or counts["timeout"]:
        status = "unknown" if counts["unknown"] else "timeout"
    else:
        status = "holds"
    updates = [step.seconds for _, step in results[1:]]
    return {"status": status, "steps": len(results), "planned": planned, "counts": counts,
            "first_violated": next((step.step for _, step in results if step.status.value == "violated"), None),
            "seconds": sum(step.seconds for _, step in results),
            "first_seconds": results[0][1].seconds if results else 0.0,
            "mean_update_seconds": sum(updates) / len(updates) if updates else 0.0,
            "wall_seconds": wall, "interrupted": interrupted}


def _coverage(step) -> str:
    """The verified share, rounded down (99.96 % covered is not shown as 100 %)."""
    return f"{math.floor(step.coverage * 1000) / 10:.1f}%"


def _print(results: list, summary: dict, options, out_path) -> None:
    from rich import box
    from rich.table import Table

    out = console()
    # Without column rules, nine columns fit in 80 characters (pipes and CI logs).
    table = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False, collapse_padding=True)
    for column in ("step", "status", "coverage", "leaves", "reused", "skipped\nlb/inn", "re-\ncomputed", "resplit",
                   "seconds"):
        table.add_column(column, justify="left" if column == "status" else "right", no_wrap=True)
    for _, step in results:
        status = step.status.value
        table.add_row(str(step.step), f"[{_STATUS_STYLE[status]}]{status}[/]", _coverage(step), f"{step.leaves:,}",
                      f"{step.reused:,}", f"{step.skipped.get('lb', 0):,}/{step.skipped.get('inn', 0):,}",
                      f"{step.recomputed:,}" + ("*" if step.rebuilt and step.step else ""),
                      f"{step.resplit:,}", f"{step.seconds:.3f}")
    out.print(table)
    if any(step.rebuilt and step.step for _, step in results):
        out.print("* the split tree was rebuilt from scratch in this step (coverage fell, or the acceleration that "
                  "reuses it is off)")
    shown = 0
    for line, step in results:
        if step.counterexample is None:
            continue
        if shown == _SHOWN_COUNTEREXAMPLES:
            out.print(f"… and {summary['counts']['violated'] - shown} more violated steps (see --json or --out)")
            break
        shown += 1
        place = "X(0)" if line is None else f"line {line}"
        out.print(f"step {step.step} ({place}) violated; counterexample re-checked by a forward pass:")
        out.print(f"  input  {_numbers(step.counterexample.input)}")
        out.print(f"  output {_numbers(step.counterexample.output)}")
    counts = ", ".join(f"{count} {status}" for status, count in summary["counts"].items() if count)
    accelerations = ",".join(sorted(options.accelerations)) or "none (from scratch)"
    out.print(f"{summary['steps']} steps: {counts}; first verification {summary['first_seconds']:.2f} s, updates "
              f"{summary['mean_update_seconds']:.3f} s on average (accelerations {accelerations})")
    if summary["counts"]["unknown"]:
        # Steps whose verifier said why (onnxruntime rejected a counterexample); the others ran out of leaves.
        reasons = list(dict.fromkeys(step.reason for _, step in results if step.reason))
        for reason in reasons:
            out.print(f"unknown: {reason}")
        if sum(step.reason is None for _, step in results if step.status.value == "unknown"):
            out.print("unknown: leaves stayed open within the leaf budget; raise --max-leaves")
    if summary["counts"]["timeout"]:
        out.print(f"timeout: a step found no verdict within {options.verify.timeout:g} s; raise --timeout")
    if summary["interrupted"]:
        out.print(f"interrupted after {summary['steps']} of {summary['planned']} steps")
    if out_path is not None:
        out.print(f"steps written to {out_path}")
