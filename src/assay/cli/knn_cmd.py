"""``assay knn-fairness``: certify KNN decisions against biased training labels (CAV 2023, Li, Wang & Wang).

Reads a training table (CSV with a header, or one of the authors' ``.npy`` splits holding
``X_train, y_train, X_test, y_test``; see :mod:`assay.datasets.tabular`), chooses K by cross-validation exactly as the paper's
learner, and certifies each test input: the decision must survive any ``--flips`` label flips,
every value of the ``--protected`` columns and every point of the ``--epsilon`` box. Prints a
summary table (certified / unknown / falsified, time per input) or, with ``--json``, every
certificate. Features are used as given (standardise them beforehand, as the authors' splits are).
Bad input raises an :class:`~assay.errors.AssayError` (the main CLI prints ``error: ...`` and exits 2).
Ctrl-C stops early and still prints the summary of the inputs certified so far. A bad row of
``--test`` gets one ``error:`` line and is left out (``--stop-on-error``: the rows after it too);
the exit code is then 2, after the summary.
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from pathlib import Path

import typer

from assay.cli._common import EXIT_ERROR, report_bad_row
from assay.errors import DataError, OptionError

__all__ = ["knn_fairness"]


def _column(name: str, names: list[str], option: str, source: Path) -> int:
    name = name.strip()
    if name in names:
        return names.index(name)
    raise DataError(f"{source}: {option} names column {name!r}, which is not a feature column; "
                    f"the feature columns are {', '.join(names)}")


def _pairs(text: str, option: str) -> list[tuple[str, str]]:
    out = []
    for part in (p for p in text.split(",") if p.strip()):
        key, sep, value = part.partition("=") if "=" in part else part.partition(":")
        if not sep or not key.strip() or not value.strip():
            raise OptionError(f"{option} expects KEY=VALUE pairs separated by commas; got {part!r}")
        out.append((key.strip(), value.strip()))
    return out


def _ints(text: str, option: str) -> list[int]:
    try:
        values = [int(p) for p in text.split(",") if p.strip()]
    except ValueError:
        values = []
    if not values:
        raise OptionError(f"{option} expects comma-separated integers, e.g. 7,8,9,10,11; got {text!r}")
    return values


def knn_fairness(
    train: Path = typer.Argument(..., help="Training data: CSV with a header, or an authors' .npy split (X_train, y_train, X_test, y_test)."),
    label: str = typer.Option(None, "--label", help="The label column of the CSV (values are mapped to 0..C-1 in sorted order)."),
    protected: str = typer.Option("", "--protected", help="Protected columns, comma-separated (individual fairness over all their training values)."),
    flips: int = typer.Option(..., "--flips", "-n", help="How many training labels may be wrong (flipped)."),
    epsilon: str = typer.Option("", "--epsilon", help="ε-box: COL=R,... (R in the column's units, or R% of its training range)."),
    test: Path = typer.Option(None, "--test", help="Inputs to certify (CSV with the feature columns). Default: the split's test set, or the training rows."),
    first: int = typer.Option(None, "--first", help="Certify only the first N inputs (the paper uses 101)."),
    k: str = typer.Option("3,5,7,9,11", "--k", help="Candidate Ks for cross-validation, in order (ties go to the first)."),
    folds: int = typer.Option(10, "--folds", help="Cross-validation folds (contiguous, unshuffled)."),
    weights: str = typer.Option("", "--weights", help="Class weights LABEL=W,... (integers; weight of that class's CV errors)."),
    down_sample: bool = typer.Option(False, "--down-sample", help="Keep every W-th row of each class first (the paper's preprocessing)."),
    flip_group: str = typer.Option("", "--flip-group", help="Only rows with COL=VALUE,... may have flipped labels."),
    direction: str = typer.Option("", "--direction", help="Only flips FROM:TO (label values), e.g. 1:0."),
    workers: int = typer.Option(1, "--workers", help="Processes to fan the inputs out to (assay.run)."),
    falsify: bool = typer.Option(True, "--falsify/--no-falsify", help="Search for confirmed counterexamples where not certified."),
    stop_on_error: bool = typer.Option(False, "--stop-on-error", help="--test: certify only the rows before the first bad one (default: report each bad row and certify the others; the exit code is 2 either way)."),
    json_output: bool = typer.Option(False, "--json", help="Print every certificate and the summary as JSON."),
) -> None:
    """Certify that KNN decisions survive biased training labels (label-flipping, individual and ε-fairness).

    A bad row of --test (ragged, not numeric, NaN) gets one error line naming its line and the other rows are still certified; the exit code is then 2, after the summary.
    """  # noqa: E501 (typer keeps a docstring's line breaks in --help)
    from assay.datasets import load_tabular, read_csv
    from assay.fairness.knn import KnnFairnessCertifier

    if flips < 0:
        raise OptionError(f"--flips must be ≥ 0; got {flips}")
    if first is not None and first < 1:
        raise OptionError(f"--first must be ≥ 1; got {first}")
    if workers < 1:
        raise OptionError(f"--workers must be ≥ 1; got {workers}")
    if train.suffix != ".npy":
        header, _ = read_csv(train, header_only=True)
        if label is None:
            raise OptionError(f"--label is required for a CSV training file; {train} has the columns {', '.join(header)}")
        if label not in header:
            raise DataError(f"{train}: no column {label!r} (the label); the columns are {', '.join(header)}; "
                            f"pass the label column with --label")
    data = load_tabular(train, label, test)
    X_train, y_train, X_test, lines = data.train_X, data.train_y, data.test_X, data.test_lines
    for problem in data.test_bad[:1] if stop_on_error else data.test_bad:
        report_bad_row(problem)
    if stop_on_error and data.test_bad:
        before = sum(line < data.test_bad[0].line for line in lines)
        X_test, lines = X_test[:before], lines[:before]
    names, classes = list(data.feature_names), list(data.label_names)
    label_index = {name: i for i, name in enumerate(classes)}

    def label_of(text: str, option: str) -> int:
        if text in label_index:
            return label_index[text]
        for name, i in label_index.items():
            try:
                if float(name) == float(text):
                    return i
            except ValueError:
                pass
        raise OptionError(f"{option} names the label {text!r}, but the labels are {', '.join(classes)}")

    protected_cols = [_column(p, names, "--protected", train) for p in protected.split(",") if p.strip()]
    class_weights = {label_of(key, "--weights"): _ints(value, "--weights")[0] for key, value in _pairs(weights, "--weights")}
    groups = {}
    for key, value in _pairs(flip_group, "--flip-group"):
        try:
            groups[_column(key, names, "--flip-group", train)] = float(value)
        except ValueError:
            raise OptionError(f"--flip-group values must be numbers; got {key}={value}") from None
    flip_direction = None
    if direction.strip():
        parts = direction.split(":")
        if len(parts) != 2:
            raise OptionError(f"--direction expects FROM:TO, e.g. 1:0; got {direction!r}")
        flip_direction = (label_of(parts[0].strip(), "--direction"), label_of(parts[1].strip(), "--direction"))
    started = time.perf_counter()
    candidates = _ints(k, "--k")
    try:
        certifier = KnnFairnessCertifier(X_train, y_train, k_candidates=candidates, folds=folds,
                                         class_weights=class_weights or None, down_sample=down_sample,
                                         flip_group=groups or None, direction=flip_direction)
    except (DataError, OptionError) as exc:  # what the training table cannot support (too few rows, one class)
        raise type(exc)(f"{train}: {exc}") from exc
    import numpy as np

    radii = {}
    for key, value in _pairs(epsilon, "--epsilon"):
        c = _column(key, names, "--epsilon", train)
        try:
            r = float(value[:-1]) / 100.0 * float(np.ptp(certifier.train_X[:, c])) if value.endswith("%") else float(value)
        except ValueError:
            raise OptionError(f"--epsilon values must be numbers or percentages, e.g. age=0.05 or age=1%; got {key}={value}") from None
        radii[c] = r
    inputs = X_test[:first] if first is not None else X_test
    if inputs.shape[1] != X_train.shape[1]:
        raise DataError(f"{test}: the inputs have {inputs.shape[1]} features, but {train} has {X_train.shape[1]}")
    options = dict(protected=protected_cols, epsilon=radii or None, falsify=falsify)
    certificates, interrupted = _run(certifier, inputs, flips, options, workers, show=not json_output and _interactive())
    wall = time.perf_counter() - started
    summary = _summary(certifier, certificates, flips, wall)
    summary["interrupted"] = interrupted
    bad = data.test_bad[:1] if stop_on_error else data.test_bad
    summary["bad_rows"] = len(bad)
    if json_output:
        payload = {"summary": summary, "labels": classes,
                   "certificates": [dict(c.to_json(), input_index=i, **({"line": lines[i]} if lines else {}))
                                    for i, c in enumerate(certificates)],
                   "errors": [problem.to_json() for problem in bad]}
        typer.echo(json.dumps(payload, indent=2))
    else:
        _print_summary(summary, train)
    if bad:
        raise typer.Exit(EXIT_ERROR)


def _interactive() -> bool:
    try:
        return sys.stderr.isatty()
    except (AttributeError, ValueError):
        return False


def _run(certifier, inputs, flips, options, workers, show):
    """Certificates for the inputs, and whether Ctrl-C stopped the run early (what finished is kept)."""
    if workers != 1:
        from assay.run import TasksInterrupted

        try:
            return certifier.certify_many(inputs, flips, workers=workers, progress=show, description="certifying", **options), False
        except TasksInterrupted as stop:
            return [c for chunk, done in zip(stop.results, stop.done) if done for c in chunk], True
    certificates: list = []
    certifier.prepare(flips)

    def loop(advance):
        try:
            for row in inputs:
                certificates.append(certifier.certify(row, flips, **options))
                advance()
        except KeyboardInterrupt:
            return True
        return False

    if not show:
        return certificates, loop(lambda: None)
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

    with Progress(TextColumn("certifying"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  TimeRemainingColumn(), console=Console(stderr=True), transient=True) as bar:
        task = bar.add_task("certifying", total=len(inputs))
        interrupted = loop(lambda: bar.advance(task))
    return certificates, interrupted


def _summary(certifier, certificates, flips, wall) -> dict:
    seconds = [c.seconds for c in certificates]
    counts = {s: sum(c.status.value == s for c in certificates) for s in ("certified", "unknown", "falsified")}
    total = max(len(certificates), 1)
    return {
        "inputs": len(certificates),
        "flips": flips,
        **counts,
        "certified_percent": 100.0 * counts["certified"] / total,
        "k_default": certifier.k_default,
        "k_possible": sorted({k for c in certificates for k in c.k_possible}),
        "method": sorted({c.method for c in certificates}),
        "training_rows": int(len(certifier.labels)),
        "setup_seconds": certifier.setup_seconds,
        "seconds_per_input_median": statistics.median(seconds) if seconds else 0.0,
        "seconds_per_input_mean": statistics.fmean(seconds) if seconds else 0.0,
        "wall_seconds": wall,
    }


def _print_summary(summary: dict, train: Path) -> None:
    from rich.console import Console
    from rich.table import Table

    stopped = " (interrupted)" if summary.get("interrupted") else ""
    table = Table(title=f"KNN fairness of {train.name} under {summary['flips']} label flips{stopped}")
    table.add_column("verdict")
    table.add_column("inputs", justify="right")
    table.add_column("%", justify="right")
    n = max(summary["inputs"], 1)
    for key in ("certified", "unknown", "falsified"):
        table.add_row(key, str(summary[key]), f"{100.0 * summary[key] / n:.1f}")
    console = Console(highlight=False)
    console.print(table)
    console.print(f"K chosen {summary['k_default']} (possible under flips: {', '.join(map(str, summary['k_possible']))}); "
                  f"{summary['training_rows']} training rows; method {', '.join(summary['method'])}")
    console.print(f"time per input: median {summary['seconds_per_input_median'] * 1e3:.2f} ms, mean "
                  f"{summary['seconds_per_input_mean'] * 1e3:.2f} ms; set-up {summary['setup_seconds']:.2f} s; "
                  f"total {summary['wall_seconds']:.2f} s")
    if summary.get("bad_rows"):
        console.print(f"{summary['bad_rows']} bad row(s) of the test file left out (see the error lines)")
