"""The ASGI application of ``assay serve``: an HTTP API and a dashboard over a :class:`MonitorHub`.

API (JSON; the OpenAPI schema is at ``/openapi.json``, interactive docs at ``/docs``):

===========================================  ==================================================
``GET  /health``                             liveness (no token needed; says nothing else)
``GET  /api/monitors``                       every monitor's options and counts
``PUT  /api/monitors/{name}``                create a monitor (ε, metric, decision column, ...)
``GET  /api/monitors/{name}``                one monitor's options and counts
``POST /api/monitors/{name}/decisions``      record one decision or a batch; returns the witnesses
``GET  /api/monitors/{name}/violations``     flagged decisions, paged, filtered by id and time
``GET  /api/monitors/{name}/stats``          decisions, violating pairs, flagged decisions
``GET  /api/monitors/{name}/decisions/{id}`` one stored decision (its input and output)
===========================================  ==================================================

Acknowledgement: a post is answered 200 only after its decisions and witnesses are committed
(:meth:`MonitorHub.submit`). Posts are queued to one writer task, which takes every post waiting
in the queue as one group — one pass through the monitors, one commit — so concurrent clients
share the cost of a disk sync (group commit) and the order of the queue is the order of ids.

Input is strict and bounded at the edge (:mod:`assay.serve.body`, :mod:`assay.serve.payload`):
the body's size is checked before it is read and its nesting depth before it is parsed; features
are finite numbers within ±1e100 (integers that a float64 holds exactly), decisions are of one
type per monitor, ids lie in the store's integer range (0 … 2^63 − 1). Every refusal is
``{"detail": "..."}`` naming the field and the rule, and leaves the stored state untouched:
400 (not UTF-8 JSON, too deep, a duplicate key, a bad header), 401 (token), 404 (unknown monitor
or decision), 409 (a monitor exists with other options), 413 (body over ``max_body_bytes``), 415
(not JSON, or compressed), 422 (wrong shape or type, a number out of range, wrong width, an
idempotency key reused for another body), 503 (the store failed; nothing of the group was kept,
and the answer names no file of the server). A post refused never costs another client's post.

Exactly-once posts: a post may carry an ``Idempotency-Key`` header (1–255 visible ASCII
characters, e.g. a UUID); the key, a digest of the body and the answer are committed with the
decisions, so the same post sent again — a retry after a lost answer, a restart, a ``kill -9`` —
gets the first answer again (with ``Idempotent-Replayed: true``) and stores nothing.
No endpoint reads files: the dashboard's assets are a fixed list of package resources.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
from importlib import resources
from urllib.parse import parse_qs

from fastapi import FastAPI, HTTPException, Path, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse, RedirectResponse, Response
from pydantic import BaseModel

from assay.errors import AssayError, DataError, OptionError
from assay.serve.auth import COOKIE, presented_token, token_matches
from assay.serve.body import (
    IDEMPOTENCY_KEY,
    MalformedBodyError,
    UnsupportedMediaError,
    check_content_headers,
    check_idempotency_key,
    decode_json,
)
from assay.serve.dashboard import render_index, render_login, render_monitor
from assay.serve.hub import (
    Accepted,
    IdempotencyKeyReusedError,
    MonitorExistsError,
    MonitorHub,
    MonitorSpec,
    Post,
    UnknownMonitorError,
)
from assay.serve.payload import SHAPES
from assay.serve.storage import StoreError

__all__ = ["create_app", "DEFAULT_MAX_BODY_BYTES", "MAX_ID"]

_log = logging.getLogger("assay.serve")

#: Largest decision id the store holds (a signed 64-bit integer); ids are ≥ 0.
MAX_ID = 2**63 - 1


#: Largest request body accepted (bytes): about 20,000 decisions of 10 features.
DEFAULT_MAX_BODY_BYTES = 4 * 1024 * 1024

# Posts taken into one group (one commit) at most.
_MAX_GROUP = 1024

_ASSETS = {"dashboard.css": "text/css; charset=utf-8", "dashboard.js": "text/javascript; charset=utf-8"}

_STATUS = ((UnknownMonitorError, 404), (MonitorExistsError, 409), (StoreError, 503), (MalformedBodyError, 400),
           (UnsupportedMediaError, 415), (DataError, 422), (OptionError, 422), (IdempotencyKeyReusedError, 422))


class ErrorBody(BaseModel):
    """Every refusal: what was wrong, naming the field and the rule."""

    detail: str


_REFUSALS = {status: {"model": ErrorBody, "description": text} for status, text in (
    (400, "Not UTF-8 JSON, nested too deeply, a duplicate key, or a malformed header"),
    (401, "Missing or wrong token"), (404, "No such monitor or decision"), (409, "The monitor exists with other options"),
    (413, "The body is larger than the server accepts"), (415, "The body is not JSON, or is compressed"),
    (422, "A field breaks a rule: the message names it"), (503, "The store failed; nothing was kept"))}


# A decision in the OpenAPI schema: one of these types, the same for every decision of a monitor.
_DECISION = {"type": ["string", "number", "boolean"]}


def _refusals(*statuses: int) -> dict:
    return {status: _REFUSALS[status] for status in (*statuses, 401, 422)}


def _validation_message(exc: RequestValidationError) -> str:
    """FastAPI's list of validation errors as one line: ``after_id: Input should be ... (got '...')``."""
    parts = []
    for error in exc.errors():
        where = ".".join(str(part) for part in error.get("loc", ())[1:]) or "the request"
        got = error.get("input")
        shown = f" (got {str(got)[:40]!r})" if isinstance(got, (str, int, float)) else ""
        parts.append(f"{where}: {error.get('msg', 'is not valid')}{shown}")
    return "; ".join(parts)


