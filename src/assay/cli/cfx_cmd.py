"""``assay cfx``: counterfactual explanations that survive retraining (MILP, exact Δ-robustness, APΔS).

Reads a model (``.onnx``/``.nnet``; a scikit-learn MLP can be saved with
:func:`assay.cfx.explain.write_onnx`), an input (``--input x.json``) or a batch (``--inputs rows.csv``,
with a progress bar), and an optional feature spec (``--features spec.json``: one-hot, ordinal,
immutable variables and bounds). Prints what to change, or with ``--json`` every result. Requests
that cannot be met (immutable features that forbid any counterfactual, bounds too tight) get a
plain answer, not a solver traceback. Ctrl-C during a batch keeps the results so far.
"""

from __future__ import annotations

import json
import time
from contextlib import contextmanager
from pathlib import Path

import typer

from assay.cli._common import console, load_network, show_progress
from assay.errors import OptionError

__all__ = ["cfx", "print_cfx_section"]


def cfx(
    model: Path = typer.Argument(..., help="The classifier: .onnx or .nnet (Linear/ReLU layers over a flat input; one output = logit of class 1)."),
    input_file: Path = typer.Option(None, "--input", help="One input to explain: a JSON list of numbers (or {\"x\": [...]}), in the model's encoded space."),
    inputs: Path = typer.Option(None, "--inputs", help="A batch: a CSV with a header, one input per row (shows a progress bar)."),
    features_file: Path = typer.Option(None, "--features", help="Feature spec JSON: size, one_hot, ordinal, immutable, lower, upper, names, cost (per-variable weights of the ℓ1 distance; default: all continuous in [0, 1], plain ℓ1)."),
    target: int = typer.Option(None, "--target", help="The class to reach (default: the other class of a binary model)."),
    distance: str = typer.Option("l1", "--distance", help="Cost of a change: l1 (default) or linf."),
    margin: float = typer.Option(0.0, "--margin", help="Ask every target logit difference to be at least this large."),
    robust: bool = typer.Option(False, "--robust", help="Find a counterfactual that stays valid under weight changes up to --delta (Algorithm 2; exact test, or APΔS with --apas)."),
    delta: float = typer.Option(None, "--delta", help="Weight/bias change δ to survive (with --robust), or to check the plain counterfactual against."),
    direct: bool = typer.Option(False, "--direct", help="With --robust: the nearest robust counterfactual by one MILP (networks with one hidden layer; exact, usually much faster)."),
    use_apas: bool = typer.Option(False, "--apas", help="Use APΔS: with --robust as the test; alone, report the largest δ with the (R, α) guarantee."),
    R: float = typer.Option(0.995, "--R", help="APΔS: fraction of shifted models that must keep the counterfactual valid."),
    alpha: float = typer.Option(0.999, "--alpha", help="APΔS: confidence of the guarantee."),
    samples: int = typer.Option(None, "--samples", help="APΔS: shifted models per test (default ⌈log(1 − α) / log R⌉, 1379 for the defaults); the guarantee then holds with confidence 1 − Rⁿ for this n."),
    seed: int = typer.Option(0, "--seed", help="APΔS sampler seed (each input gets its own stream)."),
    time_limit: float = typer.Option(None, "--time-limit", help="Seconds per MILP solve (default: no limit)."),
    json_output: bool = typer.Option(False, "--json", help="Print every result as JSON."),
) -> None:
    """Explain rejected inputs with counterfactuals, optionally robust to model retraining."""
    from assay.cfx import FeatureTypes
    from assay.cfx.explain import explain, read_inputs

    if (input_file is None) == (inputs is None):
        raise OptionError("give exactly one of --input x.json (one input) or --inputs rows.csv (a batch)")
    if distance not in ("l1", "linf"):
        raise OptionError(f"--distance must be l1 or linf; got {distance!r}")
    if delta is not None and delta < 0:
        raise OptionError(f"--delta must be ≥ 0; got {delta}")
    network = load_network(model)
    features = FeatureTypes.from_json(features_file) if features_file is not None else None
    rows = read_inputs(input_file or inputs, network.input_size, features)
    import numpy as np

    streams = np.random.SeedSequence(seed).spawn(len(rows))
    results, interrupted = [], False
    started = time.perf_counter()
    with _bar(len(rows), inputs is not None and show_progress(json_output)) as advance:
        try:
            for row, stream in zip(rows, streams):
                results.append(explain(network, row, features=features, target=target, distance=distance, margin=margin,
                                       robust=robust, delta=delta, use_apas=use_apas, R=R, alpha=alpha,
                                       rng=np.random.default_rng(stream), time_limit=time_limit, direct=direct,
                                       samples=samples))
                advance()
        except KeyboardInterrupt:
            interrupted = True
    if json_output:
        payload = {"model": str(model), "interrupted": interrupted, "seconds": time.perf_counter() - started,
                   "results": [r.to_json() for r in results]}
        typer.echo(json.dumps(payload, indent=2))
        return
    out = console()
    for index, result in enumerate(results):
        _print_one(out, result, features, index if inputs is not None else None)
    if inputs is not None:
        found = sum(r.counterfactual.found for r in results)
        line = f"{found}/{len(results)} inputs have a counterfactual; {time.perf_counter() - started:.1f} s"
        if robust:
            line += f"; {sum(r.robust.robust for r in results)} robust at δ = {delta:g}"
        out.print(line + (" (interrupted)" if interrupted else ""))


