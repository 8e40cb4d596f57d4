"""Running the service: open the store, rebuild the monitors, serve the app with uvicorn.

:func:`serve` is what ``assay serve`` calls; :func:`build` gives the hub and the app without
serving them (tests and embedding in another ASGI server).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass

from assay.serve.app import DEFAULT_MAX_BODY_BYTES, create_app
from assay.serve.auth import check_bind
from assay.serve.hub import DEFAULT_SNAPSHOT_EVERY, MonitorHub, MonitorSpec
from assay.serve.startup import StartingGate, warm_kernels
from assay.serve.storage import open_store

__all__ = ["serve", "build", "Service"]


@dataclass(frozen=True, eq=False)
class Service:
    """A hub over an open store and the app serving it."""

    hub: MonitorHub
    app: object

    def close(self) -> None:
        self.hub.close()


def build(store: str, *, default: MonitorSpec | None = None, token: str | None = None,
          max_body_bytes: int = DEFAULT_MAX_BODY_BYTES, snapshot_every: int = DEFAULT_SNAPSHOT_EVERY,
          synchronous: str = "FULL") -> Service:
    """Open ``store``, rebuild its monitors, create ``default`` if it is missing, and make the app."""
    opened = open_store(store, synchronous=synchronous)
    try:
        hub = MonitorHub(opened, snapshot_every=snapshot_every)
        if default is not None:
            hub.create(default)
    except BaseException:
        opened.close()
        raise
    return Service(hub, create_app(hub, token=token, max_body_bytes=max_body_bytes))


def serve(store: str, *, host: str = "127.0.0.1", port: int = 8000, token: str | None = None,
          default: MonitorSpec | None = None, max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
          snapshot_every: int = DEFAULT_SNAPSHOT_EVERY, synchronous: str = "FULL",
          on_ready: Callable[[Service], None] | None = None) -> None:
    """Serve until stopped (Ctrl-C or SIGTERM; both leave a snapshot behind). Loopback only without a token."""
    import uvicorn

    check_bind(host, token)
    service = build(store, default=default, token=token, max_body_bytes=max_body_bytes,
                    snapshot_every=snapshot_every, synchronous=synchronous)
    try:
        if on_ready is not None:
            on_ready(service)
        # The compiled kernels load (or compile once) beside the listening server: until they are
        # ready every request, /health included, is answered "503 starting" at once (startup.py).
        ready = threading.Event()
        specs = [service.hub.spec(name) for name in service.hub.names()]
        threading.Thread(target=_warm, args=(specs, ready), name="assay-warmup", daemon=True).start()
        # "auto": uvloop and httptools where installed (they are dependencies on Linux), else asyncio and h11.
        config = uvicorn.Config(StartingGate(service.app, ready), host=host, port=port, log_level="warning",
                                access_log=False, lifespan="on", loop="auto", http="auto")
        uvicorn.Server(config).run()
    finally:
        service.close()


def _warm(specs, ready: threading.Event) -> None:
    try:
        warm_kernels(specs)
    finally:
        ready.set()  # a failed warm-up leaves the kernels to load on first use: serve anyway
