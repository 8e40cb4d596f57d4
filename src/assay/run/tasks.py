"""`run_tasks`: run independent jobs and return their results in the order of the items.

Three backends, one contract:

* ``workers=1`` (or a single item): a plain loop in this process, no pool.
* ``workers=N``: a local :class:`concurrent.futures.ProcessPoolExecutor` with the ``spawn`` start
  method (safe with torch's thread pools, identical on Linux, macOS and Windows).

Either way every worker runs torch, OpenMP and BLAS with one thread (:func:`one_thread`), so
N workers use N cores and timings stay comparable between jobs. Threads that spin while another
process holds the core cost dearly on shared machines: ACAS Xu 3_3 property 9 took 45.8 s with
two busy processes beside it and torch's default threads, 5.8 s with one thread.
* ``scheduler="tcp://host:port"``: a Dask cluster (see :mod:`assay.run._dask`).

Failures: an exception raised by ``function`` stops the run (pending jobs are cancelled) and is
re-raised as a :class:`TaskError` naming the item, with the original as ``__cause__``. When the
original is an :class:`~assay.errors.AssayError` (a bad input, not a bug), the raised error is a
:class:`TaskInputError`, itself an ``AssayError``, so the CLI reports it as one ``error:`` line.

Ctrl-C: pending jobs are cancelled, running local workers are terminated, and
:class:`TasksInterrupted` (a ``KeyboardInterrupt``) is raised carrying the results finished so far.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import signal
from collections.abc import Callable, Iterable
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait

from assay._validate import check_int
from assay.errors import AssayError, OptionError
from assay.run._progress import task_bar, wanted

__all__ = ["run_tasks", "TaskError", "TaskInputError", "TasksInterrupted"]

_LABEL_LIMIT = 160


class TaskError(RuntimeError):
    """A job raised; ``index`` and ``item`` say which, ``__cause__`` is the original exception.

    ``results`` and ``done`` hold what had finished (as in :class:`TasksInterrupted`), so that a
    caller can keep it.
    """

    def __init__(self, message: str, index: int, item):
        super().__init__(message)
        self.index = index
        self.item = item
        self.results: list | None = None
        self.done: list[bool] | None = None


class TaskInputError(TaskError, AssayError):
    """A job raised an :class:`~assay.errors.AssayError` (bad input): reported like any user error."""


class TasksInterrupted(KeyboardInterrupt):
    """Ctrl-C stopped the run. ``results[i]`` is item i's result where ``done[i]``, else None."""

    def __init__(self, results: list, done: list[bool]):
        super().__init__(f"interrupted after {sum(done)} of {len(done)} tasks")
        self.results = results
        self.done = done


def run_tasks(
    function: Callable,
    items: Iterable,
    *,
    workers: int | None = None,
    scheduler: str | None = None,
    progress: bool = True,
    description: str = "",
    label: Callable[[object], str] | None = None,
) -> list:
    """Call ``function(item)`` for every item, possibly in parallel; return the results in item order.

    Args:
        function: a module-level function (it is pickled to the workers) of one argument.
        items: the arguments (picklable).
        workers: local processes; None means ``os.cpu_count()``; 1 runs in this process (with
            one thread for torch, OpenMP and BLAS while the jobs run, as in a pool worker).
            Not used with ``scheduler`` (the cluster has its own workers).
        scheduler: address of a Dask scheduler (e.g. ``"tcp://10.0.0.5:8786"``); None runs locally.
        progress: show a progress bar on stderr when it is a terminal (never otherwise).
        description: the bar's label.
        label: names an item in error messages (default: its shortened ``repr``).

    Returns:
        ``[function(item) for item in items]``, computed by the chosen backend.

    Raises:
        TaskInputError: a job raised an :class:`~assay.errors.AssayError` (pending jobs cancelled).
        TaskError: a job raised any other exception (pending jobs cancelled).
        TasksInterrupted: Ctrl-C; carries the finished results.
        AssayError: the scheduler cannot be reached; OptionError for bad options.
    """
    if not callable(function):
        raise OptionError(f"the `function` argument of run_tasks must be callable; got {type(function).__name__}")
    items = list(items)
    if scheduler is not None and workers is not None:
        raise OptionError("run_tasks takes `workers` (a local pool) or `scheduler` (a Dask cluster), not both")
    if workers is None and scheduler is None:
        workers = os.cpu_count() or 1
    if workers is not None:
        check_int(workers, "workers", "run_tasks", minimum=1)
    if scheduler is not None and not isinstance(scheduler, str):
        raise OptionError(f"the `scheduler` option of run_tasks must be an address string like "
                          f"'tcp://host:8786'; got {scheduler!r}")
    name = label or _default_label
    if not items:
        return []
    results: list = [None] * len(items)
    done = [False] * len(items)
    with task_bar(len(items), description, wanted(progress)) as advance:

        def record(index, value):
            results[index] = value
            done[index] = True
            advance()

        def failure(index, exc) -> TaskError:
            return _task_error(index, items[index], name, exc)

        try:
            if scheduler is not None:
                from assay.run._dask import run_on_cluster

                run_on_cluster(function, items, scheduler, record, failure)
            elif min(workers, len(items)) == 1:
                _run_in_process(function, items, record, failure)
            else:
                _run_on_pool(function, items, min(workers, len(items)), record, failure)
        except TasksInterrupted:
            raise
        except TaskError as error:
            error.results, error.done = results, done
            raise
        except KeyboardInterrupt:
            raise TasksInterrupted(results, done) from None
    return results


