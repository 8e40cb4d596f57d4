"""Small random networks and logistic-regression models for the cfx tests."""

from __future__ import annotations

import itertools

import numpy as np
import torch

from assay.nn import Linear, Network, ReLU


def random_mlp(sizes, rng: np.random.Generator, bias_scale: float = 0.5) -> Network:
    """A Linear/ReLU chain with N(0, 1) weights; ``sizes`` = (inputs, hidden…, outputs)."""
    layers = []
    for k, (a, b) in enumerate(zip(sizes, sizes[1:])):
        layers.append(Linear(rng.normal(size=(b, a)), rng.normal(size=b) * bias_scale))
        if k < len(sizes) - 2:
            layers.append(ReLU())
    return Network(tuple(layers), (sizes[0],))


def logistic(weight, bias) -> Network:
    """f(x) = w·x + b: one output, class 1 iff f(x) > 0."""
    return Network((Linear(np.asarray(weight, float)[None, :], np.array([float(bias)])),), (len(weight),))


def parameters(network: Network):
    return [(layer.weight.numpy(), layer.bias.numpy()) for layer in network.layers if isinstance(layer, Linear)]


def shifted_outputs(network: Network, x: np.ndarray, signs: np.ndarray, delta) -> np.ndarray:
    """Outputs at x of the models θ + δ·s for each row s of ``signs`` (P columns: W then b per layer)."""
    params = parameters(network)
    deltas = [delta] * len(params) if np.ndim(delta) == 0 else list(delta)
    h = torch.as_tensor(np.broadcast_to(x, (len(signs), len(x))).copy())
    s = torch.as_tensor(signs)
    offset = 0
    for k, (W, b) in enumerate(params):
        out, inp = W.shape
        dW = s[:, offset:offset + out * inp].reshape(-1, out, inp) * deltas[k]
        offset += out * inp
        db = s[:, offset:offset + out] * deltas[k]
        offset += out
        h = torch.einsum("noi,ni->no", torch.as_tensor(W) + dW, h) + torch.as_tensor(b) + db
        if k < len(params) - 1:
            h = torch.relu(h)
    return h.numpy()


def parameter_count(network: Network) -> int:
    return sum(W.size + b.size for W, b in parameters(network))


def all_vertices(count: int) -> np.ndarray:
    return np.array(list(itertools.product((-1.0, 1.0), repeat=count)))
