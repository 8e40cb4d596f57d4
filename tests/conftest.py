"""Shared fixtures: where the real data lives, and a seeded generator per test."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from tests.requirements import in_ci, require

REPO_ROOT = Path(__file__).resolve().parents[1]


def pytest_configure(config):
    """Under pytest-xdist (``make test`` runs ``-n 2``) each worker process gets one torch thread:
    two workers with a thread per core each would fight over a 2-core machine's cores."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        import torch

        torch.set_num_threads(1)


def shared_data_dir() -> Path | None:
    """``$ASSAY_DATA`` if set, else ``../shared/data`` beside the repository; None if absent."""
    candidate = Path(os.environ["ASSAY_DATA"]) if os.environ.get("ASSAY_DATA") else REPO_ROOT.parent / "shared" / "data"
    return candidate if candidate.is_dir() else None


@pytest.fixture(scope="session")
def data_dir() -> Path:
    """The real data folder. Missing data fails loudly in CI and skips (with the reason) elsewhere."""
    found = shared_data_dir()
    if found is None:
        message = "the shared data folder is missing: set ASSAY_DATA or place ../shared/data beside the repository"
        if in_ci():
            pytest.fail(message)
        pytest.skip(message)
    return found


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(20261122)


def pytest_runtest_setup(item):
    """``@pytest.mark.requires("faiss", ...)``: fail in CI, skip elsewhere, when a package is missing."""
    for mark in item.iter_markers("requires"):
        for module in mark.args:
            require(module)


@pytest.fixture
def without_bound_rule(monkeypatch):
    """``without_bound_rule(LayerClass)``: the bound engine's registry forgets that class's rules
    for this test, so the refusal of an operator without a rule can be tested although every
    operator assay loads has one."""
    from assay.bounds import rules

    rules._load()

    def drop(layer_class) -> None:
        registry = dict(rules._REGISTRY)
        registry.pop(layer_class, None)
        monkeypatch.setattr(rules, "_REGISTRY", registry)

    return drop
