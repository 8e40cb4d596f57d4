"""Exactly-once posts: an ``Idempotency-Key`` makes a retried post count once, across restarts too."""

from __future__ import annotations

import json

import httpx
import pytest
from fastapi.testclient import TestClient

from assay.monitor import Monitor
from assay.serve import Client, MonitorSpec, ServiceError, build
from assay.serve.hub import Post
from tests.serve.conftest import stream
from tests.serve.servers import ThreadServer

EPSILON = 0.1
DECISIONS = "/api/monitors/default/decisions"


@pytest.fixture
def service(tmp_path):
    built = build(f"sqlite:///{tmp_path / 'once.db'}", default=MonitorSpec("default", EPSILON))
    with TestClient(built.app) as client:
        yield built, client
    built.close()


def keyed(client, body: dict, key: str):
    return client.post(DECISIONS, content=json.dumps(body), headers={"Idempotency-Key": key, "content-type": "application/json"})


def test_a_retried_post_gets_the_first_answer_and_is_stored_once(service):
    built, client = service
    X, Y = stream(50, 12)
    first = keyed(client, {"X": X[:6].tolist(), "Y": Y[:6]}, "post-1")
    assert first.status_code == 200 and "idempotent-replayed" not in first.headers
    between = keyed(client, {"X": X[6:].tolist(), "Y": Y[6:]}, "post-2")
    again = keyed(client, {"X": X[:6].tolist(), "Y": Y[:6]}, "post-1")
    assert again.status_code == 200 and again.headers["idempotent-replayed"] == "true"
    assert again.json() == first.json()
    assert between.json()["first_id"] == 6
    assert built.hub.store.decision_count("default") == 12 and built.hub.store.post_count("default") == 2
    reference = [w.to_json() for w in Monitor(EPSILON).observe_batch(X, Y) if w.flagged]
    assert first.json()["flagged"] + between.json()["flagged"] == reference


def test_a_key_reused_for_another_body_is_refused(service):
    built, client = service
    X, Y = stream(51, 4)
    assert keyed(client, {"X": X[:2].tolist(), "Y": Y[:2]}, "k").status_code == 200
    refused = keyed(client, {"X": X[2:].tolist(), "Y": Y[2:]}, "k")
    assert refused.status_code == 422
    assert "'k'" in refused.json()["detail"] and "another body" in refused.json()["detail"]
    assert built.hub.store.decision_count("default") == 2
    # Keys are per monitor: the same key on another monitor is another post.
    client.put("/api/monitors/other", json={"epsilon": EPSILON})
    other = client.post("/api/monitors/other/decisions", json={"X": X[2:].tolist(), "Y": Y[2:]}, headers={"Idempotency-Key": "k"})
    assert other.status_code == 200 and other.json()["first_id"] == 0


def test_the_same_key_twice_in_one_commit_group_is_stored_once(service):
    built, _ = service
    X, Y = stream(52, 3)
    body = {"X": X.tolist(), "Y": Y}
    results = built.hub.submit([Post("default", body, "twin"), Post("default", body, "twin"), ("default", body)])
    assert [r.replayed for r in results] == [False, True, False]
    assert results[0].to_json() == results[1].to_json() and results[2].first_id == 3
    assert built.hub.store.decision_count("default") == 6 and built.hub.store.post_count("default") == 1


def test_keys_survive_a_restart(tmp_path):
    url = f"sqlite:///{tmp_path / 'restart.db'}"
    X, Y = stream(53, 8)
    body = {"X": X.tolist(), "Y": Y}
    first = build(url, default=MonitorSpec("default", EPSILON))
    answer = first.hub.submit([Post("default", body, "survivor")])[0]
    first.hub.store.close()  # no clean stop
    second = build(url)
    replay = second.hub.submit([Post("default", body, "survivor")])[0]
    assert replay.replayed and replay.to_json() == answer.to_json()
    assert second.hub.stats("default").decisions == 8
    second.close()


class LosesAnswers(httpx.BaseTransport):
    """Forwards every request, then loses the answer of the first ``lose`` posts (as a reset connection would)."""

    def __init__(self, lose: int):
        self.inner = httpx.HTTPTransport()
        self.lose = lose
        self.keys: list[str] = []

    def handle_request(self, request):
        response = self.inner.handle_request(request)
        if request.method == "POST":
            self.keys.append(request.headers["idempotency-key"])
            if self.lose > 0:
                self.lose -= 1
                response.read()
                response.close()
                raise httpx.ReadError("connection reset (simulated)", request=request)
        return response

    def close(self):
        self.inner.close()


def test_the_client_sends_keys_and_retries_a_post_whose_answer_was_lost(tmp_path):
    built = build(f"sqlite:///{tmp_path / 'lost.db'}", default=MonitorSpec("default", EPSILON))
    X, Y = stream(54, 20)
    with ThreadServer(built.app) as server:
        transport = LosesAnswers(lose=2)
        with Client(server.url, transport=transport, retry_wait=0.01) as client:
            first = client.post_batch(X[:10], Y[:10])       # stored, answer lost twice, answered on the third try
            second = client.post_batch(X[10:], Y[10:])
            assert client.retried == 2
        assert (first.first_id, second.first_id) == (0, 10)
        assert transport.keys[0] == transport.keys[1] == transport.keys[2] != transport.keys[3]
        assert built.hub.stats("default").decisions == 20
        never = Client(server.url, transport=LosesAnswers(lose=99), retries=2, retry_wait=0.01)
        with pytest.raises(ServiceError, match="3 tries"):
            never.post_batch(X[:1], Y[:1])
        never.close()
        assert built.hub.stats("default").decisions == 21  # sent three times, stored once
    built.close()
