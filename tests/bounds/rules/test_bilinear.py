"""The bound rules of products of two tensors (Mul, Div, MatMul), checked exactly with mpmath."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from assay.bounds.rules import rule_for
from assay.bounds.rules.bilinear import MatrixProduct, Product, Quotient
from assay.nn.ops.arith import Binary, MatMul
from tests.bounds.rules.harness import alpha_gradients, check_multi_input, check_unbounded_inputs, runs_on_meta

MUL, DIV, MATMUL = Binary("Mul"), Binary("Div"), MatMul()


def box(rng, shape, center=0.0, width=1.0, scale=1.0):
    """A random box of ``shape`` around ``center`` (per element: a normal offset, a random half-width)."""
    c = (rng.normal(size=shape) + center) * scale
    w = rng.uniform(0.0, width, size=shape) * scale
    return c - w, c + w


def tiny(rng, shape, center=0.0, width=1e-7):
    c = rng.normal(size=shape) + center
    return c - width / 2, c + width / 2


def straddling(rng, shape):
    """A box that contains 0 in every element, lopsided either way."""
    return -rng.uniform(0.01, 2.0, size=shape), rng.uniform(0.01, 2.0, size=shape)


def product(a, b):
    return a * b


def quotient(a, b):
    return None if any(v == 0 for v in np.asarray(b).ravel()) else a / b


def test_the_registry_finds_each_rule():
    assert isinstance(rule_for(MUL), Product)
    assert isinstance(rule_for(DIV), Quotient)
    assert isinstance(rule_for(MATMUL), MatrixProduct)
    assert rule_for(Binary("Add")) is None or not isinstance(rule_for(Binary("Add")), (Product, Quotient))


def test_mul_over_wide_tiny_and_straddling_boxes(rng):
    shape = (4,)
    boxes = [[box(rng, shape), box(rng, shape)],
             [tiny(rng, shape), tiny(rng, shape)],
             [straddling(rng, shape), box(rng, shape, 2.0)],
             [straddling(rng, shape), straddling(rng, shape)],
             [box(rng, shape, scale=1e3), box(rng, shape, scale=1e-3)],
             [(np.zeros(shape), np.zeros(shape)), box(rng, shape)]]
    assert check_multi_input(rule_for(MUL), MUL, product, boxes) > 0


@pytest.mark.parametrize("shapes", [((2, 3), (3,)), ((3,), (2, 1)), ((2, 1, 3), (4, 1)), ((1,), (2, 2))])
def test_mul_broadcasts_as_onnx(rng, shapes):
    boxes = [[box(rng, shapes[0]), straddling(rng, shapes[1])], [tiny(rng, shapes[0]), box(rng, shapes[1], 1.0)]]
    assert check_multi_input(rule_for(MUL), MUL, product, boxes, alphas=(None, 0.3, "random")) > 0


@pytest.mark.parametrize("shapes", [((2, 3), (3, 4)), ((2, 2, 3), (2, 3, 2)), ((1, 2, 3), (2, 3, 2)), ((2, 2, 3), (3, 1))])
def test_matmul_over_wide_tiny_and_straddling_boxes(rng, shapes):
    a, b = shapes
    boxes = [[box(rng, a), box(rng, b)], [tiny(rng, a), tiny(rng, b)], [straddling(rng, a), box(rng, b)],
             [straddling(rng, a), straddling(rng, b)]]
    assert check_multi_input(rule_for(MATMUL), MATMUL, np.matmul, boxes, count=4) > 0


def test_div_over_positive_negative_tiny_and_broadcast_divisors(rng):
    shape = (4,)
    boxes = [[box(rng, shape), box(rng, shape, 3.0)],
             [straddling(rng, shape), box(rng, shape, -3.0, width=0.5)],
             [tiny(rng, shape), tiny(rng, shape, 2.0)],
             [box(rng, shape), (np.full(shape, 1e-3), np.full(shape, 1e3))],
             [box(rng, shape), (np.full(shape, -5.0), np.full(shape, -1e-4))]]
    assert check_multi_input(rule_for(DIV), DIV, quotient, boxes) > 0
    broadcast = [[box(rng, (2, 3)), box(rng, (3,), 3.0)], [straddling(rng, (2, 3)), box(rng, (3,), -2.0, 0.5)]]
    assert check_multi_input(rule_for(DIV), DIV, quotient, broadcast) > 0


def test_div_by_an_interval_containing_zero_is_unbounded_and_stays_sound(rng):
    a = box(rng, (3,))
    b = (np.array([-1.0, 0.0, 1.0]), np.array([1.0, 2.0, 2.0]))  # 0 inside, 0 at the end, positive
    assert check_multi_input(rule_for(DIV), DIV, quotient, [[a, b]]) > 0
    # broadcast both ways: the divisor's first column reaches 0 and is shared by both rows of a
    wide = (np.array([[-1.0, 1.0, 2.0]]), np.array([[1.0, 2.0, 3.0]]))
    assert check_multi_input(rule_for(DIV), DIV, quotient, [[box(rng, (2, 1)), wide]], count=4) > 0
    inputs = [(torch.tensor(a[0])[None], torch.tensor(a[1])[None]), (torch.tensor(b[0])[None], torch.tensor(b[1])[None])]
    lo, hi = rule_for(DIV).interval(DIV, inputs)
    assert lo[0, :2].tolist() == [-math.inf, -math.inf] and hi[0, :2].tolist() == [math.inf, math.inf]
    assert math.isfinite(lo[0, 2]) and math.isfinite(hi[0, 2])
    A = torch.tensor([[[1.0, 0.0, 0.0], [0.0, 0.0, -1.0]]], dtype=torch.float64)
    crossing = rule_for(DIV).backward(DIV, A, inputs)
    assert crossing.offset[0, 0] == -math.inf and math.isfinite(crossing.offset[0, 1])


def _corner_bounds(rule, layer, A, inputs, corners, alpha):
    """The crossing's bound Σ coefficients·x + offset at each corner (float64)."""
    crossing = rule.backward(layer, A, inputs, alpha)
    return [sum(float((c[0, 0] * x).sum()) for c, x in zip(crossing.coefficients, corner)) + float(crossing.offset[0, 0])
            for corner in corners]


