"""Forward linear bounds through a product whose other factor the boxes fix (a set network's
masks, nn4sys' mscn): the factor scales the first one's functions (forward_products.scaled_product)
instead of the product's interval ending them. Every bound is checked against sampled points,
and against the interval path (the shortcut off) for tightness."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from assay.bounds import compute_bounds, forward_products, plan_for
from assay.nn import Flatten, Linear, Network, ReLU, ops

from .strategies import sample_box

ROWS, FEATURES, HIDDEN = 4, 3, 8


def _t(rng, *shape, scale=1.0):
    return torch.as_tensor(rng.normal(0.0, scale, size=shape))


def add_set_block(add, rng, rows: int, features: int = FEATURES, hidden: int = HIDDEN) -> int:
    """mscn's set block on tensor ``rows`` (elements × (``features`` values and a mask)), appended
    through ``add(layer, *reads) -> tensor``: a ReLU layer per element, times its mask, summed and
    divided by the mask count. Returns the pooled tensor."""
    values = add(ops.Slice((1,), (0,), (features,), (1,)), rows)
    mask = add(ops.Slice((1,), (features,), (features + 1,), (1,)), rows)
    t = add(ops.ConstMatMul(_t(rng, features, hidden, scale=0.8)), values)
    t = add(ops.Affine(torch.tensor(1.0), _t(rng, hidden, scale=0.3)), t)
    t = add(ReLU(), t)
    t = add(ops.ConstMatMul(_t(rng, hidden, hidden, scale=0.5)), t)
    t = add(ReLU(), t)
    t = add(ops.Binary("Mul"), t, mask)
    total = add(ops.Reduce("sum", (0,), keepdims=False), t)
    count = add(ops.Reduce("sum", (0,), keepdims=False), mask)
    return add(ops.Binary("Div"), total, count)


def set_network(seed: int) -> Network:
    """A set of ROWS elements (FEATURES values and a mask each) → a ReLU layer per element → times
    its mask → sum over the set / the mask count → Linear → ReLU → Linear → Sigmoid (mscn's shape)."""
    rng = np.random.default_rng(seed)
    layers, sources = [], []

    def add(layer, *reads):
        layers.append(layer)
        sources.append(reads)
        return len(layers)

    t = add_set_block(add, rng, 0)
    t = add(Flatten(), t)
    t = add(Linear(_t(rng, 6, HIDDEN, scale=0.6), _t(rng, 6, scale=0.2)), t)
    t = add(ReLU(), t)
    t = add(Linear(_t(rng, 2, 6, scale=0.6), _t(rng, 2, scale=0.2)), t)
    add(ops.Sigmoid(), t)
    return Network(tuple(layers), (ROWS, FEATURES + 1), sources=tuple(sources))


MASKS = {"mask": (1.0, 1.0, 1.0, 0.0), "signed": (1.0, -2.0, 1.0, 0.5)}


def boxes(seed: int, count: int = 6, width: float = 0.6, masks=MASKS["mask"]):
    """Boxes letting one element's first feature vary (width ``width``), all else fixed; masks
    1, 1, 1, 0 (the last element is padding), or as given (a negative factor: the sides swap)."""
    rng = np.random.default_rng(seed + 100)
    lower = torch.as_tensor(rng.uniform(-1, 1, (count, ROWS, FEATURES + 1)))
    lower[:, :, FEATURES] = torch.tensor(masks, dtype=torch.float64)
    upper = lower.clone()
    rows = torch.arange(count) % (ROWS - 1)
    upper[torch.arange(count), rows, 0] += width
    return lower, upper


def _relu_input_bounds(network, lower, upper):
    result = compute_bounds(network, (lower, upper), method="crown", intermediate_method="forward")
    return result, plan_for(network, torch.float64).relu_positions


@pytest.mark.parametrize("masks", sorted(MASKS))
@pytest.mark.parametrize("seed", range(3))
def test_bounds_through_fixed_masks_hold_at_sampled_points(seed, masks, monkeypatch):
    network = set_network(seed)
    lower, upper = boxes(seed, masks=MASKS[masks])
    taken = []
    original = forward_products.scaled_product

    def spy(stage, *args):
        value = original(stage, *args)
        taken.append((stage.layer.kind, value is not None))
        return value

    monkeypatch.setattr(forward_products, "scaled_product", spy)
    result, positions = _relu_input_bounds(network, lower, upper)
    assert ("Mul", True) in taken and ("Div", True) in taken, f"the shortcut was not taken: {taken}"
    _sampled_points_within(network, result, positions, lower, upper, seed)


@pytest.mark.parametrize("seed", range(3))
def test_fixed_masks_keep_the_linear_functions_and_tighten_the_layers_after_pooling(seed, monkeypatch):
    """The last ReLU layer (after the pooling) gets bounds no wider on average than with the
    product's interval, and strictly narrower in total."""
    network = set_network(seed)
    lower, upper = boxes(seed)
    result, _ = _relu_input_bounds(network, lower, upper)
    monkeypatch.setattr(forward_products, "scaled_product", lambda *args: None)
    general, _ = _relu_input_bounds(network, lower, upper)
    width = (result.intermediate.upper[-1] - result.intermediate.lower[-1]).sum()
    general_width = (general.intermediate.upper[-1] - general.intermediate.lower[-1]).sum()
    assert float(width) < float(general_width)


def test_a_factor_that_varies_gives_the_products_interval():
    """A mask the box lets vary (0.5 to 1) is no fixed factor: the product's interval stands, and
    the bounds still hold at sampled points."""
    network = set_network(0)
    lower, upper = boxes(0)
    lower[:, 0, FEATURES] = 0.5
    calls = []
    original = forward_products.scaled_product

    def spy(*args):
        calls.append(original(*args))
        return calls[-1]

    forward_products.scaled_product = spy
    try:
        result, _ = _relu_input_bounds(network, lower, upper)
    finally:
        forward_products.scaled_product = original
    assert calls[0] is None, "a varying mask was taken as fixed"
    x = sample_box(lower, upper, np.random.default_rng(0), 2000)
    with torch.no_grad():
        y = network.forward(x.reshape(-1, *network.input_shape)).reshape(x.shape[0], x.shape[1], -1)
    assert bool((y >= result.lower).all() and (y <= result.upper).all())


@pytest.mark.parametrize("seed", range(3))
def test_children_with_their_parents_bounds_skip_the_interval_pass_and_stay_sound(seed, monkeypatch):
    """A child box given its parent's bounds of every tensor forward bounds concretise (as input
    splitting gives them): no interval pass runs before the forward one, and every ReLU input's
    bounds and the output's still hold at sampled points of the child."""
    from assay.bounds import api

    network = set_network(seed)
    lower, upper = boxes(seed)
    parent = compute_bounds(network, (lower, upper), method="crown", intermediate_method="forward")
    middle = (lower + upper) / 2
    child_lower, child_upper = torch.cat([lower, middle]), torch.cat([middle, upper])
    parents = parent.intermediate.select(torch.cat([torch.arange(len(lower))] * 2))
    passes = []
    original = api.interval_pass

    def spy(*args, **kwargs):
        passes.append(kwargs.get("until"))
        return original(*args, **kwargs)

    monkeypatch.setattr(api, "interval_pass", spy)
    result = compute_bounds(network, (child_lower, child_upper), method="crown", intermediate_method="forward",
                            intermediate=parents)
    assert len(passes) == 1, "an interval pass ran before the forward pass"
    _sampled_points_within(network, result, plan_for(network, torch.float64).relu_positions, child_lower, child_upper,
                           seed)


def _sampled_points_within(network, result, positions, lower, upper, seed):
    """2,000 points sampled in each box: every ReLU input (tensors ``positions``) and the output
    lie within ``result``'s bounds."""
    x = sample_box(lower, upper, np.random.default_rng(seed), 2000)  # (n, B, *shape)
    with torch.no_grad():
        values = network.tensors(x.reshape(-1, *network.input_shape))
    n, batch = x.shape[:2]
    for k, position in enumerate(positions):
        z = values[position].reshape(n, batch, -1)
        low = result.intermediate.lower[k].reshape(batch, -1)
        high = result.intermediate.upper[k].reshape(batch, -1)
        assert bool((z >= low).all() and (z <= high).all()), f"ReLU input {k} escapes its bounds"
    y = values[-1].reshape(n, batch, -1)
    assert bool((y >= result.lower).all() and (y <= result.upper).all())
