"""``assay serve``'s start: the monitors' compiled kernels are loaded (compiled once) before any request is served.

While :func:`warm_kernels` runs, :class:`StartingGate` answers every HTTP request at once with
``503 {"status": "starting"}`` (``Retry-After: 1``) — ``/health`` included — so that a load
balancer sees the server come up and no request waits for a compiler; afterwards it passes every
request through and ``/health`` says ``{"status": "ok"}``.
"""

from __future__ import annotations

import json
import threading

__all__ = ["StartingGate", "warm_kernels"]

_STARTING = json.dumps({"status": "starting", "detail": "loading the monitor's compiled kernels; retry in a second"}).encode()


class StartingGate:
    """ASGI middleware: ``503 starting`` for every HTTP request until ``ready`` is set, then ``app``."""

    def __init__(self, app, ready: threading.Event):
        self.app = app
        self.ready = ready

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or self.ready.is_set():
            await self.app(scope, receive, send)
            return
        await send({"type": "http.response.start", "status": 503,
                    "headers": [(b"content-type", b"application/json"), (b"retry-after", b"1"),
                                (b"content-length", str(len(_STARTING)).encode())]})
        await send({"type": "http.response.body", "body": _STARTING})


def warm_kernels(specs) -> float:
    """Load (compile once) the kernels of the hash grid and of each monitor's index (``specs``: MonitorSpec); return seconds.

    The grid is always warmed: a monitor with ``index="auto"`` (also one created later) moves its
    history to it as it grows, inside a request.
    """
    from assay.monitor.warmup import warm_up

    wanted = {("linf", "grid")} | {(spec.metric, spec.index) for spec in specs}
    return sum(warm_up(metric, index) for metric, index in sorted(wanted))
