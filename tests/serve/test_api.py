"""The service's API in process (ASGI test client): answers equal the monitor's, refusals change nothing."""

from __future__ import annotations

import json

import numpy as np
import pytest
from fastapi.testclient import TestClient

from assay.errors import OptionError
from assay.monitor import Monitor
from assay.serve import MonitorSpec, build
from assay.serve.auth import check_bind, token_matches
from tests.serve.conftest import stream

EPSILON = 0.1


def brute_force_pairs(X, Y, epsilon=EPSILON) -> set[tuple[int, int]]:
    """(later, earlier) pairs with max |x_i − x_j| ≤ ε and different labels: the O(n²) definition."""
    pairs = set()
    for i in range(len(Y)):
        distances = np.abs(X[:i] - X[i]).max(axis=1)
        pairs |= {(i, int(j)) for j in np.flatnonzero(distances <= epsilon) if Y[j] != Y[i]}
    return pairs


def reported_pairs(records) -> set[tuple[int, int]]:
    return {(record["decision"], witness) for record in records for witness in record["ids"]}


@pytest.fixture
def service(tmp_path):
    built = build(f"sqlite:///{tmp_path / 'monitor.db'}", default=MonitorSpec("default", EPSILON), snapshot_every=7,
                  max_body_bytes=16384)
    with TestClient(built.app) as client:
        yield built, client
    built.close()


def state(client, name="default"):
    """Everything the store and the monitor report, to compare before and after a refused request."""
    stats = client.get(f"/api/monitors/{name}/stats").json()
    records = client.get(f"/api/monitors/{name}/violations", params={"limit": 1000}).json()["violations"]
    return stats, [(r["decision"], r["ids"], r["distances"]) for r in records]


def test_single_batch_and_record_posts_give_the_monitors_witnesses(service):
    _, client = service
    X, Y = stream(1, 60)
    answers = [client.post("/api/monitors/default/decisions", json={"x": X[i].tolist(), "y": Y[i]}).json() for i in range(20)]
    answers.append(client.post("/api/monitors/default/decisions", json={"X": X[20:40].tolist(), "Y": Y[20:40]}).json())
    items = [{"x": X[i].tolist(), "y": Y[i]} for i in range(40, 50)]
    answers.append(client.post("/api/monitors/default/decisions", json={"decisions": items}).json())
    records = [{"x0": X[i, 0], "x1": X[i, 1], "x2": X[i, 2], "prediction": Y[i]} for i in range(50, 60)]
    answers.append(client.post("/api/monitors/default/decisions", json={"decisions": records}).json())
    assert [a["first_id"] for a in answers] == list(range(20)) + [20, 40, 50]
    flagged = [record for answer in answers for record in answer["flagged"]]
    reference = [w.to_json() for w in Monitor(EPSILON).observe_batch(X, Y) if w.flagged]
    assert flagged == reference
    expected = brute_force_pairs(X, Y)
    assert reported_pairs(flagged) == expected and len(expected) > 10
    stored = client.get("/api/monitors/default/violations", params={"limit": 1000}).json()["violations"]
    assert [{k: v for k, v in r.items() if k != "received"} for r in stored] == reference
    stats = client.get("/api/monitors/default/stats").json()
    assert (stats["decisions"], stats["pairs"], stats["flagged"]) == (60, len(expected), len(reference))
    one = client.get("/api/monitors/default/decisions/57").json()
    assert one["x"] == X[57].tolist() and one["y"] == Y[57]


def test_a_tie_at_exactly_epsilon_is_a_violation_and_just_beyond_is_not(service):
    _, client = service
    post = lambda x, y: client.post("/api/monitors/default/decisions", json={"x": x, "y": y}).json()  # noqa: E731
    assert post([0.0, 0.0], "a")["flagged"] == []
    assert post([0.1, 0.0], "b")["flagged"][0]["ids"] == [0]              # d = ε: closed ball
    assert post([-0.1 - 1e-9, 5.0], "b")["flagged"] == []                 # far in the other feature
    assert post([0.2 + 1e-9, 0.0], "a")["flagged"] == []                  # d(2nd) = 0.1 + 1e-9 > ε


