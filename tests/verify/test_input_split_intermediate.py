"""Input splitting picks forward intermediate bounds for wide networks with few inputs, and its
verdicts with them agree with a dense grid of a 2-input network."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from assay.verify import VerificationStatus, input_split, verify
from assay.verify.input_split import box_intermediate_method
from tests.verify.networks import random_relu_network


def test_forward_only_where_backward_substitution_costs_far_more():
    # ACAS Xu's shape: 5 inputs, six layers of 50 (backward ~2·10⁶ multiply-adds per box).
    assert box_intermediate_method(random_relu_network(0, (5, 50, 50, 50, 50, 50, 50, 5))) == "crown"
    # Two inputs, wide layers: backward walks 3·2000 neurons through millions of weights.
    wide = random_relu_network(0, (2, 2000, 2000, 2000, 1))
    assert box_intermediate_method(wide) == "forward"
    # Many inputs: forward bounds would carry one function per input.
    assert box_intermediate_method(random_relu_network(0, (300, 2000, 2000, 2000, 1))) == "crown"


@pytest.mark.parametrize("seed", range(4))
def test_verdicts_with_forward_intermediate_bounds_agree_with_a_dense_grid(seed, monkeypatch):
    monkeypatch.setattr(input_split, "FORWARD_MIN_BACKWARD_COST", 0)
    monkeypatch.setattr(input_split, "FORWARD_MIN_COST_RATIO", 0.0)
    calls = []
    from assay.bounds import api

    original = api.forward_bounds

    def counted(*args, **kwargs):
        calls.append(1)
        return original(*args, **kwargs)

    monkeypatch.setattr(api, "forward_bounds", counted)
    network = random_relu_network(200 + seed, (2, 20, 20, 20, 1))
    assert box_intermediate_method(network) == "forward"
    grid = torch.linspace(-1, 1, 801, dtype=torch.float64)
    points = torch.cartesian_prod(grid, grid)
    grid_max = network.forward(points).max().item()
    # The grid's spacing is 0.0025: the network's true maximum lies within ~0.01 of the grid's
    # (above it). The violations just below the grid's maximum fill a small region: the search
    # must split down to it (a box closed by a wrong bound would hide it).
    offset = 0.05 if seed % 2 else -0.002
    unsafe = SimpleNamespace(conjunctions=(SimpleNamespace(C=torch.ones(1, 1, dtype=torch.float64),
                                                           d=torch.tensor([-(grid_max + offset)], dtype=torch.float64)),))
    box = SimpleNamespace(lower=-torch.ones(2, dtype=torch.float64), upper=torch.ones(2, dtype=torch.float64))
    result = verify(network, box, unsafe=unsafe, timeout=60, strategy="input", attack_restarts=0)
    expected = VerificationStatus.HOLDS if offset > 0 else VerificationStatus.VIOLATED
    assert result.status is expected, result
    assert calls  # the boxes were bounded with forward intermediate bounds
    if expected is VerificationStatus.VIOLATED:
        x = result.counterexample.input.reshape(1, 2)
        assert ((x >= -1) & (x <= 1)).all() and network.forward(x).item() >= grid_max + offset


@pytest.mark.parametrize("seed", range(2))
def test_verdicts_with_interval_intermediate_bounds_agree_with_a_dense_grid(seed, monkeypatch):
    """Where backward refinement would cost too much per box (cctsdb_yolo), the boxes' intermediate
    tensors get interval bounds and the output rows CROWN: still sound, and the search still decides."""
    monkeypatch.setattr(input_split, "INTERVAL_INTERMEDIATE_COST", 0)
    from assay.bounds import api

    original, methods = api.compute_bounds, []

    def counted(*args, **kwargs):
        methods.append((kwargs.get("method"), kwargs.get("refine_intermediate", True)))
        return original(*args, **kwargs)

    monkeypatch.setattr(input_split, "compute_bounds", counted)
    network = random_relu_network(300 + seed, (2, 12, 12, 1))
    assert box_intermediate_method(network) == "crown" and input_split.interval_intermediates(network)
    grid = torch.linspace(-1, 1, 801, dtype=torch.float64)
    grid_max = network.forward(torch.cartesian_prod(grid, grid)).max().item()
    offset = 0.05 if seed % 2 else -0.002
    unsafe = SimpleNamespace(conjunctions=(SimpleNamespace(C=torch.ones(1, 1, dtype=torch.float64),
                                                           d=torch.tensor([-(grid_max + offset)], dtype=torch.float64)),))
    box = SimpleNamespace(lower=-torch.ones(2, dtype=torch.float64), upper=torch.ones(2, dtype=torch.float64))
    result = verify(network, box, unsafe=unsafe, timeout=60, strategy="input", attack_restarts=0, method="crown")
    assert result.status is (VerificationStatus.HOLDS if offset > 0 else VerificationStatus.VIOLATED), result
    assert ("ibp", True) in methods and ("crown", False) in methods  # intervals, then CROWN on the rows only
    assert ("crown", True) not in methods
