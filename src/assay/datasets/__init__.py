"""Loaders for the data files assay's analyses read.

* :func:`load_tabular` reads a training table — a CSV with a header, or one of the authors'
  ``.npy`` splits (CAV 2023) — and the inputs to certify into a :class:`TabularData`, for
  :mod:`assay.fairness.knn`. :func:`read_csv` is its checked CSV reader.

Decision streams for the monitor are read by :func:`assay.monitor.stream.read_stream`.
"""

from assay.datasets.tabular import TabularData, load_tabular, read_csv

__all__ = ["TabularData", "load_tabular", "read_csv"]