def test_violations_are_paged_and_filtered_by_id_and_time(service):
    _, client = service
    X, Y = stream(2, 80)
    client.post("/api/monitors/default/decisions", json={"X": X.tolist(), "Y": Y})
    everything = client.get("/api/monitors/default/violations", params={"limit": 1000}).json()["violations"]
    assert len(everything) > 12
    pages, after = [], None
    while True:
        params = {"limit": 5} | ({} if after is None else {"after_id": after})
        answer = client.get("/api/monitors/default/violations", params=params).json()
        pages.extend(answer["violations"])
        if answer["next"] is None:
            break
        after = answer["next"]["after_id"]
    assert pages == everything
    newest = client.get("/api/monitors/default/violations", params={"order": "desc", "limit": 3}).json()
    assert [r["decision"] for r in newest["violations"]] == [r["decision"] for r in everything[::-1][:3]]
    middle = everything[len(everything) // 2]["decision"]
    before = client.get("/api/monitors/default/violations", params={"before_id": middle, "limit": 1000}).json()["violations"]
    assert [r["decision"] for r in before] == [r["decision"] for r in everything if r["decision"] < middle]
    received = everything[0]["received"]
    assert len(client.get("/api/monitors/default/violations", params={"since": received + 1}).json()["violations"]) == 0
    assert len(client.get("/api/monitors/default/violations",
                          params={"until": received, "limit": 1000}).json()["violations"]) == len(everything)
    assert client.get("/api/monitors/default/violations", params={"limit": 0}).status_code == 422


@pytest.mark.parametrize("body, status, words", [
    (b"{not json", 400, "not valid JSON"),
    (json.dumps({"x": [0.1, 0.2]}).encode(), 422, "expected one of the shapes"),
    (json.dumps({"x": [0.1, "a", 0.3], "y": "a"}).encode(), 422, "x[1] is the string 'a'; features must be JSON numbers"),
    (json.dumps({"x": [0.1, 0.2], "y": "a"}).encode(), 422, "built on 3"),
    (b'{"x": [0.1, NaN, 0.3], "y": 1}', 422, "NaN"),
    (json.dumps({"x": [0.1, 0.2, 0.3], "y": None}).encode(), 422, "must be a decision"),
    (json.dumps({"X": [[0.1, 0.2, 0.3]], "Y": [1, 2]}).encode(), 422, "1 rows but Y has 2"),
    (json.dumps({"decisions": [{"x0": 1, "x1": 2, "prediction": "a"}]}).encode(), 422,
     "2 features per decision, but the monitor was built on 3"),
    (json.dumps({"decisions": [{"x": [0, 0, 0], "y": "a"}, {"x": [0, 0, 1e400], "y": "a"}]}).encode().replace(b"1e400", b"Infinity"), 422, "NaN or an infinite"),
    (json.dumps([1, 2, 3]).encode(), 422, "JSON object"),
    (json.dumps({"X": [[0.0] * 3] * 2000, "Y": ["a"] * 2000}).encode(), 413, "at most 16384"),
])
def test_bad_requests_are_refused_and_change_nothing(service, body, status, words):
    built, client = service
    X, Y = stream(3, 30)
    client.post("/api/monitors/default/decisions", json={"X": X.tolist(), "Y": Y})
    before = state(client)
    answer = client.post("/api/monitors/default/decisions", content=body, headers={"content-type": "application/json"})
    assert answer.status_code == status, answer.text
    assert words in answer.json()["detail"]
    assert state(client) == before
    assert built.hub.store.decision_count("default") == 30
    # The monitor still answers as one that never saw the bad request.
    follow = client.post("/api/monitors/default/decisions", json={"X": X[:5].tolist(), "Y": Y[:5]}).json()
    reference = Monitor(EPSILON).observe_batch(np.vstack([X, X[:5]]), Y + Y[:5])[30:]
    assert follow["flagged"] == [w.to_json() for w in reference if w.flagged]


def test_oversized_bodies_are_refused_before_reading_even_when_streamed(tmp_path):
    built = build(f"sqlite:///{tmp_path / 'small.db'}", default=MonitorSpec("default", EPSILON), max_body_bytes=2048)
    with TestClient(built.app) as client:
        chunks = (b" " * 1024 for _ in range(4))  # no Content-Length: counted while read
        answer = client.post("/api/monitors/default/decisions", content=chunks)
        assert answer.status_code == 413 and "2048" in answer.json()["detail"]
        assert client.get("/api/monitors/default/stats").json()["decisions"] == 0
    built.close()


def test_monitors_are_created_with_their_own_options_and_conflicts_are_refused(service):
    _, client = service
    assert client.put("/api/monitors/images", json={"epsilon": 0.5, "metric": "l2", "image_shape": [2, 2]}).status_code == 201
    assert client.put("/api/monitors/images", json={"epsilon": 0.5, "metric": "l2", "image_shape": [2, 2]}).status_code == 200
    refused = client.put("/api/monitors/images", json={"epsilon": 0.4, "metric": "l2"})
    assert refused.status_code == 409 and "other options" in refused.json()["detail"]
    for options, words in [({"epsilon": -1}, "epsilon"), ({"metric": "l3", "epsilon": 1}, "metric"),
                           ({"epsilon": 1, "colour": 2}, "unknown monitor option"), ({}, "needs `epsilon`")]:
        answer = client.put("/api/monitors/other", json=options)
        assert answer.status_code == 422 and words in answer.json()["detail"]
    assert client.put("/api/monitors/bad%20name", json={"epsilon": 1}).status_code == 422
    missing = client.post("/api/monitors/nobody/decisions", json={"x": [1], "y": 1})
    assert missing.status_code == 404 and "PUT /api/monitors/nobody" in missing.json()["detail"]
    # Each monitor keeps its own ε and metric: (0,0)-(0.3,0.3) is within 0.5 in L2 but not within 0.1 in L∞.
    client.post("/api/monitors/images/decisions", json={"X": [[0, 0, 0, 0], [0.3, 0.3, 0, 0]], "Y": [0, 1]})
    client.post("/api/monitors/default/decisions", json={"X": [[0, 0, 0], [0.3, 0.3, 0]], "Y": [0, 1]})
    assert client.get("/api/monitors/images/stats").json()["pairs"] == 1
    assert client.get("/api/monitors/default/stats").json()["pairs"] == 0
    names = [m["options"]["name"] for m in client.get("/api/monitors").json()["monitors"]]
    assert names == ["default", "images"]


def test_a_restart_rebuilds_every_monitor_from_snapshot_and_log(tmp_path):
    url = f"sqlite:///{tmp_path / 'restart.db'}"
    X, Y = stream(4, 90)
    first = build(url, default=MonitorSpec("default", EPSILON), snapshot_every=16)
    with TestClient(first.app) as client:
        for start in range(0, 50, 10):
            client.post("/api/monitors/default/decisions", json={"X": X[start:start + 10].tolist(), "Y": Y[start:start + 10]})
    first.close()  # leaves a snapshot at shutdown
    assert first.hub.store.snapshot is not None
    second = build(url, snapshot_every=16)
    with TestClient(second.app) as client:
        assert client.get("/api/monitors/default/stats").json()["decisions"] == 50
        client.post("/api/monitors/default/decisions", json={"X": X[50:].tolist(), "Y": Y[50:]})
        stored = client.get("/api/monitors/default/violations", params={"limit": 1000}).json()["violations"]
    second.close()
    reference = [w.to_json() for w in Monitor(EPSILON).observe_batch(X, Y) if w.flagged]
    assert [{k: v for k, v in r.items() if k != "received"} for r in stored] == reference


def test_a_crash_between_snapshots_replays_the_log_after_the_snapshot(tmp_path):
    """No clean stop: the hub is dropped without its shutdown snapshot, so the restart reads snapshot + log."""
    url = f"sqlite:///{tmp_path / 'crash.db'}"
    X, Y = stream(5, 70)
    first = build(url, default=MonitorSpec("default", EPSILON), snapshot_every=20)
    first.hub.submit([("default", {"X": X[:45].tolist(), "Y": Y[:45]})])
    snapshot_at, _ = first.hub.store.snapshot("default")
    assert snapshot_at == 45  # the group that crossed 20 decisions left a snapshot
    first.hub.submit([("default", {"X": X[45:55].tolist(), "Y": Y[45:55]})])
    assert first.hub.store.snapshot("default")[0] == 45  # not due yet: 10 decisions live only in the log
    first.hub.store.close()
    second = build(url, snapshot_every=20)
    assert second.hub.stats("default").decisions == 55
    found = second.hub.submit([("default", {"X": X[55:].tolist(), "Y": Y[55:]})])[0]
    assert (found.first_id, found.accepted) == (55, 15)
    assert found.flagged == [w.to_json() for w in Monitor(EPSILON).observe_batch(X, Y)[55:] if w.flagged]
    second.close()


class FailingCommit:
    def __init__(self, store):
        self.store = store

    def __getattr__(self, name):
        return getattr(self.store, name)

    def commit(self, batches):
        from assay.serve.storage import StoreError

        raise StoreError("the disk is full (simulated)")


def test_a_failed_commit_is_503_and_the_monitor_forgets_the_group(service):
    built, client = service
    X, Y = stream(6, 40)
    client.post("/api/monitors/default/decisions", json={"X": X[:20].tolist(), "Y": Y[:20]})
    before = state(client)
    real = built.hub.store
    built.hub.store = FailingCommit(real)
    answer = client.post("/api/monitors/default/decisions", json={"X": X[20:].tolist(), "Y": Y[20:]})
    built.hub.store = real
    assert answer.status_code == 503 and "disk is full" in answer.json()["detail"]
    assert state(client) == before
    again = client.post("/api/monitors/default/decisions", json={"X": X[20:].tolist(), "Y": Y[20:]}).json()
    assert again["first_id"] == 20
    assert again["flagged"] == [w.to_json() for w in Monitor(EPSILON).observe_batch(X, Y)[20:] if w.flagged]


TOKEN = "s3cret-token-of-24-chars"


def test_a_token_guards_the_api_and_the_dashboard(tmp_path):
    built = build(f"sqlite:///{tmp_path / 'guarded.db'}", default=MonitorSpec("default", EPSILON), token=TOKEN)
    with TestClient(built.app) as client:
        assert client.get("/health").status_code == 200
        body = {"x": [0, 0, 0], "y": 1}
        assert client.post("/api/monitors/default/decisions", json=body).status_code == 401
        wrong = client.post("/api/monitors/default/decisions", json=body, headers={"Authorization": f"Bearer {TOKEN}x"})
        assert wrong.status_code == 401
        assert client.get("/api/monitors/default/stats", headers={"Authorization": TOKEN}).status_code == 401  # no scheme
        assert client.get("/openapi.json").status_code == 401
        assert built.hub.store.decision_count("default") == 0
        right = {"Authorization": f"Bearer {TOKEN}"}
        assert client.post("/api/monitors/default/decisions", json=body, headers=right).status_code == 200
        page = client.get("/", follow_redirects=False)
        assert page.status_code == 303 and page.headers["location"] == "/login"
        assert client.post("/login", data={"token": "guess"}).status_code == 401
        signed_in = client.post("/login", data={"token": TOKEN}, follow_redirects=False)
        assert signed_in.status_code == 303 and "httponly" in signed_in.headers["set-cookie"].lower()
        assert client.get("/monitors/default").status_code == 200  # the cookie now signs the browser in
    built.close()


def test_token_comparison_and_binding_rules():
    assert token_matches(TOKEN, TOKEN) and not token_matches(TOKEN[:-1], TOKEN) and not token_matches(None, TOKEN)
    check_bind("127.0.0.1", None)
    check_bind("::1", None)
    with pytest.raises(OptionError, match="without a token"):
        check_bind("0.0.0.0", None)
    with pytest.raises(OptionError, match="16 characters"):
        check_bind("0.0.0.0", "short")
    check_bind("0.0.0.0", TOKEN)


@pytest.mark.parametrize("path", ["/static/..%2F..%2F..%2Fetc%2Fpasswd", "/static/%2Fetc%2Fpasswd", "/static/app.py",
                                  "/static/../storage.py", "/monitors/..%2F..%2Fetc%2Fpasswd"])
def test_no_endpoint_reads_files_of_the_server(service, path):
    _, client = service
    answer = client.get(path)
    assert answer.status_code in (404, 422)
    assert "root:" not in answer.text and "import" not in answer.text


def test_openapi_schema_lists_the_api(service):
    _, client = service
    schema = client.get("/openapi.json").json()
    for path in ("/health", "/api/monitors", "/api/monitors/{name}", "/api/monitors/{name}/decisions",
                 "/api/monitors/{name}/violations", "/api/monitors/{name}/stats"):
        assert path in schema["paths"], path
    assert "requestBody" in schema["paths"]["/api/monitors/{name}/decisions"]["post"]


def test_dashboard_pages_escape_user_data(service):
    _, client = service
    client.post("/api/monitors/default/decisions", json={"X": [[0, 0, 0], [0, 0, 0.05]], "Y": ["<script>alert(1)</script>", "b"]})
    page = client.get("/monitors/default").text
    assert "<script>alert(1)</script>" not in page and "&lt;script&gt;" in page
    assert "decision #1" in page and 'data-decision="1"' in page
    assert client.get("/").status_code == 200


class BrokenStore(FailingCommit):
    """Commits fail, and so does every read: the database is gone."""

    def iter_decisions(self, *args, **kwargs):
        from assay.serve.storage import StoreError

        raise StoreError("the database is unreachable (simulated)")

    def snapshot(self, name):
        return self.iter_decisions()


def test_when_the_store_is_down_the_monitor_is_rebuilt_once_it_is_back(service):
    built, client = service
    X, Y = stream(8, 30)
    client.post("/api/monitors/default/decisions", json={"X": X[:10].tolist(), "Y": Y[:10]})
    real = built.hub.store
    built.hub.store = BrokenStore(real)
    assert client.post("/api/monitors/default/decisions", json={"X": X[10:].tolist(), "Y": Y[10:]}).status_code == 503
    assert client.post("/api/monitors/default/decisions", json={"X": X[10:].tolist(), "Y": Y[10:]}).status_code == 503
    built.hub.store = real
    again = client.post("/api/monitors/default/decisions", json={"X": X[10:].tolist(), "Y": Y[10:]}).json()
    assert again["first_id"] == 10
    assert again["flagged"] == [w.to_json() for w in Monitor(EPSILON).observe_batch(X, Y)[10:] if w.flagged]


def test_image_monitors_refuse_inputs_of_another_size(service):
    _, client = service
    client.put("/api/monitors/pixels", json={"epsilon": 0.1, "image_shape": [2, 3]})
    answer = client.post("/api/monitors/pixels/decisions", json={"x": [0.0] * 5, "y": 1})
    assert answer.status_code == 422 and "have 6 pixels" in answer.json()["detail"]
    assert client.post("/api/monitors/pixels/decisions", json={"x": [0.0] * 6, "y": 1}).status_code == 200


def test_public_surface():
    import assay.serve

    assert assay.serve.__all__ == ["Client", "PostResult", "ServiceError", "post_stream", "MonitorHub", "MonitorSpec",
                                   "Service", "build", "serve", "StoreError", "open_store"]


def test_the_violation_histogram_counts_by_time_bin(service):
    built, client = service
    X, Y = stream(9, 60)
    client.post("/api/monitors/default/decisions", json={"X": X.tolist(), "Y": Y})
    records = client.get("/api/monitors/default/violations", params={"limit": 1000}).json()["violations"]
    start = records[0]["received"] - 0.5
    counts = built.hub.store.violation_histogram("default", start, 0.25, 4)
    assert counts.tolist() == [0, 0, len(records), 0]  # one commit: every record at start + 0.5
    assert built.hub.store.violation_histogram("default", start + 1, 1.0, 3).tolist() == [0, 0, 0]


def test_sqlite_sync_levels_and_bad_store_urls(tmp_path):
    from assay.serve import open_store
    from assay.serve.storage import SQLiteStore, StoreError

    for level in ("FULL", "NORMAL"):
        store = open_store(tmp_path / f"{level}.db", synchronous=level)
        assert isinstance(store, SQLiteStore)
        assert store._writer.execute("PRAGMA synchronous").fetchone()[0] == {"FULL": 2, "NORMAL": 1}[level]
        assert store._writer.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        store.close()
    with pytest.raises(OptionError, match="FULL' or 'NORMAL"):
        open_store(tmp_path / "x.db", synchronous="OFF")
    with pytest.raises(OptionError, match="neither sqlite"):
        open_store("mysql://localhost/db")
    with pytest.raises(StoreError, match="does not exist"):
        open_store(tmp_path / "missing" / "x.db")


def test_serve_refuses_to_start_when_the_store_holds_the_monitor_with_other_options(tmp_path):
    from typer.testing import CliRunner

    from assay.cli.main import app as cli

    store = tmp_path / "kept.db"
    build(f"sqlite:///{store}", default=MonitorSpec("default", 0.1)).close()
    result = CliRunner().invoke(cli, ["serve", "--epsilon", "0.2", "--store", f"sqlite:///{store}"])
    assert result.exit_code == 2 and "exists with other options" in result.output


class FailingSnapshot(FailingCommit):
    """Commits work; snapshots fail."""

    def commit(self, batches):
        return self.store.commit(batches)

    def save_snapshot(self, *args):
        from assay.serve.storage import StoreError

        raise StoreError("no room for the snapshot (simulated)")


def test_a_failed_snapshot_does_not_turn_a_stored_post_into_an_error(service):
    built, client = service  # snapshots every 7 decisions
    real = built.hub.store
    built.hub.store = FailingSnapshot(real)
    X, Y = stream(10, 20)
    answer = client.post("/api/monitors/default/decisions", json={"X": X.tolist(), "Y": Y})
    built.hub.store = real
    assert answer.status_code == 200 and real.decision_count("default") == 20
    assert real.snapshot("default") is None
    client.post("/api/monitors/default/decisions", json={"x": [0, 0, 0], "y": "a"})  # due again: taken now
    assert real.snapshot("default")[0] == 21
