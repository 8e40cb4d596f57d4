"""``assay monitor``: run the exact fairness / robustness monitor over a stream of decisions.

Reads a CSV, Parquet or JSON-lines stream (``-`` for CSV on stdin), feeds it to
:class:`assay.monitor.Monitor` in batches, optionally writes one JSON line per flagged decision,
and prints a summary: decisions, violating pairs, flagged decisions, per-decision latency
(p50/p99, amortised over each batch; ``--batch-size 1`` measures single decisions) and peak memory.
``--report report.html`` also writes a self-contained HTML summary (latency histogram, the most
witnessed flagged decisions).
Ctrl-C stops early and still prints the summary of what was monitored. Any
:class:`~assay.errors.AssayError` prints one ``error: ...`` line on stderr and exits with code 2.
"""

from __future__ import annotations

import heapq
import json
import resource
import sys
import time
from pathlib import Path

import numpy as np
import typer

from assay.errors import AssayError, DataError, UnsupportedError

__all__ = ["monitor"]


def _peak_memory_mb() -> float:
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / 1024.0 / (1024.0 if sys.platform == "darwin" else 1.0)


_TOP_FLAGGED = 25


def _run(stream, epsilon, metric, decision_column, drop, out, index, max_history, max_witnesses, batch_size, checkpoint, progress,
         keep_top=False):
    from assay.monitor import Monitor
    from assay.monitor.frnn import warm_up
    from assay.monitor.stream import read_stream

    monitor = Monitor(epsilon, metric, index=index, max_history=max_history, max_witnesses=max_witnesses, batch_size=max(batch_size, 1))
    latencies: list[np.ndarray] = []
    interrupted = False
    started = time.perf_counter()
    handle = open(out, "w", encoding="utf-8") if out is not None else None
    warmed = False
    top: list = []  # a min-heap of (count, -decision, record): the most-witnessed flagged decisions
    try:
        for chunk in read_stream(stream, decision_column, drop, chunk_size=batch_size):
            if not warmed:  # load the compiled kernels before timing, on a throwaway monitor
                warm_up(metric, chunk.features.shape[1]) if metric != "cosine" else None
                Monitor(epsilon, metric, index=index).observe_batch(chunk.features[:2], chunk.decisions[:2])
                warmed = True
            tic = time.perf_counter()
            found = monitor.observe_batch(chunk.features, chunk.decisions)
            elapsed = time.perf_counter() - tic
            latencies.append(np.full(len(found), elapsed / max(len(found), 1)))
            if handle is not None or keep_top:
                for offset, witnesses in enumerate(found):
                    if witnesses.flagged:
                        record = witnesses.to_json() | {"line": chunk.first_line + offset}
                        if handle is not None:
                            handle.write(json.dumps(record) + "\n")
                        if keep_top:
                            record["decision_value"] = chunk.decisions[offset].item() if hasattr(chunk.decisions[offset], "item") else chunk.decisions[offset]
                            item = (witnesses.count, -witnesses.decision, record)
                            if len(top) < _TOP_FLAGGED:
                                heapq.heappush(top, item)
                            elif item[:2] > top[0][:2]:
                                heapq.heapreplace(top, item)
            if progress is not None:
                progress(len(found), monitor.stats.flagged)
    except KeyboardInterrupt:
        interrupted = True
    finally:
        if handle is not None:
            handle.close()
    if checkpoint is not None:
        monitor.save(checkpoint)
    latency = np.concatenate(latencies) if latencies else np.zeros(0)
    stats = monitor.stats
    top_flagged = [record for _, _, record in sorted(top, key=lambda item: item[:2], reverse=True)]
    return latency, top_flagged, {
        "stream": str(stream),
        "decisions": stats.decisions,
        "pairs": stats.pairs,
        "flagged": stats.flagged,
        "epsilon": epsilon,
        "metric": metric,
        "index": type(monitor.index).name if monitor.index is not None else index,
        "latency_ms_p50": float(np.percentile(latency, 50) * 1e3) if latency.size else 0.0,
        "latency_ms_p99": float(np.percentile(latency, 99) * 1e3) if latency.size else 0.0,
        "latency_ms_mean": float(latency.mean() * 1e3) if latency.size else 0.0,
        "batch_size": batch_size,
        "seconds": time.perf_counter() - started,
        "peak_memory_mb": _peak_memory_mb(),
        "interrupted": interrupted,
        "witnesses_file": None if out is None else str(out),
    }


def monitor(
    stream: str = typer.Argument(..., help="Decision stream: CSV, Parquet (.parquet) or JSON lines (.jsonl); '-' reads CSV from stdin."),
    epsilon: float = typer.Option(..., "--epsilon", "-e", help="Inputs within this distance (≤ ε) are close."),
    metric: str = typer.Option("linf", "--metric", help="Input distance: linf, l2, l1 or cosine."),
    decision_column: str = typer.Option("prediction", "--decision-column", help="Column holding the model's decision."),
    drop: str = typer.Option("", "--drop", help="Comma-separated columns that are not input features (e.g. label)."),
    out: Path = typer.Option(None, "--out", help="Write one JSON line per flagged decision (its witnesses) here."),
    json_output: bool = typer.Option(False, "--json", help="Print the summary as JSON."),
    index: str = typer.Option("auto", "--index", help="Index backend: auto, grid, brute, kdtree, snn, bdd, partition or faiss."),
    max_history: int = typer.Option(None, "--max-history", help="Compare each decision with the last N decisions only."),
    max_witnesses: int = typer.Option(None, "--max-witnesses", help="List at most N witnesses per decision (counts stay exact)."),
    batch_size: int = typer.Option(256, "--batch-size", help="Decisions per batch (latency is amortised over a batch)."),
    checkpoint: Path = typer.Option(None, "--checkpoint", help="Save the monitor's state here at the end."),
    report: Path = typer.Option(None, "--report", help="Also write a self-contained HTML summary (latency histogram, top flagged decisions) here."),
) -> None:
    """Monitor a stream of decisions for pairs of close inputs with different decisions."""
    try:
        if batch_size < 1:
            raise UnsupportedError(f"--batch-size must be ≥ 1; got {batch_size}")
        dropped = tuple(column.strip() for column in drop.split(",") if column.strip())
        if sys.stderr.isatty() and not json_output:
            from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

            with Progress(SpinnerColumn(), TextColumn("{task.description}"), TextColumn("{task.completed:,} decisions"),
                          TextColumn("{task.fields[flagged]:,} flagged"), TimeElapsedColumn(), transient=True) as bar:
                task = bar.add_task(f"monitoring {stream}", total=None, flagged=0)
                latency, top_flagged, summary = _run(
                    stream, epsilon, metric, decision_column, dropped, out, index, max_history, max_witnesses,
                    batch_size, checkpoint, lambda n, flagged: bar.update(task, advance=n, flagged=flagged), report is not None)
        else:
            latency, top_flagged, summary = _run(stream, epsilon, metric, decision_column, dropped, out, index, max_history,
                                                 max_witnesses, batch_size, checkpoint, None, report is not None)
        if report is not None:
            from assay.monitor.report import write_report

            try:
                write_report(report, summary, latency, top_flagged)
            except OSError as exc:
                raise DataError(f"cannot write the report {report}: {exc}") from exc
            summary["report"] = str(report)
    except AssayError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    if json_output:
        typer.echo(json.dumps(summary, indent=2))
        return
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
    typer.echo("\n".join(lines))
