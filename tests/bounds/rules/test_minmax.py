"""The bound rule of Min and Max (of tensors and a constant), checked exactly with mpmath."""

from __future__ import annotations

import mpmath
import numpy as np
import pytest
import torch

from assay.bounds.rules import rule_for
from assay.bounds.rules.minmax import Extremum
from assay.nn.ops.arith import MinMax
from tests.bounds.rules.harness import alpha_gradients, check_multi_input, check_unbounded_inputs, runs_on_meta


def box(rng, shape, center=0.0, width=1.0):
    c = rng.normal(size=shape) + center
    w = rng.uniform(0.0, width, size=shape)
    return c - w, c + w


def tiny(rng, shape, center=0.0, width=1e-7):
    c = rng.normal(size=shape) * 1e-7 + center  # tiny boxes that overlap each other
    return c - width / 2, c + width / 2


def exact(kind, constant=None):
    """The true Min/Max of object arrays of mpf (numpy broadcasting), and of ``constant``."""
    pick = max if kind == "Max" else min

    def f(*xs):
        if constant is not None:
            xs = (*xs, np.vectorize(mpmath.mpf, otypes=[object])(np.asarray(constant, dtype=np.float64)))
        xs = np.broadcast_arrays(*xs)
        out = np.empty(xs[0].shape, dtype=object)
        for index in np.ndindex(out.shape):
            out[index] = pick(x[index] for x in xs)
        return out

    return f


@pytest.mark.parametrize("kind", ["Max", "Min"])
def test_two_inputs_over_dominated_overlapping_tiny_and_straddling_boxes(rng, kind):
    layer = MinMax(kind)
    shape = (4,)
    boxes = [[box(rng, shape), box(rng, shape)],
             [box(rng, shape, 3.0, 0.5), box(rng, shape, -3.0, 0.5)],  # one dominates
             [tiny(rng, shape), tiny(rng, shape)],
             [box(rng, shape, 0.0, 3.0), box(rng, shape, 0.0, 0.01)],
             [(np.zeros(shape), np.zeros(shape)), box(rng, shape)],
             [tuple(1e30 * e for e in box(rng, shape)), tuple(1e30 * e for e in box(rng, shape))],
             [tuple(1e-30 * e for e in box(rng, shape)), tuple(1e-30 * e for e in box(rng, shape))]]
    assert isinstance(rule_for(layer), Extremum)
    assert check_multi_input(rule_for(layer), layer, exact(kind), boxes) > 0


@pytest.mark.parametrize("kind", ["Max", "Min"])
def test_several_inputs_broadcasting_and_a_constant(rng, kind):
    constant = np.array([0.0, 0.5, -0.5])
    layer = MinMax(kind, constant=torch.tensor(constant))
    boxes = [[box(rng, (2, 3)), box(rng, (3,)), box(rng, (2, 1))], [tiny(rng, (2, 3)), box(rng, (3,)), tiny(rng, (2, 1))]]
    assert check_multi_input(rule_for(layer), layer, exact(kind, constant), boxes) > 0
    single = MinMax(kind)
    assert check_multi_input(rule_for(single), single, exact(kind), [[box(rng, (3,))]]) > 0
    relu = MinMax(kind, constant=torch.tensor(0.0))
    assert check_multi_input(rule_for(relu), relu, exact(kind, np.array(0.0)), [[box(rng, (5,))], [tiny(rng, (5,))]]) > 0


def _bound_at(layer, A, inputs, point, alpha=None):
    crossing = rule_for(layer).backward(layer, A, inputs, alpha)
    return float(sum((c[0, 0] * x).sum() for c, x in zip(crossing.coefficients, point)) + crossing.offset[0, 0])


def test_max_bounds_touch_the_maximum_where_they_should():
    """Upper plane: exact at the corners (u_a, l_b) and (l_a, u_b); lower side: exact where the
    dominant input is the maximum, and equal to x_a when it dominates."""
    layer = MinMax("Max")
    inputs = [(torch.tensor([[-1.0]], dtype=torch.float64), torch.tensor([[2.0]], dtype=torch.float64)),
              (torch.tensor([[-0.5]], dtype=torch.float64), torch.tensor([[1.0]], dtype=torch.float64))]
    up = torch.tensor([[[-1.0]]], dtype=torch.float64)
    for x, z in [(2.0, -0.5), (-1.0, 1.0)]:
        point = [torch.tensor([x], dtype=torch.float64), torch.tensor([z], dtype=torch.float64)]
        assert _bound_at(layer, up, inputs, point) == pytest.approx(-max(x, z), abs=1e-12)
    down = torch.tensor([[[1.0]]], dtype=torch.float64)
    point = [torch.tensor([1.5], dtype=torch.float64), torch.tensor([0.0], dtype=torch.float64)]
    assert _bound_at(layer, down, inputs, point) == pytest.approx(1.5, abs=1e-12)
    dominated = [(torch.tensor([[3.0]], dtype=torch.float64), torch.tensor([[4.0]], dtype=torch.float64)), inputs[1]]
    for A in (up, down):
        crossing = rule_for(layer).backward(layer, A, dominated)
        assert crossing.coefficients[0].item() == A.item() and crossing.coefficients[1].item() == 0.0
        assert abs(crossing.offset.item()) < 1e-12


def test_alpha_steers_the_lower_side():
    torch.manual_seed(0)
    layer = MinMax("Max")
    x, z = torch.randn(1, 4, dtype=torch.float64), torch.randn(1, 4, dtype=torch.float64)
    inputs = [(x - 1.0, x + 1.0), (z - 1.0, z + 1.0)]
    grad, *bounds = alpha_gradients(rule_for(layer), layer, inputs, torch.rand(1, 2, 4, dtype=torch.float64))
    assert torch.isfinite(grad).all() and (grad != 0).any()
    assert all(g is not None and torch.isfinite(g).all() for g in bounds)


def test_rule_makes_no_tensor_off_the_inputs_device():
    layer = MinMax("Min", constant=torch.tensor([0.0, 1.0, 2.0]))
    runs_on_meta(rule_for(layer), layer, [(3,), (2, 3)])


@pytest.mark.parametrize("kind", ["Max", "Min"])
def test_unbounded_inputs_give_trivial_bounds_not_nan(kind):
    check_unbounded_inputs(rule_for(MinMax(kind)), MinMax(kind), [(3,), (3,)])
