"""``assay serve``'s start: every request is answered "503 starting" until the kernels are ready, then served."""

from __future__ import annotations

import threading

import pytest

pytest.importorskip("fastapi")

from fastapi import FastAPI  # noqa: E402
from fastapi.testclient import TestClient  # noqa: E402

from assay.serve.startup import StartingGate  # noqa: E402


def test_requests_wait_for_nothing_and_health_says_starting_until_ready():
    app = FastAPI()

    @app.get("/health")
    def health():
        return {"status": "ok"}

    @app.post("/api/monitors/default/decisions")
    def post():
        return {"accepted": 1}

    ready = threading.Event()
    client = TestClient(StartingGate(app, ready))
    for response in (client.get("/health"), client.post("/api/monitors/default/decisions", json={})):
        assert response.status_code == 503
        assert response.json()["status"] == "starting"
        assert response.headers["retry-after"] == "1"
    ready.set()
    assert client.get("/health").json() == {"status": "ok"}
    assert client.post("/api/monitors/default/decisions", json={}).json() == {"accepted": 1}
