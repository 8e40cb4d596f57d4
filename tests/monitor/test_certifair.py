"""The CertiFair streams of the Clemont paper: every backend equals the O(n²) oracle at ε ∈ {0.01, 0.16}."""

from __future__ import annotations

import numpy as np
import pytest

from assay.monitor import BACKENDS, Monitor
from tests.monitor.certifair import certifair_names, load_certifair, oracle_pairs_linf

pytestmark = pytest.mark.data

STREAMS = ["german-base-P1", "german-global-P2", "german-local-P1", "compas-base-P1", "compas-global-P1", "compas-local-P2"]


@pytest.fixture(scope="module")
def streams(data_dir):
    names = {name.split("/")[-1].removesuffix("-combined.csv"): name for name in certifair_names(data_dir)}
    return {key: load_certifair(data_dir, names[key]) for key in STREAMS}


@pytest.mark.parametrize("epsilon", [0.01, 0.16])
@pytest.mark.parametrize("stream", STREAMS)
def test_certifair_stream_equals_oracle(streams, stream, epsilon):
    X, Y = streams[stream]
    later, earlier = oracle_pairs_linf(X, Y, epsilon)
    expected = sorted(zip(later.tolist(), earlier.tolist()))
    for backend in BACKENDS:
        monitor = Monitor(epsilon, "linf", index=backend, batch_size=64)
        found = monitor.observe_batch(X, Y)
        got = sorted((w.decision, j) for w in found for j in w.ids.tolist())
        assert got == expected, f"{backend} on {stream} at ε={epsilon}"
        assert monitor.stats.pairs == len(expected)
        assert monitor.stats.flagged == len(set(later.tolist()))
