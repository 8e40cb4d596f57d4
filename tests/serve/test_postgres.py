"""The PostgreSQL store against a real server (started by the fixture from Debian's postgresql)."""

from __future__ import annotations

from fastapi.testclient import TestClient

from assay.monitor import Monitor
from assay.serve import MonitorSpec, build, open_store
from assay.serve.storage import PostgresStore
from tests.serve.conftest import stream

EPSILON = 0.1


def strip(records):
    return [{k: v for k, v in r.items() if k != "received"} for r in records]


def test_postgres_store_keeps_decisions_and_witnesses_across_a_restart(postgres_url):
    X, Y = stream(31, 120)
    first = build(postgres_url, default=MonitorSpec("pg", EPSILON), snapshot_every=25)
    assert isinstance(first.hub.store, PostgresStore)
    with TestClient(first.app) as client:
        for start in range(0, 70, 10):
            assert client.post("/api/monitors/pg/decisions", json={"X": X[start:start + 10].tolist(),
                                                                   "Y": Y[start:start + 10]}).status_code == 200
        refused = client.post("/api/monitors/pg/decisions", json={"X": [[0.0, 1.0]], "Y": ["a"]})
        assert refused.status_code == 422
    first.hub.store.close()  # no clean stop: the restart reads the snapshot at 30 … plus the log
    second = build(postgres_url, snapshot_every=25)
    with TestClient(second.app) as client:
        assert client.get("/api/monitors/pg/stats").json()["decisions"] == 70
        client.post("/api/monitors/pg/decisions", json={"X": X[70:].tolist(), "Y": Y[70:]})
        stored = client.get("/api/monitors/pg/violations", params={"limit": 1000}).json()["violations"]
        page = client.get("/monitors/pg")
        assert page.status_code == 200 and "decision #" in page.text
    second.close()
    assert strip(stored) == [w.to_json() for w in Monitor(EPSILON).observe_batch(X, Y) if w.flagged]
    reader = open_store(postgres_url)
    assert reader.decision_count("pg") == 120 and reader.snapshot("pg")[0] >= 100
    start = min(r["received"] for r in stored) - 0.001
    counts = reader.violation_histogram("pg", start, 3600.0, 2)  # integer division on PostgreSQL floors too
    assert counts.tolist() == [len(stored), 0]
    reader.close()


def test_a_wrong_postgres_address_is_a_clear_error(postgres_url):
    import pytest

    from assay.serve import StoreError

    with pytest.raises(StoreError, match="cannot connect to the PostgreSQL store"):
        open_store(postgres_url.rsplit("/", 1)[0] + "/no_such_database")
