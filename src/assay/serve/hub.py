"""The service's monitors: one :class:`assay.monitor.Monitor` per name, kept in step with a store.

:class:`MonitorHub` owns the monitors and the :class:`~assay.serve.storage.Store`. Its contract:

* :meth:`MonitorHub.submit` runs a group of posts through their monitors in order, then commits
  every accepted decision *and* its witnesses in one transaction, and only then returns — the
  service acknowledges after that. A post that is malformed (wrong width, NaN, a missing column)
  gets its :class:`~assay.errors.DataError` and changes nothing; the others in the group go on.
* If the commit fails, the monitors it touched are rebuilt from the store (so memory never holds
  a decision the store lacks) and every post of the group gets the :class:`StoreError`.
* On start (:meth:`MonitorHub.open`) each monitor is rebuilt from its latest snapshot (a
  :meth:`Monitor.save` checkpoint kept in the store every ``snapshot_every`` decisions) plus the
  decisions stored after it. Every index is exact, so the rebuilt monitor answers as the one
  that crashed: the witnesses after a restart equal those of an uninterrupted run.
"""

from __future__ import annotations

import logging
import re
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import numpy as np

from assay._validate import check_choice, check_float, check_int
from assay.errors import AssayError, DataError, OptionError
from assay.monitor import Monitor, MonitorStats, Witnesses
from assay.serve.payload import parse_decisions
from assay.serve.storage import Store, StoredBatch, StoreError

__all__ = ["MonitorSpec", "MonitorHub", "UnknownMonitorError", "MonitorExistsError", "DEFAULT_SNAPSHOT_EVERY"]

_log = logging.getLogger("assay.serve")

#: Decisions between two snapshots: a restart replays at most this many (≈ 1 s of replay).
DEFAULT_SNAPSHOT_EVERY = 100_000

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")


class UnknownMonitorError(AssayError):
    """No monitor of that name exists on this server."""


class MonitorExistsError(AssayError):
    """A monitor of that name exists with other options."""


@dataclass(frozen=True)
class MonitorSpec:
    """The options of one served monitor, checked when built.

    Args:
        name: letters, digits, ``_ . -`` (≤ 64 characters); the monitor's path in the API.
        epsilon, metric, index, max_witnesses: the :class:`~assay.monitor.Monitor`'s options
            (ε ≥ 0; ``linf`` (the paper's default), ``l2``, ``l1``, ``cosine``).
        decision_column: in posts of records (``{"age": 41, ..., "prediction": "deny"}``), the
            key holding the decision; the other keys are the features.
        features: the feature names, in order, for posts of records; None: taken from the first
            record posted (and kept).
        image_shape: ``(height, width)`` or ``(height, width, channels)`` when inputs are images
            (the dashboard draws them); its product must equal the number of features.
    """

    name: str
    epsilon: float
    metric: str = "linf"
    decision_column: str = "prediction"
    index: str = "auto"
    max_witnesses: int | None = None
    features: tuple[str, ...] | None = None
    image_shape: tuple[int, ...] | None = None

    def __post_init__(self):
        if not isinstance(self.name, str) or not _NAME.match(self.name):
            raise OptionError(f"a monitor name must be 1–64 letters, digits, '_', '.' or '-' (starting with a letter or "
                              f"digit); got {self.name!r}")
        object.__setattr__(self, "epsilon", check_float(self.epsilon, "epsilon", "a served monitor", minimum=0.0))
        check_choice(self.metric, "metric", "a served monitor", ("linf", "l2", "l1", "cosine"))
        if not isinstance(self.decision_column, str) or not self.decision_column:
            raise OptionError(f"the `decision_column` of a served monitor must be a non-empty string; got {self.decision_column!r}")
        if self.max_witnesses is not None:
            check_int(self.max_witnesses, "max_witnesses", "a served monitor", minimum=0)
        if self.features is not None:
            features = tuple(self.features)
            if not features or not all(isinstance(f, str) and f for f in features) or len(set(features)) != len(features):
                raise OptionError(f"the `features` of a served monitor must be distinct non-empty names; got {self.features!r}")
            if self.decision_column in features:
                raise OptionError(f"the decision column {self.decision_column!r} cannot also be a feature")
            object.__setattr__(self, "features", features)
        if self.image_shape is not None:
            shape = tuple(self.image_shape)
            if len(shape) not in (2, 3) or not all(isinstance(s, int) and not isinstance(s, bool) and s >= 1 for s in shape) \
                    or (len(shape) == 3 and shape[2] not in (1, 3)):
                raise OptionError(f"the `image_shape` of a served monitor must be (height, width) or (height, width, 1 or 3); "
                                  f"got {self.image_shape!r}")
            object.__setattr__(self, "image_shape", shape)
        if self.features is not None and self.image_shape is not None and len(self.features) != int(np.prod(self.image_shape)):
            raise OptionError(f"image_shape {self.image_shape} has {int(np.prod(self.image_shape))} pixels but the monitor "
                              f"has {len(self.features)} features")
        Monitor(self.epsilon, self.metric, index=self.index, max_witnesses=self.max_witnesses)  # checks index and metric

    def to_json(self) -> dict:
        data = asdict(self)
        for key in ("features", "image_shape"):
            if data[key] is not None:
                data[key] = list(data[key])
        return data

    @classmethod
    def from_json(cls, data: dict) -> "MonitorSpec":
        if not isinstance(data, dict):
            raise OptionError(f"monitor options must be a JSON object; got {type(data).__name__}")
        known = {"name", "epsilon", "metric", "decision_column", "index", "max_witnesses", "features", "image_shape"}
        unknown = sorted(set(data) - known)
        if unknown:
            raise OptionError(f"unknown monitor option {unknown[0]!r}; the options are {', '.join(sorted(known))}")
        if "epsilon" not in data:
            raise OptionError("a monitor needs `epsilon` (the input radius ε)")
        values = dict(data)
        for key in ("features", "image_shape"):
            if isinstance(values.get(key), list):
                values[key] = tuple(values[key])
        return cls(**values)

    def new_monitor(self) -> Monitor:
        return Monitor(self.epsilon, self.metric, index=self.index, max_witnesses=self.max_witnesses)

    def same_options(self, other: "MonitorSpec") -> bool:
        """Equal options, where features learned from the first record do not count as a difference."""
        mine, theirs = self.to_json(), other.to_json()
        if mine["features"] is None or theirs["features"] is None:
            mine["features"] = theirs["features"] = None
        return mine == theirs


