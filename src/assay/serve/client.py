"""A small Python client of ``assay serve`` (httpx), and :func:`post_stream` behind ``assay monitor --post``.

>>> from assay.serve import Client
>>> with Client("http://127.0.0.1:8000", monitor="credit") as client:      # doctest: +SKIP
...     client.create_monitor(epsilon=0.1, metric="linf")
...     found = client.post([0.2, 0.4], "deny")          # the witnesses of this decision
...     client.stats()

Every refusal of the server (4xx, 5xx) raises :class:`ServiceError` with the server's explanation
and the HTTP status; a server that cannot be reached raises it too, saying where it looked.

Exactly once: every post carries a fresh ``Idempotency-Key``. When the connection fails (refused,
reset, timed out) or the server answers 503 (its store failed and kept nothing), the client waits
and sends the same bytes with the same key again, up to ``retries`` times; the server answers a
post it stored already with its first answer, so a decision never counts twice and an answer
lost on the way is not a decision lost.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import numpy as np

from assay.errors import AssayError
from assay.monitor import MonitorStats, Witnesses

__all__ = ["Client", "PostResult", "ServiceError", "post_stream", "StreamPost"]


class ServiceError(AssayError):
    """The monitor service refused a request (``status`` holds the HTTP status) or could not be reached (status 0)."""

    def __init__(self, message: str, status: int = 0):
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class PostResult:
    """The answer to a post: ids ``first_id`` … ``first_id + accepted − 1``, and the flagged ones' witnesses."""

    monitor: str
    first_id: int
    accepted: int
    flagged: tuple[Witnesses, ...]

    def to_json(self) -> dict:
        return {"monitor": self.monitor, "first_id": self.first_id, "accepted": self.accepted,
                "flagged": [w.to_json() for w in self.flagged]}


def _witnesses(record: dict) -> Witnesses:
    return Witnesses(record["decision"], record["ids"], record["distances"], record["count"], record["incomplete"])


