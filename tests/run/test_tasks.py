"""run_tasks: item order, errors naming the item, Ctrl-C, the same results on every backend."""

from __future__ import annotations

import socket

import pytest

from assay.errors import AssayError, OptionError
from assay.run import TaskError, TaskInputError, TasksInterrupted, run_tasks
from tests.requirements import require
from tests.run import jobs


def test_in_process_results_follow_item_order():
    assert run_tasks(jobs.square, [3, 1, 2], workers=1, progress=False) == [9, 1, 4]


def test_empty_items_give_an_empty_list_without_a_pool():
    assert run_tasks(jobs.square, [], workers=4) == []


def test_pool_results_follow_item_order_even_when_finished_out_of_order():
    # The first item takes longest: a pool of 2 finishes it last, yet it comes back first.
    items = [(1, 0.6), (2, 0.0), (3, 0.0), (4, 0.0)]
    pooled = run_tasks(jobs.square_after_delay, items, workers=2, progress=False)
    assert pooled == run_tasks(jobs.square_after_delay, items, workers=1, progress=False) == [1, 4, 9, 16]


def test_pool_workers_run_torch_with_one_thread():
    results = run_tasks(jobs.torch_threads, range(4), workers=2, progress=False)
    assert {threads for threads, _ in results} == {1}
    import os

    assert os.getpid() not in {pid for _, pid in results}


@pytest.mark.parametrize("workers", [1, 2])
def test_a_failing_job_is_reraised_naming_the_item(workers):
    with pytest.raises(TaskError, match=r"task 3 \(3\) failed: ValueError: three is not allowed") as caught:
        run_tasks(jobs.fail_on_three, range(6), workers=workers, progress=False)
    assert not isinstance(caught.value, AssayError)  # a bug stays a bug, with its traceback
    assert isinstance(caught.value.__cause__, ValueError)
    assert caught.value.index == 3 and caught.value.item == 3


def test_a_job_with_bad_input_is_an_assay_error_and_uses_the_label():
    with pytest.raises(TaskInputError, match=r"task 2 \(row two\) failed: row 2 has NaN") as caught:
        run_tasks(jobs.bad_input_on_two, range(4), workers=1, label=lambda v: f"row {['zero', 'one', 'two', 'three'][v]}")
    assert isinstance(caught.value, AssayError)


@pytest.mark.parametrize("workers", [1, 2])
def test_ctrl_c_returns_the_finished_results(workers):
    with pytest.raises(TasksInterrupted) as caught:
        run_tasks(jobs.interrupt_on_two, range(3), workers=workers, progress=False)
    interrupted = caught.value
    assert isinstance(interrupted, KeyboardInterrupt)
    assert interrupted.done[2] is False
    if workers == 1:  # in process, items run in order
        assert interrupted.done == [True, True, False] and interrupted.results[:2] == [0, 1]
    for done, result, expected in zip(interrupted.done, interrupted.results, range(3)):
        assert result == (expected if done else None)


@pytest.mark.parametrize(
    "options, message",
    [
        ({"workers": 0}, "`workers` option of run_tasks must be an int ≥ 1"),
        ({"workers": 2, "scheduler": "tcp://127.0.0.1:8786"}, "not both"),
        ({"workers": None, "scheduler": 8786}, "address string"),
    ],
)
def test_bad_options_are_option_errors(options, message):
    with pytest.raises(OptionError, match=message):
        run_tasks(jobs.square, [1], **options)


def test_not_callable_is_an_option_error():
    with pytest.raises(OptionError, match="callable"):
        run_tasks(42, [1])


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_unreachable_scheduler_is_a_clear_error():
    address = f"tcp://127.0.0.1:{_closed_port()}"
    with pytest.raises(AssayError, match="cannot reach the Dask scheduler.*dask scheduler"):
        run_tasks(jobs.square, [1, 2], scheduler=address)


def test_scheduler_address_without_port_is_a_clear_error():
    with pytest.raises(AssayError, match="needs a host and a port"):
        run_tasks(jobs.square, [1, 2], scheduler="tcp://localhost")


@pytest.fixture(scope="module")
def dask_address():
    distributed = require("distributed")
    with distributed.LocalCluster(n_workers=1, threads_per_worker=1, processes=False, protocol="tcp",
                                  host="127.0.0.1", dashboard_address=None) as cluster:
        yield cluster.scheduler_address


def test_dask_cluster_gives_the_same_results_in_order(dask_address):
    items = [(1, 0.05), (2, 0.0), (3, 0.0)]
    assert dask_address.startswith("tcp://")
    on_cluster = run_tasks(jobs.square_after_delay, items, scheduler=dask_address, progress=False)
    assert on_cluster == run_tasks(jobs.square_after_delay, items, workers=1, progress=False) == [1, 4, 9]


def test_dask_job_failures_name_the_item(dask_address):
    with pytest.raises(TaskError, match=r"task 3 \(3\) failed: ValueError") as caught:
        run_tasks(jobs.fail_on_three, range(5), scheduler=dask_address, progress=False)
    assert isinstance(caught.value.__cause__, ValueError)


def test_public_surface():
    import assay.run

    assert assay.run.__all__ == ["run_tasks", "TaskError", "TaskInputError", "TasksInterrupted"]


@pytest.mark.parametrize("workers", [1, 2])
def test_every_worker_runs_one_thread_for_torch_openmp_and_blas(workers):
    """--workers N promises N cores: one thread per worker for torch, OpenMP and BLAS alike
    (also in this process with workers=1), and this process's own setting comes back afterwards."""
    import torch

    before = torch.get_num_threads()
    seen = run_tasks(jobs.thread_counts, range(4), workers=workers, progress=False)
    assert all(torch_threads == 1 and pools in ([1], []) for torch_threads, pools in seen), seen
    assert torch.get_num_threads() == before
