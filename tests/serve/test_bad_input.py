"""The bad-input suite: malformed requests of every kind, each refused with a 4xx that names the problem.

Shapes, types, numbers, sizes, encodings, ids and headers. For each: a status in 400–499, a
message holding the words that name the field or the rule, no path of the server's disk, and
the store exactly as before (decisions, witnesses, keyed posts, monitors).
"""

from __future__ import annotations

import gzip
import json

import pytest
from fastapi.testclient import TestClient

from assay.serve import MonitorSpec, build
from tests.serve.conftest import stream

EPSILON = 0.1
MAX_BODY = 16384
POST = ("POST", "/api/monitors/default/decisions")
RECORDS = ("POST", "/api/monitors/records/decisions")  # a monitor whose features a, b, c came with its first record
JSON = {"content-type": "application/json"}
HUGE = "1" + "0" * 399
OK_BODY = b'{"x": [0, 0, 0], "y": "a"}'


def body(value) -> bytes:
    return json.dumps(value).encode()


def case(name, request, content, status, words, headers=None):
    method, path = request
    return pytest.param(method, path, content, {**JSON, **(headers or {})}, status, words, id=name)


def get(name, path, words, status=422):
    return pytest.param("GET", path, None, {}, status, words, id=name)


def put(name, content, words, status=422, headers=None):
    return case(name, ("PUT", "/api/monitors/fresh"), content, status, words, headers)


