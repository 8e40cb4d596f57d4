"""The service's monitors: one :class:`assay.monitor.Monitor` per name, kept in step with a store.

:class:`MonitorHub` owns the monitors and the :class:`~assay.serve.storage.Store`. Its contract:

* :meth:`MonitorHub.submit` runs a group of posts through their monitors in order, then commits
  every accepted decision *and* its witnesses in one transaction, and only then returns — the
  service acknowledges after that. A post that is malformed (wrong width, NaN, a missing column)
  gets its :class:`~assay.errors.DataError` and changes nothing; the others in the group go on.
* A post may carry an idempotency key: its decisions, witnesses, key and answer are committed in
  one transaction, and a later post with the same key (a retry, even after a restart or a
  ``kill -9``) is answered with the stored answer and stores nothing (:class:`Accepted` with
  ``replayed``); the same key with another body is refused (:class:`IdempotencyKeyReusedError`).
* If the commit fails, the monitors it touched are rebuilt from the store (so memory never holds
  a decision the store lacks) and every post of the group gets the :class:`StoreError`.
* On start (:meth:`MonitorHub.open`) each monitor is rebuilt from its latest snapshot (a
  :meth:`Monitor.save` checkpoint kept in the store every ``snapshot_every`` decisions) plus the
  decisions stored after it. Every index is exact, so the rebuilt monitor answers as the one
  that crashed: the witnesses after a restart equal those of an uninterrupted run.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import re
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import NamedTuple

from assay._validate import check_choice, check_float, check_int
from assay.errors import AssayError, DataError, OptionError
from assay.monitor import Monitor, MonitorStats
from assay.serve.payload import DECISION_TYPES, decision_type_of, parse_decisions
from assay.serve.storage import Store, StoredBatch, StoreError

__all__ = ["MonitorSpec", "MonitorHub", "Post", "Accepted", "UnknownMonitorError", "MonitorExistsError",
           "IdempotencyKeyReusedError", "DEFAULT_SNAPSHOT_EVERY"]

_log = logging.getLogger("assay.serve")

#: Decisions between two snapshots: a restart replays at most this many (≈ 1 s of replay).
DEFAULT_SNAPSHOT_EVERY = 100_000

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")


class UnknownMonitorError(AssayError):
    """No monitor of that name exists on this server."""


class MonitorExistsError(AssayError):
    """A monitor of that name exists with other options."""


class IdempotencyKeyReusedError(AssayError):
    """A post reuses the idempotency key of an earlier post with another body."""


class Post(NamedTuple):
    """One post for :meth:`MonitorHub.submit`: the monitor, the decoded JSON body, and optionally an
    idempotency key with a fingerprint of the body (None: computed from ``body``)."""

    name: str
    body: object
    key: str | None = None
    fingerprint: str | None = None


@dataclass(frozen=True)
class Accepted:
    """The answer to an accepted post: ids ``first_id`` … ``first_id + accepted − 1`` and the flagged
    decisions' witnesses (``Witnesses.to_json()`` dicts). ``replayed``: the answer of an earlier post
    with the same idempotency key, given again (nothing was stored this time)."""

    monitor: str
    first_id: int
    accepted: int
    flagged: list[dict] = field(default_factory=list)
    replayed: bool = False

    def to_json(self) -> dict:
        return {"monitor": self.monitor, "first_id": self.first_id, "accepted": self.accepted, "flagged": self.flagged}

    @classmethod
    def from_json(cls, data: dict, replayed: bool = False) -> "Accepted":
        return cls(data["monitor"], data["first_id"], data["accepted"], data["flagged"], replayed)


def fingerprint_of(body) -> str:
    """A digest of a decoded body (for posts made through the Python API; the app digests the raw bytes)."""
    return "json-sha256:" + hashlib.sha256(json.dumps(body, sort_keys=True, allow_nan=True).encode()).hexdigest()


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
        decision_type: ``"string"``, ``"number"`` or ``"boolean"``: the only type of decision the
            monitor takes; None: the type of the first decision posted (and kept).
    """

    name: str
    epsilon: float
    metric: str = "linf"
    decision_column: str = "prediction"
    index: str = "auto"
    max_witnesses: int | None = None
    features: tuple[str, ...] | None = None
    image_shape: tuple[int, ...] | None = None
    decision_type: str | None = None

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
            if len(shape) not in (2, 3) or not all(isinstance(s, int) and not isinstance(s, bool) and 1 <= s <= 65536
                                                     for s in shape) or (len(shape) == 3 and shape[2] not in (1, 3)):
                raise OptionError(f"the `image_shape` of a served monitor must be (height, width) or (height, width, 1 or 3), "
                                  f"sides 1 to 65536; got {self.image_shape!r}")
            object.__setattr__(self, "image_shape", shape)
        if self.features is not None and self.image_shape is not None and len(self.features) != math.prod(self.image_shape):
            raise OptionError(f"image_shape {self.image_shape} has {math.prod(self.image_shape)} pixels but the monitor "
                              f"has {len(self.features)} features")
        if self.decision_type is not None:
            check_choice(self.decision_type, "decision_type", "a served monitor", DECISION_TYPES)
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
        known = {"name", "epsilon", "metric", "decision_column", "index", "max_witnesses", "features", "image_shape",
                 "decision_type"}
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
        """Equal options, where features and the decision type learned from the first post do not count as a difference."""
        mine, theirs = self.to_json(), other.to_json()
        for learned in ("features", "decision_type"):
            if mine[learned] is None or theirs[learned] is None:
                mine[learned] = theirs[learned] = None
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
    def submit(self, posts: list[Post | tuple]) -> list[Accepted | AssayError]:
        """Run ``posts`` (:class:`Post`, or ``(name, body)``) in order; commit; return each one's answer or error.

        Returns only after the accepted decisions are committed. Errors are returned, not
        raised, except a failed commit, which raises :class:`StoreError` for the whole group.
        A keyed post whose key the store (or this group) holds already gets that post's answer,
        ``replayed``, and stores nothing.
        """
        with self._lock:
            results: list = []
            batches: list[StoredBatch] = []
            touched: dict[str, MonitorSpec] = {}
            keyed: dict[tuple[str, str], tuple[str, Accepted]] = {}  # keys of this group: (fingerprint, answer)
            received = time.time()
            try:
                for post in map(_as_post, posts):
                    name = post.name
                    try:
                        if post.key is not None:
                            earlier = keyed.get((name, post.key)) or self._stored_answer(name, post.key)
                            if earlier is not None:
                                results.append(_replay(post, *earlier))
                                continue
                        if name in self._stale:  # a failed commit whose rebuild failed too: try again now
                            self._entries[name] = self._rebuild(self._stale[name])
                            del self._stale[name]
                        entry = self._entry(name)
                        parsed = parse_decisions(post.body, entry.spec, entry.monitor.dim)
                        rows = parsed.rows
                        pixels = None if entry.spec.image_shape is None else math.prod(entry.spec.image_shape)
                        if pixels is not None and rows.shape[0] and rows.shape[1] != pixels:
                            raise DataError(f"the inputs have {rows.shape[1]} features but the monitor's images "
                                            f"{tuple(entry.spec.image_shape)} have {pixels} pixels")
                        spec = entry.spec
                        if parsed.features is not None and spec.features is None:
                            spec = replace(spec, features=parsed.features)
                        if parsed.decision_type is not None and spec.decision_type is None:
                            spec = replace(spec, decision_type=parsed.decision_type)
                        first_id = entry.monitor.stats.decisions
                        touched.setdefault(name, entry.spec)  # the options before this group, to rebuild with
                        found = entry.monitor.observe_batch(rows, parsed.outputs)  # checks everything before recording
                    except AssayError as exc:
                        results.append(exc)
                        continue
                    entry.spec = spec
                    answer = Accepted(name, first_id, rows.shape[0], [w.to_json() for w in found if w.flagged])
                    batch = StoredBatch(name, first_id, rows, parsed.outputs, received, answer.flagged)
                    if post.key is not None:
                        keyed[(name, post.key)] = (post.fingerprint, answer)
                        batch = replace(batch, key=post.key, fingerprint=post.fingerprint, answer=answer.to_json())
                    batches.append(batch)
                    results.append(answer)
                for name in touched:
                    entry = self._entries[name]
                    if entry.spec != touched[name]:  # features or decision type learned: kept with the options
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

    def _stored_answer(self, name: str, key: str) -> tuple[str, Accepted] | None:
        self._entry(name)  # an unknown monitor is refused as such, not looked up
        found = self.store.post(name, key)
        return None if found is None else (found[0], Accepted.from_json(found[1]))

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
        if spec.decision_type is None and monitor.stats.decisions:
            # A store written before decision types: the first decision's type holds from now on.
            first = self.store.decision(spec.name, 0)
            if first is not None and decision_type_of(first[1]) is not None:
                spec = replace(spec, decision_type=decision_type_of(first[1]))
        return _Entry(spec, monitor, snapshot_at)

    def close(self) -> None:
        self.store.close()



def _as_post(post) -> Post:
    post = post if isinstance(post, Post) else Post(*post)
    if post.key is not None and post.fingerprint is None:
        post = post._replace(fingerprint=fingerprint_of(post.body))
    return post


def _replay(post: Post, fingerprint: str, answer: Accepted) -> Accepted:
    if fingerprint != post.fingerprint:
        raise IdempotencyKeyReusedError(f"the Idempotency-Key {post.key!r} was used for another body before (its post "
                                        f"was stored as decisions {answer.first_id}–{answer.first_id + answer.accepted - 1}); "
                                        "use a new key for a new post")
    return replace(answer, replayed=True)
