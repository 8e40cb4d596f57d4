"""assay as a service: the exact monitor behind an HTTP API, a durable store and a browser dashboard.

>>> from assay.serve import build, Client, MonitorSpec          # doctest: +SKIP
>>> service = build("sqlite:///monitor.db", default=MonitorSpec("default", epsilon=0.1))

* :mod:`assay.serve.app` — the ASGI app (FastAPI): the API, the dashboard, the token check;
* :mod:`assay.serve.hub` — monitors by name (:class:`assay.monitor.Monitor`), kept in step with
  the store: a decision is acknowledged only once it and its witnesses are committed;
* :mod:`assay.serve.storage` — SQLite in WAL mode (default) or PostgreSQL;
* :mod:`assay.serve.client` — :class:`Client`, and :func:`post_stream` (``assay monitor --post``);
* :mod:`assay.serve.server` — :func:`serve` (``assay serve``) and :func:`build`.

Importing this package needs the ``serve`` extra (fastapi, uvicorn, httpx, jinja2; psycopg for
PostgreSQL).
"""

from assay.serve.client import Client, PostResult, ServiceError, post_stream
from assay.serve.hub import MonitorHub, MonitorSpec
from assay.serve.server import Service, build, serve
from assay.serve.storage import StoreError, open_store

__all__ = ["Client", "PostResult", "ServiceError", "post_stream", "MonitorHub", "MonitorSpec", "Service", "build",
           "serve", "StoreError", "open_store"]
