"""Global Lipschitz constants hold for ReLU networks and refuse other operators (the ℓ2 constant
is a product of the layers' norms, which an operator such as exp does not keep)."""

from __future__ import annotations

import pytest
import torch

from assay.bounds import lipschitz_bounds
from assay.errors import UnsupportedOperatorError
from assay.nn import Linear, Network, ReLU
from assay.nn.ops import Exp


def _network(activation) -> Network:
    g = torch.Generator().manual_seed(0)
    w = lambda *shape: torch.randn(*shape, generator=g, dtype=torch.float64)  # noqa: E731
    return Network((Linear(w(4, 3), w(4)), activation, Linear(w(2, 4), w(2))), (3,))


@pytest.mark.parametrize("norm", ["2", "inf"])
def test_lipschitz_constants_refuse_an_operator_that_is_not_relu(norm):
    with pytest.raises(UnsupportedOperatorError, match="Exp"):
        lipschitz_bounds(_network(Exp()), torch.ones(1, 2, dtype=torch.float64), norm=norm)


@pytest.mark.parametrize("norm", ["2", "inf"])
def test_lipschitz_constants_of_a_relu_network_hold_at_sampled_pairs(norm):
    network = _network(ReLU())
    rows = torch.tensor([[1.0, -1.0], [0.5, 2.0]], dtype=torch.float64)
    constants = lipschitz_bounds(network, rows, norm=norm)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(500, 3, generator=g, dtype=torch.float64)
    y = x + 0.01 * torch.randn(500, 3, generator=g, dtype=torch.float64)
    change = ((network.forward(x) - network.forward(y)) @ rows.T).abs()
    distance = torch.linalg.vector_norm(x - y, ord=2 if norm == "2" else float("inf"), dim=1, keepdim=True)
    assert bool((change <= constants * distance).all())
