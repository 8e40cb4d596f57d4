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


def mixed_encodings():
    """Every valid code of the mixed test spec's categorical part: a one-hot of 3 (bits 2–4)
    and a thermometer of 3 levels (bits 5–7)."""
    for hot, level in itertools.product(range(3), range(3)):
        bits = np.zeros(6)
        bits[hot] = 1.0
        bits[3:3 + level + 1] = 1.0
        yield bits


def cheapest_on_grid(network, x, target, cost=None, points_per_axis=4001):
    """(the least cost of a valid point, the grid step): over the mixed spec's inputs that keep
    x's immutable v0, move v1 along a dense grid and take every categorical code; ``cost`` weighs
    the ℓ1 distance (None: plain ℓ1). inf where no grid point is valid."""
    from assay.cfx._model import row_margins, target_rows
    from assay.cfx.milp import MIN_MARGIN

    grid = np.linspace(0, 1, points_per_axis)
    weights = np.ones(len(x)) if cost is None else np.asarray(cost)
    best = np.inf
    for bits in mixed_encodings():
        points = np.tile(x, (len(grid), 1))
        points[:, 1] = grid
        points[:, 2:] = bits
        valid = row_margins(network, points, target_rows(network, target)) >= MIN_MARGIN
        if valid.any():
            best = min(best, float((np.abs(points[valid] - x) * weights).sum(1).min()))
    return best, grid[1] - grid[0]
