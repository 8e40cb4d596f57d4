"""Exact runtime monitoring of robustness and individual fairness (Clemont, KDD 2025).

>>> from assay.monitor import Monitor
>>> monitor = Monitor(epsilon=0.1, metric="linf")
>>> monitor.observe([0.0, 0.0], "approve").count
0
>>> monitor.observe([0.05, 0.1], "deny").ids.tolist()   # d = 0.1 ≤ ε: closed ball
[0]

See :class:`Monitor` for the semantics, :mod:`assay.monitor.frnn` for the index backends and
their protocol, and :func:`monitor_stream` to monitor a whole CSV, Parquet or JSON-lines stream.
"""

from assay.monitor.frnn import BACKENDS, FrnnIndex, choose_backend, make_index
from assay.monitor.monitor import Monitor, MonitorConfig, MonitorStats, load_checkpoint, save_checkpoint
from assay.monitor.stream import StreamRun, monitor_stream
from assay.monitor.witnesses import Witnesses

__all__ = [
    "Monitor",
    "MonitorConfig",
    "MonitorStats",
    "Witnesses",
    "FrnnIndex",
    "BACKENDS",
    "choose_backend",
    "make_index",
    "save_checkpoint",
    "load_checkpoint",
    "monitor_stream",
    "StreamRun",
]
