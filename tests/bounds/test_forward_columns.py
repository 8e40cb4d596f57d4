"""Grouped input columns of forward linear bounds (assay.bounds.forward_columns): the windows
contain every receptive field (autograd), the grouped bounds equal the dense ones and contain
sampled tensors, and compute_bounds takes intermediate_method="forward" on images of more than
MAX_FORWARD_INPUTS pixels."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from assay.bounds import compute_bounds, plan_for
from assay.bounds.forward import MAX_FORWARD_INPUTS, forward_bounds, forward_columns
from assay.bounds.forward_columns import tensor_windows
from assay.nn import Add, AvgPool2d, Conv2d, Flatten, Linear, Network, ReLU

from .strategies import forward_batched, sample_box


def _t(rng, *shape, scale=0.5):
    return torch.as_tensor(rng.normal(0.0, scale, size=shape))


def image_network(rng, size: int = 14, channels: int = 2) -> Network:
    """conv 3x3 → ReLU → conv 3x3 + skip → ReLU → avgpool → conv (stride 2, dilation 2) → ReLU
    → conv 1x1 + conv 3x3 (two branches, added) → ReLU → flatten → linear → ReLU → linear:
    padding, strides, dilation, pooling and residual additions of two widths."""
    layers = [Conv2d(_t(rng, 4, channels, 3, 3), _t(rng, 4), (1, 1), (1, 1)), ReLU(),
              Conv2d(_t(rng, 4, 4, 3, 3), _t(rng, 4), (1, 1), (1, 1)), Add(), ReLU(),
              AvgPool2d((2, 2), (2, 2)), Conv2d(_t(rng, 5, 4, 3, 3), _t(rng, 5), (2, 2), (1, 1), (2, 2)), ReLU(),
              Conv2d(_t(rng, 3, 5, 1, 1), _t(rng, 3)), Conv2d(_t(rng, 3, 5, 3, 3), _t(rng, 3), (1, 1), (1, 1)),
              Add(), ReLU(), Flatten()]
    sources = [(0,), (1,), (2,), (3, 1), (4,), (5,), (6,), (7,), (8,), (8,), (9, 10), (11,), (12,)]
    flat = Network(tuple(layers), (channels, size, size), sources=tuple(sources)).output_shape[0]
    layers += [Linear(_t(rng, 6, flat, scale=0.3), _t(rng, 6)), ReLU(), Linear(_t(rng, 2, 6), _t(rng, 2))]
    sources += [(13,), (14,), (15,)]
    return Network(tuple(layers), (channels, size, size), sources=tuple(sources))


def _box(network, rng, batch=2, width=0.1):
    shape = (batch, *network.input_shape)
    center = torch.as_tensor(rng.uniform(-1, 1, size=shape))
    radius = torch.as_tensor(rng.uniform(0, width, size=shape))
    return center - radius, center + radius


def _keep(position, low, high):
    return low, high


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_windows_contain_every_receptive_field(seed):
    """Every input pixel that an element's gradient depends on lies in the element's window."""
    rng = np.random.default_rng(seed)
    network = image_network(rng)
    windows = tensor_windows(plan_for(network, torch.float64))
    x = torch.as_tensor(rng.uniform(-1, 1, size=(1, *network.input_shape)))
    for t in range(1, len(network.shapes)):
        if windows[t] is None:
            continue
        _, height, width = network.shapes[t]
        for c, i, j in [(0, 0, 0), (0, height // 2, width // 2), (network.shapes[t][0] - 1, height - 1, width - 1)]:
            point = x.clone().requires_grad_(True)
            value = network.tensors(point)[t][0, c, i, j]
            # a linear surrogate of every path: the gradient with all ReLUs passing everything
            # would be stricter, but any nonzero gradient entry must be inside the window
            grad, = torch.autograd.grad(value, point, allow_unused=True)
            if grad is None:
                continue
            rows, cols = torch.nonzero(grad[0].abs().sum(0), as_tuple=True)
            (rs, rlo, rhi), (cs, clo, chi) = ((w.stride, w.lo, w.hi) for w in windows[t])
            assert bool(((rows >= rs * i + rlo) & (rows <= rs * i + rhi)).all()), (t, c, i, j)
            assert bool(((cols >= cs * j + clo) & (cols <= cs * j + chi)).all()), (t, c, i, j)


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_grouped_forward_bounds_equal_dense_and_contain_samples(seed, dtype):
    rng = np.random.default_rng(seed)
    network = image_network(rng)
    plan = plan_for(network, dtype)
    lower, upper = _box(network, rng)
    grouped = forward_bounds(plan, lower.to(dtype), upper.to(dtype), _keep)
    dense = forward_bounds(plan, lower.to(dtype), upper.to(dtype), _keep, grouped=False)
    assert set(grouped) == set(dense) == set(plan.relu_positions)
    tolerance = 1e-9 if dtype == torch.float64 else 1e-3
    for t in dense:
        for g, d in zip(grouped[t], dense[t]):
            assert torch.allclose(g.double(), d.double(), rtol=tolerance, atol=tolerance), t
    x = sample_box(lower, upper, rng, 500)
    with torch.no_grad():
        values = network.tensors(x.reshape(-1, *network.input_shape))
    for t, (low, high) in grouped.items():
        v = values[t].reshape(500, 2, *values[t].shape[1:])
        assert bool((v >= low.double()).all() and (v <= high.double()).all()), t


def test_grouped_columns_are_fewer_than_inputs():
    network = image_network(np.random.default_rng(0), size=20)
    counts = forward_columns(plan_for(network, torch.float64))
    n = math.prod(network.input_shape)
    assert counts[1] == 2 * 3 * 3  # a 3x3 convolution: windows 3 wide
    assert counts[1] < counts[5] < n  # they grow with the receptive field
    assert max(counts.values()) == n  # after the flatten every column is one input


def test_compute_bounds_forward_on_a_large_image():
    """More inputs than MAX_FORWARD_INPUTS: "forward" runs (grouped), holds for samples, and is
    no looser than IBP."""
    rng = np.random.default_rng(4)
    network = image_network(rng, size=12, channels=2)
    assert network.input_size > MAX_FORWARD_INPUTS
    lower, upper = _box(network, rng, batch=1, width=0.05)
    result = compute_bounds(network, (lower, upper), method="crown", intermediate_method="forward")
    ibp = compute_bounds(network, (lower, upper), method="ibp")
    y = forward_batched(network, sample_box(lower, upper, rng, 2000))
    assert bool((y >= result.lower).all() and (y <= result.upper).all())
    assert bool((result.lower >= ibp.lower).all() and (result.upper <= ibp.upper).all())
    for k in range(len(result.intermediate.lower)):
        assert bool((result.intermediate.lower[k] >= ibp.intermediate.lower[k]).all())
        assert bool((result.intermediate.upper[k] <= ibp.intermediate.upper[k]).all())
