"""Loaders for the data files assay's analyses read, and generated tasks for benchmarks.

* :func:`load_tabular` reads a training table — a CSV with a header, or one of the authors'
  ``.npy`` splits (CAV 2023) — and the inputs to certify into a :class:`TabularData`, for
  :mod:`assay.fairness.knn`. :func:`read_csv` is its checked CSV reader.
* :mod:`assay.datasets.online_tasks` builds the reproducible tasks of online verification
  (networks, input boxes that drift per time step, properties, weight-update sequences):
  :func:`motion_task` (:class:`MotionTask`, :func:`sgd_updates`, :func:`motion_spec`,
  :func:`motion_reparametrisation`, :func:`motion_velocities`) and :func:`digits_task`
  (:class:`DigitsTask`).

Every name is loaded on first use, so importing this package (or its light modules, such as
:mod:`assay.datasets.csv_rows`) imports neither numpy nor torch.

Decision streams for the monitor are read by :func:`assay.monitor.stream.read_stream`.
"""

from assay._lazy import lazy_names

_HOMES = {
    **{name: "assay.datasets.tabular" for name in ("TabularData", "load_tabular", "read_csv")},
    **{name: "assay.datasets.online_tasks"
       for name in ("MotionTask", "motion_task", "sgd_updates", "motion_spec", "motion_reparametrisation",
                    "motion_velocities", "DigitsTask", "digits_task")},
}

__all__ = [*_HOMES]

__getattr__, __dir__ = lazy_names(__name__, _HOMES)
