"""Max pooling relaxed window by window (MaxPool2d stages of a network's `pooled` twin).

Where bugs hide: overlapping windows (an element chosen in one window must still count in its
neighbours), ties (equal intervals, point intervals), coefficients of both signs, float32.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from assay.bounds import AlphaCrownOptions, compute_bounds
from assay.bounds.relaxation import relax_maxpool
from assay.errors import UnsupportedOperatorError
from assay.nn import load
from assay.nn.layers import MaxPool2d
from assay.nn.network import Network
from assay.verify.relu_split import ReluSplitting

from .strategies import onnx_graph_model, tied_maxpool_model

POOLS = [((2, 2), (2, 2)), ((3, 3), (1, 1)), ((2, 3), (1, 2)), ((3, 2), (2, 1))]


def brute_force(lower, upper, kernel, stride):
    """Per window: the chosen element (largest lower bound, first on ties), its dominance, the largest upper."""
    batch, channels, height, width = lower.shape
    out_h, out_w = (height - kernel[0]) // stride[0] + 1, (width - kernel[1]) // stride[1] + 1
    index = torch.zeros(batch, channels, out_h, out_w, dtype=torch.long)
    dominant = torch.zeros(batch, channels, out_h, out_w, dtype=torch.bool)
    top = torch.zeros(batch, channels, out_h, out_w, dtype=lower.dtype)
    for b in range(batch):
        for c in range(channels):
            for i in range(out_h):
                for j in range(out_w):
                    cells = [(i * stride[0] + p, j * stride[1] + q) for p in range(kernel[0]) for q in range(kernel[1])]
                    lows = [float(lower[b, c, r, s]) for r, s in cells]
                    chosen = int(np.argmax(lows))
                    others = [float(upper[b, c, r, s]) for n, (r, s) in enumerate(cells) if n != chosen]
                    r, s = cells[chosen]
                    index[b, c, i, j] = r * width + s
                    dominant[b, c, i, j] = lows[chosen] >= max(others)
                    top[b, c, i, j] = max(float(upper[b, c, r, s]) for r, s in cells)
    return index, dominant, top


@pytest.mark.parametrize("jitter", [0.0, 1e-4])
@pytest.mark.parametrize("kernel,stride", POOLS)
def test_relaxation_matches_brute_force_with_ties_and_overlaps(kernel, stride, jitter):
    rng = np.random.default_rng(1)
    # Few distinct values, so that ties of lower and upper bounds are common; the jitter puts
    # many comparisons 1e-4 from a tie.
    lower = torch.as_tensor(rng.integers(0, 4, size=(3, 2, 6, 7)) / 2 + jitter * rng.integers(0, 2, size=(3, 2, 6, 7)))
    upper = lower + torch.as_tensor(rng.integers(0, 3, size=lower.shape) / 2 + jitter * rng.integers(-1, 2, size=lower.shape)).clamp(min=0)
    relaxation = relax_maxpool(lower, upper, kernel, stride)
    index, dominant, top = brute_force(lower, upper, kernel, stride)
    # Ties of the largest lower bound may pick another element; it must have the same lower bound.
    flat_lower = lower.flatten(2)
    assert torch.equal(flat_lower.gather(2, relaxation.index.flatten(2)), flat_lower.gather(2, index.flatten(2)))
    assert torch.equal(relaxation.dominant, dominant)
    assert torch.equal(relaxation.upper, top)


def test_an_element_chosen_in_one_window_still_counts_in_an_overlapping_one():
    """Windows (0,1) and (1,2) of a 1x3 row share element 1: window 0 chooses it, and its upper
    bound (5) is above the lower bound (3) of window 1's choice, so window 1 is not dominated."""
    lower = torch.tensor([[[[4.0, 2.0, 3.0]]]], dtype=torch.float64)
    upper = torch.tensor([[[[4.5, 5.0, 3.5]]]], dtype=torch.float64)
    relaxation = relax_maxpool(lower, upper, (1, 2), (1, 1))
    assert relaxation.index.flatten().tolist() == [0, 2]
    assert relaxation.dominant.flatten().tolist() == [False, False]


