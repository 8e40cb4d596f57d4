"""Grouped rows of CROWN's intermediate bounds (assay.bounds.grouped_rows): one backward walk per
group of neurons with disjoint receptive fields gives each neuron the bounds of its own walk,
and compute_bounds' intermediate bounds (which use them) contain sampled tensors."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from assay.bounds import center_radius, compute_bounds, interval_pass, plan_for, tensor_bounds
from assay.bounds.grouped_rows import row_spacing
from assay.bounds.relaxation import relax_relu
from assay.nn import Add, AvgPool2d, Conv2d, Network, ReLU

from .strategies import forward_batched, sample_box
from .test_forward_columns import _t, image_network


def _box(network, rng, batch=2, width=0.3):
    shape = (batch, *network.input_shape)
    center = torch.as_tensor(rng.uniform(-1, 1, size=shape))
    radius = torch.as_tensor(rng.uniform(0, width, size=shape))
    return center - radius, center + radius


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_grouped_rows_give_each_neuron_its_own_walks_bounds(seed, dtype):
    rng = np.random.default_rng(seed)
    network = image_network(rng, size=20)
    plan = plan_for(network, dtype)
    lower, upper = (t.to(dtype) for t in _box(network, rng))
    bounds = interval_pass(plan, lower, upper, {}, lambda position, low, high: (low, high))
    center, radius = center_radius(lower, upper)
    grouped_layers = 0
    for position in plan.relu_positions:
        grouped = tensor_bounds._crown_layer_bounds_grouped(plan, position, bounds, {}, center, radius, relax_relu)
        if grouped is None:
            continue
        grouped_layers += 1
        single = tensor_bounds._crown_layer_bounds_padded(plan, position, bounds, {}, center, radius, relax_relu)
        tolerance = 1e-9 if dtype == torch.float64 else 1e-3
        for g, s in zip(grouped, single):
            assert torch.allclose(g, s, rtol=tolerance, atol=tolerance), position
    assert grouped_layers >= 2  # the first two ReLU layers (52 and 100 s of 1,800 neurons saved)


def test_row_spacing_covers_the_widest_field():
    network = image_network(np.random.default_rng(0), size=20)
    plan = plan_for(network, torch.float64)
    (sh, sw), fields = row_spacing(plan, plan.relu_positions[1])
    # two 3x3 convolutions (and a 3x3 + skip) from the input: fields 5 wide, so rows 5 apart
    assert (sh, sw) == (5, 5)
    assert 0 in fields
    assert row_spacing(plan, plan.relu_positions[-1]) is None  # after the flatten: not an image


@pytest.mark.parametrize("seed", [2, 3])
def test_crown_with_grouped_rows_contains_sampled_tensors(seed):
    rng = np.random.default_rng(seed)
    network = image_network(rng, size=20)
    lower, upper = _box(network, rng, batch=1, width=0.2)
    result = compute_bounds(network, (lower, upper), method="crown")
    x = sample_box(lower, upper, rng, 1000)
    y = forward_batched(network, x)
    assert bool((y >= result.lower).all() and (y <= result.upper).all())
    with torch.no_grad():
        values = network.tensors(x.reshape(-1, *network.input_shape))
    plan = plan_for(network, torch.float64)
    ibp = compute_bounds(network, (lower, upper), method="ibp")
    for k, position in enumerate(plan.relu_positions):
        v = values[position]
        assert bool((v >= result.intermediate.lower[k]).all() and (v <= result.intermediate.upper[k]).all()), position
        assert bool((result.intermediate.lower[k] >= ibp.intermediate.lower[k]).all())
        assert bool((result.intermediate.upper[k] <= ibp.intermediate.upper[k]).all())


def fully_convolutional_network(rng, size: int = 12) -> Network:
    """conv 3x3 → ReLU → conv 3x3 + skip → ReLU → avgpool → conv 3x3 → ReLU → conv 1x1: every
    output element reads a window of the image."""
    layers = [Conv2d(_t(rng, 4, 2, 3, 3), _t(rng, 4), (1, 1), (1, 1)), ReLU(),
              Conv2d(_t(rng, 4, 4, 3, 3), _t(rng, 4), (1, 1), (1, 1)), Add(), ReLU(),
              AvgPool2d((2, 2), (2, 2)), Conv2d(_t(rng, 5, 4, 3, 3), _t(rng, 5), (1, 1), (1, 1)), ReLU(),
              Conv2d(_t(rng, 3, 5, 1, 1), _t(rng, 3))]
    sources = [(0,), (1,), (2,), (3, 1), (4,), (5,), (6,), (7,), (8,)]
    return Network(tuple(layers), (2, size, size), sources=tuple(sources))


@pytest.mark.parametrize("seed", [0, 1])
def test_rows_reading_a_window_refine_only_the_neurons_they_reach(seed):
    """A row reading one output element: CROWN bounds only the neurons in its field (the others
    keep their interval bounds), and the row's bounds are those of bounding every neuron."""
    rng = np.random.default_rng(seed)
    network = fully_convolutional_network(rng)
    lower, upper = _box(network, rng, batch=1, width=0.2)
    out = network.output_shape
    C = torch.zeros(1, *out, dtype=torch.float64)
    C[0, 1, 1, 2] = 1.0  # a corner's neighbour: a window of the image
    row = compute_bounds(network, (lower, upper), spec=C.reshape(1, -1), method="crown")
    every = compute_bounds(network, (lower, upper), method="crown")
    ibp = compute_bounds(network, (lower, upper), method="ibp")
    flat = int(C.reshape(-1).nonzero()[0, 0])
    assert torch.allclose(row.lower[0, 0], every.lower[0, flat], rtol=1e-9, atol=1e-9)
    assert torch.allclose(row.upper[0, 0], every.upper[0, flat], rtol=1e-9, atol=1e-9)
    # the first layer far from the row (rows 8+ of the 12) is not refined: its interval bounds stay
    plan = plan_for(network, torch.float64)
    k = len(plan.relu_positions) - 2  # the layer before the pooling
    far = (slice(None), slice(None), slice(9, None), slice(9, None))
    assert torch.equal(row.intermediate.lower[k][far], ibp.intermediate.lower[k][far])
    assert not torch.equal(every.intermediate.lower[k][far], ibp.intermediate.lower[k][far])
    # and every neuron in the row's field gets the bounds it gets when every neuron is bounded:
    # output (1, 2) reads the last ReLU at (1, 2), the 6x6 layer at rows 0-2, columns 1-3, and so
    # this layer (before the 2x2 pooling) at rows 0-5, columns 2-7
    near = (slice(None), slice(None), slice(0, 6), slice(2, 8))
    for k_near in (k, k + 1):
        for mine, theirs in ((row.intermediate.lower, every.intermediate.lower),
                             (row.intermediate.upper, every.intermediate.upper)):
            window = near if k_near == k else (slice(None), slice(None), slice(1, 2), slice(2, 3))
            assert torch.allclose(mine[k_near][window], theirs[k_near][window], rtol=1e-9, atol=1e-9)
    y = forward_batched(network, sample_box(lower, upper, rng, 1000)).reshape(1000, 1, -1)[..., flat]
    assert bool((y >= row.lower[0, 0]).all() and (y <= row.upper[0, 0]).all())
