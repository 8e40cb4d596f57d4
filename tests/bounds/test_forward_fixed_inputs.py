"""Forward linear bounds give coefficients only to the inputs some box lets vary
(:func:`assay.bounds.forward.varying_inputs`); an input every box fixes is a constant.

In exact arithmetic that is the same bound as a coefficient per input (a fixed input has radius
0), so the bounds must match the all-inputs computation to rounding, contain every sampled
tensor, and hold through the hybrid method's cuts (whose coefficients are scattered back onto
the full input)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import assay.bounds.forward as forward
from assay.bounds import compute_bounds, plan_for
from assay.bounds.forward import box_columns, forward_bounds, varying_inputs
from assay.errors import OptionError

from .strategies import sample_box
from .test_forward_general import generator_graph
from .test_general_graphs import NONLINEAR, TEMPLATES


def _every_column(lower, upper):
    """The old representation: every input a coefficient, no constants."""
    n = lower[0].numel()
    return torch.arange(n).expand(lower.shape[0], n), torch.zeros_like(lower)


def _union_columns(lower, upper):
    """Every box a coefficient for each input some box lets vary (:func:`varying_inputs`)."""
    columns, fixed = varying_inputs(lower, upper)
    return columns.expand(lower.shape[0], -1), fixed


def _boxes(network, rng, fixed_in_all=(0, 2), fixed_in_first=(1,)):
    """Two boxes: inputs ``fixed_in_all`` fixed in both, ``fixed_in_first`` only in the first."""
    shape = (2, *network.input_shape)
    center = torch.as_tensor(rng.uniform(-1, 1, size=shape)).reshape(2, -1)
    radius = torch.as_tensor(rng.uniform(0.05, 0.5, size=shape)).reshape(2, -1)
    radius[:, list(fixed_in_all)] = 0.0
    radius[0, list(fixed_in_first)] = 0.0
    return (center - radius).reshape(shape), (center + radius).reshape(shape)


def test_varying_inputs_are_the_union_over_the_boxes():
    lower = torch.tensor([[0.0, 1.0, 2.0, 3.0], [0.0, 1.0, 2.5, 3.0]])
    upper = torch.tensor([[0.0, 1.5, 2.0, 3.0], [0.0, 1.0, 2.5, 3.0]])
    columns, fixed = varying_inputs(lower, upper)
    assert columns.tolist() == [1]
    assert torch.equal(fixed, torch.tensor([[0.0, 0.0, 2.0, 3.0], [0.0, 0.0, 2.5, 3.0]]))
    columns, fixed = varying_inputs(lower, lower)  # nothing varies: one column all the same
    assert columns.numel() == 1 and bool((fixed.reshape(2, -1)[:, columns] == 0).all())


def test_box_columns_list_each_boxs_varying_inputs_then_fixed_ones():
    lower = torch.tensor([[0.0, 1.0, 2.0, 3.0], [0.0, 1.0, 2.5, 3.0], [5.0, 1.0, 2.0, 3.0]])
    upper = torch.tensor([[0.0, 1.5, 2.0, 3.5], [0.0, 1.0, 2.5, 3.0], [5.0, 1.0, 2.0, 4.0]])
    columns, fixed = box_columns(lower, upper)
    assert columns.tolist() == [[1, 3], [0, 1], [3, 0]]  # k = 2: box 1 varies none, box 2 one
    assert torch.equal(fixed, torch.tensor([[0.0, 0.0, 2.0, 0.0], [0.0, 0.0, 2.5, 3.0], [0.0, 1.0, 2.0, 0.0]]))
    columns, fixed = box_columns(lower, lower)  # nothing varies: one column per box
    assert columns.tolist() == [[0], [0], [0]] and torch.equal(fixed[:, 1:], lower[:, 1:]) and not fixed[:, 0].any()


@pytest.mark.parametrize("kind", ["generator", "sigmoid", "sin", "reciprocal"])
@pytest.mark.parametrize("seed", range(3))
def test_fixed_inputs_give_the_all_inputs_bounds_and_contain_samples(kind, seed, monkeypatch):
    rng = np.random.default_rng(seed)
    network = generator_graph(rng) if kind == "generator" else TEMPLATES["branches"](rng, NONLINEAR[kind])
    lower, upper = _boxes(network, rng)
    x = sample_box(lower, upper, rng, 2000)
    with torch.no_grad():
        values = network.tensors(x.reshape(-1, *network.input_shape))
    plan = plan_for(network, torch.float64)
    keep = lambda position, low, high: (low, high)  # noqa: E731
    compressed = forward_bounds(plan, lower, upper, keep)
    monkeypatch.setattr(forward, "box_columns", _union_columns)
    union = forward_bounds(plan, lower, upper, keep)
    monkeypatch.setattr(forward, "box_columns", _every_column)
    full = forward_bounds(plan, lower, upper, keep)
    assert set(compressed) == set(full) == set(union)
    for tensor, (low, high) in compressed.items():
        scale = 1 + full[tensor][1].abs().max()
        for other in (full, union):
            assert torch.allclose(low, other[tensor][0], atol=1e-9 * scale, rtol=0)
            assert torch.allclose(high, other[tensor][1], atol=1e-9 * scale, rtol=0)
        seen = values[tensor].reshape(-1, 2, *low.shape[1:])
        assert bool((seen >= low - 1e-12).all() and (seen <= high + 1e-12).all()), f"tensor {tensor} escapes"


@pytest.mark.parametrize("method", ["forward", "hybrid"])
def test_compute_bounds_with_fixed_inputs_contains_the_outputs(method, monkeypatch):
    rng = np.random.default_rng(7)
    network = generator_graph(rng)
    lower, upper = _boxes(network, rng)
    x = sample_box(lower, upper, rng, 3000)
    with torch.no_grad():
        y = network(x.reshape(-1, *network.input_shape)).reshape(-1, 2, network.output_size)
    result = compute_bounds(network, (lower, upper), method="crown", intermediate_method=method)
    assert bool((y >= result.lower - 1e-12).all() and (y <= result.upper + 1e-12).all())
    monkeypatch.setattr(forward, "box_columns", _every_column)
    full = compute_bounds(network, (lower, upper), method="crown", intermediate_method=method)
    assert torch.allclose(result.upper, full.upper, atol=1e-8) and torch.allclose(result.lower, full.lower, atol=1e-8)


def test_forward_bounds_take_a_wide_input_when_few_of_its_elements_vary():
    """A network of 300 inputs (over MAX_FORWARD_INPUTS) whose boxes let 3 vary: forward bounds
    are cheap and allowed, and hybrid bounds (which keep forward functions at their cuts) too;
    hybrid bounds over 300 varying inputs are refused with the fix named."""
    rng = np.random.default_rng(3)
    from assay.nn import Linear, Network, ReLU

    network = Network((Linear(torch.as_tensor(rng.normal(0, 0.1, (20, 300))), torch.zeros(20, dtype=torch.float64)),
                       ReLU(), Linear(torch.as_tensor(rng.normal(0, 0.3, (2, 20))), torch.zeros(2, dtype=torch.float64))),
                      (300,))
    lower = torch.as_tensor(rng.uniform(-1, 1, (1, 300)))
    upper = lower.clone()
    upper[0, :3] += 0.5
    result = compute_bounds(network, (lower, upper), method="crown", intermediate_method="forward")
    x = sample_box(lower, upper, rng, 2000)
    y = network(x.reshape(-1, 300)).reshape(-1, 1, 2)
    assert bool((y >= result.lower - 1e-12).all() and (y <= result.upper + 1e-12).all())
    hybrid = compute_bounds(network, (lower, upper), method="crown", intermediate_method="hybrid")
    assert bool((y >= hybrid.lower - 1e-12).all() and (y <= hybrid.upper + 1e-12).all())
    with pytest.raises(OptionError, match="vary 300"):
        compute_bounds(network, (lower, lower + 0.1), method="crown", intermediate_method="hybrid")


@pytest.mark.parametrize("seed", range(3))
def test_walks_stopped_at_a_cut_with_fixed_inputs_bound_every_sample(seed):
    """CROWN rows walked back to a cut, then through its forward bounds on the varying inputs
    (coefficients scattered back onto the full input, 0 on the fixed ones), hold on every
    sample, and equal the all-inputs computation to rounding."""
    from assay.bounds.crown import backsubstitute, concretize
    from assay.bounds.ibp import center_radius, interval_pass

    rng = np.random.default_rng(seed)
    network = generator_graph(rng)
    plan = plan_for(network, torch.float64)
    lower, upper = _boxes(network, rng, fixed_in_all=(0,), fixed_in_first=(2,))
    bounds = interval_pass(plan, lower, upper)
    center, radius = center_radius(lower, upper)
    C = torch.eye(2, dtype=torch.float64).expand(2, 2, 2)
    C = torch.cat([C, -C], 1)
    x = sample_box(lower, upper, rng, 2000)
    with torch.no_grad():
        y = network(x.reshape(-1, 4)).reshape(-1, 2, 2)
    values = torch.cat([y, -y], 2)

    def lows(columns_of):
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(forward, "box_columns", columns_of)
            cuts = {}
            forward_bounds(plan, lower, upper, lambda position, low, high: (low, high), keep=set(range(1, 11)),
                           cuts=cuts)
        return {stop: concretize(plan, backsubstitute(plan, len(plan.stages), C, torch.zeros(2, 4, dtype=torch.float64),
                                                      bounds, cut=cut), center, radius)[0] for stop, cut in cuts.items()}

    compressed, union, full = lows(box_columns), lows(_union_columns), lows(_every_column)
    assert compressed.keys() == full.keys() == union.keys() and compressed
    for stop, low in compressed.items():
        assert bool((values >= low.unsqueeze(0) - 1e-12).all()), f"cut at {stop}: a sample below the bound"
        for other in (full, union):
            assert torch.allclose(low, other[stop], atol=1e-9 * (1 + float(other[stop].abs().max())), rtol=0)
