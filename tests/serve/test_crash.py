"""``assay serve`` as a process, killed with SIGKILL mid-stream: no acknowledged decision is lost."""

from __future__ import annotations

import random
import signal
import sqlite3
import threading
import time

import numpy as np
from typer.testing import CliRunner

from assay.cli.main import app as cli
from assay.monitor import Monitor
from assay.serve import Client, ServiceError, open_store
from tests.serve.conftest import stream
from tests.serve.servers import free_port, serve_process, stop_process

EPSILON = 0.1


def stored_stream(store: str) -> tuple[np.ndarray, list]:
    """The inputs and decisions of the default monitor as the store holds them, in id order."""
    reader = open_store(store)
    try:
        chunks = list(reader.iter_decisions("default"))
    finally:
        reader.close()
    return np.vstack([rows for _, rows, _ in chunks]), [label for _, _, outputs in chunks for label in outputs]


def test_sigkill_mid_stream_loses_no_acknowledged_decision_and_keeps_the_witnesses(tmp_path):
    store = f"sqlite:///{tmp_path / 'crash.db'}"
    X, Y = stream(21, 600)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    options = ("--epsilon", str(EPSILON), "--snapshot-every", "64")
    process = serve_process(store, port, *options)
    acknowledged = []  # (first_id, count) of every answered post
    stop = threading.Event()

    def post_until_refused():
        with Client(url, timeout=60, retries=0) as client:  # stops at the kill: what was acknowledged is checked
            for start in range(0, 600, 6):
                if stop.is_set():
                    return
                try:
                    result = client.post_batch(X[start:start + 6], Y[start:start + 6])
                except ServiceError:
                    return
                acknowledged.append((result.first_id, result.accepted))

    poster = threading.Thread(target=post_until_refused)
    poster.start()
    deadline = time.monotonic() + 600  # generous: a loaded machine posts slowly; a quick one waits no longer
    while sum(count for _, count in acknowledged) < 200 and time.monotonic() < deadline and poster.is_alive():
        time.sleep(0.005)
    process.send_signal(signal.SIGKILL)  # mid-stream: the poster is still sending
    process.wait(timeout=30)
    stop.set()
    poster.join(timeout=60)
    acked = sum(count for _, count in acknowledged)
    assert 200 <= acked < 600, acked
    assert [first for first, _ in acknowledged] == list(range(0, acked, 6))

    restarted = serve_process(store, port, *options)
    try:
        with Client(url, timeout=30) as client:
            kept = client.stats().decisions
            assert kept >= acked  # a batch stored but not yet answered may be there too
            rows, labels = stored_stream(store)
            assert np.array_equal(rows, X[:kept]) and labels == Y[:kept]
            for start in range(kept, 600, 50):  # the client resumes where the store ends
                client.post_batch(X[start:start + 50], Y[start:start + 50])
            stored = list(client.iter_violations(page=200))
    finally:
        stop_process(restarted)
    uninterrupted = [w.to_json() for w in Monitor(EPSILON).observe_batch(X, Y) if w.flagged]
    assert [{k: v for k, v in r.items() if k != "received"} for r in stored] == uninterrupted


def test_serve_refuses_a_public_address_without_a_token(tmp_path):
    result = CliRunner().invoke(cli, ["serve", "--epsilon", "0.1", "--host", "0.0.0.0", "--store", str(tmp_path / "x.db")])
    assert result.exit_code == 2 and "without a token" in result.output
    assert not (tmp_path / "x.db").exists()
    short = CliRunner().invoke(cli, ["serve", "--host", "0.0.0.0", "--token", "abc", "--store", str(tmp_path / "x.db")])
    assert short.exit_code == 2 and "16 characters" in short.output


def stored_count(path) -> int:
    with sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=30) as connection:
        return connection.execute("SELECT COUNT(*) FROM decisions").fetchone()[0]


def test_sigkill_between_commit_and_answer_then_a_retry_stores_nothing_twice(tmp_path):
    """The worst moment for a client: its post is stored but the answer never comes (the server is killed).

    The server is paused (SIGSTOP) at random moments until the store holds a post the client has
    no answer for, then killed there and restarted; the client, retrying with the same idempotency
    key, gets the first answer. The store ends up holding every decision exactly once, in order.
    (Without keys the retry would store the post twice.) The 20-kill run with four clients at
    random moments is ``benchmarks/service.py --only kill-retry``.
    """
    path = tmp_path / "retry.db"
    store = f"sqlite:///{path}"
    X, Y = stream(22, 480)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    options = ("--epsilon", str(EPSILON), "--snapshot-every", "6")  # a snapshot after each post widens the window
    process = serve_process(store, port, *options)
    answers, failure = [], []

    def post_everything():
        try:
            with Client(url, timeout=10, retries=40, retry_wait=0.1) as client:
                for start in range(0, 480, 6):
                    answers.append(client.post_batch(X[start:start + 6], Y[start:start + 6]))
        except ServiceError as exc:  # pragma: no cover - reported by the assertion below
            failure.append(exc)

    poster = threading.Thread(target=post_everything)
    poster.start()
    rng = random.Random(7)
    caught = False
    try:
        while not caught and poster.is_alive():
            time.sleep(rng.uniform(0.0, 0.02))
            process.send_signal(signal.SIGSTOP)
            time.sleep(0.2)  # the client reads any answer already sent
            caught = stored_count(path) > 6 * len(answers)
            process.send_signal(signal.SIGKILL if caught else signal.SIGCONT)
        assert caught, "the client finished before a post was caught between its commit and its answer"
        process.wait(timeout=30)
        process = serve_process(store, port, *options)
        poster.join(timeout=300)
        assert not failure and not poster.is_alive()
        assert [answer.first_id for answer in answers] == list(range(0, 480, 6))
        with Client(url, timeout=30) as client:
            assert client.stats().decisions == 480
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGCONT)
        stop_process(process)
    rows, labels = stored_stream(store)
    assert np.array_equal(rows, X) and labels == Y  # 0 lost, 0 duplicated, in order
