"""The service section of ``assay demo``: a monitor served over HTTP, fed by a client, restarted from its store.

Starts ``assay serve``'s app on a free loopback port (uvicorn in a thread, a SQLite store in a
temporary folder), posts 2,000 synthetic loan decisions as records in batches with
:class:`~assay.serve.Client`, reads the stored violations back, fetches the dashboard page, then
stops the server and rebuilds the monitor from the store to show that it comes back with the same
counts. Needs no files; everything is removed at the end.
"""

from __future__ import annotations

import socket
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

__all__ = ["demo_section"]

_FEATURES = ("income", "debt_ratio", "years_employed", "age")
_DECISIONS = 2000
_BATCH = 500
_EPSILON = 0.05


def _decide(rows: np.ndarray) -> list[str]:
    """A scoring rule that also denies the youngest applicants (the unfairness the monitor finds)."""
    score = 0.6 * rows[:, 0] - 0.5 * rows[:, 1] + 0.2 * rows[:, 2]
    return np.where((score > 0.15) & (rows[:, 3] >= 0.1), "approve", "deny").tolist()


def demo_section(progress: Callable[[str], None] | None = None, seed: int = 0) -> dict:
    """Serve, post, read back, restart; return what each step showed (JSON-able)."""
    import httpx
    import uvicorn

    from assay.serve import Client, MonitorSpec, build

    say = progress or (lambda stage: None)
    rows = np.random.default_rng(seed).random((_DECISIONS, len(_FEATURES))).round(3)
    labels = _decide(rows)
    with tempfile.TemporaryDirectory(prefix="assay-serve-demo-") as folder:
        store = f"sqlite:///{Path(folder) / 'monitor.db'}"
        service = build(store, default=MonitorSpec("loans", _EPSILON, decision_column="approved", features=_FEATURES))
        listener = socket.socket()
        listener.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{listener.getsockname()[1]}"
        server = uvicorn.Server(uvicorn.Config(service.app, log_level="warning", access_log=False, lifespan="on"))
        thread = threading.Thread(target=server.run, kwargs={"sockets": [listener]}, daemon=True)
        say(f"serving a monitor at {url}")
        thread.start()
        try:
            deadline = time.monotonic() + 30
            while not server.started and time.monotonic() < deadline:
                time.sleep(0.01)
            started = time.perf_counter()
            with Client(url, "loans") as client:
                for start in range(0, _DECISIONS, _BATCH):
                    records = [dict(zip(_FEATURES, row.tolist())) | {"approved": label}
                               for row, label in zip(rows[start:start + _BATCH], labels[start:start + _BATCH])]
                    client.post_records(records)
                seconds = time.perf_counter() - started
                stats = client.stats()
                first = client.violations(limit=1)
                page = httpx.get(f"{url}/monitors/loans", timeout=10)
        finally:
            server.should_exit = True
            thread.join(timeout=30)
            listener.close()
            service.close()
        example = None
        if first:
            record = first[0]
            nearest = int(np.argmin(record["distances"]))
            earlier, later = record["ids"][nearest], record["decision"]
            example = {"ids": [earlier, later], "distance": record["distances"][nearest],
                       "inputs": [rows[earlier].tolist(), rows[later].tolist()], "decisions": [labels[earlier], labels[later]]}
        say("restarting from the store")
        restarted = build(store)
        again = restarted.hub.stats("loans")
        restored_seconds = restarted.hub.restored_seconds
        restarted.close()
    return {"url": url, "decisions": stats.decisions, "flagged": stats.flagged, "pairs": stats.pairs,
            "posts": -(-_DECISIONS // _BATCH), "seconds": seconds, "epsilon": _EPSILON, "features": list(_FEATURES),
            "first_violation": example, "dashboard_status": page.status_code, "dashboard_bytes": len(page.content),
            "restart": {"decisions": again.decisions, "flagged": again.flagged, "pairs": again.pairs,
                        "seconds": restored_seconds}}
