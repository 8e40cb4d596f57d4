"""Module-level jobs for the run_tasks tests (spawned workers import them by name)."""

from __future__ import annotations

import os
import time

from assay.errors import DataError


def square_after_delay(item):
    """Sleeps longer for smaller items, so that a pool finishes them out of order."""
    value, delay = item
    time.sleep(delay)
    return value * value


def square(value):
    return value * value


def fail_on_three(value):
    if value == 3:
        raise ValueError("three is not allowed")
    return value


def bad_input_on_two(value):
    if value == 2:
        raise DataError("row 2 has NaN in column 'age'")
    return value


def interrupt_on_two(value):
    if value == 2:
        raise KeyboardInterrupt
    return value


def torch_threads(_):
    import torch

    return torch.get_num_threads(), os.getpid()


def thread_counts(_item):
    """The threads a job sees: torch's, and every OpenMP / BLAS pool's."""
    import torch
    from threadpoolctl import threadpool_info

    return torch.get_num_threads(), sorted({pool["num_threads"] for pool in threadpool_info()})
