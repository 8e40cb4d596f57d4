"""Helpers shared by the benchmark scripts: data location, timing, JSON + markdown output."""

from __future__ import annotations

import json
import os
import platform
import statistics
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
RESULTS = REPO_ROOT / "benchmarks" / "results"


def data_dir() -> Path:
    """``$ASSAY_DATA`` or ``../shared/data`` beside the repository."""
    path = Path(os.environ["ASSAY_DATA"]) if os.environ.get("ASSAY_DATA") else REPO_ROOT.parent / "shared" / "data"
    if not path.is_dir():
        raise SystemExit(f"data folder {path} not found: set ASSAY_DATA or place ../shared/data beside the repository")
    return path


def median_seconds(function, repeats: int) -> tuple[float, list[float]]:
    """Run ``function`` once to warm up, then ``repeats`` times; return the median and all times."""
    function()
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        function()
        times.append(time.perf_counter() - started)
    return statistics.median(times), times


def machine() -> dict:
    import torch

    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "cpus": os.cpu_count(),
        "platform": platform.platform(),
    }


def write_results(name: str, payload: dict, table: str) -> tuple[Path, Path]:
    """Write ``results/<name>.json`` and ``results/<name>.md``; return both paths."""
    RESULTS.mkdir(parents=True, exist_ok=True)
    json_path = RESULTS / f"{name}.json"
    md_path = RESULTS / f"{name}.md"
    json_path.write_text(json.dumps(payload, indent=2))
    md_path.write_text(table)
    return json_path, md_path


def add_run_options(parser, name: str, time_limit: float) -> None:
    """The options every preimage benchmark shares: --time-limit, --threads, --name."""
    parser.add_argument("--time-limit", type=float, default=time_limit)
    parser.add_argument("--threads", type=int, default=1, help="torch threads (small tensors: 1 is fastest on a "
                        "shared machine)")
    parser.add_argument("--name", default=name, help="results file name in benchmarks/results/")


def markdown_table(header: list[str], rows: list[list]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for row in rows:
        lines.append("| " + " | ".join(str(cell) for cell in row) + " |")
    return "\n".join(lines) + "\n"
