"""The service tried as a careless or hostile client would (issue 33): strict, bounded input at the edge.

Every refused request gets a 4xx whose message names the field and the rule, never a 5xx, never
a path of the server's disk, and leaves the store and the other clients' posts untouched.
"""

from __future__ import annotations

import json
import threading

import httpx
import numpy as np
import pytest
from fastapi.testclient import TestClient
from typer.testing import CliRunner

from assay.cli.main import app as cli
from assay.serve import MonitorSpec, build
from tests.serve.conftest import stream
from tests.serve.servers import ThreadServer

EPSILON = 0.1
HUGE = "1" + "0" * 399  # a 400-digit integer
DECISIONS = "/api/monitors/default/decisions"


@pytest.fixture
def service(tmp_path):
    built = build(f"sqlite:///{tmp_path / 'hostile.db'}", default=MonitorSpec("default", EPSILON), max_body_bytes=1 << 20)
    with TestClient(built.app, raise_server_exceptions=False) as client:
        yield built, client
    built.close()


def post_raw(client, body: bytes | str, **headers):
    content = body.encode() if isinstance(body, str) else body
    return client.post(DECISIONS, content=content, headers={"content-type": "application/json", **headers})


def no_disk_path(answer, built) -> bool:
    folder = str(built.hub.store.path.parent)
    return folder not in answer.text and ".db" not in answer.text


# -- the five cases of the issue --------------------------------------------------------------

def test_a_400_digit_integer_is_refused_naming_the_feature(service):
    built, client = service
    answer = post_raw(client, f'{{"x": [{HUGE}, 0, 0], "y": 1}}')
    assert answer.status_code == 422, answer.text
    detail = answer.json()["detail"]
    assert "x[0]" in detail and "float64" in detail
    assert built.hub.store.decision_count("default") == 0


def test_a_poisoned_post_in_the_same_group_does_not_fail_the_others(service):
    """Posts queued together share one commit: a bad one must fail alone (it failed the group: 22 of 160 lost)."""
    built, _ = service
    X, Y = stream(40, 4)
    poison = {"x": [10 ** 400, 0, 0], "y": "a"}
    results = built.hub.submit([("default", {"X": X[:2].tolist(), "Y": Y[:2]}), ("default", poison),
                                ("default", {"X": X[2:].tolist(), "Y": Y[2:]})])
    assert [type(result).__name__ for result in results] == ["Accepted", "DataError", "Accepted"]
    assert "x[0]" in str(results[1])
    assert built.hub.store.decision_count("default") == 4


def test_concurrent_poison_posts_do_not_cost_other_clients_a_post(tmp_path):
    built = build(f"sqlite:///{tmp_path / 'poison.db'}", default=MonitorSpec("default", EPSILON))
    X, Y = stream(41, 160)
    failures, poison_statuses = [], set()
    stop = threading.Event()

    def good(part: int) -> None:
        with httpx.Client(base_url=server.url, timeout=30) as http:
            for i in range(part, 160, 4):
                answer = http.post(DECISIONS, json={"x": X[i].tolist(), "y": Y[i]})
                if answer.status_code != 200:
                    failures.append(answer.status_code)

    def poison() -> None:
        bodies = [f'{{"x": [{HUGE}, 0, 0], "y": 1}}', "[" * 100_000 + "]" * 100_000]
        with httpx.Client(base_url=server.url, timeout=30) as http:
            while not stop.is_set():
                for body in bodies:
                    poison_statuses.add(http.post(DECISIONS, content=body).status_code)

    with ThreadServer(built.app) as server:
        attacker = threading.Thread(target=poison)
        attacker.start()
        clients = [threading.Thread(target=good, args=(part,)) for part in range(4)]
        for thread in clients:
            thread.start()
        for thread in clients:
            thread.join(timeout=120)
        stop.set()
        attacker.join(timeout=30)
    built.close()
    assert failures == []
    assert poison_statuses <= {400, 422} and poison_statuses
    reader = build(f"sqlite:///{tmp_path / 'poison.db'}")
    assert reader.hub.stats("default").decisions == 160
    reader.close()


