"""Fixtures of the service tests: a reference stream, a store in a temp folder, a PostgreSQL server."""

from __future__ import annotations

import numpy as np
import pytest

from tests.requirements import require
from tests.serve.servers import PostgresServer


def stream(seed: int, count: int, dim: int = 3):
    """Decisions on a coarse grid (many inputs at exactly ε = 0.1 from each other: ties) with 3 labels."""
    rng = np.random.default_rng(seed)
    X = rng.integers(0, 6, size=(count, dim)) * 0.05
    Y = [str(label) for label in rng.choice(["approve", "deny", "review"], size=count)]
    return X, Y


@pytest.fixture(scope="session")
def postgres_url():
    require("psycopg")
    with PostgresServer() as server:
        yield server.url
