"""Durable storage of a monitoring service: SQLite in WAL mode (default) or PostgreSQL.

One schema, two dialects. A store holds, per monitor (a name):

* ``monitors``   the monitor's options (a :class:`~assay.serve.hub.MonitorSpec` as JSON);
* ``decisions``  every accepted decision: its id (0, 1, ... per monitor, the
  :class:`~assay.monitor.Monitor`'s own numbering), the time it was received, its input row
  (float64 bytes) and its decision (JSON, so labels keep their type);
* ``violations`` the witnesses of every flagged decision, as the monitor reported them;
* ``snapshots``  the latest checkpoint of the monitor (:meth:`assay.monitor.Monitor.save`), so
  that a restart replays only the decisions after it;
* ``posts``      the ``Idempotency-Key`` of every keyed post, a fingerprint of its body and the
  answer it got, so that a retried post is answered again instead of stored twice.

Durability contract: :meth:`Store.commit` writes decisions, their witnesses and the idempotency
keys of their posts in one transaction and returns only once it is committed (SQLite
``synchronous=FULL`` by default: the write-ahead log is on disk; PostgreSQL's own commit). The
service acknowledges a decision after that, so a crash (even ``kill -9``) never loses an acknowledged decision, never keeps a
decision without its witnesses, and never keeps a keyed post without its key (nor the reverse).

URLs: ``sqlite:///relative/path.db``, ``sqlite:////absolute/path.db``, a plain path (SQLite), or
``postgresql://user@host:port/dbname`` (psycopg 3; the ``postgres`` extra).
"""

from __future__ import annotations

import json
import sqlite3
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import numpy as np

from assay.errors import AssayError, OptionError

__all__ = ["Store", "SQLiteStore", "PostgresStore", "StoredBatch", "StoreError", "open_store"]


class StoreError(AssayError):
    """The database could not be opened, read or written (the message says which and why)."""


@dataclass(frozen=True, eq=False)
class StoredBatch:
    """Consecutive decisions of one monitor to commit together.

    ``rows`` float64 (n, d), ``outputs`` n JSON values, ids ``first_id`` … ``first_id + n − 1``,
    ``received`` the Unix time they arrived, ``violations`` one ``Witnesses.to_json()`` dict per
    flagged decision; ``key`` the post's ``Idempotency-Key`` (or None), kept with ``fingerprint``
    (of its body) and ``answer`` (the JSON the post was answered with).
    """

    monitor: str
    first_id: int
    rows: np.ndarray
    outputs: list
    received: float
    violations: list[dict]
    key: str | None = None
    fingerprint: str = ""
    answer: dict | None = None


_SCHEMA = """
CREATE TABLE IF NOT EXISTS monitors (name TEXT PRIMARY KEY, spec TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS decisions (
    monitor TEXT NOT NULL, id BIGINT NOT NULL, received {real} NOT NULL, x {blob} NOT NULL, y TEXT NOT NULL,
    PRIMARY KEY (monitor, id));
CREATE TABLE IF NOT EXISTS violations (
    monitor TEXT NOT NULL, decision BIGINT NOT NULL, received {real} NOT NULL, count BIGINT NOT NULL,
    witnesses TEXT NOT NULL, PRIMARY KEY (monitor, decision));
CREATE INDEX IF NOT EXISTS violations_by_time ON violations (monitor, received);
CREATE TABLE IF NOT EXISTS snapshots (monitor TEXT PRIMARY KEY, next_id BIGINT NOT NULL, data {blob} NOT NULL);
CREATE TABLE IF NOT EXISTS posts (
    monitor TEXT NOT NULL, key TEXT NOT NULL, fingerprint TEXT NOT NULL, received {real} NOT NULL, answer TEXT NOT NULL,
    PRIMARY KEY (monitor, key));
"""