def _status_of(error: AssayError) -> int:
    for kind, status in _STATUS:
        if isinstance(error, kind):
            return status
    return 422


class _Writer:
    """One task that runs queued posts through the hub in groups (see the module docstring)."""

    def __init__(self, hub: MonitorHub):
        self.hub = hub
        self.queue: asyncio.Queue = asyncio.Queue()
        self.task: asyncio.Task | None = None

    async def submit(self, post: Post):
        future = asyncio.get_running_loop().create_future()
        await self.queue.put((post, future))
        return await future

    async def run(self) -> None:
        while True:
            group = [await self.queue.get()]
            while not self.queue.empty() and len(group) < _MAX_GROUP:
                group.append(self.queue.get_nowait())
            try:
                results = await asyncio.to_thread(self.hub.submit, [post for post, _ in group])
            except Exception as exc:  # a failed commit: every post of the group is refused
                for _, future in group:
                    if not future.done():
                        future.set_exception(exc)
                continue
            for (_, future), result in zip(group, results):
                if not future.done():
                    future.set_result(result)


class _TokenCheck:
    """Pure ASGI middleware: every request but ``/health``, the login page and the assets needs the token.

    API calls without it get 401; a browser asking for a page is sent to the login form.
    """

    def __init__(self, app, token: str):
        self.app = app
        self.token = token

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        path = scope["path"]
        if path in ("/health", "/login") or path.startswith("/static/"):
            return await self.app(scope, receive, send)
        request = Request(scope)
        if token_matches(presented_token(request.headers, request.cookies), self.token):
            return await self.app(scope, receive, send)
        if path.startswith("/api/") or path in ("/openapi.json", "/docs", "/redoc") or scope["method"] != "GET":
            response = JSONResponse({"detail": "missing or wrong token: send `Authorization: Bearer TOKEN`"},
                                    status_code=401, headers={"WWW-Authenticate": "Bearer"})
        else:
            response = RedirectResponse("/login", status_code=303)
        await response(scope, receive, send)