@pytest.mark.parametrize("alpha, sign, touching", [
    (1.0, 1.0, [(0, 0), (0, 1), (1, 0)]),   # lower plane anchored at (xl, zl)
    (0.0, 1.0, [(1, 1), (0, 1), (1, 0)]),   # lower plane anchored at (xu, zu)
    (1.0, -1.0, [(0, 1), (0, 0), (1, 1)]),  # upper plane anchored at (xl, zu)
    (0.0, -1.0, [(1, 0), (0, 0), (1, 1)]),  # upper plane anchored at (xu, zl)
])
def test_mcCormick_planes_touch_the_product_at_their_corners(alpha, sign, touching):
    x, z = (-0.5, 2.0), (1.0, 3.0)
    inputs = [(torch.tensor([[x[0]]], dtype=torch.float64), torch.tensor([[x[1]]], dtype=torch.float64)),
              (torch.tensor([[z[0]]], dtype=torch.float64), torch.tensor([[z[1]]], dtype=torch.float64))]
    A = torch.tensor([[[sign]]], dtype=torch.float64)
    corners = [[torch.tensor([x[i]], dtype=torch.float64), torch.tensor([z[j]], dtype=torch.float64)] for i, j in touching]
    pair = (torch.full((1, 1), alpha, dtype=torch.float64),)
    bounds = _corner_bounds(rule_for(MUL), MUL, A, inputs, corners, pair)
    for (i, j), value in zip(touching, bounds):
        assert value == pytest.approx(sign * x[i] * z[j], abs=1e-12)