class Store:
    """The SQL both dialects share; subclasses open connections and name their types.

    Thread safety: one writer at a time (the service's writer task) on the write connection;
    reads go through a separate connection under a lock, so the dashboard never waits for a
    commit's disk write longer than the database itself makes it.
    """

    placeholder = "?"
    real_type = "REAL"
    blob_type = "BLOB"
    url: str

    def __init__(self):
        self._write_lock = threading.Lock()
        self._read_lock = threading.Lock()
        self._writer = self._connect()
        self._reader = self._connect()
        with self._write_lock:
            self._script(self._writer, _SCHEMA.format(real=self.real_type, blob=self.blob_type))

    # -- dialect --------------------------------------------------------------------------
    def _connect(self):
        raise NotImplementedError

    def _script(self, connection, script: str) -> None:
        raise NotImplementedError

    def _sql(self, text: str) -> str:
        return text if self.placeholder == "?" else text.replace("?", self.placeholder)

    def _run(self, connection, text: str, params=(), many: bool = False):
        cursor = connection.cursor()
        try:
            if many:
                cursor.executemany(self._sql(text), params)
            else:
                cursor.execute(self._sql(text), params)
            return cursor
        except Exception as exc:  # sqlite3 / psycopg errors: translated at this one boundary
            raise StoreError(f"the store {self.url} failed: {type(exc).__name__}: {exc}") from exc

    def _read(self, text: str, params=()) -> list[tuple]:
        with self._read_lock:
            try:
                rows = self._run(self._reader, text, params).fetchall()
            finally:
                self._end_read()
        return rows

    def redact(self, text: str) -> str:
        """``text`` without the store's URL or location on disk (for answers to clients; the log keeps them)."""
        return text.replace(f"the store {self.url}", "the store").replace(self.url, "the store")

    def _end_read(self) -> None:
        """End the read transaction (PostgreSQL keeps one open otherwise and would see old data)."""

    # -- monitors -------------------------------------------------------------------------
    def monitors(self) -> dict[str, dict]:
        """Every monitor's options, by name."""
        return {name: json.loads(spec) for name, spec in self._read("SELECT name, spec FROM monitors ORDER BY name")}

    def save_monitor(self, name: str, spec: dict) -> None:
        """Create (or update the options of) monitor ``name``."""
        with self._write_lock:
            self._transaction(lambda c: self._run(
                c, "INSERT INTO monitors (name, spec) VALUES (?, ?) ON CONFLICT (name) DO UPDATE SET spec = excluded.spec",
                (name, json.dumps(spec))))

    # -- writing --------------------------------------------------------------------------
    def commit(self, batches: list[StoredBatch]) -> None:
        """Write ``batches`` (decisions and witnesses) in one transaction; return once committed."""
        decision_rows, violation_rows, post_rows = [], [], []
        for batch in batches:
            if batch.key is not None:
                post_rows.append((batch.monitor, batch.key, batch.fingerprint, batch.received, json.dumps(batch.answer)))
            rows = np.ascontiguousarray(batch.rows, dtype=np.float64)
            for offset in range(rows.shape[0]):
                decision_rows.append((batch.monitor, batch.first_id + offset, batch.received, rows[offset].tobytes(),
                                      json.dumps(batch.outputs[offset])))
            for record in batch.violations:
                violation_rows.append((batch.monitor, record["decision"], batch.received, record["count"], json.dumps(record)))

        def write(connection):
            if decision_rows:
                self._run(connection, "INSERT INTO decisions (monitor, id, received, x, y) VALUES (?, ?, ?, ?, ?)",
                          decision_rows, many=True)
            if violation_rows:
                self._run(connection, "INSERT INTO violations (monitor, decision, received, count, witnesses) "
                          "VALUES (?, ?, ?, ?, ?)", violation_rows, many=True)
            if post_rows:
                self._run(connection, "INSERT INTO posts (monitor, key, fingerprint, received, answer) VALUES (?, ?, ?, ?, ?)",
                          post_rows, many=True)

        with self._write_lock:
            self._transaction(write)

    def save_snapshot(self, name: str, next_id: int, data: bytes) -> None:
        """Keep ``data`` (a checkpoint covering decisions ``< next_id``) as ``name``'s snapshot."""
        with self._write_lock:
            self._transaction(lambda c: self._run(
                c, "INSERT INTO snapshots (monitor, next_id, data) VALUES (?, ?, ?) "
                "ON CONFLICT (monitor) DO UPDATE SET next_id = excluded.next_id, data = excluded.data",
                (name, next_id, data)))

    def _transaction(self, work) -> None:
        connection = self._writer
        try:
            work(connection)
            connection.commit()
        except BaseException:
            try:
                connection.rollback()
            except Exception:  # the connection itself is gone: the original error says why
                pass
            raise

    # -- reading --------------------------------------------------------------------------
    def snapshot(self, name: str) -> tuple[int, bytes] | None:
        """``(next_id, checkpoint bytes)`` of ``name``'s latest snapshot, or None."""
        rows = self._read("SELECT next_id, data FROM snapshots WHERE monitor = ?", (name,))
        return (int(rows[0][0]), bytes(rows[0][1])) if rows else None

    def post(self, name: str, key: str) -> tuple[str, dict] | None:
        """``(fingerprint, answer)`` of the post to ``name`` made with Idempotency-Key ``key``, or None."""
        rows = self._read("SELECT fingerprint, answer FROM posts WHERE monitor = ? AND key = ?", (name, key))
        return (rows[0][0], json.loads(rows[0][1])) if rows else None

    def post_count(self, name: str) -> int:
        """Keyed posts of ``name`` remembered."""
        return int(self._read("SELECT COUNT(*) FROM posts WHERE monitor = ?", (name,))[0][0])

    def decision_count(self, name: str) -> int:
        rows = self._read("SELECT COUNT(*) FROM decisions WHERE monitor = ?", (name,))
        return int(rows[0][0])

    def iter_decisions(self, name: str, first_id: int = 0, chunk: int = 50_000) -> Iterator[tuple[np.ndarray, np.ndarray, list]]:
        """``(ids, rows, outputs)`` of ``name``'s decisions with id ≥ ``first_id``, in id order, in chunks."""
        start = first_id
        while True:
            rows = self._read("SELECT id, x, y FROM decisions WHERE monitor = ? AND id >= ? ORDER BY id LIMIT ?",
                              (name, start, chunk))
            if not rows:
                return
            ids = np.fromiter((row[0] for row in rows), dtype=np.int64, count=len(rows))
            matrix = np.frombuffer(b"".join(bytes(row[1]) for row in rows), dtype=np.float64).reshape(len(rows), -1)
            yield ids, matrix, [json.loads(row[2]) for row in rows]
            start = int(ids[-1]) + 1

    def decision(self, name: str, decision_id: int) -> tuple[np.ndarray, object, float] | None:
        """``(x, y, received)`` of one decision, or None."""
        rows = self._read("SELECT x, y, received FROM decisions WHERE monitor = ? AND id = ?", (name, decision_id))
        if not rows:
            return None
        return np.frombuffer(bytes(rows[0][0]), dtype=np.float64), json.loads(rows[0][1]), float(rows[0][2])

    def violations(self, name: str, *, after_id: int | None = None, before_id: int | None = None,
                   since: float | None = None, until: float | None = None, limit: int = 100,
                   newest_first: bool = False) -> list[dict]:
        """Stored witness records of ``name``, filtered by decision id (exclusive bounds) and time (inclusive).

        Paging: pass the last ``decision`` seen as ``after_id`` (or ``before_id`` when newest first).
        Each record is ``Witnesses.to_json()`` plus ``received`` (Unix time).
        """
        clauses, params = ["monitor = ?"], [name]
        for column, operator, value in (("decision", ">", after_id), ("decision", "<", before_id),
                                        ("received", ">=", since), ("received", "<=", until)):
            if value is not None:
                clauses.append(f"{column} {operator} ?")
                params.append(value)
        order = "DESC" if newest_first else "ASC"
        rows = self._read(f"SELECT witnesses, received FROM violations WHERE {' AND '.join(clauses)} "
                          f"ORDER BY decision {order} LIMIT ?", (*params, limit))
        return [json.loads(text) | {"received": float(received)} for text, received in rows]

    def violation_histogram(self, name: str, start: float, width: float, bins: int) -> np.ndarray:
        """Flagged decisions of ``name`` per time bin ``[start + k·width, start + (k+1)·width)``, k < ``bins``.

        Counted by the database (one row per bin comes back, not one per violation); times are
        taken in whole milliseconds, and integer division floors them into bins on both dialects.
        """
        width_ms = max(int(width * 1000), 1)
        rows = self._read("SELECT CAST((received - ?) * 1000 AS BIGINT) / ? AS bin, COUNT(*) FROM violations "
                          "WHERE monitor = ? AND received >= ? GROUP BY bin", (start, width_ms, name, start))
        counts = np.zeros(bins, dtype=np.int64)
        for position, count in rows:
            counts[min(int(position), bins - 1)] += int(count)
        return counts

    def first_received(self, name: str) -> float | None:
        rows = self._read("SELECT MIN(received) FROM decisions WHERE monitor = ?", (name,))
        return None if not rows or rows[0][0] is None else float(rows[0][0])

    def close(self) -> None:
        for connection in (self._writer, self._reader):
            try:
                connection.close()
            except Exception:  # closing twice or after the server went away is harmless
                pass