CASES = [
    # -- shapes --------------------------------------------------------------------------------
    case("body is an array", POST, body([1, 2, 3]), 422, "JSON object"),
    case("body is a string", POST, body("x"), 422, "JSON object"),
    case("body is a number", POST, b"1", 422, "JSON object"),
    case("body is null", POST, b"null", 422, "JSON object"),
    case("empty object", POST, b"{}", 422, "expected one of the shapes"),
    case("x without y", POST, body({"x": [0, 0, 0]}), 422, "expected one of the shapes"),
    case("y without x", POST, body({"y": "a"}), 422, "expected one of the shapes"),
    case("an extra key", POST, body({"x": [0, 0, 0], "y": "a", "z": 1}), 422, "expected one of the shapes"),
    case("x is a number", POST, body({"x": 5, "y": "a"}), 422, "x must be a list of numbers"),
    case("x is empty", POST, body({"x": [], "y": "a"}), 422, "x has no features"),
    case("x is nested", POST, body({"x": [[0, 0, 0]], "y": "a"}), 422, "x[0] is an array"),
    case("x too narrow", POST, body({"x": [0, 0], "y": "a"}), 422, "built on 3"),
    case("x too wide", POST, body({"x": [0, 0, 0, 0], "y": "a"}), 422, "built on 3"),
    case("X and Y of other lengths", POST, body({"X": [[0, 0, 0]], "Y": ["a", "b"]}), 422, "1 rows but Y has 2"),
    case("X empty", POST, body({"X": [], "Y": []}), 422, "X has no decisions"),
    case("X ragged", POST, body({"X": [[0, 0, 0], [0, 0]], "Y": ["a", "a"]}), 422, "X[1] has 2 features"),
    case("X not rows", POST, body({"X": [0, 0, 0], "Y": ["a", "a", "a"]}), 422, "X[0] must be a list"),
    case("X a string", POST, body({"X": "abc", "Y": ["a"]}), 422, "X must be a list of rows"),
    case("Y a string", POST, body({"X": [[0, 0, 0]], "Y": "a"}), 422, "Y a list of decisions"),
    case("decisions an object", POST, body({"decisions": {}}), 422, "decisions must be a list"),
    case("decisions of numbers", POST, body({"decisions": [1]}), 422, "decisions[0] must be an object"),
    case("record without decision", POST, body({"decisions": [{"x": [0, 0, 0]}]}), 422, "without the decision column"),
    case("record missing a feature", RECORDS, body({"decisions": [{"a": 1, "b": 2, "c": 3, "prediction": "a"},
                                                               {"a": 1, "b": 2, "prediction": "a"}]}), 422, "no value for the feature 'c'"),
    case("record with an extra feature", RECORDS, body({"decisions": [{"a": 1, "b": 2, "c": 3, "prediction": "a"},
                                                                   {"a": 1, "b": 2, "c": 3, "d": 4, "prediction": "a"}]}),
         422, "unknown feature 'd'"),
    case("record of the decision only", POST, body({"decisions": [{"prediction": "a"}]}), 422, "no feature besides"),
    case("item x a string", POST, body({"decisions": [{"x": "abc", "y": "a"}]}), 422, "decisions[0].x must be a list"),
    # -- types ---------------------------------------------------------------------------------
    case("feature a numeric string", POST, body({"x": ["0.5", 0, 0], "y": "a"}), 422, "x[0] is the string '0.5'"),
    case("feature true", POST, body({"x": [0, True, 0], "y": "a"}), 422, "x[1] is a boolean"),
    case("feature null", POST, body({"x": [0, 0, None], "y": "a"}), 422, "x[2] is null"),
    case("feature an object", POST, body({"x": [{"v": 1}, 0, 0], "y": "a"}), 422, "x[0] is an object"),
    case("record feature a string", RECORDS, body({"decisions": [{"a": "1", "b": 2, "c": 3, "prediction": "a"}]}), 422,
         "decisions[0].a is the string '1'"),
    case("decision null", POST, body({"x": [0, 0, 0], "y": None}), 422, "y must be a decision"),
    case("decision a list", POST, body({"x": [0, 0, 0], "y": ["a"]}), 422, "y must be a decision"),
    case("decision an object", POST, body({"x": [0, 0, 0], "y": {"a": 1}}), 422, "y must be a decision"),
    case("decision of another type", POST, body({"x": [0, 0, 0], "y": 1}), 422, "y is a number, but this monitor's decisions are strings"),
    case("decision true", POST, body({"x": [0, 0, 0], "y": True}), 422, "y is a boolean"),
    case("decisions of mixed types", POST, body({"X": [[0, 0, 0], [0, 0, 0]], "Y": ["a", 1]}), 422, "Y[1] is a number"),
    case("decision NaN", POST, b'{"x": [0, 0, 0], "y": NaN}', 422, "y must be a decision"),
    case("decision Infinity", POST, b'{"x": [0, 0, 0], "y": Infinity}', 422, "y must be a decision"),
    case("decision a 400-digit integer", POST, f'{{"x": [0, 0, 0], "y": {HUGE}}}'.encode(), 422, "float64 cannot hold exactly"),
    # -- numbers -------------------------------------------------------------------------------
    case("a 400-digit feature", POST, f'{{"x": [{HUGE}, 0, 0], "y": "a"}}'.encode(), 422, "x[0] is the integer"),
    case("a negative 400-digit feature", POST, f'{{"x": [0, -{HUGE}, 0], "y": "a"}}'.encode(), 422, "x[1] is the integer"),
    case("2^53 + 1", POST, b'{"x": [9007199254740993, 0, 0], "y": "a"}', 422, "x[0] is the integer 9007199254740993"),
    case("1e101", POST, b'{"x": [0, 0, 1e101], "y": "a"}', 422, "x[2] is 1e+101, beyond"),
    case("-1e400", POST, b'{"x": [0, -1e400, 0], "y": "a"}', 422, "x[1] is NaN or an infinite value"),
    case("NaN feature", POST, b'{"x": [NaN, 0, 0], "y": "a"}', 422, "x[0] is NaN"),
    case("Infinity feature", POST, b'{"x": [0, Infinity, 0], "y": "a"}', 422, "x[1] is NaN or an infinite"),
    case("-Infinity feature", POST, b'{"x": [0, 0, -Infinity], "y": "a"}', 422, "x[2] is NaN or an infinite"),
    case("a huge value in row 1", POST, body({"X": [[0, 0, 0], [0, 1e200, 0]], "Y": ["a", "a"]}), 422, "X[1][1] is 1e+200"),
    case("a huge record value", RECORDS, body({"decisions": [{"a": 0, "b": 1e300, "c": 0, "prediction": "a"}]}), 422,
         "decisions[0].b is 1e+300"),
    # -- sizes and depth -----------------------------------------------------------------------
    case("100,000-deep arrays", POST, b"[" * 100_000 + b"]" * 100_000, 413, "at most 16384"),
    case("5,000-deep arrays", POST, b"[" * 5_000 + b"]" * 5_000, 400, "5000 levels deep; at most 16"),
    case("17 levels", POST, b'{"x": ' + b"[" * 16 + b"]" * 16 + b', "y": "a"}', 400, "17 levels deep"),
    case("deep objects", POST, b'{"a": ' * 1000 + b"1" + b"}" * 1000, 400, "1000 levels deep"),
    case("body over the limit", POST, body({"X": [[0.0] * 3] * 2000, "Y": ["a"] * 2000}), 413, "at most 16384"),
    # -- encodings and syntax ------------------------------------------------------------------
    case("not UTF-8", POST, b'{"x": [0, 0, 0], "y": "\xff\xfe"}', 400, "not UTF-8"),
    case("UTF-16", POST, OK_BODY.decode().encode("utf-16"), 400, "not UTF-8"),
    case("a byte-order mark", POST, b"\xef\xbb\xbf" + OK_BODY, 400, "byte-order mark"),
    case("a Latin-1 label", POST, '{"x": [0, 0, 0], "y": "café"}'.encode("latin-1"), 400, "not UTF-8"),
    case("empty body", POST, b"", 400, "the body is empty"),
    case("only spaces", POST, b"   \n ", 400, "the body is empty"),
    case("truncated", POST, b'{"x": [0, 0', 400, "not valid JSON"),
    case("trailing garbage", POST, OK_BODY + b" x", 400, "not valid JSON"),
    case("a duplicate key", POST, b'{"x": [0, 0, 0], "x": [1, 1, 1], "y": "a"}', 400, "the key 'x' twice"),
    case("single quotes", POST, b"{'x': [0, 0, 0], 'y': 'a'}", 400, "not valid JSON"),
    case("a comment", POST, b'{"x": [0, 0, 0], /* c */ "y": "a"}', 400, "not valid JSON"),
    case("a hex number", POST, b'{"x": [0x10, 0, 0], "y": "a"}', 400, "not valid JSON"),
    case("a leading zero", POST, b'{"x": [01, 0, 0], "y": "a"}', 400, "not valid JSON"),
    case("an unterminated string with brackets", POST, b'{"x": [0, 0, 0], "y": "' + b"[" * 50, 400, "not valid JSON"),
    # -- headers -------------------------------------------------------------------------------
    case("gzip body", POST, gzip.compress(OK_BODY), 415, "Content-Encoding 'gzip'", {"content-encoding": "gzip"}),
    case("brotli declared", POST, OK_BODY, 415, "Content-Encoding 'br'", {"content-encoding": "br"}),
    case("text/plain", POST, OK_BODY, 415, "Content-Type 'text/plain' is not JSON", {"content-type": "text/plain"}),
    case("a form", POST, b"x=0&y=a", 415, "is not JSON", {"content-type": "application/x-www-form-urlencoded"}),
    case("a Latin-1 charset", POST, OK_BODY, 415, "charset 'latin-1'", {"content-type": "application/json; charset=latin-1"}),
    case("an empty idempotency key", POST, OK_BODY, 400, "Idempotency-Key header must be 1–255", {"idempotency-key": ""}),
    case("a long idempotency key", POST, OK_BODY, 400, "(256 characters)", {"idempotency-key": "k" * 256}),
    case("an idempotency key with a space", POST, OK_BODY, 400, "visible ASCII", {"idempotency-key": "two words"}),
    case("a non-ASCII idempotency key", POST, OK_BODY, 400, "visible ASCII", {"idempotency-key": "clé".encode("latin-1")}),
    case("a key reused for another body", POST, b'{"x": [0.5, 0.5, 0.5], "y": "a"}', 422, "another body",
         {"idempotency-key": "used-once"}),
    # -- ids, queries, paths -------------------------------------------------------------------
    get("after_id 2^63", "/api/monitors/default/violations?after_id=9223372036854775808", "after_id: Input should be less"),
    get("before_id 2^64", "/api/monitors/default/violations?before_id=18446744073709551616", "before_id"),
    get("after_id -2", "/api/monitors/default/violations?after_id=-2", "after_id: Input should be greater"),
    get("after_id a word", "/api/monitors/default/violations?after_id=abc", "after_id: Input should be a valid integer"),
    get("after_id a float", "/api/monitors/default/violations?after_id=1.5", "after_id"),
    get("limit 0", "/api/monitors/default/violations?limit=0", "limit"),
    get("limit 1001", "/api/monitors/default/violations?limit=1001", "limit"),
    get("order up", "/api/monitors/default/violations?order=up", "order"),
    get("since NaN", "/api/monitors/default/violations?since=nan", "since"),
    get("until infinity", "/api/monitors/default/violations?until=inf", "until"),
    get("decision 2^63", "/api/monitors/default/decisions/9223372036854775808", "decision_id"),
    get("decision -1", "/api/monitors/default/decisions/-1", "decision_id"),
    get("decision a word", "/api/monitors/default/decisions/abc", "decision_id"),
    get("a decision not stored", "/api/monitors/default/decisions/5000", "has no decision 5000", status=404),
    get("an unknown monitor", "/api/monitors/nobody/stats", "no monitor named 'nobody'", status=404),
    get("dashboard before_id 2^63", "/monitors/default?before_id=9223372036854775808", "before_id"),
    case("post to an unknown monitor", ("POST", "/api/monitors/nobody/decisions"), OK_BODY, 404, "no monitor named"),
    # -- monitor options -----------------------------------------------------------------------
    put("epsilon a string", body({"epsilon": "0.1"}), "epsilon"),
    put("epsilon NaN", b'{"epsilon": NaN}', "epsilon"),
    put("epsilon true", body({"epsilon": True}), "epsilon"),
    put("an unknown decision type", body({"epsilon": 0.1, "decision_type": "float"}), "decision_type"),
    put("a huge image", body({"epsilon": 0.1, "image_shape": [10**20, 10**20]}), "image_shape"),
    put("features of numbers", body({"epsilon": 0.1, "features": [1, 2]}), "features"),
    put("a deep options body", b'{"epsilon": 0.1, "features": ' + b"[" * 40 + b"]" * 40 + b"}", "41 levels deep", 400),
    put("options not an object", body([0.1]), "JSON object"),
    case("a monitor name with a space", ("PUT", "/api/monitors/bad%20name"), body({"epsilon": 0.1}), 422, "monitor name"),
    case("the other options of an existing monitor", ("PUT", "/api/monitors/default"), body({"epsilon": 0.2}), 409,
         "exists with other options"),
]


