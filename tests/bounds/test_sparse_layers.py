"""Large mostly-zero dense layers run as CSR products: the same bounds and outputs as dense ones."""

from __future__ import annotations

import pytest
import torch

import assay.nn.sparse as sparse_module
from assay.bounds import compute_bounds, plan_for
from assay.nn import Linear, Network, ReLU
from assay.nn.sparse import SPARSE_MAX_DENSITY, SPARSE_MIN_WEIGHTS, SparseLinear, is_sparse_weight


def sparse_matrix(rows: int, cols: int, density: float, generator: torch.Generator) -> torch.Tensor:
    weight = torch.randn(rows, cols, generator=generator, dtype=torch.float64)
    keep = torch.rand(rows, cols, generator=generator) < density
    return torch.where(keep, weight, torch.zeros_like(weight))


def tll_like(seed: int = 0) -> Network:
    """2 inputs, a 300 × 300 layer with ~1 % nonzero weights (90,000 ≥ the threshold), 2 outputs."""
    g = torch.Generator().manual_seed(seed)
    layers = (
        Linear(torch.randn(300, 2, generator=g, dtype=torch.float64), torch.randn(300, generator=g, dtype=torch.float64)),
        ReLU(),
        Linear(sparse_matrix(300, 300, 0.01, g) * 2, 0.3 * torch.randn(300, generator=g, dtype=torch.float64)),
        ReLU(),
        Linear(sparse_matrix(256, 300, 0.015, g), 0.3 * torch.randn(256, generator=g, dtype=torch.float64)),
        ReLU(),
        Linear(torch.randn(2, 256, generator=g, dtype=torch.float64) / 4, torch.zeros(2, dtype=torch.float64)),
    )
    return Network(layers, (2,))


def twin(network: Network) -> Network:
    """The same layers in a new Network object (plans are cached per object)."""
    return Network(tuple(network.layers), network.input_shape)


def dense_forward(network: Network, x: torch.Tensor) -> torch.Tensor:
    for layer in network.layers:
        x = x @ layer.weight.t() + layer.bias if isinstance(layer, Linear) else x.clamp(min=0)
    return x


def boxes(count: int, seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    center = torch.rand(count, 2, generator=g, dtype=torch.float64) * 2 - 1
    radius = torch.rand(count, 2, generator=g, dtype=torch.float64) * 0.05 + 0.005
    return center - radius, center + radius


def test_threshold_counts_weights_and_nonzeros():
    side = int(SPARSE_MIN_WEIGHTS ** 0.5)
    nonzero = int(SPARSE_MAX_DENSITY * side * side)
    weight = torch.zeros(side, side)
    weight.view(-1)[:nonzero] = 1.0
    assert is_sparse_weight(weight)
    weight.view(-1)[nonzero] = 1.0  # one nonzero too many
    assert not is_sparse_weight(weight)
    small = torch.zeros(side, side - 1)
    assert not is_sparse_weight(small)  # too small to bother
    assert not is_sparse_weight(torch.zeros(4, side, side))  # not a matrix


def test_the_plan_of_a_tll_like_network_stores_csr_maps_of_exactly_the_dense_values():
    network = tll_like()
    plan = plan_for(network, torch.float64)
    sparse = [stage for stage in plan.stages if getattr(stage, "sparse", None) is not None]
    assert [stage.index for stage in sparse] == [2, 4]
    for stage in sparse:
        W = stage.weight
        assert torch.equal(stage.sparse.weight.to_dense(), W)
        assert torch.equal(stage.sparse.abs_weight.to_dense(), W.abs())
        assert torch.equal(stage.sparse.positive.to_dense(), W.clamp(min=0))
        assert torch.equal(stage.sparse.negative.to_dense(), W.clamp(max=0))
        assert torch.equal(stage.sparse.weight_t.to_dense(), W.t())
        assert torch.equal(stage.sparse.abs_weight_t.to_dense(), W.abs().t())
        x = torch.randn(5, 7, stage.in_shape[0], dtype=torch.float64)
        A = torch.randn(3, 4, stage.out_shape[0], dtype=torch.float64)
        torch.testing.assert_close(stage.forward(x.reshape(35, -1)), x.reshape(35, -1) @ W.t())
        torch.testing.assert_close(stage.forward_bias(x[0]), x[0] @ W.t() + stage.bias)
        torch.testing.assert_close(stage.forward_abs(x[0]), x[0] @ W.abs().t())
        torch.testing.assert_close(stage.backward(A), A @ W)
        torch.testing.assert_close(stage.backward_abs(A), A @ W.abs())
    assert all(getattr(s, "sparse", None) is None for s in plan.stages if s.index in (0, 6))


@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("method, intermediate_method", [
    ("ibp", "crown"), ("crown", "crown"), ("crown", "forward"), ("crown", "hybrid"), ("alpha", "forward"),
])
def test_sparse_and_dense_layers_give_the_same_sound_bounds(monkeypatch, dtype, method, intermediate_method):
    network = tll_like()
    dense = twin(network)
    lower, upper = boxes(6)
    kwargs = dict(method=method, dtype=dtype, intermediate_method=intermediate_method)
    fast = compute_bounds(network, (lower, upper), **kwargs)
    assert any(getattr(s, "sparse", None) is not None for s in plan_for(network, getattr(torch, dtype)).stages)
    monkeypatch.setattr(sparse_module, "is_sparse_weight", lambda weight: False)
    slow = compute_bounds(dense, (lower, upper), **kwargs)
    assert all(getattr(s, "sparse", None) is None for s in plan_for(dense, getattr(torch, dtype)).stages)
    # Only the order of the (nonzero) terms differs: bounds agree up to a few roundings.
    tolerance = dict(rtol=1e-9, atol=1e-9) if dtype == "float64" else dict(rtol=2e-4, atol=2e-4)
    torch.testing.assert_close(fast.lower, slow.lower, **tolerance)
    torch.testing.assert_close(fast.upper, slow.upper, **tolerance)
    # ... and both are sound: every sampled output lies within them.
    g = torch.Generator().manual_seed(3)
    points = lower.unsqueeze(1) + (upper - lower).unsqueeze(1) * torch.rand(6, 200, 2, generator=g, dtype=torch.float64)
    outputs = network.forward(points.reshape(-1, 2)).reshape(6, 200, -1)
    for result in (fast, slow):
        assert bool((outputs >= result.lower.unsqueeze(1)).all()) and bool((outputs <= result.upper.unsqueeze(1)).all())


def test_the_torch_module_of_a_sparse_layer_computes_the_network_and_differentiates():
    network = tll_like()
    module = network.to_torch()
    assert sum(isinstance(m, SparseLinear) for m in module.modules()) == 2
    x = torch.rand(9, 2, dtype=torch.float64) * 2 - 1
    torch.testing.assert_close(module(x), network.forward(x), rtol=1e-12, atol=1e-12)
    single = module.to(torch.float32)
    xs = x.to(torch.float32).requires_grad_(True)
    y = single(xs)
    assert y.dtype == torch.float32
    torch.testing.assert_close(y.double(), network.forward(x), rtol=1e-4, atol=1e-4)
    (grad,) = torch.autograd.grad(y[:, 0].sum(), xs)
    dense = torch.func.jacrev(lambda v: dense_forward(network, v)[0])(x[0])
    torch.testing.assert_close(grad[0].double(), dense, rtol=1e-3, atol=1e-4)
