"""relu_coefficients: the walk ends at CROWN's own linear bound, holds on samples, and matches a hand computation."""

from __future__ import annotations

import numpy as np
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from assay.bounds import IntermediateBounds, compute_bounds, relu_coefficients
from assay.nn import Linear, Network, ReLU

from .strategies import (
    conv_networks,
    dense_networks,
    forward_batched,
    graph_networks,
    random_boxes,
    random_splits,
    sample_box,
    satisfies_splits,
)

FEW = settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _rows(network: Network, rng: np.random.Generator, count: int = 2):
    C = torch.as_tensor(rng.normal(size=(count, network.output_size)))
    d = torch.as_tensor(rng.normal(size=count))
    return C, d


@FEW
@given(network=st.one_of(dense_networks(), conv_networks(), graph_networks(pooled=False)), seed=st.integers(0, 2**32 - 1),
       method=st.sampled_from(["crown", "alpha"]), split=st.booleans())
def test_walk_ends_at_crowns_linear_bound_and_holds_on_samples(network, seed, method, split):
    rng = np.random.default_rng(seed)
    lower, upper = random_boxes(network, rng, 3)
    C, d = _rows(network, rng)
    splits = None
    if split:
        root = compute_bounds(network, (lower, upper), (C, d), "crown")
        splits = random_splits(network, root.intermediate, rng)
    result = compute_bounds(network, (lower, upper), (C, d), method, sides="lower", splits=splits, return_linear=True)
    coefficients = relu_coefficients(network, result.intermediate, C, d, alphas=result.alphas)
    assert len(coefficients.layers) == len(result.intermediate.lower)
    for layer, bound in zip(coefficients.layers, result.intermediate.lower):
        assert layer.shape == (3, 2, *bound.shape[1:])
    scale = 1 + result.linear.lower_A.abs().max()
    assert torch.allclose(coefficients.A, result.linear.lower_A, rtol=0, atol=1e-12 * scale)
    # The linear bound the walk ends with (no rounding margin: a tiny tolerance) holds on samples.
    x = sample_box(lower, upper, rng, 200)
    value = forward_batched(network, x) @ C.T + d                           # (n, B, S)
    bound = (x.reshape(200, 3, 1, -1) * coefficients.A.reshape(1, 3, 2, -1)).sum(-1) + coefficients.b
    keep = torch.ones(200, 3, dtype=torch.bool) if splits is None else satisfies_splits(network, x, splits)
    tolerance = 1e-9 * (1 + value.abs())
    assert ((bound <= value + tolerance) | ~keep.unsqueeze(-1)).all()


def test_hand_computed_coefficients():
    """y = W2 relu(z) with z = W1 x; row c: c·W2 = (2, −3). Neuron 0 in [−1, 3]: a positive weight takes
    CROWN's lower slope (1, since u > −l), or the α given; neuron 1 in [−1, 1]: a negative weight takes
    the chord's slope u/(u − l) = 0.5. A stable inactive neuron gets 0 whatever its weight."""
    W1 = torch.eye(3, 2, dtype=torch.float64)
    W2 = torch.tensor([[2.0, -3.0, 5.0]], dtype=torch.float64)
    network = Network((Linear(W1, torch.zeros(3, dtype=torch.float64)), ReLU(),
                       Linear(W2, torch.zeros(1, dtype=torch.float64))), (2,))
    bounds = IntermediateBounds((torch.tensor([[-1.0, -1.0, -2.0]], dtype=torch.float64),),
                                (torch.tensor([[3.0, 1.0, -0.5]], dtype=torch.float64),))
    C = torch.ones(1, 1, dtype=torch.float64)
    plain = relu_coefficients(network, bounds, C)
    assert plain.layers[0].tolist() == [[[2.0, -1.5, 0.0]]]
    # The chord's intercept −u·l/(u − l) = 0.5 (nudged up by a few ulps) enters b with the row's weight −3.
    assert abs(plain.b.item() + 1.5) < 1e-12
    given_alpha = relu_coefficients(network, bounds, C, alphas=[torch.tensor([[[0.25, 0.9, 0.7]]], dtype=torch.float64)])
    assert given_alpha.layers[0].tolist() == [[[0.5, -1.5, 0.0]]]
