"""Loading the monitor's compiled kernels ahead of their first use, and compiling them once, visibly.

The hash-grid and brute-force indexes run numba kernels. numba compiles a kernel the first time it
is called with a new signature and keeps the machine code in its cache (``__pycache__`` beside the
sources, or the user's cache folder when that is read-only, or ``NUMBA_CACHE_DIR``); later
processes load it from there in about a second. :func:`warm_up` does that first call on a tiny
index — the calls, and so the signatures, that the monitor makes, and no others — so that no
decision (and no request of ``assay serve``) waits for the compiler. ``assay warmup`` runs it at
set-up (``make demo`` and ``make test`` do); otherwise the first job that needs the kernels runs
it and says so on stderr, once.
"""

from __future__ import annotations

import sys
import time

__all__ = ["warm_up", "kernels_cached", "cache_location", "seconds_spent", "COMPILE_MESSAGE"]

#: What a process prints on stderr before compiling the kernels (``{seconds}``: the estimate).
COMPILE_MESSAGE = "compiling the monitor's kernels once (about {seconds} s); later runs start at once"

# The grid's cold compile: about 21 CPU seconds (a cold `assay monitor` on 100,000 × 12 rows took
# 25.4 CPU s, 3.8 of them the job; see README, Benchmarks). A loaded machine stretches the wall time.
_COMPILE_SECONDS = 20

_warmed: set[tuple[str, str]] = set()
_spent = [0.0]
_announced: list[str] = []


def seconds_spent() -> float:
    """Seconds this process has spent in :func:`warm_up` (loading or compiling kernels): one-off time, not work."""
    return _spent[0]


def _main_kernel(index: str):
    """The largest kernel an index runs: the grid's and brute force's query-then-insert loop, else the pair check."""
    if index in ("grid", "brute"):
        from assay.monitor.frnn import _cells

        return _cells.observe_rows
    from assay.monitor import _kernels

    return _kernels.verify_pairs


def kernels_cached(index: str = "grid") -> bool | None:
    """Whether numba's cache holds ``index``'s kernels for this numba and these sources (None: cannot tell)."""
    try:
        return bool(_main_kernel(index)._cache._cache_file._load_index())
    except Exception:  # numba's cache internals differ (another numba version), or numba is absent
        return None


def cache_location() -> str | None:
    """The folder where numba keeps the monitor's compiled kernels (None: numba absent or caching off)."""
    try:
        return str(_main_kernel("grid")._cache.cache_path)
    except Exception:
        return None


def warm_up(metric: str = "linf", index: str = "grid", *, announce: bool = True, stream=None) -> float:
    """Load (compiling on first use) the kernels a monitor with this metric and index runs; return the seconds it took.

    Runs a tiny monitor through what the real one does: a batch (with a re-fit of the grid's
    cells) and a single decision, and moves a history into a new index. Index names whose kernels are
    not compiled (``scan``) and ``partition`` (whose sub-indexes run in other processes) need
    nothing; ``auto`` warms the index it moves to. Once per process per (metric, index). When numba must compile, prints
    :data:`COMPILE_MESSAGE` on ``stream`` (default stderr) first, unless ``announce`` is False.
    """
    import numpy as np

    from assay.monitor.frnn import choose_backend, make_index

    name = choose_backend(metric, 8) if index == "auto" else index
    if (metric, name) in _warmed or name in ("scan", "partition"):  # partition: its sub-indexes live in other processes
        return 0.0
    started = time.perf_counter()
    if announce and not _announced and kernels_cached(name) is False:
        _announced.append(name)  # one line per process, however many indexes compile
        print(COMPILE_MESSAGE.format(seconds=_COMPILE_SECONDS), file=stream or sys.stderr, flush=True)
    from assay.monitor.monitor import Monitor

    dim = 3
    rows = np.random.default_rng(0).random((12, dim))
    labels = np.arange(12) % 2
    options = {"min_fit": 4} if name == "grid" else {}  # a grid that re-fits its cells at 4 rows
    monitor = Monitor(0.1, metric, index=make_index(name, dim, metric, 0.1, **options))
    monitor.observe_batch(rows[:8], labels[:8])  # a batch: the fused loop, a re-fit of the cells
    monitor.observe(rows[8], labels[8])  # a single decision
    # What Monitor.prepare does when it moves a grown history into a new index.
    make_index(name, dim, metric, 0.1, **options).add_rows(rows, np.arange(12, dtype=np.int64), labels.astype(np.int64))
    _warmed.add((metric, name))
    seconds = time.perf_counter() - started
    _spent[0] += seconds
    return seconds
