"""``assay verify``: decide one property, or run a whole VNN-COMP style benchmark.

Exit codes (one instance): 0 holds, 10 violated, 20 unknown or timeout, 2 error, 130 Ctrl-C.
With ``--instances``: 0 when every instance ran (whatever its verdict), 2 when some row was malformed
or some instance could not be run (bad file: status ``error`` in the results; each gets an ``error:``
line naming its line in the CSV, and the others still run; ``--stop-on-error`` stops at the first),
130 Ctrl-C (finished rows still written).
"""

from __future__ import annotations

import functools
import json
import time
from pathlib import Path

import typer

from assay.cli import _common
from assay.cli._common import (
    EXIT_ERROR,
    EXIT_INTERRUPTED,
    EXIT_UNDECIDED,
    EXIT_VIOLATED,
    console,
    load_network,
    read_property,
    report_bad_row,
    show_progress,
)
from assay.errors import OptionError
from assay.verify.options import (
    INPUT_SPLIT_METHODS,
    SMALL_NETWORK_ELEMENTS,
    SMALL_NETWORK_PARAMETERS,
    STRATEGIES,
    VerifyOptions,
)
from assay.verify.result import UNKNOWN_REASON

__all__ = ["verify"]

DEFAULT_TIMEOUT = VerifyOptions().timeout
_METHODS = INPUT_SPLIT_METHODS
_STRATEGIES = STRATEGIES
_EXIT_FOR_STATUS = {"holds": 0, "violated": EXIT_VIOLATED, "unknown": EXIT_UNDECIDED, "timeout": EXIT_UNDECIDED}


def verify(
    model: Path = typer.Argument(None, metavar="MODEL", help="Model file: .onnx or .nnet (optionally .gz). Not with --instances."),
    property_file: Path = typer.Argument(None, metavar="PROPERTY", help="VNN-LIB property (.vnnlib, optionally "
                                         ".gz). Not with --instances."),
    timeout: float = typer.Option(None, "--timeout", "-t", help=f"Seconds before giving up (status timeout), counted "
                                  f"from the start of the command, loading included (as VNN-COMP counts them); default "
                                  f"{DEFAULT_TIMEOUT:g}. With --instances: for rows without a timeout."),
    method: str = typer.Option("alpha", "--method", "-m", help="Bound method of input splitting: alpha (CROWN, then α-CROWN on boxes left open), or crown."),
    strategy: str = typer.Option("auto", "--strategy", help="Branching: input (split the input box), relu (split "
                                 "ReLUs, β-CROWN), operator (split the input of any non-linear operator) or auto "
                                 "(input when at most 16 inputs vary, else relu, or operator on networks with other "
                                 "non-linear operators)."),
    json_output: bool = typer.Option(False, "--json", help="Print the full result(s) as JSON."),
    instances: Path = typer.Option(None, "--instances", help="VNN-COMP instances CSV (rows network,property,timeout; "
                                   "paths relative to the CSV's folder) to run instead of MODEL PROPERTY."),
    workers: int = typer.Option(None, "--workers", "-w", help="With --instances: local worker processes (default: "
                                "one per CPU core)."),
    scheduler: str = typer.Option(None, "--scheduler", help="With --instances: run on the Dask cluster at this address "
                                  "(e.g. tcp://10.0.0.5:8786) instead of a local process pool."),
    out: Path = typer.Option(None, "--out", "-o", help="With --instances: write per-instance results to this CSV."),
    threads: int = typer.Option(None, "--threads", help="torch threads for one instance (default: 1 for networks "
                                f"under {SMALL_NETWORK_PARAMETERS:,} parameters in every layer and {SMALL_NETWORK_ELEMENTS:,} tensor elements, "
                                "whose small tensors gain nothing "
                                "from threads and lose much when the cores are shared; torch's default otherwise)."),
    stop_on_error: bool = typer.Option(False, "--stop-on-error", help="With --instances: stop at the first bad row "
                                       "or instance that cannot be run (default: report each one and run the others; "
                                       "the exit code is 2 either way)."),
    result_file: Path = typer.Option(None, "--result-file", help="Also write the verdict as a VNN-COMP result file "
                                     "(sat with the counterexample, unsat, timeout, unknown or error; see "
                                     "vnncomp/run_instance.sh). A model or property that cannot be run writes error."),
) -> None:
    """Decide whether MODEL satisfies PROPERTY, or run every instance of an --instances CSV.

    Exit codes: 0 holds, 10 violated (the counterexample, re-checked by a forward pass, is printed), 20 unknown or timeout, 2 error, 130 interrupted.

    With --instances: 0 when every instance ran (verdicts are in the table and --out), 2 when some row was malformed or some instance could not be run (each gets an error line naming its line; the others still run, unless --stop-on-error), 130 interrupted (finished rows are still written).
    """  # noqa: E501 (typer keeps a docstring's line breaks in --help)
    # The deadline counts loading torch, the model and the property too: from the process's
    # start when run as the `assay` command, else from here.
    started = _common.COMMAND_STARTED if _common.COMMAND_STARTED is not None else time.monotonic()
    if method not in _METHODS:
        raise OptionError(f"--method must be one of {', '.join(_METHODS)}; got {method!r}")
    if strategy not in _STRATEGIES:
        raise OptionError(f"--strategy must be one of {', '.join(_STRATEGIES)}; got {strategy!r}")
    engine = {"method": method, "strategy": strategy}
    if timeout is not None and not timeout > 0:
        raise OptionError(f"--timeout must be a positive number of seconds; got {timeout}")
    if instances is not None:
        if model is not None or property_file is not None:
            raise OptionError("give either MODEL PROPERTY or --instances CSV, not both")
        if workers is not None and scheduler is not None:
            raise OptionError("give --workers (a local pool) or --scheduler (a Dask cluster), not both")
        if workers is not None and workers < 1:
            raise OptionError(f"--workers must be ≥ 1; got {workers}")
        if threads is not None:
            raise OptionError("--threads is for one instance; with --instances every worker runs one torch thread")
        if result_file is not None:
            raise OptionError("--result-file is for one instance; with --instances use --out")
        code = _run_instances(instances, timeout, engine, json_output, workers, scheduler, out, stop_on_error)
    else:
        if model is None or property_file is None:
            raise OptionError("give MODEL and PROPERTY (e.g. `assay verify net.onnx prop.vnnlib`), or --instances CSV")
        for flag, value in (("--workers", workers), ("--scheduler", scheduler), ("--out", out),
                            ("--stop-on-error", stop_on_error or None)):
            if value is not None:
                raise OptionError(f"{flag} is only used with --instances")
        if threads is not None and threads < 1:
            raise OptionError(f"--threads must be ≥ 1; got {threads}")
        timeout = timeout if timeout is not None else DEFAULT_TIMEOUT
        if result_file is not None:
            code = _run_competition(model, property_file, timeout, engine, json_output, threads, started, result_file)
        else:
            code = _run_one(model, property_file, timeout, engine, json_output, threads, started)
    if code:
        raise typer.Exit(code)


