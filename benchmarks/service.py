"""assay serve under bounded loopback load: throughput, latency, restart time, and what a SIGKILL loses.

Usage:
    python benchmarks/service.py [--decisions 100000] [--quick] [--skip-postgres] [--restart-size 1000000]
    python benchmarks/service.py --poison            # only the poison run (the others kept from service.json)
    python benchmarks/service.py --only kill-retry --kills 20

Everything runs on 127.0.0.1, with a bounded number of decisions and a time limit per run.
The server is the real ``assay serve`` command in its own process (SQLite in WAL mode with
``synchronous=FULL``, or PostgreSQL started in a temp folder when Debian's postgresql is
installed); the load comes from 4 client threads in this process, each with its own keep-alive
connection, posting pre-encoded JSON bodies (so that the clients' own JSON work is not measured).

Runs (the issue's targets in brackets):

* **batched**: 10⁵ decisions of 10 features in posts of 500, 4 clients as fast as answered —
  decisions acknowledged per second [≥ 5,000/s on SQLite], p50/p99 latency per post;
* **single, paced**: 10⁵ single-decision posts at 500 requests/s in all (125/s per client, each on
  its own schedule) — p50/p99 latency [p99 ≤ 20 ms on SQLite];
* **single, unpaced**: single-decision posts as fast as answered for at most 20 s — the ceiling;
* the same three on SQLite with ``--sync normal`` (``--only sqlite-normal``): no disk sync per commit
  (a ``kill -9`` loses nothing acknowledged, a power cut may lose the last commits);
* **restart**: a store of 10⁶ decisions (snapshots every 10⁵), then the time from starting
  ``assay serve`` until ``/health`` answers, and the hub's own rebuild time [≤ 10 s]; beside it the
  same store with its snapshot removed (a full replay), to show what the snapshot buys;
* **SIGKILL**: 4 clients post batches; the server is killed with SIGKILL when half the decisions
  are acknowledged; after a restart every acknowledged decision is looked up in the store and
  compared with what its client sent [0 lost].
* **poison** (``--poison``): 4 well-behaved clients post single decisions at 50 requests/s each
  while a fifth client, in its own process, posts 400-digit integers and 100,000-deep nestings
  as fast as it is answered; the same run without the poison client beside it. Lost posts of the
  well-behaved clients (not answered 200, or answered but not in the store) [0] and their p99
  latency with / without poison [≤ 2×], each condition run ``--repeats`` times, alternating.
* **kill-retry** (``--only kill-retry``): 4 clients post batches through :class:`assay.serve.Client`
  (an idempotency key per post, retries on connection errors) while the server is killed with
  SIGKILL ``--kills`` times at random moments and restarted on the same port; then every
  decision sent is looked up in the store [0 lost, 0 stored twice].

The machine is shared: the load average (1 min) before and after each run is reported beside it.
Writes benchmarks/results/service.json and service.md.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from _common import machine, markdown_table, write_results  # noqa: E402

DIM = 10
EPSILON = 0.05
CLIENTS = 4
RUN_LIMIT_S = 600.0  # no run goes on longer than this, whatever happens


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start_server(store: str, *extra: str, port: int | None = None) -> tuple[subprocess.Popen, str, float]:
    """``assay serve`` in its own process; returns it, its URL and the seconds until /health answered."""
    import httpx

    port = port or free_port()
    url = f"http://127.0.0.1:{port}"
    command = [sys.executable, "-m", "assay.cli.main", "serve", "--store", store, "--port", str(port),
               "--epsilon", str(EPSILON), *extra]
    started = time.perf_counter()
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                               env=dict(os.environ, OMP_NUM_THREADS="1"))
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise SystemExit(f"assay serve exited: {process.stderr.read()}")
        try:
            if httpx.get(f"{url}/health", timeout=1.0).status_code == 200:
                return process, url, time.perf_counter() - started
        except httpx.HTTPError:
            pass
        time.sleep(0.02)
    process.kill()
    raise SystemExit(f"assay serve did not answer at {url} within 120 s")


def stop_server(process: subprocess.Popen, sig=signal.SIGTERM) -> None:
    if process.poll() is None:
        process.send_signal(sig)
        try:
            process.wait(timeout=120)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def decisions(seed: int, count: int) -> tuple[np.ndarray, list]:
    rng = np.random.default_rng(seed)
    return rng.random((count, DIM)).round(4), rng.choice(["approve", "deny"], size=count).tolist()


def bodies(X: np.ndarray, Y: list, batch: int) -> list[bytes]:
    if batch == 1:
        return [json.dumps({"x": X[i].tolist(), "y": Y[i]}).encode() for i in range(len(Y))]
    return [json.dumps({"X": X[i:i + batch].tolist(), "Y": Y[i:i + batch]}).encode() for i in range(0, len(Y), batch)]


def load(url: str, per_client: list[list[bytes]], rate_per_client: float | None, time_limit: float,
         kill_at: int | None = None, on_kill=None, keep_going: bool = False) -> dict:
    """Post every client's bodies (one thread and connection each); return counts and latencies.

    ``rate_per_client``: requests per second per client on a fixed schedule (None: as fast as
    answered). ``kill_at``: call ``on_kill`` once this many decisions are acknowledged.
    ``keep_going``: a refused or failed post is counted (``failed``) and the client goes on;
    otherwise the client stops at the first.
    """
    import httpx

    latencies: list[list[float]] = [[] for _ in per_client]
    acknowledged: list[list[tuple[int, int, int]]] = [[] for _ in per_client]  # (post index, first_id, accepted)
    lock = threading.Lock()
    total = [0]
    failed = [0]
    killed = threading.Event()
    deadline = time.monotonic() + min(time_limit, RUN_LIMIT_S)
    barrier = threading.Barrier(len(per_client))

    def client(index: int) -> None:
        with httpx.Client(base_url=url, timeout=30.0, headers={"content-type": "application/json"}) as http:
            barrier.wait(timeout=60)
            start = time.perf_counter()
            for number, body in enumerate(per_client[index]):
                if time.monotonic() > deadline or killed.is_set():
                    return
                if rate_per_client is not None:
                    due = start + number / rate_per_client
                    pause = due - time.perf_counter()
                    if pause > 0:
                        time.sleep(pause)
                tic = time.perf_counter()
                try:
                    response = http.post("/api/monitors/default/decisions", content=body)
                except httpx.HTTPError:
                    if not keep_going:
                        return
                    response = None
                if response is None or response.status_code != 200:
                    if not keep_going:
                        return
                    with lock:
                        failed[0] += 1
                    continue
                latencies[index].append(time.perf_counter() - tic)
                answer = response.json()
                acknowledged[index].append((number, answer["first_id"], answer["accepted"]))
                with lock:
                    total[0] += answer["accepted"]
                    if kill_at is not None and total[0] >= kill_at and not killed.is_set():
                        killed.set()
                        on_kill()

    threads = [threading.Thread(target=client, args=(i,)) for i in range(len(per_client))]
    tic = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    seconds = time.perf_counter() - tic
    flat = np.array([value for values in latencies for value in values]) * 1e3
    return {"seconds": seconds, "acknowledged": total[0], "posts": int(flat.size), "failed": failed[0],
            "decisions_per_s": total[0] / seconds if seconds else 0.0,
            "p50_ms": float(np.percentile(flat, 50)) if flat.size else None,
            "p99_ms": float(np.percentile(flat, 99)) if flat.size else None,
            "max_ms": float(flat.max()) if flat.size else None,
            "acks": acknowledged}


def split(items: list, parts: int) -> list[list]:
    return [items[i::parts] for i in range(parts)]


def measured(function, *args, **kwargs) -> dict:
    before = os.getloadavg()[0]
    result = function(*args, **kwargs)
    result["load_before"] = round(before, 2)
    result["load_after"] = round(os.getloadavg()[0], 2)
    result.pop("acks", None)
    return result


def throughput_runs(store: str, label: str, count: int, quick: bool, *extra: str) -> list[dict]:
    rows = []
    X, Y = decisions(1, count)
    process, url, _ = start_server(store, "--snapshot-every", "100000", *extra)
    try:
        batched = split(bodies(X, Y, 500), CLIENTS)
        rows.append({"store": label, "run": "batched (500 per post)", **measured(load, url, batched, None, 300)})
        X2, Y2 = decisions(2, count)
        singles = split(bodies(X2, Y2, 1), CLIENTS)
        rows.append({"store": label, "run": "single, paced 500 req/s", **measured(load, url, singles, 125.0, 300)})
        X3, Y3 = decisions(3, count)
        rows.append({"store": label, "run": "single, unpaced (≤ 20 s)",
                     **measured(load, url, split(bodies(X3, Y3, 1), CLIENTS), None, 5 if quick else 20)})
    finally:
        stop_server(process)
    return rows


def restart_run(folder: Path, size: int) -> dict:
    """Fill a SQLite store with ``size`` decisions through the hub, then time restarts.

    Two cases: the worst, ``size − 1`` decisions with the last snapshot ``snapshot_every − 1``
    decisions back (a restart replays all of those), and ``size`` decisions with a snapshot at
    the end (nothing to replay).
    """
    from assay.serve import MonitorSpec, build

    path = folder / "restart.db"
    every = 100_000
    service = build(f"sqlite:///{path}", default=MonitorSpec("default", EPSILON), snapshot_every=every,
                    synchronous="NORMAL")
    fill_started = time.perf_counter()
    chunk = 20_000
    for start in range(0, size - 1, chunk):
        X, Y = decisions(100 + start, min(chunk, size - 1 - start))
        service.hub.submit([("default", {"X": X.tolist(), "Y": Y})])
    fill_seconds = time.perf_counter() - fill_started
    result = {"decisions": size, "fill_seconds": round(fill_seconds, 1), "db_mb": round(path.stat().st_size / 2**20, 1),
              "load_before": round(os.getloadavg()[0], 2), "cases": []}

    def measure(label: str) -> None:
        store = build(f"sqlite:///{path}")
        stored = store.hub.stats("default").decisions
        snapshot_at = store.hub.store.snapshot("default")[0]
        store.hub.store.close()
        times, rebuilds = [], []
        for _ in range(3):
            process, _, seconds = start_server(f"sqlite:///{path}")
            stop_server(process, signal.SIGKILL)  # no shutdown snapshot: every start replays the same log
            times.append(seconds)
            rebuilt = build(f"sqlite:///{path}")
            rebuilds.append(rebuilt.hub.restored_seconds)
            rebuilt.hub.store.close()
        result["cases"].append({"case": label, "stored": stored, "snapshot_at": snapshot_at, "replayed": stored - snapshot_at,
                                "start_to_health_s": round(statistics.median(times), 2),
                                "start_to_health_all": [round(t, 2) for t in times],
                                "rebuild_s": round(statistics.median(rebuilds), 2)})

    service.hub.store.close()  # a crash-like stop: no shutdown snapshot
    measure("worst: a whole snapshot interval to replay")
    service = build(f"sqlite:///{path}", snapshot_every=every, synchronous="NORMAL")
    X, Y = decisions(99, 1)
    service.hub.submit([("default", {"X": X.tolist(), "Y": Y})])  # the size-th decision: a snapshot is due
    service.hub.store.close()
    measure("snapshot at the last decision")
    # The same store without its snapshot: the whole history is replayed.
    import sqlite3

    copy = folder / "no-snapshot.db"
    shutil.copy(path, copy)
    with sqlite3.connect(copy) as connection:
        connection.execute("DELETE FROM snapshots")
    rebuilt = build(f"sqlite:///{copy}")
    result["rebuild_without_snapshot_s"] = round(rebuilt.hub.restored_seconds, 2)
    rebuilt.hub.store.close()
    result["load_after"] = round(os.getloadavg()[0], 2)
    return result


def sigkill_run(store: str, count: int) -> dict:
    """Kill the server with SIGKILL at half the run; count acknowledged decisions missing after restart."""
    from assay.serve import open_store

    X, Y = decisions(7, count)
    per_client_rows = split(list(range(count)), CLIENTS)
    per_client = []
    for rows in per_client_rows:
        per_client.append([json.dumps({"X": X[rows[i:i + 100]].tolist(), "Y": [Y[r] for r in rows[i:i + 100]]}).encode()
                           for i in range(0, len(rows), 100)])
    process, url, _ = start_server(store, "--snapshot-every", "20000")
    load_before = os.getloadavg()[0]
    result = load(url, per_client, None, 300, kill_at=count // 2, on_kill=lambda: process.send_signal(signal.SIGKILL))
    process.wait(timeout=60)
    restarted, _, _ = start_server(store)
    stop_server(restarted)
    reader = open_store(store)
    stored = {}
    for ids, rows, outputs in reader.iter_decisions("default"):
        for k in range(ids.size):
            stored[int(ids[k])] = (rows[k], outputs[k])
    reader.close()
    lost = mismatched = 0
    for client, acks in enumerate(result["acks"]):
        for number, first_id, accepted in acks:
            sent = per_client_rows[client][number * 100:(number + 1) * 100]
            for offset in range(accepted):
                kept = stored.get(first_id + offset)
                if kept is None:
                    lost += 1
                elif not (np.array_equal(kept[0], X[sent[offset]]) and kept[1] == Y[sent[offset]]):
                    mismatched += 1
    return {"decisions_sent": count, "acknowledged_before_kill": result["acknowledged"], "stored_after_restart": len(stored),
            "acknowledged_lost": lost, "acknowledged_changed": mismatched, "load_before": round(load_before, 2),
            "load_after": round(os.getloadavg()[0], 2)}


POISON_BODIES = (b'{"x": [1' + b"0" * 399 + b', 0, 0, 0, 0, 0, 0, 0, 0, 0], "y": "approve"}',
                 b"[" * 100_000 + b"]" * 100_000)


def poison_client(url: str, stop, counts) -> None:
    """Post oversized integers and deep nestings as fast as answered until ``stop`` is set (a process of its own)."""
    import httpx

    statuses: dict[int, int] = {}
    with httpx.Client(base_url=url, timeout=30.0, headers={"content-type": "application/json"}) as http:
        while not stop.is_set():
            for body in POISON_BODIES:
                try:
                    status = http.post("/api/monitors/default/decisions", content=body).status_code
                except httpx.HTTPError:
                    status = 0
                statuses[status] = statuses.get(status, 0) + 1
    counts.update(statuses)


def poison_run(folder: Path, seconds: float, repeats: int, rate: float = 50.0) -> dict:
    """4 paced well-behaved clients, with and without a poison client beside them (alternating runs)."""
    import multiprocessing

    context = multiprocessing.get_context("spawn")
    per_client = int(seconds * rate)
    runs = []
    for repeat in range(repeats):
        for poisoned in (False, True):
            store = f"sqlite:///{folder / f'poison-{repeat}-{int(poisoned)}.db'}"
            process, url, _ = start_server(store, "--snapshot-every", "100000")
            manager = context.Manager() if poisoned else None
            counts = manager.dict() if manager else {}
            stop = context.Event()
            attacker = context.Process(target=poison_client, args=(url, stop, counts)) if poisoned else None
            try:
                if attacker is not None:
                    attacker.start()
                    time.sleep(1.0)  # the poison is flowing before the measured clients start
                X, Y = decisions(40 + repeat, per_client * CLIENTS)
                result = measured(load, url, split(bodies(X, Y, 1), CLIENTS), rate, seconds * 3, keep_going=True)
            finally:
                stop.set()
                if attacker is not None:
                    attacker.join(timeout=60)
                stop_server(process)
            from assay.serve import open_store

            reader = open_store(store)
            stored = reader.decision_count("default")
            reader.close()
            poison = dict(counts)
            if manager is not None:
                manager.shutdown()
            attempted = result["posts"] + result["failed"]  # single-decision posts sent (all, unless the time ran out)
            runs.append({"repeat": repeat, "poison": poisoned, "sent": attempted,
                         "acknowledged": result["acknowledged"], "failed": result["failed"], "stored": stored,
                         "lost": attempted - stored,
                         "p50_ms": result["p50_ms"], "p99_ms": result["p99_ms"], "max_ms": result["max_ms"],
                         "seconds": round(result["seconds"], 1),
                         "poison_posts": sum(poison.values()), "poison_statuses": {str(k): v for k, v in sorted(poison.items())},
                         "poison_per_s": round(sum(poison.values()) / result["seconds"], 1) if poisoned else 0.0,
                         "load_before": result["load_before"], "load_after": result["load_after"]})
            print(json.dumps(runs[-1]), flush=True)
    clean = [r["p99_ms"] for r in runs if not r["poison"]]
    dirty = [r["p99_ms"] for r in runs if r["poison"]]
    return {"clients": CLIENTS, "rate_per_client": rate, "seconds": seconds, "runs": runs,
            "lost": sum(r["lost"] for r in runs), "p99_ms_without": statistics.median(clean),
            "p99_ms_with": statistics.median(dirty), "p99_ratio": statistics.median(dirty) / statistics.median(clean)}


def kill_retry_run(folder: Path, kills: int, per_client: int = 6000, batch: int = 10, seed: int = 11) -> dict:
    """SIGKILL the server ``kills`` times at random moments while 4 clients post keyed batches with retries."""
    import random

    from assay.serve import Client, ServiceError, open_store

    store = f"sqlite:///{folder / 'kill-retry.db'}"
    port = free_port()
    process, url, _ = start_server(store, "--snapshot-every", "500", port=port)
    rng = random.Random(seed)
    sent = [decisions(seed + 1 + client, per_client) for client in range(CLIENTS)]
    retried, errors, answered = [0] * CLIENTS, [], [0] * CLIENTS
    finished = threading.Event()

    def client(index: int) -> None:
        X, Y = sent[index]
        try:
            with Client(url, timeout=30, retries=60, retry_wait=0.05) as http:
                for start in range(0, per_client, batch):
                    http.post_batch(X[start:start + batch], Y[start:start + batch])
                    answered[index] += 1
                retried[index] = http.retried
        except ServiceError as exc:
            errors.append(str(exc))

    threads = [threading.Thread(target=client, args=(i,)) for i in range(CLIENTS)]
    started = time.perf_counter()
    for thread in threads:
        thread.start()
    done = 0
    restarts = []
    try:
        while done < kills and any(thread.is_alive() for thread in threads):
            time.sleep(rng.uniform(0.05, 0.8))
            process.send_signal(signal.SIGKILL)
            process.wait(timeout=60)
            done += 1
            process, _, seconds = start_server(store, port=port)
            restarts.append(seconds)
        for thread in threads:
            thread.join(timeout=RUN_LIMIT_S)
        finished.set()
    finally:
        stop_server(process)
    reader = open_store(store)
    counts: dict[bytes, int] = {}
    for _, rows, _ in reader.iter_decisions("default"):
        for row in rows:
            key = row.tobytes()
            counts[key] = counts.get(key, 0) + 1
    keyed_posts = reader.post_count("default")
    reader.close()
    expected = [X[i].tobytes() for X, _ in sent for i in range(per_client)]
    lost = sum(1 for key in expected if key not in counts)
    duplicated = sum(count - 1 for count in counts.values() if count > 1)
    return {"kills": done, "clients": CLIENTS, "decisions_sent": len(expected), "batch": batch,
            "posts_answered": sum(answered), "stored": sum(counts.values()), "keyed_posts_stored": keyed_posts,
            "lost": lost, "duplicated": duplicated, "client_retries": sum(retried), "client_errors": errors[:3],
            "restart_s_median": round(statistics.median(restarts), 2) if restarts else None,
            "seconds": round(time.perf_counter() - started, 1), "load_after": round(os.getloadavg()[0], 2)}


def postgres_url(folder: Path):
    try:
        from tests.serve.servers import PostgresServer, find_postgres_bin
    except ImportError:
        return None
    if find_postgres_bin() is None:
        return None
    return PostgresServer()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--decisions", type=int, default=100_000, help="Decisions per load run (4 clients in all).")
    parser.add_argument("--restart-size", type=int, default=1_000_000, help="Decisions in the store of the restart run.")
    parser.add_argument("--quick", action="store_true", help="A smoke run: 10⁴ decisions, a 10⁵-decision restart store.")
    parser.add_argument("--skip-postgres", action="store_true")
    parser.add_argument("--only", default="sqlite,sigkill,restart,postgres",
                        help="Runs to do (comma-separated: sqlite, sqlite-normal, sigkill, restart, postgres); the others are kept "
                             "from the last results/service.json, so one part can be measured again.")
    parser.add_argument("--render", action="store_true", help="Rewrite service.md from service.json and stop.")
    parser.add_argument("--poison", action="store_true", help="Only the poison run (as --only poison).")
    parser.add_argument("--poison-seconds", type=float, default=20.0, help="Length of each poison / clean run.")
    parser.add_argument("--repeats", type=int, default=2, help="Runs of each condition of the poison run.")
    parser.add_argument("--kills", type=int, default=20, help="SIGKILLs of the kill-retry run.")
    arguments = parser.parse_args()
    chosen = {part.strip() for part in ("poison" if arguments.poison else arguments.only).split(",") if part.strip()}
    previous_path = Path(__file__).resolve().parent / "results" / "service.json"
    previous = json.loads(previous_path.read_text()) if previous_path.exists() else {}
    if arguments.render:
        render(previous)
        return
    count = 10_000 if arguments.quick else arguments.decisions
    restart_size = 100_000 if arguments.quick else arguments.restart_size
    folder = Path(tempfile.mkdtemp(prefix="assay-service-bench-"))
    kept_runs = previous.get("runs", [])
    runs = {"sqlite": [r for r in kept_runs if r["store"] == "SQLite (WAL, sync full)"],
            "sqlite-normal": [r for r in kept_runs if r["store"] == "SQLite (WAL, sync normal)"],
            "postgres": [r for r in kept_runs if r["store"].startswith("PostgreSQL")]}
    restart, kill = previous.get("restart"), previous.get("sigkill")
    poison, kill_retry = previous.get("poison"), previous.get("kill_retry")
    try:
        if "sqlite" in chosen:
            runs["sqlite"] = throughput_runs(f"sqlite:///{folder / 'load.db'}", "SQLite (WAL, sync full)", count,
                                             arguments.quick)
            print(json.dumps(runs["sqlite"], indent=1), flush=True)
        if "sqlite-normal" in chosen:  # the log synced by the OS, not at every commit: survives kill -9, not power loss
            runs["sqlite-normal"] = throughput_runs(f"sqlite:///{folder / 'normal.db'}", "SQLite (WAL, sync normal)", count,
                                                    arguments.quick, "--sync", "normal")
            print(json.dumps(runs["sqlite-normal"], indent=1), flush=True)
        if "sigkill" in chosen:
            kill = sigkill_run(f"sqlite:///{folder / 'kill.db'}", count)
            print(json.dumps(kill, indent=1), flush=True)
        if "restart" in chosen:
            restart = restart_run(folder, restart_size)
            print(json.dumps(restart, indent=1), flush=True)
        if "poison" in chosen:
            poison = poison_run(folder, 5.0 if arguments.quick else arguments.poison_seconds, arguments.repeats)
            print(json.dumps({k: v for k, v in poison.items() if k != "runs"}, indent=1), flush=True)
        if "kill-retry" in chosen:
            kill_retry = kill_retry_run(folder, arguments.kills)
            print(json.dumps(kill_retry, indent=1), flush=True)
        if "postgres" in chosen and not arguments.skip_postgres:
            server = postgres_url(folder)
            if server is None:
                print("PostgreSQL is not installed: its rows are left out", flush=True)
            else:
                with server:
                    runs["postgres"] = throughput_runs(server.url, "PostgreSQL 15", count, arguments.quick)
                    print(json.dumps(runs["postgres"], indent=1), flush=True)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    payload = {"machine": machine(), "clients": CLIENTS, "dim": DIM, "epsilon": EPSILON, "decisions_per_run": count,
               "runs": runs["sqlite"] + runs["sqlite-normal"] + runs["postgres"], "restart": restart, "sigkill": kill,
               "poison": poison, "kill_retry": kill_retry,
               "measured_at": {**previous.get("measured_at", {}), **{part: time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
                                                                     for part in chosen}}}
    render(payload)


def render(payload: dict) -> None:
    runs, restart, kill, count = payload["runs"], payload["restart"], payload["sigkill"], payload["decisions_per_run"]
    poison, kill_retry = payload.get("poison"), payload.get("kill_retry")
    when = ", ".join(f"{part} {stamp}" for part, stamp in sorted(payload.get("measured_at", {}).items()))
    table = ["# assay serve under loopback load\n\n",
             f"{CLIENTS} client threads, {DIM} features, ε = {EPSILON} (L∞)"
             f"{f', {count:,} decisions per throughput run' if runs else ''}; "
             f"{payload['machine']['cpus']} cores shared with other work (load average, 1 min, before → after each run). "
             f"Measured: {when or 'see service.json'}.\n\n"]
    if runs:
        table.append(markdown_table(["store", "run", "decisions acked", "decisions/s", "p50 ms / post", "p99 ms / post",
                                     "max ms", "load"],
                                    [[r["store"], r["run"], f"{r['acknowledged']:,}", f"{r['decisions_per_s']:,.0f}",
                                      f"{r['p50_ms']:.2f}", f"{r['p99_ms']:.2f}", f"{r['max_ms']:.1f}",
                                      f"{r['load_before']} → {r['load_after']}"] for r in runs]))
    else:
        table.append("(The throughput runs were not measured in this results file: `--only sqlite` measures them.)\n")
    table += ["\n## Targets (issues 15 and 33)\n\n",
              markdown_table(["target", "measured", "met"], _targets(runs, restart, kill) + _input_targets(poison, kill_retry))]
    if poison:
        table.append(f"\n## Poison (issue 33): {poison['clients']} clients at {poison['rate_per_client']:g} single posts/s each, "
                     f"{poison['seconds']:g} s per run, with and without a fifth client posting 400-digit integers and "
                     "100,000-deep nestings as fast as it is answered\n\n")
        table.append(markdown_table(
            ["run", "poison", "sent", "acked", "failed", "stored", "lost", "p50 ms", "p99 ms", "max ms", "poison posts/s",
             "poison answers", "load"],
            [[r["repeat"], "yes" if r["poison"] else "no", f"{r['sent']:,}", f"{r['acknowledged']:,}", r["failed"],
              f"{r['stored']:,}", r["lost"], f"{r['p50_ms']:.2f}", f"{r['p99_ms']:.2f}", f"{r['max_ms']:.1f}",
              f"{r['poison_per_s']:,.0f}", ", ".join(f"{k}: {v:,}" for k, v in r["poison_statuses"].items()) or "–",
              f"{r['load_before']} → {r['load_after']}"] for r in poison["runs"]]))
    if kill_retry:
        k = kill_retry
        table.append(f"\n## SIGKILL during retried posts (issue 33)\n\n{k['clients']} clients posted {k['decisions_sent']:,} "
                     f"decisions in batches of {k['batch']} through `assay.serve.Client` (an Idempotency-Key per post, retries "
                     f"on connection errors) while the server was killed with SIGKILL {k['kills']} times at random moments and "
                     f"restarted (median {k['restart_s_median']} s to /health); the clients retried {k['client_retries']:,} "
                     f"times. Stored: {k['stored']:,} decisions, {k['keyed_posts_stored']:,} keyed posts; **lost {k['lost']}, "
                     f"stored twice {k['duplicated']}**{'; client errors: ' + '; '.join(k['client_errors']) if k['client_errors'] else ''}. "
                     f"{k['seconds']} s in all.\n")
    if restart and "cases" in restart:
        table.append(f"\n## Restart ({restart['db_mb']} MB store, load {restart['load_before']} → {restart['load_after']})\n\n")
        table.append(markdown_table(["case", "decisions", "snapshot at", "replayed", "start → /health (median of 3)",
                                     "all three", "hub rebuild in process"],
                                    [[c["case"], f"{c['stored']:,}", f"{c['snapshot_at']:,}", f"{c['replayed']:,}",
                                      f"{c['start_to_health_s']} s", ", ".join(map(str, c["start_to_health_all"])),
                                      f"{c['rebuild_s']} s"] for c in restart["cases"]]))
        table.append(f"\nWithout any snapshot (the whole history replayed) the rebuild takes "
                     f"{restart['rebuild_without_snapshot_s']} s. Start → /health includes starting Python and "
                     "importing assay (about 2–3 s for an empty store on this machine).\n")
    if kill:
        table.append(f"\nSIGKILL at half the run: {kill['acknowledged_before_kill']:,} decisions acknowledged, "
                     f"{kill['stored_after_restart']:,} stored after the restart, {kill['acknowledged_lost']} acknowledged "
                     f"lost, {kill['acknowledged_changed']} changed.\n")
    json_path, md_path = write_results("service", payload, "".join(table))
    print(md_path.read_text())


def _input_targets(poison, kill_retry) -> list[list]:
    rows = []
    if poison:
        rows.append(["0 posts of well-behaved clients lost under poison", str(poison["lost"]), "yes" if poison["lost"] == 0 else "no"])
        rows.append(["p99 with poison ≤ 2× p99 without",
                     f"{poison['p99_ms_with']:.1f} ms vs {poison['p99_ms_without']:.1f} ms ({poison['p99_ratio']:.2f}×, "
                     f"medians of {len(poison['runs']) // 2} runs each)", "yes" if poison["p99_ratio"] <= 2 else "no"])
    if kill_retry:
        ok = kill_retry["lost"] == 0 and kill_retry["duplicated"] == 0 and not kill_retry["client_errors"]
        rows.append([f"SIGKILL × {kill_retry['kills']} during retried posts: 0 lost, 0 duplicated",
                     f"{kill_retry['lost']} lost, {kill_retry['duplicated']} duplicated", "yes" if ok else "no"])
    return rows


def _targets(runs, restart, kill) -> list[list]:
    rows = []
    for run in runs:
        if run["store"] == "SQLite (WAL, sync full)" and run["run"].startswith("batched"):
            rows.append(["≥ 5,000 decisions/s, batched posts, SQLite", f"{run['decisions_per_s']:,.0f}/s",
                         "yes" if run["decisions_per_s"] >= 5000 else "no"])
        if run["store"].startswith("SQLite") and run["run"].startswith("single, paced"):
            label = "sync full" if "full" in run["store"] else "sync normal"
            achieved = run["posts"] / run["seconds"]
            rows.append([f"p99 ≤ 20 ms, single posts at 500 req/s, SQLite ({label})",
                         f"p99 {run['p99_ms']:.1f} ms at {achieved:.0f} req/s", "yes" if run["p99_ms"] <= 20 else "no"])
    for case in (restart or {}).get("cases", []):
        rows.append([f"restart after {case['stored']:,} decisions ≤ 10 s ({case['case']})",
                     f"{case['start_to_health_s']} s to /health", "yes" if case["start_to_health_s"] <= 10 else "no"])
    if kill:
        rows.append(["0 acknowledged decisions lost after SIGKILL", str(kill["acknowledged_lost"] + kill["acknowledged_changed"]),
                     "yes" if kill["acknowledged_lost"] + kill["acknowledged_changed"] == 0 else "no"])
    return rows


if __name__ == "__main__":
    main()
