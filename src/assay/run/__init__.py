"""Fan-out of many independent jobs: in process, on a local process pool, or on a Dask cluster.

:func:`run_tasks` is the one entry point. Every batch command (``assay verify --instances``,
benchmarks) calls it with a top-level (picklable) function and a list of items; results come back
in the order of the items, whichever backend ran them.
"""

from assay.run.tasks import TaskError, TaskInputError, TasksInterrupted, run_tasks

__all__ = ["run_tasks", "TaskError", "TaskInputError", "TasksInterrupted"]