# ------------------------------------------------------------------------------- one instance
def _run_one(model: Path, property_file: Path, timeout: float, engine: dict, json_output: bool, threads: int | None,
             started: float) -> int:
    from assay.threads import threads_for, torch_threads

    network = load_network(model)
    prop = read_property(property_file, network)
    with torch_threads(threads_for(network, threads)):  # callers in the same process keep their setting
        return _verify_and_report(network, prop, model, property_file, timeout, engine, json_output, started)


def _verify_and_report(network, prop, model, property_file, timeout, engine, json_output, command_started) -> int:
    from assay.verify import verify_vnnlib

    # What loading left of the timeout (a tiny positive rest makes the verifier answer TIMEOUT at once).
    left = max(timeout - (time.monotonic() - command_started), 1e-9)
    started = time.perf_counter()
    if show_progress(json_output):
        from rich.console import Console
        from rich.progress import BarColumn, Progress, TaskProgressColumn, TextColumn, TimeElapsedColumn

        with Progress(TextColumn("verifying"), BarColumn(), TaskProgressColumn(), TextColumn("{task.fields[pending]} boxes"),
                      TimeElapsedColumn(), console=Console(stderr=True), transient=True) as bar:
            task = bar.add_task("verify", total=1.0, pending=0)
            result = verify_vnnlib(network, prop, timeout=left, **engine,
                                   progress=lambda fraction, pending: bar.update(task, completed=fraction, pending=pending))
    else:
        result = verify_vnnlib(network, prop, timeout=left, **engine)
    seconds = time.perf_counter() - started
    status = result.status.value
    if json_output:
        payload = {"network": str(model), "property": str(property_file), "timeout": timeout, **engine,
                   "seconds": seconds} | result.to_json()
        typer.echo(json.dumps(payload, indent=2))
    else:
        out = console()
        stats = result.stats
        out.print(f"{status}  ({seconds:.2f} s, {stats.domains:,} domains, {stats.bound_calls:,} "
                  f"bound calls)")
        if result.counterexample is not None:
            example = result.counterexample
            out.print(f"counterexample (query {example.query}), re-checked by a forward pass:")
            out.print(f"  input  {_numbers(example.input)}")
            out.print(f"  output {_numbers(example.output)}")
        elif status == "timeout":
            out.print(f"no verdict within {timeout:g} s; raise --timeout")
        elif status == "unknown":
            out.print(result.reason or UNKNOWN_REASON)
    return _EXIT_FOR_STATUS[status]


