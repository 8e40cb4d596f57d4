"""``assay cfx``: counterfactual explanations that survive retraining (MILP, exact Δ-robustness, APΔS).

Reads a model (``.onnx``/``.nnet``; a scikit-learn MLP can be saved with
:func:`assay.cfx.explain.write_onnx`), an input (``--input x.json``) or a batch (``--inputs rows.csv``,
with a progress bar; a bad row gets an ``error:`` line naming its line and the others are still
explained, exit code 2 at the end; ``--stop-on-error`` stops at the first), and an optional
feature spec (``--features spec.json``: one-hot, ordinal, immutable variables and bounds). Prints what to change, or with ``--json`` every result. Requests
that cannot be met (immutable features that forbid any counterfactual, bounds too tight) get a
plain answer, not a solver traceback. Ctrl-C during a batch keeps the results so far.
"""

from __future__ import annotations

import json
import time
from contextlib import contextmanager
from pathlib import Path

import typer

from assay.cli._common import EXIT_ERROR, console, load_network, report_bad_row, show_progress
from assay.errors import DataError, OptionError

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
    positional: bool = typer.Option(False, "--positional", help="--inputs: read the CSV's columns in order, one per input, whatever the header names (default: by the --features spec's names when it has them)."),
    stop_on_error: bool = typer.Option(False, "--stop-on-error", help="--inputs: stop at the first bad row (default: report it and go on with the others; the exit code is 2 either way)."),
    json_output: bool = typer.Option(False, "--json", help="Print every result as JSON."),
) -> None:
    """Explain rejected inputs with counterfactuals, optionally robust to model retraining.

    With --inputs, a bad row (not numeric, NaN, outside the feature spec) gets one error line naming its line and the others are still explained; the exit code is then 2, after the results.
    """  # noqa: E501 (typer keeps a docstring's line breaks in --help)
    from assay.cfx import FeatureTypes
    from assay.cfx.explain import explain, read_input_rows

    if (input_file is None) == (inputs is None):
        raise OptionError("give exactly one of --input x.json (one input) or --inputs rows.csv (a batch)")
    if distance not in ("l1", "linf"):
        raise OptionError(f"--distance must be l1 or linf; got {distance!r}")
    if delta is not None and delta < 0:
        raise OptionError(f"--delta must be ≥ 0; got {delta}")
    network = load_network(model)
    features = FeatureTypes.from_json(features_file) if features_file is not None else None
    if features is not None and features.size != network.input_size:
        raise DataError(f"{features_file}: the feature spec has {features.size} variables, but {model} takes "
                        f"{network.input_size} inputs; write the spec for this model")
    source = input_file or inputs
    rows = read_input_rows(source, network.input_size, features, positional)
    import numpy as np

    from assay.datasets.csv_rows import BadRow

    streams = np.random.SeedSequence(seed).spawn(len(rows.values))
    # Every row in file order: (row, line, values or its BadRow, random stream).
    batch = sorted([*zip(rows.rows, rows.lines, rows.values, streams), *((bad.row, bad.line, bad, None) for bad in rows.bad)],
                   key=lambda item: item[0])
    results, bad_rows, interrupted, stopped_at = [], [], False, None
    started = time.perf_counter()
    with _bar(len(batch), inputs is not None and show_progress(json_output)) as advance:
        try:
            for row, line, values, stream in batch:
                problem = values if isinstance(values, BadRow) else None
                if problem is None:
                    try:
                        results.append((row, line, explain(
                            network, values, features=features, target=target, distance=distance, margin=margin,
                            robust=robust, delta=delta, use_apas=use_apas, R=R, alpha=alpha,
                            rng=np.random.default_rng(stream), time_limit=time_limit, direct=direct, samples=samples)))
                    except DataError as exc:  # this row's values (outside the spec); option errors stop the batch
                        if inputs is None:  # the one input of --input x.json: name its file
                            raise DataError(f"{source}: {exc}") from exc
                        problem = BadRow(str(source), line, row, str(exc))
                advance()
                if problem is not None:
                    report_bad_row(problem)
                    bad_rows.append(problem)
                    if stop_on_error:
                        stopped_at = problem.line
                        break
        except KeyboardInterrupt:
            interrupted = True
    if json_output:
        payload = {"model": str(model), "interrupted": interrupted, "seconds": time.perf_counter() - started,
                   "results": [{"row": row, "line": line} | r.to_json() for row, line, r in results]}
        if inputs is not None:
            payload |= {"errors": [bad.to_json() for bad in bad_rows], "stopped_at": stopped_at}
        typer.echo(json.dumps(payload, indent=2))
    else:
        _print_results(results, bad_rows, features, inputs is not None, robust, delta, interrupted, stopped_at,
                       time.perf_counter() - started)
    if bad_rows:
        raise typer.Exit(EXIT_ERROR)


def _print_results(results, bad_rows, features, batch: bool, robust, delta, interrupted, stopped_at, seconds) -> None:
    out = console()
    for row, _, result in results:
        _print_one(out, result, features, row if batch else None)
    if batch:
        found = sum(r.counterfactual.found for _, _, r in results)
        line = f"{found}/{len(results)} inputs have a counterfactual; {seconds:.1f} s"
        if robust:
            line += f"; {sum(r.robust.robust for _, _, r in results)} robust at δ = {delta:g}"
        if bad_rows:
            line += f"; {len(bad_rows)} bad row{'s' if len(bad_rows) > 1 else ''} skipped (see the error lines)"
        if stopped_at is not None:
            line += f"; stopped at line {stopped_at} (--stop-on-error)"
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
