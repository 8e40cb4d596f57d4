"""Small random ReLU networks for verifier tests (float64 weights, reproducible by seed)."""

from __future__ import annotations

import numpy as np
import torch

from assay.nn import Linear, Network, ReLU


def random_relu_network(seed: int, widths=(3, 10, 10, 2)) -> Network:
    """Layers of the given widths with N(0, 1/fan-in) weights and N(0, 0.1²) biases."""
    rng = np.random.default_rng(seed)
    layers = []
    for i, (a, b) in enumerate(zip(widths[:-1], widths[1:])):
        layers.append(Linear(torch.as_tensor(rng.normal(0, 1 / np.sqrt(a), (b, a))), torch.as_tensor(rng.normal(0, 0.1, b))))
        if i < len(widths) - 2:
            layers.append(ReLU())
    return Network(tuple(layers), (widths[0],))