class _Entry:
    """A monitor, its options, and what the store holds of it (updated only after a commit)."""

    def __init__(self, spec: MonitorSpec, monitor: Monitor, snapshot_at: int):
        self.spec = spec
        self.monitor = monitor
        self.snapshot_at = snapshot_at
        self.committed = monitor.stats


class MonitorHub:
    """Monitors by name over one store (see the module docstring for the durability contract).

    Args:
        store: where decisions, witnesses and snapshots are kept.
        snapshot_every: write a snapshot of a monitor after this many decisions since its last one
            (≥ 1); a restart replays at most about this many decisions per monitor.
    """

    def __init__(self, store: Store, snapshot_every: int = DEFAULT_SNAPSHOT_EVERY):
        check_int(snapshot_every, "snapshot_every", "MonitorHub", minimum=1)
        self.store = store
        self.snapshot_every = snapshot_every
        self._lock = threading.RLock()
        self._entries: dict[str, _Entry] = {}
        self._stale: dict[str, MonitorSpec] = {}
        self.restored_seconds = 0.0
        started = time.perf_counter()
        for name, data in store.monitors().items():
            self._entries[name] = self._rebuild(MonitorSpec.from_json(data))
        self.restored_seconds = time.perf_counter() - started

    # -- monitors -------------------------------------------------------------------------
    def names(self) -> list[str]:
        return list(self._entries)

    def spec(self, name: str) -> MonitorSpec:
        return self._entry(name).spec

    def stats(self, name: str) -> MonitorStats:
        """Counts of the committed decisions of ``name``."""
        return self._entry(name).committed

    def create(self, spec: MonitorSpec) -> bool:
        """Add monitor ``spec.name``; True if created, False if it exists with the same options.

        Raises MonitorExistsError when it exists with other options.
        """
        with self._lock:
            entry = self._entries.get(spec.name)
            if entry is not None:
                if entry.spec.same_options(spec):
                    return False
                raise MonitorExistsError(f"the monitor {spec.name!r} exists with other options ({entry.spec.to_json()}); "
                                         "pick another name")
            self.store.save_monitor(spec.name, spec.to_json())
            self._entries[spec.name] = _Entry(spec, spec.new_monitor(), 0)
            return True

    def _entry(self, name: str) -> _Entry:
        entry = self._entries.get(name)
        if entry is None:
            known = ", ".join(sorted(self._entries)) or "none yet"
            raise UnknownMonitorError(f"no monitor named {name!r} on this server (monitors: {known}); create it with "
                                      f"PUT /api/monitors/{name}")
        return entry

    # -- decisions ------------------------------------------------------------------------
    def submit(self, posts: list[tuple[str, object]]) -> list[list[Witnesses] | AssayError]:
        """Run ``posts`` (monitor name, decoded JSON body) in order; commit; return each post's witnesses or error.

        Returns only after the accepted decisions are committed. Errors are returned, not
        raised, except a failed commit, which raises :class:`StoreError` for the whole group.
        """
        with self._lock:
            results: list = []
            batches: list[StoredBatch] = []
            touched: dict[str, MonitorSpec] = {}
            received = time.time()
            try:
                for name, body in posts:
                    try:
                        if name in self._stale:  # a failed commit whose rebuild failed too: try again now
                            self._entries[name] = self._rebuild(self._stale[name])
                            del self._stale[name]
                        entry = self._entry(name)
                        rows, outputs, features = parse_decisions(body, entry.spec, entry.monitor.dim)
                        pixels = None if entry.spec.image_shape is None else int(np.prod(entry.spec.image_shape))
                        if pixels is not None and rows.shape[0] and rows.shape[1] != pixels:
                            raise DataError(f"the inputs have {rows.shape[1]} features but the monitor's images "
                                            f"{tuple(entry.spec.image_shape)} have {pixels} pixels")
                        learned = features is not None and entry.spec.features is None
                        spec = replace(entry.spec, features=features) if learned else entry.spec
                        first_id = entry.monitor.stats.decisions
                        touched.setdefault(name, entry.spec)  # the options before this group, to rebuild with
                        found = entry.monitor.observe_batch(rows, outputs)  # checks everything before recording
                    except AssayError as exc:
                        results.append(exc)
                        continue
                    entry.spec = spec
                    batches.append(StoredBatch(name, first_id, rows, outputs, received,
                                               [w.to_json() for w in found if w.flagged]))
                    results.append(found)
                for name in touched:
                    entry = self._entries[name]
                    if entry.spec.features is not None and touched[name].features is None:
                        self.store.save_monitor(name, entry.spec.to_json())
                if batches:
                    self.store.commit(batches)
            except BaseException:
                # Memory must not hold what the store lacks: rebuild what this group touched. If the
                # store cannot be read either, the monitor is set aside and rebuilt on its next use.
                for name, before in touched.items():
                    try:
                        self._entries[name] = self._rebuild(before)
                    except Exception:
                        self._stale[name] = before
                        self._entries[name].monitor = None
                raise
            for name in touched:
                entry = self._entries[name]
                entry.committed = entry.monitor.stats
                if entry.committed.decisions - entry.snapshot_at >= self.snapshot_every:
                    self._snapshot(name, entry)
            return results

    def _snapshot(self, name: str, entry: _Entry) -> None:
        """Keep a checkpoint of ``entry``'s monitor in the store; a failure is logged, not raised.

        The decisions are committed already: a snapshot only shortens the next restart, so a
        failed one must not turn an acknowledged post into an error (it is tried again later).
        """
        try:
            with tempfile.TemporaryDirectory(prefix="assay-snapshot-") as folder:
                path = entry.monitor.save(Path(folder) / "monitor.npz")
                data = path.read_bytes()
            self.store.save_snapshot(name, entry.monitor.stats.decisions, data)
        except (AssayError, OSError) as exc:
            _log.warning("could not snapshot monitor %r (the next restart replays more): %s", name, exc)
            return
        entry.snapshot_at = entry.monitor.stats.decisions

    def snapshot_all(self) -> None:
        """Snapshot every monitor with decisions since its last snapshot (at shutdown)."""
        with self._lock:
            for name, entry in self._entries.items():
                if entry.monitor is not None and entry.committed.decisions > entry.snapshot_at:
                    self._snapshot(name, entry)

    def _rebuild(self, spec: MonitorSpec) -> _Entry:
        """The monitor as the store holds it: the latest snapshot plus the decisions stored after it."""
        snapshot = self.store.snapshot(spec.name)
        monitor = None
        snapshot_at = 0
        if snapshot is not None:
            snapshot_at, data = snapshot
            with tempfile.TemporaryDirectory(prefix="assay-snapshot-") as folder:
                path = Path(folder) / "monitor.npz"
                path.write_bytes(data)
                monitor = Monitor.load(path)
            if monitor.stats.decisions != snapshot_at:
                raise StoreError(f"the snapshot of monitor {spec.name!r} in {self.store.url} covers "
                                 f"{monitor.stats.decisions} decisions but is recorded as {snapshot_at}")
        if monitor is None:
            monitor = spec.new_monitor()
        for ids, rows, outputs in self.store.iter_decisions(spec.name, monitor.stats.decisions):
            expected = monitor.stats.decisions
            if ids[0] != expected or ids[-1] != expected + ids.size - 1:
                raise StoreError(f"the store {self.store.url} misses decisions of monitor {spec.name!r} "
                                 f"(expected id {expected}, found {int(ids[0])})")
            monitor.observe_batch(rows, outputs)
        return _Entry(spec, monitor, snapshot_at)

    def close(self) -> None:
        self.store.close()