@contextmanager
def _bar(total: int, enabled: bool):
    """Yield ``advance()`` for a rich progress bar on stderr (a no-op when disabled)."""
    if not enabled:
        yield lambda: None
        return
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

    with Progress(TextColumn("explaining"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  TimeRemainingColumn(), console=Console(stderr=True), transient=True) as bar:
        task = bar.add_task("explaining", total=total)
        yield lambda: bar.advance(task)


def _print_one(out, result, features, index) -> None:
    cf = result.counterfactual
    head = f"input {index}: " if index is not None else ""
    if not cf.found:
        out.print(f"{head}no counterfactual: {cf.message}")
        if result.robust is not None and result.robust.candidates:
            out.print(f"  (after {result.robust.candidates} candidate(s) that were not robust)")
        return
    import numpy as np

    changes = np.flatnonzero(np.abs(cf.x_cf - cf.x) > 1e-9)
    out.print(f"{head}class {cf.target} reached: {cf.distance:.4g} {cf.norm} cost"
              f"{' (optimal)' if cf.optimal else ''}, margin {cf.achieved_margin:.3g}, {cf.seconds:.2f} s")
    for i in changes[:12]:
        name = features.name(int(i)) if features is not None else f"x[{i}]"
        out.print(f"  {name}: {cf.x[i]:.4g} → {cf.x_cf[i]:.4g}")
    if len(changes) > 12:
        out.print(f"  … and {len(changes) - 12} more variables")
    if result.robust is not None:
        r = result.robust
        state = "robust" if r.robust else "NOT robust"
        out.print(f"  {state} at δ = {max(r.deltas):g} ({r.test} test, {r.candidates} candidate(s)): {r.guarantee}")
    if result.delta_check is not None:
        out.print(f"  Δ-robustness at δ = {max(result.delta_check.deltas):g}: {result.delta_check.message}")
    if result.apas is not None:
        a = result.apas
        out.print(f"  APΔS: largest δ = {a.delta:.4g} (grid step {a.grid_step:g}, n = {a.samples}): {a.guarantee}")


def print_cfx_section(out, data: dict) -> None:
    """The demo tour's cfx section (``data`` from :func:`assay.cfx.demo.demo_section`)."""
    applicant = ", ".join(f"{k} {v:.2f}" for k, v in data["input"].items())
    plain, robust, apas = data["plain"], data["robust"], data["apas"]
    undone = (f"a model with every weight moved by ≤ {data['delta']} rejects it again (logit {plain['shifted_logit']:.2f}, "
              "re-checked)" if plain["robust_after_shift"] == "not_robust" else f"it is {plain['robust_after_shift']}")
    out.print(f"Robust counterfactuals (APΔS, ECAI 2024): a loan model ({data['model']}) rejects the applicant with "
              f"{applicant}. Nearest change to be accepted: {plain['change']} (ℓ1 cost {plain['cost']:.3f}), but {undone}.")
    out.print(f"MILP-R asks for more: {robust['change']} (ℓ1 cost {robust['cost']:.3f}, {robust['candidates']} candidates) is "
              f"{'proven valid for every model within δ = ' + str(data['delta']) if robust['proven'] else 'not proven robust'}; "
              f"exactly certified up to δ = {data['exact_delta']:.3f}, and APΔS says: with confidence "
              f"{apas['confidence']:.4f}, ≥ 99.5 % of models within δ = {apas['delta']:.3f} keep it. `assay cfx` explains "
              "any input or CSV of inputs.")
