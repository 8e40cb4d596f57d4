"""ReLU splitting on networks with MaxPool: the root is bounded on the pooled twin first.

The twin's bounds may refute a query outright (no search); they must never refute one that a
point violates, and a query they cannot refute is still searched on the lowered network.
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from assay.bounds import compute_bounds
from assay.sets import Box
from assay.verify import VerificationStatus, verify
from tests.bounds.strategies import tied_maxpool_model


def unsafe_at_least(threshold: float, output: int = 0, outputs: int = 3):
    """The forbidden region y[output] ≥ threshold."""
    row = torch.zeros(1, outputs, dtype=torch.float64)
    row[0, output] = 1.0
    return SimpleNamespace(conjunctions=(SimpleNamespace(C=row, d=torch.tensor([-threshold], dtype=torch.float64)),))


def _setup(pool, stride, seed=5, eps=0.02):
    network = tied_maxpool_model(np.random.default_rng(seed), pool, stride)
    center = torch.full(network.input_shape, 0.5, dtype=torch.float64)
    center = center + 1e-3 * torch.as_tensor(np.random.default_rng(seed).normal(size=center.shape))
    return network, Box(center - eps, center + eps)


def _largest_sampled(network, box, n=4000):
    generator = torch.Generator().manual_seed(0)
    x = box.lower + (box.upper - box.lower) * torch.rand(n, *network.input_shape, dtype=torch.float64, generator=generator)
    x[: n // 2] = torch.where(x[: n // 2] > (box.lower + box.upper) / 2, box.upper, box.lower)
    return network.forward(x)[:, 0].max().item()


@pytest.mark.parametrize("pool,stride", [(2, 2), (3, 1)])
def test_the_pooled_root_refutes_what_its_bound_allows_without_a_search(pool, stride):
    network, box = _setup(pool, stride)
    pooled_upper = compute_bounds(network.pooled, box, method="crown").upper[0, 0].item()
    lowered_upper = compute_bounds(network, box, method="crown").upper[0, 0].item()
    assert pooled_upper < lowered_upper  # the case this is for: the twin's bound is tighter
    result = verify(network, box, unsafe=unsafe_at_least(pooled_upper + 1e-6), timeout=60, strategy="relu")
    assert result.status is VerificationStatus.HOLDS
    assert result.stats.domains == 0


@pytest.mark.parametrize("pool,stride", [(2, 2), (3, 1)])
def test_a_threshold_just_below_a_reached_output_is_violated(pool, stride):
    """The pooled shortcut never refutes a query that a point violates (1e-4 below a sampled output)."""
    network, box = _setup(pool, stride)
    reached = _largest_sampled(network, box)
    result = verify(network, box, unsafe=unsafe_at_least(reached - 1e-4), timeout=60, strategy="relu")
    assert result.status is VerificationStatus.VIOLATED
    x = torch.as_tensor(result.counterexample.input, dtype=torch.float64).reshape(network.input_shape)
    assert ((x >= box.lower) & (x <= box.upper)).all()
    assert network.forward(x.unsqueeze(0))[0, 0].item() >= reached - 1e-4


@pytest.mark.data
def test_verivital_maxpool_prop_8_holds_at_the_root(data_dir):
    """VNN-COMP 2021 verivital row 48: the lowered network's root leaves two conjunctions open
    (upper bounds 0.42 and 1.59) and its search timed out at 420 s; the pooled twin refutes all."""
    import assay.nn as nn
    from assay.sets import read_vnnlib
    from assay.verify import verify_vnnlib

    folder = data_dir / "vnncomp" / "verivital"
    network = nn.load(folder / "Convnet_maxpool.onnx")
    prop = read_vnnlib(folder / "specs" / "maxpool_specs" / "prop_8_0.004.vnnlib", network.input_size,
                       network.output_size)
    result = verify_vnnlib(network, prop, timeout=120)
    assert result.status is VerificationStatus.HOLDS
    assert result.stats.domains == 0