def create_app(hub: MonitorHub, *, token: str | None = None, max_body_bytes: int = DEFAULT_MAX_BODY_BYTES) -> FastAPI:
    """The FastAPI app serving ``hub`` (see the module docstring).

    Args:
        hub: the monitors and their store; the app does not close it.
        token: when set, every endpoint but ``/health`` and the login page needs it
            (``Authorization: Bearer TOKEN``, or the cookie the login form sets).
        max_body_bytes: larger request bodies are refused with 413 before they are read.
    """
    writer = _Writer(hub)

    @contextlib.asynccontextmanager
    async def lifespan(_app):
        writer.task = asyncio.create_task(writer.run())
        try:
            yield
        finally:
            writer.task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await writer.task
            # A clean stop leaves a snapshot, so the next start replays nothing.
            await asyncio.to_thread(hub.snapshot_all)

    app = FastAPI(title="assay monitor service", version="1", lifespan=lifespan,
                  description="Exact runtime monitoring of robustness and individual fairness (assay.monitor) over HTTP.")

    if token is not None:
        app.add_middleware(_TokenCheck, token=token)

    @app.exception_handler(AssayError)
    async def assay_error(_request: Request, exc: AssayError):
        status = _status_of(exc)
        detail = str(exc)
        if status == 503:  # the operator's log names the store; the client's answer does not
            _log.error("%s", detail)
            detail = hub.store.redact(detail)
        return JSONResponse({"detail": detail}, status_code=status)

    @app.exception_handler(RequestValidationError)
    async def invalid_request(_request: Request, exc: RequestValidationError):
        return JSONResponse({"detail": _validation_message(exc)}, status_code=422)

    async def read_json(request: Request) -> tuple[bytes, object]:
        """``(raw bytes, JSON value)`` of the body: headers, size, depth and encoding checked first."""
        check_content_headers(request.headers.get("content-type"), request.headers.get("content-encoding"))
        length = request.headers.get("content-length")
        if length is not None:
            try:
                declared = int(length)
            except ValueError:
                raise HTTPException(400, f"Content-Length {length!r} is not a number") from None
            if declared < 0:
                raise HTTPException(400, f"Content-Length {length!r} is negative")
            if declared > max_body_bytes:
                raise HTTPException(413, f"the body has {declared} bytes; this server accepts at most {max_body_bytes} "
                                         "(post smaller batches, or start the server with a larger --max-body-bytes)")
        body = bytearray()
        async for chunk in request.stream():
            body += chunk
            if len(body) > max_body_bytes:
                raise HTTPException(413, f"the body is over {max_body_bytes} bytes; post smaller batches")
        raw = bytes(body)
        return raw, decode_json(raw)

    def describe(name: str) -> dict:
        return {"options": hub.spec(name).to_json(), "stats": hub.stats(name).to_json()}

    # -- API ------------------------------------------------------------------------------
    @app.get("/health", tags=["service"], summary="Liveness check")
    async def health() -> dict:
        return {"status": "ok"}

    @app.get("/api/monitors", tags=["monitors"], summary="Every monitor's options and counts")
    async def list_monitors() -> dict:
        return {"monitors": [describe(name) for name in hub.names()]}

    @app.put("/api/monitors/{name}", tags=["monitors"], summary="Create a monitor", status_code=201,
             responses={200: {"description": "The monitor exists with the same options: nothing changed"},
                        **_refusals(400, 409, 413, 415)},
             openapi_extra={"requestBody": {"required": True, "content": {"application/json": {"schema": {
                 "type": "object", "required": ["epsilon"], "properties": {
                     "epsilon": {"type": "number", "minimum": 0}, "metric": {"enum": ["linf", "l2", "l1", "cosine"]},
                     "decision_column": {"type": "string"}, "index": {"type": "string"},
                     "max_witnesses": {"type": "integer", "minimum": 0},
                     "features": {"type": "array", "items": {"type": "string"}},
                     "image_shape": {"type": "array", "items": {"type": "integer"}},
                     "decision_type": {"enum": ["string", "number", "boolean"]}}}}}}})
    async def create_monitor(name: str, request: Request, response: Response) -> dict:
        _, options = await read_json(request)
        if not isinstance(options, dict):
            raise DataError("the monitor's options must be a JSON object like {\"epsilon\": 0.1, \"metric\": \"linf\"}")
        if options.get("name", name) != name:
            raise OptionError(f"the body names the monitor {options['name']!r} but the path names {name!r}")
        spec = MonitorSpec.from_json(options | {"name": name})
        created = await asyncio.to_thread(hub.create, spec)
        if not created:
            response.status_code = 200
        return describe(name)

    @app.get("/api/monitors/{name}", tags=["monitors"], summary="One monitor's options and counts", responses=_refusals(404))
    async def get_monitor(name: str) -> dict:
        return describe(name)

    @app.post("/api/monitors/{name}/decisions", tags=["decisions"], summary="Record decisions; get their witnesses",
              responses=_refusals(400, 404, 413, 415, 503),
              openapi_extra={"requestBody": {"required": True, "content": {"application/json": {
                  "schema": {"oneOf": [
                      {"type": "object", "required": ["x", "y"], "additionalProperties": False, "properties": {
                          "x": {"type": "array", "minItems": 1, "items": {"type": "number"}}, "y": _DECISION}},
                      {"type": "object", "required": ["decisions"], "additionalProperties": False,
                       "properties": {"decisions": {"type": "array", "items": {"type": "object"}}}},
                      {"type": "object", "required": ["X", "Y"], "additionalProperties": False, "properties": {
                          "X": {"type": "array", "items": {"type": "array", "minItems": 1, "items": {"type": "number"}}},
                          "Y": {"type": "array", "items": _DECISION}}}]},
                  "example": {"x": [0.1, 0.5], "y": "deny"}}}}},
              description="Bodies: " + " | ".join(SHAPES) + ". Answered after the decisions are stored. "
                          "`flagged` lists the witnesses of each decision that has any. Features: finite JSON numbers "
                          "within ±1e100 (integers a float64 holds exactly); decisions: strings, numbers or booleans, one "
                          f"type per monitor. Send an `{IDEMPOTENCY_KEY}` header to make a retried post count once.")
    async def post_decisions(name: str, request: Request) -> Response:
        hub.spec(name)  # 404 before reading the body
        key = check_idempotency_key(request.headers.get(IDEMPOTENCY_KEY))
        raw, body = await read_json(request)
        fingerprint = None if key is None else "sha256:" + hashlib.sha256(raw).hexdigest()
        result = await writer.submit(Post(name, body, key, fingerprint))
        if isinstance(result, AssayError):
            raise result
        assert isinstance(result, Accepted)
        # Serialised here, not by FastAPI's encoder (which walks every value: slow for big batches).
        headers = {"Idempotent-Replayed": "true"} if result.replayed else None
        return Response(json.dumps(result.to_json()), media_type="application/json", headers=headers)

    @app.get("/api/monitors/{name}/violations", tags=["decisions"], summary="Flagged decisions, paged",
             responses=_refusals(404, 503))
    async def violations(name: str,
                         after_id: int | None = Query(None, ge=-1, le=MAX_ID,
                                                      description="Only decisions with a larger id (paging forward)."),
                         before_id: int | None = Query(None, ge=0, le=MAX_ID,
                                                       description="Only decisions with a smaller id (paging back)."),
                         since: float | None = Query(None, allow_inf_nan=False, description="Received at or after this Unix time."),
                         until: float | None = Query(None, allow_inf_nan=False, description="Received at or before this Unix time."),
                         limit: int = Query(100, ge=1, le=1000, description="Page size."),
                         order: str = Query("asc", pattern="^(asc|desc)$", description="By decision id.")) -> dict:
        hub.spec(name)
        page = await asyncio.to_thread(hub.store.violations, name, after_id=after_id, before_id=before_id, since=since,
                                       until=until, limit=limit, newest_first=order == "desc")
        following = None
        if len(page) == limit:
            following = {"after_id" if order == "asc" else "before_id": page[-1]["decision"]}
        return {"monitor": name, "violations": page, "next": following}

    @app.get("/api/monitors/{name}/stats", tags=["decisions"], summary="Counts of the stored decisions",
             responses=_refusals(404))
    async def stats(name: str) -> dict:
        return {"monitor": name} | hub.stats(name).to_json()

    @app.get("/api/monitors/{name}/decisions/{decision_id}", tags=["decisions"], summary="One stored decision",
             responses=_refusals(404, 503))
    async def decision(name: str, decision_id: int = Path(ge=0, le=MAX_ID, description="The decision's id.")) -> dict:
        hub.spec(name)
        found = await asyncio.to_thread(hub.store.decision, name, decision_id)
        if found is None:
            raise HTTPException(404, f"monitor {name!r} has no decision {decision_id}")
        x, y, received = found
        return {"monitor": name, "id": decision_id, "x": x.tolist(), "y": y, "received": received}

    # -- dashboard ------------------------------------------------------------------------
    @app.get("/", response_class=HTMLResponse, include_in_schema=False)
    async def index() -> HTMLResponse:
        return HTMLResponse(await asyncio.to_thread(render_index, hub))

    @app.get("/monitors/{name}", response_class=HTMLResponse, include_in_schema=False)
    async def monitor_page(name: str, before_id: int | None = Query(None, ge=0, le=MAX_ID)) -> HTMLResponse:
        hub.spec(name)
        return HTMLResponse(await asyncio.to_thread(render_monitor, hub, name, before_id))

    @app.get("/login", response_class=HTMLResponse, include_in_schema=False)
    async def login_form() -> HTMLResponse:
        return HTMLResponse(render_login(failed=False))

    @app.post("/login", include_in_schema=False)
    async def login(request: Request):
        body = bytearray()
        async for chunk in request.stream():
            body += chunk
            if len(body) > 4096:
                raise HTTPException(413, "the login form is too large")
        presented = parse_qs(body.decode("utf-8", "replace")).get("token", [""])[0]
        if token is None or not token_matches(presented, token):
            return HTMLResponse(render_login(failed=token is not None), status_code=401 if token is not None else 200)
        response = RedirectResponse("/", status_code=303)
        response.set_cookie(COOKIE, presented, httponly=True, samesite="strict")
        return response

    @app.get("/static/{asset}", include_in_schema=False)
    async def static(asset: str) -> Response:
        if asset not in _ASSETS:  # a fixed list: no path ever reaches the file system
            raise HTTPException(404, "no such asset")
        content = resources.files("assay.serve").joinpath("static", asset).read_bytes()
        return Response(content, media_type=_ASSETS[asset], headers={"Cache-Control": "max-age=300"})

    return app