def test_a_100000_deep_body_is_refused_before_it_is_parsed(service):
    built, client = service
    for body in ("[" * 100_000 + "]" * 100_000, '{"x": ' + "[" * 100_000 + "]" * 100_000 + ', "y": 1}',
                 '{"a": ' * 50_000 + "1" + "}" * 50_000):
        answer = post_raw(client, body)
        assert answer.status_code == 400, answer.text
        assert "levels deep; at most 16 are accepted" in answer.json()["detail"]  # measured by the scan, not the parser
    assert built.hub.store.decision_count("default") == 0
    # Brackets inside strings are text, not nesting.
    assert post_raw(client, '{"x": [0, 0, 0], "y": "' + "[" * 100 + '"}').status_code == 200


@pytest.mark.parametrize("body, field", [
    ('{"x": ["0.5", true, 0], "y": 1}', "x[0]"),
    ('{"x": [0.5, true, 0], "y": 1}', "x[1]"),
    ('{"X": [[0, 0, 0], [0, null, 0]], "Y": [1, 1]}', "X[1][1]"),
    ('{"decisions": [{"x": [0, 0, 0], "y": 1}, {"x": [0, 0, false], "y": 1}]}', "decisions[1].x[2]"),
])
def test_strings_and_booleans_are_not_features(service, body, field):
    built, client = service
    answer = post_raw(client, body)
    assert answer.status_code == 422, answer.text
    assert field in answer.json()["detail"] and "number" in answer.json()["detail"]
    assert built.hub.store.decision_count("default") == 0


def test_a_monitor_keeps_one_type_of_decision_so_true_is_not_1(service):
    built, client = service
    assert post_raw(client, '{"x": [0, 0, 0], "y": 1}').status_code == 200
    for body, kind in (('{"x": [0, 0, 0.05], "y": true}', "boolean"), ('{"x": [0, 0, 0.05], "y": "1"}', "string")):
        answer = post_raw(client, body)
        assert answer.status_code == 422, answer.text
        assert kind in answer.json()["detail"] and "number" in answer.json()["detail"] and "y" in answer.json()["detail"]
    assert built.hub.store.decision_count("default") == 1
    assert client.get("/api/monitors/default").json()["options"]["decision_type"] == "number"
    # A monitor may declare its type up front; booleans then are the only decisions it takes.
    assert client.put("/api/monitors/flags", json={"epsilon": 0.1, "decision_type": "boolean"}).status_code == 201
    assert client.post("/api/monitors/flags/decisions", json={"x": [0.0], "y": 1}).status_code == 422
    assert client.post("/api/monitors/flags/decisions", json={"x": [0.0], "y": True}).status_code == 200


@pytest.mark.parametrize("path", [
    "/api/monitors/default/violations?after_id=9223372036854775808",
    "/api/monitors/default/violations?before_id=18446744073709551616",
    "/api/monitors/default/violations?after_id=-9223372036854775809",
    "/api/monitors/default/decisions/9223372036854775808",
    "/api/monitors/default/decisions/-1",
    "/api/monitors/default/violations?since=nan",
    "/monitors/default?before_id=9223372036854775808",
])
def test_ids_out_of_the_stores_range_are_422_and_name_no_file(service, path):
    built, client = service
    answer = client.get(path)
    assert answer.status_code == 422, answer.text
    assert no_disk_path(answer, built)
    assert any(word in answer.text for word in ("after_id", "before_id", "decision_id", "since"))


def test_the_dashboard_header_names_the_monitor_not_the_store(service):
    built, client = service
    page = client.get("/monitors/default").text
    index = client.get("/").text
    assert "hostile.db" not in page and "hostile.db" not in index
    assert str(built.hub.store.path.parent) not in page + index
    assert 'class="monitor-name"' in page and ">default<" in page


