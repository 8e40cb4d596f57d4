"""Hypothesis strategies and samplers for the bound-engine conformance tests."""

from __future__ import annotations

import numpy as np
import torch
from hypothesis import strategies as st

from assay.nn import AvgPool2d, Conv2d, Flatten, Linear, Network, ReLU


def _tensor(rng: np.random.Generator, *shape, scale=1.0) -> torch.Tensor:
    return torch.as_tensor(rng.normal(0.0, scale, size=shape))


@st.composite
def dense_networks(draw):
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    widths = [draw(st.integers(1, 5))] + draw(st.lists(st.integers(1, 8), min_size=1, max_size=3)) + [draw(st.integers(1, 4))]
    layers = []
    for i, (fan_in, fan_out) in enumerate(zip(widths[:-1], widths[1:])):
        layers.append(Linear(_tensor(rng, fan_out, fan_in, scale=1 / np.sqrt(fan_in) * 1.5), _tensor(rng, fan_out, scale=0.5)))
        if i < len(widths) - 2:
            layers.append(ReLU())
    return Network(tuple(layers), (widths[0],))


@st.composite
def conv_networks(draw):
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    channels = draw(st.integers(1, 2))
    size = draw(st.integers(4, 6))
    out_channels = draw(st.integers(1, 3))
    kernel = draw(st.integers(2, 3))
    stride = draw(st.integers(1, 2))
    padding = draw(st.integers(0, 1))
    layers = [Conv2d(_tensor(rng, out_channels, channels, kernel, kernel, scale=0.6), _tensor(rng, out_channels, scale=0.3),
                     stride, padding), ReLU()]
    shape = Network(tuple(layers), (channels, size, size)).output_shape
    if draw(st.booleans()) and shape[1] >= 2:
        layers.append(AvgPool2d(2, 2))
        shape = Network(tuple(layers), (channels, size, size)).output_shape
    layers.append(Flatten())
    flat = int(np.prod(shape))
    hidden = draw(st.integers(1, 6))
    layers += [Linear(_tensor(rng, hidden, flat, scale=1 / np.sqrt(flat) * 1.5), _tensor(rng, hidden, scale=0.3)), ReLU(),
               Linear(_tensor(rng, 3, hidden, scale=1.0), _tensor(rng, 3, scale=0.3))]
    return Network(tuple(layers), (channels, size, size))


def random_boxes(network: Network, rng: np.random.Generator, batch: int, max_width: float = 1.0):
    """A batch of random input boxes (lower, upper), each of shape (batch, *input_shape)."""
    shape = (batch, *network.input_shape)
    center = torch.as_tensor(rng.uniform(-1.0, 1.0, size=shape))
    radius = torch.as_tensor(rng.uniform(0.0, max_width / 2, size=shape))
    return center - radius, center + radius


def sample_box(lower: torch.Tensor, upper: torch.Tensor, rng: np.random.Generator, n: int) -> torch.Tensor:
    """n points per domain (n, B, *shape): a quarter at random vertices, the rest uniform."""
    u = torch.as_tensor(rng.uniform(size=(n, *lower.shape)))
    vertices = n // 4
    u[:vertices] = torch.as_tensor(rng.integers(0, 2, size=(vertices, *lower.shape)), dtype=u.dtype)
    return lower + (upper - lower) * u


def forward_batched(network: Network, x: torch.Tensor) -> torch.Tensor:
    """Forward pass of x (n, B, *input_shape) → (n, B, n_out) in float64."""
    n, batch = x.shape[:2]
    return network.forward(x.reshape(n * batch, *network.input_shape)).reshape(n, batch, -1)


def random_splits(network: Network, intermediate, rng: np.random.Generator, per_layer: int = 2):
    """Split histories fixing up to ``per_layer`` unstable ReLUs per layer to a random sign."""
    splits = []
    for lower, upper in zip(intermediate.lower, intermediate.upper):
        split = torch.zeros(lower.shape, dtype=torch.int64)
        flat_split = split.reshape(lower.shape[0], -1)
        unstable = ((lower < 0) & (upper > 0)).reshape(lower.shape[0], -1)
        for b in range(lower.shape[0]):
            candidates = unstable[b].nonzero().flatten().numpy()
            if candidates.size:
                chosen = rng.choice(candidates, size=min(per_layer, candidates.size), replace=False)
                flat_split[b, torch.as_tensor(chosen)] = torch.as_tensor(rng.choice([-1, 1], size=chosen.size))
        splits.append(split)
    return splits


def satisfies_splits(network: Network, x: torch.Tensor, splits) -> torch.Tensor:
    """Mask (n, B): which points satisfy every split constraint of their domain."""
    n, batch = x.shape[:2]
    h = x.reshape(n * batch, *network.input_shape)
    ok = torch.ones(n * batch, dtype=torch.bool)
    k = 0
    with torch.no_grad():
        for index, layer in enumerate(network.layers):
            if isinstance(layer, ReLU):
                split = splits[k].unsqueeze(0).expand(n, *splits[k].shape).reshape(n * batch, -1)
                z = h.reshape(n * batch, -1)
                ok &= (((split == 1) & (z < 0)) | ((split == -1) & (z > 0))).logical_not().all(1)
                k += 1
            h = network.apply_layer(index, h)
    return ok.reshape(n, batch)


def perturbed_network(network: Network, rng: np.random.Generator, delta: float) -> Network:
    """The same network with every Linear/Conv2d weight and bias moved by ≤ δ (often at ±δ)."""
    def move(t):
        corner = rng.choice([-1.0, 1.0], size=t.shape)
        step = np.where(rng.uniform(size=t.shape) < 0.5, corner, rng.uniform(-1.0, 1.0, size=t.shape))
        return t + delta * torch.as_tensor(step)

    layers = []
    for layer in network.layers:
        if isinstance(layer, Linear):
            layer = Linear(move(layer.weight), move(layer.bias))
        elif isinstance(layer, Conv2d):
            layer = Conv2d(move(layer.weight), move(layer.bias), layer.stride, layer.padding, layer.dilation, layer.groups)
        layers.append(layer)
    return Network(tuple(layers), network.input_shape)
