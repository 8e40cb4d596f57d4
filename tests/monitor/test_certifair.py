"""The CertiFair streams of the Clemont paper: every backend equals the O(n²) oracle at ε ∈ {0.01, 0.16}.

The backends whose cost grows fastest with the stream (scan, bdd, partition: seconds to tens of seconds
each on a 5,278-decision COMPAS stream) see the first ``SHORT`` decisions of each stream, the
others the whole stream; both against the same oracle (its pairs among those decisions).
"""

from __future__ import annotations

import pytest

from assay.monitor import Monitor
from tests.monitor.certifair import certifair_names, load_certifair, oracle_pairs_linf
from tests.monitor.test_monitor import BACKEND_NAMES

pytestmark = pytest.mark.data

# Backends that see only the first SHORT decisions of each stream (the German streams are shorter already).
SHORT_BACKENDS = {"scan", "bdd", "partition"}
SHORT = 1000

STREAMS = ["german-base-P1", "german-global-P2", "german-local-P1", "compas-base-P1", "compas-global-P1", "compas-local-P2"]


@pytest.fixture(scope="module")
def streams(data_dir):
    names = {name.split("/")[-1].removesuffix("-combined.csv"): name for name in certifair_names(data_dir)}
    return {key: load_certifair(data_dir, names[key]) for key in STREAMS}


@pytest.fixture(scope="module")
def oracle(streams):
    cache = {}

    def pairs(stream, epsilon, rows=None):
        """The oracle's (later, earlier) pairs among the first ``rows`` decisions (all: None), and how many decisions have one."""
        if (stream, epsilon) not in cache:
            X, Y = streams[stream]
            later, earlier = oracle_pairs_linf(X, Y, epsilon)
            cache[stream, epsilon] = sorted(zip(later.tolist(), earlier.tolist()))
        found = [pair for pair in cache[stream, epsilon] if rows is None or pair[0] < rows]  # earlier < later < rows
        return found, len({later for later, _ in found})

    return pairs


@pytest.mark.parametrize("backend", BACKEND_NAMES)
@pytest.mark.parametrize("epsilon", [0.01, 0.16])
@pytest.mark.parametrize("stream", STREAMS)
def test_certifair_stream_equals_oracle(streams, oracle, stream, epsilon, backend):
    X, Y = streams[stream]
    rows = SHORT if backend in SHORT_BACKENDS else None
    X, Y = X[:rows], Y[:rows]
    expected, flagged = oracle(stream, epsilon, rows)
    monitor = Monitor(epsilon, "linf", index=backend, batch_size=64)
    found = monitor.observe_batch(X, Y)
    got = sorted((w.decision, j) for w in found for j in w.ids.tolist())
    assert got == expected, f"{backend} on {stream} at ε={epsilon}"
    assert monitor.stats.pairs == len(expected)
    assert monitor.stats.flagged == flagged
    if backend == "grid" and X.shape[0] > 2000:
        assert monitor.index.hashed, "the grid's cost model should hash some columns on a stream this long"


@pytest.mark.parametrize("epsilon", [0.01, 0.16])
def test_certifair_one_decision_at_a_time(streams, oracle, epsilon):
    """The single-decision fast path (observe) on a real stream: the same pairs as the oracle."""
    X, Y = streams["compas-base-P1"]
    expected, _ = oracle("compas-base-P1", epsilon)
    monitor = Monitor(epsilon, "linf")
    got = sorted((w.decision, j) for w in (monitor.observe(x, y) for x, y in zip(X, Y)) for j in w.ids.tolist())
    assert got == expected