@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("gap", [1e-4, 0.0, -1e-4])
def test_a_window_short_of_dominance_by_1e4_keeps_the_constant_upper_bound(dtype, gap):
    """max(x1, x2) with x1 = 1 and x2 ∈ [0, 1 + gap]: x1 dominates only when gap ≤ 0; the bounds
    of the max and of its negation hold at the worst vertex either way."""
    network = Network((MaxPool2d((1, 2), (1, 1)),), (1, 1, 2))
    lower = torch.tensor([[[[1.0, 0.0]]]], dtype=torch.float64)
    upper = torch.tensor([[[[1.0, 1.0 + gap]]]], dtype=torch.float64)
    for method in ("crown", "alpha"):
        result = compute_bounds(network, (lower, upper), spec=torch.tensor([[1.0], [-1.0]]), method=method, dtype=dtype)
        assert float(result.upper[0, 0]) >= max(1.0, 1.0 + gap)  # at x2 = 1 + gap
        assert float(result.lower[0, 0]) <= 1.0 and float(result.upper[0, 1]) >= -1.0
        if gap <= 0:  # x1 dominates: the max is exactly x1 = 1
            assert float(result.upper[0, 0]) <= 1.0 + 1e-6


def pooled_model(rng, pool, stride, residual=False):
    network = load(onnx_graph_model(rng, 1, 6, pool, stride, residual, False))
    assert network.pooled is not None and any(isinstance(layer, MaxPool2d) for layer in network.pooled.layers)
    return network


def attack_maximum(network, lower, upper, rows, steps=60):
    """The largest value of each row found by projected gradient ascent from the box's corners and centre."""
    best = torch.full((rows.shape[0],), -torch.inf, dtype=torch.float64)
    for r, row in enumerate(rows):
        starts = torch.stack([lower[0], upper[0], (lower[0] + upper[0]) / 2])
        x = starts.clone().requires_grad_(True)
        for step in range(steps):
            value = network.tensors(x)[-1].reshape(len(x), -1) @ row
            (grad,) = torch.autograd.grad(value.sum(), x)
            with torch.no_grad():
                size = (upper[0] - lower[0]) * 0.25 * (0.9 ** step)
                x = torch.minimum(torch.maximum(x + size * grad.sign(), lower[0]), upper[0]).requires_grad_(True)
        with torch.no_grad():
            best[r] = (network.forward(x).reshape(len(x), -1) @ row).max()
    return best


@pytest.mark.parametrize("pool,stride", [(2, 2), (3, 1), (3, 2)])
@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_pooled_bounds_hold_on_nearly_tied_windows(pool, stride, dtype):
    """A nearly constant image makes each channel's convolution outputs nearly equal: every window
    is a near tie. IBP, CROWN and α-CROWN bounds of the pooled twin (both output sides) contain
    every sampled and attacked output, and its CROWN bounds are tighter than the lowered network's."""
    rng = np.random.default_rng(7)
    network = tied_maxpool_model(rng, pool, stride)
    pooled = network.pooled
    center = torch.full((1, *network.input_shape), 0.5, dtype=torch.float64)
    center = center + 1e-3 * torch.as_tensor(rng.normal(size=center.shape))
    eps = 1e-2
    lower, upper = center - eps, center + eps
    samples = lower + (upper - lower) * torch.rand(3000, *network.input_shape, dtype=torch.float64,
                                                   generator=torch.Generator().manual_seed(0))
    samples[:1000] = torch.where(samples[:1000] > center, upper, lower)  # vertices
    outputs = pooled.forward(samples).reshape(len(samples), -1)
    assert torch.allclose(outputs, network.forward(samples).reshape(len(samples), -1), atol=1e-12)
    eye = torch.eye(outputs.shape[1], dtype=torch.float64)
    attacked_high = attack_maximum(pooled, lower, upper, eye)
    attacked_low = -attack_maximum(pooled, lower, upper, -eye)
    for method in ("ibp", "crown", "alpha"):
        result = compute_bounds(pooled, (lower, upper), method=method, dtype=dtype,
                                options=AlphaCrownOptions(iterations=10) if method == "alpha" else None)
        assert (outputs >= result.lower).all() and (outputs <= result.upper).all(), method
        assert (attacked_high <= result.upper[0]).all() and (attacked_low >= result.lower[0]).all(), method
    whole = compute_bounds(pooled, (lower, upper), method="crown", dtype=dtype)
    lowered = compute_bounds(network, (lower, upper), method="crown", dtype=dtype)
    assert ((whole.upper - whole.lower) < (lowered.upper - lowered.lower)).all()


def test_relu_only_walks_refuse_a_pooled_twin():
    network = pooled_model(np.random.default_rng(3), 2, 2)
    box = (torch.zeros(1, *network.input_shape, dtype=torch.float64), torch.ones(1, *network.input_shape, dtype=torch.float64))
    with pytest.raises(UnsupportedOperatorError, match="MaxPool2d"):
        compute_bounds(network.pooled, box, intermediate_method="forward")
    query = type("Query", (), {})()  # ReLU splitting refuses before it reads the query
    with pytest.raises(UnsupportedOperatorError, match="MaxPool lowered to ReLUs"):
        ReluSplitting(network.pooled, query, torch.zeros(1, 3), torch.zeros(1))
