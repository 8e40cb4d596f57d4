"""A real server on loopback (uvicorn in a thread): concurrent clients, the Python client, ``assay monitor --post``."""

from __future__ import annotations

import threading

import numpy as np
import pytest
from typer.testing import CliRunner

from assay.cli.main import app as cli
from assay.monitor import Monitor
from assay.serve import Client, MonitorSpec, ServiceError, build
from tests.serve.conftest import stream
from tests.serve.servers import ThreadServer, free_port

EPSILON = 0.1


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    folder = tmp_path_factory.mktemp("live")
    service = build(f"sqlite:///{folder / 'live.db'}", default=MonitorSpec("default", EPSILON))
    with ThreadServer(service.app) as running:
        yield running
    service.close()


def unordered_pairs(witnesses, identity) -> set[frozenset]:
    """Violating pairs as sets of two decision identities: independent of the order of arrival."""
    return {frozenset((identity[w.decision], identity[other])) for w in witnesses for other in w.ids.tolist()}


def test_two_concurrent_clients_give_the_witnesses_of_one_sequential_stream(server):
    X, Y = stream(11, 240)
    halves = {"a": (X[:120], Y[:120]), "b": (X[120:], Y[120:])}
    Client(server.url, "pair").create_monitor(epsilon=EPSILON)
    answers: dict[str, list] = {"a": [], "b": []}
    start = threading.Barrier(2)

    def post(name):
        rows, labels = halves[name]
        with Client(server.url, "pair") as client:
            start.wait(timeout=30)
            for i in range(0, 120, 4):  # small posts so that the two clients interleave
                answers[name].append((i, client.post_batch(rows[i:i + 4], labels[i:i + 4])))

    threads = [threading.Thread(target=post, args=(name,)) for name in halves]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    identity, order = {}, []
    for name, results in answers.items():
        for offset, result in results:
            for k in range(result.accepted):
                identity[result.first_id + k] = (name, offset + k)
    assert sorted(identity) == list(range(240))
    firsts = [[r.first_id for _, r in answers[name]] for name in "ab"]
    assert not (max(firsts[0]) < min(firsts[1]) or max(firsts[1]) < min(firsts[0])), "the clients did not interleave"
    with Client(server.url, "pair") as client:
        stored = [r for r in client.iter_violations(page=50)]
    served = unordered_pairs([_as_witnesses(r) for r in stored], identity)
    # One sequential stream (client a, then b) through the monitor itself.
    sequential = Monitor(EPSILON).observe_batch(X, Y)
    sequence_identity = {i: ("a", i) if i < 120 else ("b", i - 120) for i in range(240)}
    expected = unordered_pairs(sequential, sequence_identity)
    assert served == expected and len(expected) > 50
    # The server's ids are a sequential stream too: replaying it in that order gives the stored witnesses.
    order = [identity[i] for i in range(240)]
    rows = np.array([halves[name][0][k] for name, k in order])
    labels = [halves[name][1][k] for name, k in order]
    assert [r | {"received": 0} for r in stored] == [w.to_json() | {"received": 0}
                                                    for w in Monitor(EPSILON).observe_batch(rows, labels) if w.flagged]


def _as_witnesses(record):
    from assay.monitor import Witnesses

    return Witnesses(record["decision"], record["ids"], record["distances"], record["count"], record["incomplete"])


def test_the_python_client_posts_reads_and_reports_refusals(server):
    with Client(server.url, "client") as client:
        client.create_monitor(epsilon=0.5, metric="l1")
        assert client.post([0.0, 0.0], "yes").count == 0
        found = client.post([0.25, 0.25], "no")                       # L1 distance 0.5 = ε
        assert found.ids.tolist() == [0] and found.distances.tolist() == [0.5]
        assert client.stats().to_json() == {"decisions": 2, "pairs": 1, "flagged": 1}
        assert client.decision(1)["x"] == [0.25, 0.25]
        with pytest.raises(ServiceError, match=r"\(422\).*built on 2") as refused:
            client.post([1.0, 2.0, 3.0], "no")
        assert refused.value.status == 422
        assert client.stats().decisions == 2
    with pytest.raises(ServiceError, match="cannot reach .* \\(2 tries\\)"):
        Client(f"http://127.0.0.1:{free_port()}", timeout=2, retries=1, retry_wait=0.01).stats()  # tried twice


def test_assay_monitor_post_streams_a_file_into_the_server(server, tmp_path):
    X, Y = stream(12, 50)
    path = tmp_path / "decisions.csv"
    lines = ["a,b,c,prediction,truth"] + [f"{x[0]},{x[1]},{x[2]},{y},0" for x, y in zip(X, Y)]
    path.write_text("\n".join(lines) + "\n")
    Client(server.url, "posted").create_monitor(epsilon=EPSILON)
    result = CliRunner().invoke(cli, ["monitor", str(path), "--post", server.url, "--post-monitor", "posted",
                                      "--drop", "truth", "--batch-size", "16"])
    assert result.exit_code == 0, result.output
    reference = Monitor(EPSILON).observe_batch(X, Y)  # the server's ε applies (no --epsilon asked for)
    flagged = sum(w.flagged for w in reference)
    assert "posted          50 decisions" in result.output and f"flagged         {flagged}" in result.output
    with Client(server.url, "posted") as client:
        assert client.stats().flagged == flagged
    missing = CliRunner().invoke(cli, ["monitor", str(path), "--post", server.url, "--post-monitor", "nobody"])
    assert missing.exit_code == 2 and "no monitor named 'nobody'" in missing.output