def test_monitor_post_needs_no_epsilon_and_refuses_one(tmp_path):
    built = build(f"sqlite:///{tmp_path / 'post.db'}", default=MonitorSpec("credit", EPSILON))
    csv = tmp_path / "decisions.csv"
    X, Y = stream(42, 20)
    csv.write_text("a,b,c,prediction\n" + "".join(f"{r[0]},{r[1]},{r[2]},{y}\n" for r, y in zip(X, Y)))
    with ThreadServer(built.app) as server:
        ok = CliRunner().invoke(cli, ["monitor", str(csv), "--post", server.url, "--post-monitor", "credit"])
        assert ok.exit_code == 0, ok.output
        assert "posted          20 decisions" in ok.output
        for option in (["--epsilon", "0.3"], ["--metric", "l2"], ["--max-history", "5"]):
            refused = CliRunner().invoke(cli, ["monitor", str(csv), "--post", server.url, "--post-monitor", "credit",
                                               *option])
            assert refused.exit_code == 2, refused.output
            assert option[0] in refused.output and "server" in refused.output
    assert built.hub.stats("credit").decisions == 20
    built.close()
    missing = CliRunner().invoke(cli, ["monitor", str(csv)])
    assert missing.exit_code == 2 and "--epsilon" in missing.output


def json_body(value) -> str:
    return json.dumps(value)


def test_numbers_beyond_the_documented_range_are_refused(service):
    built, client = service
    for body, field in (('{"x": [1e101, 0, 0], "y": 1}', "x[0]"), ('{"x": [0, -1e300, 0], "y": 1}', "x[1]"),
                        ('{"x": [0, 0, 1e400], "y": 1}', "x[2]"), ('{"x": [9007199254740993, 0, 0], "y": 1}', "x[0]")):
        answer = post_raw(client, body)
        assert answer.status_code == 422, (body, answer.text)
        assert field in answer.json()["detail"]
    # 2^53 and exactly representable larger integers are numbers like any other.
    assert post_raw(client, '{"x": [9007199254740992, 0, 0], "y": 1}').status_code == 200
    assert built.hub.store.decision_count("default") == 1
    assert np.isfinite(built.hub.store.decision("default", 0)[0]).all()


# -- safe defaults said aloud -------------------------------------------------------------------

def start_up_line(tmp_path, monkeypatch, token: str | None) -> str:
    from tests.serve.servers import free_port, serve_process, stop_process

    if token is None:
        monkeypatch.delenv("ASSAY_TOKEN", raising=False)
    else:
        monkeypatch.setenv("ASSAY_TOKEN", token)
    port = free_port()
    process = serve_process(f"sqlite:///{tmp_path / f'line-{port}.db'}", port, "--epsilon", "0.1")
    try:
        return process.stderr.readline() + process.stderr.readline()
    finally:
        stop_process(process)


def test_the_start_up_line_says_where_it_listens_and_whether_a_token_is_required(tmp_path, monkeypatch):
    open_line = start_up_line(tmp_path, monkeypatch, None)
    assert "listening on http://127.0.0.1:" in open_line and "loopback only; no token required" in open_line
    guarded = start_up_line(tmp_path, monkeypatch, "a-token-of-24-characters")
    assert "token required" in guarded and "no token" not in guarded
    assert "a-token-of-24-characters" not in guarded


def test_an_empty_token_is_an_error_not_no_token(tmp_path):
    for arguments, environment in (([], {"ASSAY_TOKEN": ""}), (["--token", ""], {})):
        result = CliRunner().invoke(cli, ["serve", "--epsilon", "0.1", "--store", str(tmp_path / "x.db"), *arguments],
                                    env=environment)
        assert result.exit_code == 2, result.output
        assert "token is empty" in result.output
    assert not (tmp_path / "x.db").exists()


def test_the_depth_scan_reads_strings_as_the_parser_does():
    from assay.serve.body import nesting_depth

    assert nesting_depth(rb'["a\"[[", [1], {"b": [[2]]}]') == 4
    assert nesting_depth(rb'["\\", [[1]]]') == 3              # an escaped backslash ends before the quote
    assert nesting_depth(b"") == nesting_depth(b"1") == 0
    assert nesting_depth(b'"' + b'\\"' * 100_000 + b"[[[") == 0  # an unterminated string runs to the end (and stays linear)
    assert nesting_depth(b"[]" * 1000) == 1


def test_serve_checks_the_declared_decision_type(tmp_path):
    result = CliRunner().invoke(cli, ["serve", "--epsilon", "0.1", "--decision-type", "float", "--store", str(tmp_path / "t.db")])
    assert result.exit_code == 2 and "`decision_type`" in result.output and "'string', 'number', 'boolean'" in result.output