class SQLiteStore(Store):
    """A SQLite file in WAL mode: readers never block the writer, a commit is one WAL append.

    ``synchronous="FULL"`` (default) syncs the log at every commit, so acknowledged decisions
    survive a power cut too; ``"NORMAL"`` survives a crash of the process (``kill -9``) but
    may lose the last commits on a power cut, for fewer disk syncs.
    """

    def __init__(self, path, synchronous: str = "FULL"):
        if synchronous.upper() not in ("FULL", "NORMAL"):
            raise OptionError(f"the `synchronous` option of SQLiteStore must be 'FULL' or 'NORMAL'; got {synchronous!r}")
        self.path = Path(path)
        self.url = f"sqlite:///{self.path}"
        self._synchronous = synchronous.upper()
        if not self.path.parent.is_dir():
            raise StoreError(f"cannot create the store {self.path}: the folder {self.path.parent} does not exist")
        super().__init__()

    def redact(self, text: str) -> str:
        text = super().redact(text)
        for place in (str(self.path.resolve()), str(self.path), str(self.path.resolve().parent)):
            if place not in ("", "."):
                text = text.replace(place, "(the store's folder)")
        return text

    def _connect(self):
        try:
            connection = sqlite3.connect(self.path, check_same_thread=False, timeout=30.0)
            connection.execute("PRAGMA journal_mode=WAL")
            connection.execute(f"PRAGMA synchronous={self._synchronous}")
        except sqlite3.Error as exc:
            raise StoreError(f"cannot open the SQLite store {self.path}: {exc}") from exc
        return connection

    def _script(self, connection, script: str) -> None:
        try:
            connection.executescript(script)
            connection.commit()
        except sqlite3.Error as exc:
            raise StoreError(f"{self.path} is not a store this assay can use: {exc}") from exc


