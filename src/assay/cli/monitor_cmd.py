"""``assay monitor``: run the exact fairness / robustness monitor over a stream of decisions.

Reads a CSV, Parquet or JSON-lines stream (``-`` for CSV on stdin) and feeds it to
:class:`assay.monitor.Monitor` in batches (:func:`assay.monitor.monitor_stream` does the work),
optionally writes one JSON line per flagged decision, and prints a summary: decisions, violating
pairs, flagged decisions, per-decision latency (p50/p99, amortised over each batch;
``--batch-size 1`` measures single decisions) and peak memory.
``--report report.html`` also writes a self-contained HTML summary (latency histogram, the most
witnessed flagged decisions).
A bad row (a feature that is not a finite number, no decision, too few values, a line that is not
JSON) gets one ``error:`` line naming its line and is left out; the others are monitored and the exit
code is 2 after the summary (``--stop-on-error``: the run ends at the first bad row).
Ctrl-C stops early and still prints the summary of what was monitored. Any
:class:`~assay.errors.AssayError` prints one ``error: ...`` line on stderr and exits with code 2.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import typer

from assay.cli._common import EXIT_ERROR, one_line, report_bad_row
from assay.errors import AssayError, DataError, UnsupportedError

__all__ = ["monitor"]


# How many of the most-witnessed flagged decisions the HTML report lists.
_REPORT_TOP_FLAGGED = 25


def monitor(
    stream: str = typer.Argument(..., help="Decision stream: CSV, Parquet (.parquet) or JSON lines (.jsonl); '-' reads CSV from stdin."),
    epsilon: float = typer.Option(None, "--epsilon", "-e", help="Inputs within this distance (≤ ε) are close. Required, except with --post (the server's monitor has its own)."),
    metric: str = typer.Option(None, "--metric", help="Input distance: linf (default), l2, l1 or cosine."),
    decision_column: str = typer.Option("prediction", "--decision-column", help="Column holding the model's decision."),
    drop: str = typer.Option("", "--drop", help="Comma-separated columns that are not input features (e.g. label)."),
    out: Path = typer.Option(None, "--out", help="Write one JSON line per flagged decision (its witnesses) here."),
    json_output: bool = typer.Option(False, "--json", help="Print the summary as JSON."),
    index: str = typer.Option(None, "--index", help="Index backend: auto (default), grid, brute, kdtree, snn, bdd, partition or faiss."),
    max_history: int = typer.Option(None, "--max-history", help="Compare each decision with the last N decisions only."),
    max_witnesses: int = typer.Option(None, "--max-witnesses", help="List at most N witnesses per decision (counts stay exact)."),
    batch_size: int = typer.Option(256, "--batch-size", help="Decisions per batch (latency is amortised over a batch)."),
    checkpoint: Path = typer.Option(None, "--checkpoint", help="Save the monitor's state here at the end."),
    report: Path = typer.Option(None, "--report", help="Also write a self-contained HTML summary (latency histogram, top flagged decisions) here."),
    post: str = typer.Option(None, "--post", help="Stream the decisions into a running `assay serve` at this URL (e.g. http://127.0.0.1:8000) instead of monitoring here; the server's monitor decides ε and the metric. Each batch is sent with an idempotency key and re-sent on connection errors, so it counts once."),
    post_monitor: str = typer.Option("default", "--post-monitor", help="With --post: the server's monitor to post to."),
    token: str = typer.Option(None, "--token", envvar="ASSAY_TOKEN", help="With --post: the server's token (also read from ASSAY_TOKEN)."),
    stop_on_error: bool = typer.Option(False, "--stop-on-error", help="Stop at the first bad row (default: report each bad row, leave it out and monitor the others; the exit code is 2 either way)."),
) -> None:
    """Monitor a stream of decisions for pairs of close inputs with different decisions."""
    if post is not None:
        local = {"--epsilon": epsilon, "--metric": metric, "--index": index, "--max-history": max_history,
                 "--max-witnesses": max_witnesses, "--out": out, "--checkpoint": checkpoint, "--report": report}
        _post(stream, post, post_monitor, token, decision_column, drop, batch_size, json_output,
              [option for option, value in local.items() if value is not None])
        return
    try:
        if epsilon is None:
            raise UnsupportedError("--epsilon is required: the radius ε within which inputs are close (e.g. --epsilon 0.05); "
                                   "with --post URL the server's monitor decides it instead")
        metric = metric or "linf"
        index = index or "auto"
        if batch_size < 1:
            raise UnsupportedError(f"--batch-size must be ≥ 1; got {batch_size}")
        dropped = tuple(column.strip() for column in drop.split(",") if column.strip())
        from assay.monitor import monitor_stream

        options = dict(decision_column=decision_column, drop=dropped, index=index, max_history=max_history,
                       max_witnesses=max_witnesses, batch_size=batch_size, witnesses_out=out, checkpoint=checkpoint,
                       keep_top=_REPORT_TOP_FLAGGED if report is not None else 0, on_bad_row=report_bad_row,
                       stop_on_error=stop_on_error)
        if sys.stderr.isatty() and not json_output:
            from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

            with Progress(SpinnerColumn(), TextColumn("{task.description}"), TextColumn("{task.completed:,} decisions"),
                          TextColumn("{task.fields[flagged]:,} flagged"), TimeElapsedColumn(), transient=True) as bar:
                task = bar.add_task(f"monitoring {stream}", total=None, flagged=0)
                run = monitor_stream(stream, epsilon, metric, **options,
                                     progress=lambda n, flagged: bar.update(task, advance=n, flagged=flagged))
        else:
            run = monitor_stream(stream, epsilon, metric, **options)
        summary = run.to_json()
        if report is not None:
            from assay.monitor.report import write_report

            try:
                write_report(report, summary, run.latencies, list(run.top_flagged))
            except OSError as exc:
                raise DataError(f"cannot write the report {report}: {exc}") from exc
            summary["report"] = str(report)
    except AssayError as exc:
        typer.echo(f"error: {one_line(str(exc))}", err=True)
        raise typer.Exit(2) from None
    if json_output:
        typer.echo(json.dumps(summary, indent=2))
    else:
        typer.echo(_summary_text(summary, out, report))
    if summary["bad_rows"]:
        raise typer.Exit(EXIT_ERROR)


def _summary_text(summary: dict, out, report) -> str:
    lines = [
        f"decisions       {summary['decisions']:,}" + (" (interrupted)" if summary["interrupted"] else ""),
        f"violating pairs {summary['pairs']:,}",
        f"flagged         {summary['flagged']:,}",
        f"latency         p50 {summary['latency_ms_p50']:.4f} ms, p99 {summary['latency_ms_p99']:.4f} ms per decision "
        f"(batches of {summary['batch_size']}, index {summary['index']})",
        f"peak memory     {summary['peak_memory_mb']:.0f} MB",
    ]
    if out is not None:
        lines.append(f"witnesses       {out}")
    if report is not None:
        lines.append(f"report          {report}")
    if summary["bad_rows"]:
        stopped = f", stopped at line {summary['stopped_at']} (--stop-on-error)" if summary["stopped_at"] else ""
        lines.append(f"bad rows        {summary['bad_rows']:,} left out (see the error lines){stopped}")
    return "\n".join(lines)


def _post(stream, url, monitor_name, token, decision_column, drop, batch_size, json_output, local_options) -> None:
    """``--post``: stream the file into a running server (assay.serve.post_stream) and print what it answered.

    Options of a local monitor (``local_options``: ε, metric, index, outputs) have no effect on the
    server's monitor; given with ``--post`` they are refused rather than silently ignored.
    """
    try:
        if local_options:
            raise UnsupportedError(f"{', '.join(local_options)} cannot be used with --post: the server's monitor "
                                   f"{monitor_name!r} has its own ε, metric and index, and keeps the witnesses (read them from "
                                   f"{url.rstrip('/')}/api/monitors/{monitor_name}/violations); leave "
                                   f"{'it' if len(local_options) == 1 else 'them'} out")
        if batch_size < 1:
            raise UnsupportedError(f"--batch-size must be ≥ 1; got {batch_size}")
        from assay.serve import post_stream

        dropped = tuple(column.strip() for column in drop.split(",") if column.strip())
        result = post_stream(stream, url, monitor_name, token=token, decision_column=decision_column, drop=dropped,
                             batch_size=batch_size)
    except AssayError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    if json_output:
        typer.echo(json.dumps(result.to_json(), indent=2))
        return
    ids = "" if result.first_id is None else f" (ids {result.first_id}–{result.last_id})"
    typer.echo(f"posted          {result.decisions:,} decisions to {url} monitor {monitor_name!r}{ids}\n"
               f"flagged         {result.flagged:,}")
