"""Products of two vectors crossed through their factors' linear bounds in a small input
(:mod:`assay.bounds.rules.linearized`): every bound must contain the network at corners, points
1e-6 from the ends, random points and the exact minimiser, on boxes of every size, in both dtypes
and for CROWN and α-CROWN; on a nearly quadratic network it beats McCormick's planes."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from assay.bounds import compute_bounds
from assay.bounds.plan import plan_for
from assay.bounds.rules import bilinear
from assay.bounds.rules.bilinear import LinearizedProduct, Product
from assay.nn import Linear, Network, ReLU, ops

MUL = ops.Binary("Mul")


def _t(rng, *shape, scale=1.0):
    return torch.as_tensor(rng.normal(0.0, scale, size=shape))


def _decrease(rng, n=4, dt=0.05) -> Network:
    """A closed loop x' = x + dt·(F x + G·relu-controller(x) + sin), and V(x) − V(x') as lsnc
    writes it: −(x' − x)ᵀ P (x' + x) — a product of two vectors, each a non-linear function of x."""
    R = rng.normal(size=(n, n))
    P = torch.as_tensor(R.T @ R + 0.1 * np.eye(n))
    layers, sources = [], []

    def add(layer, reads):
        layers.append(layer)
        sources.append(reads)
        return len(layers)

    h = add(Linear(_t(rng, 6, n, scale=0.7), _t(rng, 6, scale=0.3)), (0,))
    h = add(ReLU(), (h,))
    u = add(Linear(_t(rng, n, 6, scale=0.5), _t(rng, n, scale=0.1)), (h,))
    s = add(ops.Sin(), (0,))
    f = add(Linear(-torch.eye(n, dtype=torch.float64) + _t(rng, n, n, scale=0.2), torch.zeros(n, dtype=torch.float64)), (0,))
    f = add(ops.Binary("Add"), (f, u))
    f = add(ops.Binary("Add"), (f, s))
    step = add(ops.Affine(torch.tensor(dt, dtype=torch.float64), torch.tensor(0.0, dtype=torch.float64)), (f,))  # x' − x
    total = add(ops.Affine(torch.tensor(2.0, dtype=torch.float64), torch.tensor(0.0, dtype=torch.float64)), (0,))
    total = add(ops.Binary("Add"), (total, step))  # x' + x
    weighted = add(Linear(P, torch.zeros(n, dtype=torch.float64)), (total,))
    product = add(MUL, (step, weighted))
    add(ops.Reduce("sum", (0,)), (product,))
    add(ops.Neg(), (len(layers),))
    return Network(tuple(layers), (n,), sources=tuple(sources))


def _square_of_image(rng, n=3) -> Network:
    """(W x) ⊙ (W x) through two Linear layers (neither factor is the other's image): Σ (W x)²,
    least value 0 at x = 0."""
    W = _t(rng, n, n)
    layers = (Linear(W, torch.zeros(n, dtype=torch.float64)), Linear(W.clone(), torch.zeros(n, dtype=torch.float64)),
              MUL, ops.Reduce("sum", (0,)))
    return Network(layers, (n,), sources=((0,), (0,), (1, 2), (3,)))


def _boxes(rng, n, count, width):
    c = rng.normal(size=(count, n)) * 0.5
    w = rng.uniform(0.2, 1.0, size=(count, n)) * width
    return torch.as_tensor(c - w), torch.as_tensor(c + w)


def _samples(lower, upper, rng, count=4000):
    """Per box: corners, points 1e-6 inside the ends, the centre and random points."""
    B, n = lower.shape
    bits = torch.tensor([[(k >> i) & 1 for i in range(n)] for k in range(2 ** n)], dtype=torch.bool)
    corners = torch.where(bits, upper.unsqueeze(1), lower.unsqueeze(1))
    inside = torch.minimum(torch.full_like(lower, 1e-6), (upper - lower) / 2).unsqueeze(1)
    near = torch.where(bits, upper.unsqueeze(1) - inside, lower.unsqueeze(1) + inside)
    t = torch.as_tensor(rng.random((B, count, n)))
    return torch.cat([corners, near, ((lower + upper) / 2).unsqueeze(1), lower.unsqueeze(1) + (upper - lower).unsqueeze(1) * t], 1)


@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("method", ["crown", "alpha"])
def test_bounds_contain_the_network(dtype, method):
    rng = np.random.default_rng(5)
    net = _decrease(rng)
    assert isinstance(plan_for(net, torch.float64).stages[11].rule, LinearizedProduct)
    lower, upper = (torch.cat(t) for t in zip(*[_boxes(rng, 4, 3, w) for w in (1.0, 0.1, 1e-7, 1e-12)]))
    bounds = compute_bounds(net, (lower, upper), method=method, dtype=dtype)
    x = _samples(lower, upper, rng)
    y = net.forward(x.reshape(-1, 4)).reshape(x.shape[0], -1)
    assert (bounds.lower[:, 0].double() <= y.amin(1)).all(), (bounds.lower[:, 0] - y.amin(1)).max()
    assert (bounds.upper[:, 0].double() >= y.amax(1)).all(), (y.amax(1) - bounds.upper[:, 0]).max()


def test_a_convex_product_of_images_is_exact_at_its_minimiser():
    """Σ (W x)² over boxes around 0: both bounds hold at every sample, and the lower one is 0 up
    to rounding (the tangent at the minimiser 0), where McCormick's planes go well below."""
    rng = np.random.default_rng(2)
    net = _square_of_image(rng)
    assert isinstance(plan_for(net, torch.float64).stages[2].rule, LinearizedProduct)
    half = torch.as_tensor(rng.uniform(0.05, 1.0, size=(5, 3)))
    lower, upper = -half, half * torch.as_tensor(rng.uniform(0.5, 2.0, size=(5, 3)))
    bounds = compute_bounds(net, (lower, upper), method="crown", dtype="float64")
    x = torch.cat([torch.zeros(5, 1, 3, dtype=torch.float64), _samples(lower, upper, rng)], 1)
    y = net.forward(x.reshape(-1, 3)).reshape(5, -1)
    assert (bounds.lower[:, 0] <= y.amin(1)).all() and (bounds.upper[:, 0] >= y.amax(1)).all()
    assert (bounds.lower[:, 0] > -1e-9).all()
    mccormick = compute_bounds(net, (lower, upper), method="crown", dtype="float32")
    assert (mccormick.lower[:, 0] < -1e-2).all()


def test_it_beats_mccormick_on_a_near_quadratic_network(monkeypatch):
    rng = np.random.default_rng(9)
    lower, upper = _boxes(rng, 4, 8, 0.05)
    ours = compute_bounds(_decrease(np.random.default_rng(1)), (lower, upper), method="crown", dtype="float64")
    monkeypatch.setattr(bilinear, "linearizable", lambda network, index: False)
    plain = _decrease(np.random.default_rng(1))
    assert type(plan_for(plain, torch.float64).stages[11].rule) is Product
    theirs = compute_bounds(plain, (lower, upper), method="crown", dtype="float64")
    # each row takes whichever crossing its factors' lines rate higher: better on the whole, though
    # the rest of the walk may favour McCormick's by a little on a box
    assert float((ours.lower[:, 0] - theirs.lower[:, 0]).sum()) > 0
    assert (ours.lower[:, 0] > theirs.lower[:, 0] + 1e-4).any()


def test_only_a_product_with_affine_layers_after_it_is_linearized():
    """The registry says which layers are affine (``rule.linear``): a product read by a sum is
    linearized, one read by a ReLU (or another non-linear operator) is not."""
    from assay.bounds.rules.linearized import linearizable

    rng = np.random.default_rng(3)
    affine_after = _square_of_image(rng)
    assert linearizable(affine_after, 2)
    layers = (*affine_after.layers[:3], ReLU(), ops.Reduce("sum", (0,)))
    relu_after = Network(layers, (3,), sources=((0,), (0,), (1, 2), (3,), (4,)))
    assert not linearizable(relu_after, 2)
    sine_after = Network((*affine_after.layers[:3], ops.Sin(), ops.Reduce("sum", (0,))), (3,),
                         sources=((0,), (0,), (1, 2), (3,), (4,)))
    assert not linearizable(sine_after, 2)