@pytest.fixture(scope="module")
def service(tmp_path_factory):
    folder = tmp_path_factory.mktemp("bad-input")
    built = build(f"sqlite:///{folder / 'bad.db'}", default=MonitorSpec("default", EPSILON), max_body_bytes=MAX_BODY)
    X, Y = stream(60, 30)
    with TestClient(built.app, raise_server_exceptions=False) as client:
        assert client.post(POST[1], json={"X": X.tolist(), "Y": Y}).status_code == 200
        records = [{"a": 0.5, "b": 0.5, "c": 0.5, "prediction": "a"}]
        assert client.put("/api/monitors/records", json={"epsilon": EPSILON}).status_code == 201
        assert client.post("/api/monitors/records/decisions", json={"decisions": records}).status_code == 200
        used = client.post(POST[1], content=OK_BODY, headers={**JSON, "Idempotency-Key": "used-once"})
        assert used.status_code == 200
        yield built, client, folder
    built.close()


def snapshot(built) -> tuple:
    """Everything the store holds, to compare before and after a refused request."""
    store = built.hub.store
    return (store.monitors(), [store.decision_count(name) for name in ("default", "records")],
            [store.post_count(name) for name in ("default", "records")], store.violations("default", limit=1000),
            [(name, built.hub.stats(name)) for name in built.hub.names()])


def test_the_suite_is_large_and_every_case_distinct():
    assert len(CASES) >= 60
    assert len({param.id for param in CASES}) == len(CASES)
    assert len({param.values[:4].__repr__() for param in CASES}) == len(CASES)


@pytest.mark.parametrize("method, path, content, headers, status, words", CASES)
def test_a_malformed_request_is_refused_and_changes_nothing(service, method, path, content, headers, status, words):
    built, client, folder = service
    before = snapshot(built)
    answer = client.request(method, path, content=content, headers=headers)
    assert answer.status_code == status, answer.text
    assert 400 <= answer.status_code < 500
    detail = answer.json()["detail"]
    assert isinstance(detail, str) and words in detail, detail
    assert str(folder) not in answer.text and "bad.db" not in answer.text
    assert snapshot(built) == before