class Client:
    """Talk to one monitor (``monitor``) of the service at ``url``.

    Args:
        url: the server, e.g. ``http://127.0.0.1:8000``.
        monitor: the monitor's name (``assay serve --epsilon`` creates ``default``).
        token: the server's token, when it has one.
        timeout: seconds per request.
        retries: how many times a request is sent again after a connection error or a 503 (posts
            with the same idempotency key, so they count once); 0: never.
        retry_wait: seconds before the first retry; doubled after each, up to 8 s.
        transport: an httpx transport (a test seam: ``httpx.ASGITransport`` or a mock).
    """

    def __init__(self, url: str = "http://127.0.0.1:8000", monitor: str = "default", *, token: str | None = None,
                 timeout: float = 30.0, retries: int = 6, retry_wait: float = 0.25, transport=None):
        import httpx

        self.url = url.rstrip("/")
        self.monitor = monitor
        self.retries = max(0, int(retries))
        self.retry_wait = float(retry_wait)
        #: Requests sent again after a connection error or a 503 (for tests and benchmarks).
        self.retried = 0
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._http = httpx.Client(base_url=self.url, headers=headers, timeout=timeout, transport=transport)

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *_exc) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()

    def _request(self, method: str, path: str, **options) -> dict:
        """Send one request, again after connection errors and 503s (see the module docstring); its JSON answer."""
        import httpx

        wait = self.retry_wait
        for attempt in range(self.retries + 1):
            last = attempt == self.retries
            try:
                response = self._http.request(method, path, **options)
            except httpx.TransportError as exc:
                if last:
                    raise ServiceError(f"cannot reach the monitor service at {self.url}{path} ({self.retries + 1} tries): "
                                       f"{exc} — is `assay serve` running there?") from exc
            except httpx.HTTPError as exc:
                raise ServiceError(f"the request {method} {self.url}{path} failed: {exc}") from exc
            else:
                if response.status_code != 503 or last:
                    break
            self.retried += 1
            time.sleep(wait)
            wait = min(wait * 2, 8.0)
        if response.status_code >= 400:
            try:
                detail = response.json().get("detail", response.text)
            except ValueError:
                detail = response.text
            raise ServiceError(f"the monitor service refused {method} {path} ({response.status_code}): {detail}",
                               response.status_code)
        return response.json()

    def _path(self, suffix: str = "") -> str:
        return f"/api/monitors/{self.monitor}{suffix}"

    # -- monitors -------------------------------------------------------------------------
    def health(self) -> dict:
        return self._request("GET", "/health")

    def monitors(self) -> list[dict]:
        return self._request("GET", "/api/monitors")["monitors"]

    def create_monitor(self, epsilon: float, metric: str = "linf", **options) -> dict:
        """Create this client's monitor (options as :class:`~assay.serve.MonitorSpec`); no-op if it exists alike."""
        return self._request("PUT", self._path(), json={"epsilon": epsilon, "metric": metric, **options})

    # -- decisions ------------------------------------------------------------------------
    def post(self, x: Sequence[float], y) -> Witnesses:
        """Record one decision; return its witnesses (after the server stored it)."""
        result = self._post({"x": np.asarray(x, dtype=np.float64).tolist(), "y": _plain(y)})
        return result.flagged[0] if result.flagged else Witnesses(result.first_id, [], [], 0)

    def post_batch(self, X, Y) -> PostResult:
        """Record decisions ``X`` (n, d) with outputs ``Y`` (n,) in order; return the flagged ones' witnesses."""
        rows = np.asarray(X, dtype=np.float64)
        return self._post({"X": rows.tolist(), "Y": [_plain(y) for y in Y]})

    def post_records(self, records: list[dict]) -> PostResult:
        """Record decisions given as records ``{feature: value, ..., decision_column: label}``."""
        return self._post({"decisions": records})

    def _post(self, body: dict) -> PostResult:
        # Encoded once: a retry sends the same bytes under the same key.
        content = json.dumps(body).encode()
        headers = {"Idempotency-Key": uuid.uuid4().hex, "Content-Type": "application/json"}
        answer = self._request("POST", self._path("/decisions"), content=content, headers=headers)
        return PostResult(answer["monitor"], answer["first_id"], answer["accepted"],
                          tuple(_witnesses(record) for record in answer["flagged"]))

    def stats(self) -> MonitorStats:
        answer = self._request("GET", self._path("/stats"))
        return MonitorStats(answer["decisions"], answer["pairs"], answer["flagged"])

    def violations(self, *, after_id: int | None = None, before_id: int | None = None, since: float | None = None,
                   until: float | None = None, limit: int = 100, order: str = "asc") -> list[dict]:
        """One page of stored witness records (``Witnesses.to_json()`` plus ``received``)."""
        params = {key: value for key, value in dict(after_id=after_id, before_id=before_id, since=since, until=until,
                                                    limit=limit, order=order).items() if value is not None}
        return self._request("GET", self._path("/violations"), params=params)["violations"]

    def iter_violations(self, page: int = 1000, **filters) -> Iterator[dict]:
        """Every stored witness record, oldest first, fetched page by page."""
        after = filters.pop("after_id", None)
        while True:
            records = self.violations(after_id=after, limit=page, **filters)
            yield from records
            if len(records) < page:
                return
            after = records[-1]["decision"]

    def decision(self, decision_id: int) -> dict:
        return self._request("GET", self._path(f"/decisions/{int(decision_id)}"))


def _plain(value):
    """numpy scalars to Python ones (JSON)."""
    return value.item() if isinstance(value, np.generic) else value


@dataclass(frozen=True)
class StreamPost:
    """What streaming a file into a server gave: decisions posted, flagged among them, the ids given."""

    stream: str
    url: str
    monitor: str
    decisions: int
    flagged: int
    first_id: int | None
    last_id: int | None

    def to_json(self) -> dict:
        return dict(self.__dict__)


def post_stream(source: str, url: str, monitor: str = "default", *, token: str | None = None,
                decision_column: str = "prediction", drop: tuple[str, ...] = (), batch_size: int = 256,
                progress: Callable[[int, int], None] | None = None, stdin=None) -> StreamPost:
    """Post every decision of ``source`` (CSV, Parquet, JSON lines, ``-``) to a running server, in batches.

    The monitor must exist on the server. Returns once the last batch is acknowledged (stored).
    """
    from assay.monitor.stream import read_stream

    decisions = flagged = 0
    first_id = last_id = None
    with Client(url, monitor, token=token) as client:
        for chunk in read_stream(source, decision_column, drop, chunk_size=batch_size, stdin=stdin):
            result = client.post_batch(chunk.features, list(chunk.decisions))
            if first_id is None:
                first_id = result.first_id
            last_id = result.first_id + result.accepted - 1
            decisions += result.accepted
            flagged += len(result.flagged)
            if progress is not None:
                progress(result.accepted, flagged)
    return StreamPost(str(source), url, monitor, decisions, flagged, first_id, last_id)