def _run_competition(model, property_file, timeout, engine, json_output, threads, started, result_file) -> int:
    """Verify the way VNN-COMP counts it and write its result file (assay.verify.competition)."""
    from assay.verify.competition import run_instance, write_result_file

    if show_progress(json_output):
        with _bar() as (bar, task):
            result = run_instance(model, property_file, timeout, started=started, **engine, threads=threads,
                                  progress=lambda fraction, pending: bar.update(task, completed=fraction, pending=pending))
    else:
        result = run_instance(model, property_file, timeout, started=started, **engine, threads=threads)
    write_result_file(result_file, result)
    if json_output:
        payload = {"network": str(model), "property": str(property_file), **engine,
                   "result_file": str(result_file)} | result.to_json()
        typer.echo(json.dumps(payload, indent=2))
    else:
        console().print(f"{result.word}  ({result.status.value}, {result.seconds:.2f} s) written to {result_file}")
    if result.word == "error":
        typer.echo(f"error: {result.reason}", err=True)
        return EXIT_ERROR
    if result.reason is not None and not json_output:
        console().print(result.reason)
    return _EXIT_FOR_STATUS[result.status.value]


def _bar():
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TaskProgressColumn, TextColumn, TimeElapsedColumn

    class _Bar:
        def __enter__(self):
            self.progress = Progress(TextColumn("verifying"), BarColumn(), TaskProgressColumn(),
                                     TextColumn("{task.fields[pending]} branches"), TimeElapsedColumn(),
                                     console=Console(stderr=True), transient=True)
            self.progress.__enter__()
            return self.progress, self.progress.add_task("verify", total=1.0, pending=0)

        def __exit__(self, *exc):
            return self.progress.__exit__(*exc)

    return _Bar()


def _numbers(tensor) -> str:
    return "[" + ", ".join(f"{value:.9g}" for value in tensor.reshape(-1).tolist()) + "]"


# ------------------------------------------------------------------------------- many instances
def _run_instances(csv_path: Path, timeout, engine: dict, json_output, workers, scheduler, out, stop_on_error) -> int:
    from assay.run import TaskError, TasksInterrupted, run_tasks
    from assay.run.vnncomp import read_instance_rows, summarize, verify_instance, write_results

    rows, bad = read_instance_rows(csv_path, default_timeout=timeout if timeout is not None else DEFAULT_TIMEOUT)
    for problem in bad[:1] if stop_on_error else bad:
        report_bad_row(problem)
    if stop_on_error and bad:
        rows = [row for row in rows if row.line < bad[0].line]
    started = time.perf_counter()
    interrupted = False
    try:
        results = run_tasks(functools.partial(verify_instance, **engine, raise_errors=stop_on_error), rows,
                            workers=workers, scheduler=scheduler, progress=show_progress(json_output),
                            description=f"{len(rows)} instances",
                            label=lambda row: f"{csv_path}, line {row.line} ({row.network}, {row.property})")
    except (TasksInterrupted, TaskError) as stopped:
        if stopped.results is None:
            raise
        finished = [result for result, done in zip(stopped.results, stopped.done) if done]
        if out is not None:
            write_results(out, finished)
        if not isinstance(stopped, TasksInterrupted):
            raise
        results, interrupted = finished, True
    wall = time.perf_counter() - started
    if out is not None:
        write_results(out, results)
    for row in results:
        if row["status"] == "error":
            report_bad_row(f"{csv_path}, line {row['line']}: {row['error']}")
    summary = summarize(results) | {"wall_seconds": wall, "interrupted": interrupted, "planned": len(rows),
                                    "bad_rows": len(bad[:1] if stop_on_error else bad)}
    if json_output:
        payload = {"summary": summary, "results": results, "errors": [problem.to_json() for problem in bad]}
        typer.echo(json.dumps(payload, indent=2))
    else:
        _print_summary(summary, results, out)
    if interrupted:
        return EXIT_INTERRUPTED
    return EXIT_ERROR if summary["counts"]["error"] or bad else 0


def _print_summary(summary: dict, results: list[dict], out_path) -> None:
    from rich.table import Table

    out = console()
    table = Table(title=f"{summary['instances']} of {summary['planned']} instances"
                  + (" (interrupted)" if summary["interrupted"] else ""), show_edge=False)
    table.add_column("status")
    table.add_column("instances", justify="right")
    table.add_column("seconds", justify="right")
    for status, count in summary["counts"].items():
        if count or status != "error":
            seconds = sum(row["seconds"] for row in results if row["status"] == status)
            table.add_row(status, str(count), f"{seconds:.1f}")
    table.add_row("total", str(summary["instances"]), f"{summary['total_seconds']:.1f}", style="bold")
    out.print(table)
    out.print(f"wall time {summary['wall_seconds']:.1f} s")
    if summary["counts"]["error"] or summary["bad_rows"]:
        out.print(f"{summary['counts']['error']} instance(s) could not be run and {summary['bad_rows']} row(s) were "
                  "malformed (see the error lines)")
    if out_path is not None:
        out.print(f"results written to {out_path}")