def test_matmul_bound_is_exact_at_the_anchor_corner():
    """With α = 1 every product's lower plane passes through (xl, zl): at x = xl, z = zl the
    bound of a positive row equals the true value."""
    rng = np.random.default_rng(3)
    xl, zl = rng.normal(size=(1, 2, 3)), rng.normal(size=(1, 3, 4))
    inputs = [(torch.tensor(xl), torch.tensor(xl + 1.0)), (torch.tensor(zl), torch.tensor(zl + 0.5))]
    A = torch.tensor(np.abs(rng.normal(size=(1, 1, 2, 4))))
    bound = _corner_bounds(rule_for(MATMUL), MATMUL, A, inputs, [[inputs[0][0][0], inputs[1][0][0]]], None)[0]
    assert bound == pytest.approx(float((A[0, 0] * torch.tensor(xl[0] @ zl[0])).sum()), abs=1e-12)


def test_intervals_are_the_corner_products():
    inputs = [(torch.tensor([[-1.0, 2.0]]), torch.tensor([[3.0, 4.0]])), (torch.tensor([[-2.0, -1.0]]), torch.tensor([[5.0, -0.5]]))]
    lo, hi = rule_for(MUL).interval(MUL, inputs)
    assert lo[0].tolist() == pytest.approx([-6.0, -4.0], rel=1e-6) and hi[0].tolist() == pytest.approx([15.0, -1.0], rel=1e-6)


@pytest.mark.parametrize("layer, shapes", [(MUL, ((3,), (3,))), (DIV, ((3,), (3,))), (MATMUL, ((2, 3), (3, 2)))])
def test_alphas_steer_the_bound(layer, shapes):
    """α-CROWN follows these gradients: they exist, are finite and not all zero."""
    torch.manual_seed(0)
    x = torch.randn(1, *shapes[0], dtype=torch.float64)
    z = torch.rand(1, *shapes[1], dtype=torch.float64) + (1.0 if layer is DIV else -0.5)
    inputs = [(x - 0.5, x + 0.5), (z, z + 0.5)]
    out = layer.forward(x, z).shape[1:]
    grads = alpha_gradients(rule_for(layer), layer, inputs, torch.randn(1, 3, *out, dtype=torch.float64))
    assert len(grads) == rule_for(layer).parameters + 4
    for grad in grads:
        assert grad is not None and torch.isfinite(grad).all() and (grad != 0).any()


@pytest.mark.parametrize("scales", [(1e20, 1e20), (1e-25, 1e-25), (1e-20, 1e20)])
def test_products_that_overflow_or_underflow_stay_sound(rng, scales):
    """float32 products of 1e20s overflow, of 1e-25s fall into the subnormals; a divisor near
    3e22 has a subnormal 1/b² (the tangent falls back to a flat line there)."""
    sx, sz = scales
    few = {"count": 4, "alphas": (None, "random")}
    assert check_multi_input(rule_for(MUL), MUL, product, [[box(rng, (3,), scale=sx), box(rng, (3,), scale=sz)]], **few) > 0
    assert check_multi_input(rule_for(MATMUL), MATMUL, np.matmul, [[box(rng, (2, 2), scale=sx), box(rng, (2, 2), scale=sz)]],
                             **few) > 0
    divisor = box(rng, (3,), center=3.0, width=0.5, scale=sz * 100)
    assert check_multi_input(rule_for(DIV), DIV, quotient, [[box(rng, (3,), scale=sx * 100), divisor]], **few) > 0


@pytest.mark.parametrize("layer, shapes", [(MUL, ((2, 3), (3,))), (MATMUL, ((2, 2, 3), (3, 2)))])
def test_rules_make_no_tensor_off_the_inputs_device(layer, shapes):
    runs_on_meta(rule_for(layer), layer, shapes)


@pytest.mark.parametrize("layer, shapes", [(MUL, ((3,), (3,))), (DIV, ((3,), (3,))), (MATMUL, ((2, 3), (3, 2)))])
def test_unbounded_inputs_give_trivial_bounds_not_nan(layer, shapes):
    check_unbounded_inputs(rule_for(layer), layer, shapes)