def _default_label(item) -> str:
    text = repr(item)
    return text if len(text) <= _LABEL_LIMIT else text[:_LABEL_LIMIT - 1] + "…"


def _task_error(index: int, item, name, exc: BaseException) -> TaskError:
    try:
        described = name(item)
    except Exception:  # a broken label function must not hide the job's own error
        described = _default_label(item)
    kind = TaskInputError if isinstance(exc, AssayError) else TaskError
    reason = str(exc) if isinstance(exc, AssayError) else f"{type(exc).__name__}: {exc}"
    error = kind(f"task {index} ({described}) failed: {reason}", index, item)
    error.__cause__ = exc
    return error


def _run_in_process(function, items, record, failure):
    with one_thread():
        for index, item in enumerate(items):
            try:
                value = function(item)
            except Exception as exc:
                raise failure(index, exc) from exc
            record(index, value)


@contextlib.contextmanager
def one_thread():
    """Run the block with one thread for torch, OpenMP and BLAS (OpenBLAS, MKL); restore after.

    Environment variables alone do not do it: OpenMP and BLAS read them when they are loaded,
    which happened long before a job runs; threadpoolctl resizes their pools at run time.
    """
    from threadpoolctl import threadpool_limits

    from assay.threads import torch_threads

    with torch_threads(1), threadpool_limits(limits=1):
        yield


def _init_worker(threads: int) -> None:
    """Runs first in every pool worker: Ctrl-C is the parent's business; one thread per worker."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    # For libraries loaded later in this process; those already loaded are resized below.
    for variable in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        os.environ[variable] = str(threads)
    import torch
    from threadpoolctl import threadpool_limits

    torch.set_num_threads(threads)
    threadpool_limits(limits=threads)  # kept for the worker's life


def _run_on_pool(function, items, workers, record, failure):
    context = multiprocessing.get_context("spawn")
    executor = ProcessPoolExecutor(max_workers=workers, mp_context=context, initializer=_init_worker, initargs=(1,))
    clean = False
    try:
        pending = {executor.submit(function, item): index for index, item in enumerate(items)}
        while pending:
            finished, _ = wait(pending, return_when=FIRST_COMPLETED)
            for future in finished:
                index = pending.pop(future)
                try:
                    value = future.result()
                except Exception as exc:
                    raise failure(index, exc) from exc
                record(index, value)
        clean = True
    finally:
        if clean:
            executor.shutdown(wait=True)
        else:
            _stop(executor)


def _stop(executor: ProcessPoolExecutor) -> None:
    """Cancel what has not started and terminate the workers that are still running jobs."""
    processes = list((getattr(executor, "_processes", None) or {}).values())
    executor.shutdown(wait=False, cancel_futures=True)
    for process in processes:
        if process.is_alive():
            process.terminate()
    for process in processes:
        process.join(timeout=5)