class PostgresStore(Store):
    """A PostgreSQL database (psycopg 3), for a service shared by several machines' clients."""

    placeholder = "%s"
    real_type = "DOUBLE PRECISION"
    blob_type = "BYTEA"

    def __init__(self, url: str):
        self.url = _redacted(url)
        self._dsn = url
        super().__init__()

    def _connect(self):
        try:
            import psycopg
        except ImportError as exc:
            raise StoreError("a PostgreSQL store needs psycopg: pip install 'psycopg[binary]'") from exc
        try:
            return psycopg.connect(self._dsn, connect_timeout=10)
        except psycopg.Error as exc:
            raise StoreError(f"cannot connect to the PostgreSQL store {self.url}: {exc}") from exc

    def _script(self, connection, script: str) -> None:
        try:
            with connection.cursor() as cursor:
                for statement in filter(str.strip, script.split(";")):
                    cursor.execute(statement)
            connection.commit()
        except Exception as exc:
            connection.rollback()
            raise StoreError(f"cannot create the tables in {self.url}: {exc}") from exc

    def _end_read(self) -> None:
        self._reader.rollback()


def _redacted(url: str) -> str:
    """The URL without its password, for messages."""
    parts = urlsplit(url)
    if parts.password:
        netloc = parts.netloc.replace(f":{parts.password}@", ":***@")
        return parts._replace(netloc=netloc).geturl()
    return url


def open_store(url, *, synchronous: str = "FULL") -> Store:
    """Open (creating tables where missing) the store at ``url``: ``sqlite:///PATH``, a path, or ``postgresql://...``."""
    text = str(url)
    if text.startswith(("postgresql://", "postgres://")):
        return PostgresStore(text)
    if text.startswith("sqlite:///"):
        return SQLiteStore(text[len("sqlite:///"):], synchronous=synchronous)
    if "://" in text:
        raise OptionError(f"the store {text!r} is neither sqlite:///PATH nor postgresql://...; give one of those")
    return SQLiteStore(text, synchronous=synchronous)
