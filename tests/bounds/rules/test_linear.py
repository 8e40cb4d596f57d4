"""The convolution rule's direct transpose (its adjoint convolution) against torch's
vector-Jacobian product, which is the transpose of any affine map by definition; and the affine
operators' intervals and crossings checked exactly by the falsification harness."""

from __future__ import annotations

import itertools

import mpmath
import numpy as np
import pytest
import torch

from assay.bounds.rules import rule_for
from assay.bounds.rules.linear import LinearRule
from assay.nn import ops
from tests.bounds.rules.harness import check_multi_input

_IN_SHAPE = (4, 9, 8)


def _layers():
    """Convolutions and transposed convolutions over strides, asymmetric pads, dilations, groups
    and output paddings (those that give a non-empty output for a (4, 9, 8) input)."""
    grid = itertools.product([False, True], [(1, 1), (2, 2), (2, 1)], [(0, 0), (1, 0)], [(0, 0), (0, 2)],
                             [(1, 1), (2, 1)], [1, 2], [(0, 0), (1, 0)])
    generator = torch.Generator().manual_seed(0)
    for transposed, stride, begin, end, dilation, groups, output_padding in grid:
        if output_padding != (0, 0) and (not transposed or any(
                o >= max(s, d) for o, s, d in zip(output_padding, stride, dilation))):
            continue
        shape = (4, 2, 3, 3) if transposed else (4, 4 // groups, 3, 3)
        weight = torch.randn(*shape, generator=generator, dtype=torch.float64)
        channels = 2 * groups if transposed else 4
        bias = torch.randn(channels, generator=generator, dtype=torch.float64)
        layer = ops.Conv(weight, bias, stride, begin, end, dilation, groups, transposed, output_padding)
        out = layer.forward(torch.zeros(1, *_IN_SHAPE, dtype=torch.float64))
        if min(out.shape[2:]) >= 1:
            yield layer, _IN_SHAPE, tuple(out.shape[1:])
    # a 1-D convolution whose samples have a leading dimension (nn4sys' pensieve)
    layer = ops.Conv(torch.randn(3, 1, 4, generator=generator, dtype=torch.float64),
                     torch.randn(3, generator=generator, dtype=torch.float64), (1,), (0,), (0,), (1,))
    yield layer, (1, 1, 8), (1, 3, 5)


@pytest.mark.parametrize("case", list(_layers()))
def test_the_convolution_transpose_is_the_vector_jacobian_product(case):
    layer, in_shape, out_shape = case
    G = torch.randn(5, *out_shape, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    expected, = LinearRule.transpose(rule_for(layer), layer, G, [in_shape])
    got, = rule_for(layer).transpose(layer, G, [in_shape])
    assert got.shape == expected.shape
    torch.testing.assert_close(got, expected, rtol=1e-12, atol=1e-12)


def _direct_cases():
    """Constant matrix products (both sides, vectors and stacked samples), element-wise affine
    maps that broadcast their input, and sums/differences of broadcast tensors."""
    g = torch.Generator().manual_seed(2)
    r = lambda *shape: torch.randn(*shape, generator=g, dtype=torch.float64)  # noqa: E731
    yield ops.ConstMatMul(r(6, 4)), [(6,)]
    yield ops.ConstMatMul(r(6, 4)), [(3, 6)]
    yield ops.ConstMatMul(r(4, 6), constant_first=True), [(6,)]
    yield ops.ConstMatMul(r(4, 6), constant_first=True), [(6, 3)]
    yield ops.ConstMatMul(r(6), constant_first=False), [(3, 6)]  # no direct form: the fallback
    yield ops.Affine(r(3, 5), r(5)), [(3, 1)]
    yield ops.Affine(r(5), r(3, 5)), [(5,)]
    yield ops.Affine(r(1), torch.zeros(())), [(2, 5)]
    yield ops.Binary("Add"), [(3, 5), (5,)]
    yield ops.Binary("Sub"), [(3, 1), (3, 5)]
    yield ops.Binary("Sub"), [(4,), (4,)]
    # the moving operators and sums of small control networks' graphs (lsnc: slices, concatenations)
    yield ops.Slice((0,), (1,), (5,), (2,)), [(6,)]
    yield ops.Slice((0, 1), (1, 0), (3, 4), (1, 3)), [(3, 5)]
    yield ops.Concat(0, (None, r(2), None)), [(3,), (1,)]
    yield ops.Concat(1, (None, None)), [(2, 3), (2, 1)]
    yield ops.Transpose((2, 0, 1)), [(2, 3, 4)]
    yield ops.Reduce("sum", (1,), keepdims=True), [(2, 3, 4)]
    yield ops.Reduce("sum", (0, 2), keepdims=False), [(2, 3, 4)]
    yield ops.Reduce("mean", (0,)), [(3,)]  # no direct form: the fallback
    yield ops.Neg(), [(2, 3)]


@pytest.mark.parametrize("case", list(_direct_cases()), ids=lambda case: type(case[0]).__name__)
def test_direct_transposes_are_the_vector_jacobian_product(case):
    layer, in_shapes = case
    rule = rule_for(layer)
    out = layer.forward(*[torch.zeros(5, *shape, dtype=torch.float64) for shape in in_shapes])
    G = torch.randn(*out.shape, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    expected = rule.vjp_transpose(layer, G, in_shapes)
    got = rule.transpose(layer, G, in_shapes)
    assert len(got) == len(expected)
    for a, b in zip(got, expected):
        assert a.shape == b.shape
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)
    if not (isinstance(layer, ops.ConstMatMul) and layer.matrix.ndim == 1) and getattr(layer, "kind", "") != "mean":
        direct = rule.direct_transpose(layer, G, in_shapes)
        assert direct is not None  # the direct form exists, and is itself right (not the fallback's result)
        for a, b in zip(direct, expected, strict=True):
            assert a.shape == b.shape
            torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)


def _mp(t: torch.Tensor) -> np.ndarray:
    """A constant as an object array of mpf (exact: float64 converts exactly)."""
    return np.vectorize(mpmath.mpf, otypes=[object])(t.numpy())


def _exact_cases():
    """Affine operators (scalings, constant matrix products both ways, sums, means, differences,
    negation) and the moving ones (slices, a concatenation with a constant, a transpose), each
    with its exact map on object arrays of mpf. The constants are float32 values, so that the
    network is the same in both dtypes the harness checks."""
    g = torch.Generator().manual_seed(4)
    r = lambda *shape: torch.randn(*shape, generator=g).double()  # noqa: E731
    scale, shift = r(3, 5), r(5)
    yield ops.Affine(scale, shift), [(3, 1)], lambda x: x * _mp(scale) + _mp(shift)
    right = r(6, 4)
    yield ops.ConstMatMul(right), [(6,)], lambda x: np.dot(x, _mp(right))
    left = r(4, 6)
    yield ops.ConstMatMul(left, constant_first=True), [(6, 3)], lambda x: np.dot(_mp(left), x)
    yield ops.Binary("Sub"), [(3, 1), (3, 5)], lambda a, b: a - b
    yield ops.Binary("Add"), [(3, 5), (5,)], lambda a, b: a + b
    yield ops.Reduce("sum", (1,), keepdims=True), [(2, 3, 4)], lambda x: x.sum(axis=1, keepdims=True)
    yield ops.Reduce("mean", (0,)), [(3,)], lambda x: x.sum(axis=0, keepdims=True) / 3
    yield ops.Neg(), [(2, 3)], lambda x: -x
    yield ops.Slice((0,), (1,), (5,), (2,)), [(6,)], lambda x: x[1:5:2]
    part = r(2)
    yield ops.Concat(0, (None, part, None)), [(3,), (1,)], lambda a, b: np.concatenate([a, _mp(part), b])
    yield ops.Transpose((2, 0, 1)), [(2, 3, 4)], lambda x: x.transpose(2, 0, 1)


def _unrounded_constant_cases():
    """Moving operators whose constants float32 cannot hold (0.1, 1/3, a Pad value of 0.1): in a
    float32 plan the constant the forward pass uses is rounded, and the bounds must still hold for
    the network's own (float64) constants."""
    part = torch.tensor([0.1, 1 / 3], dtype=torch.float64)
    yield ops.Concat(0, (None, part)), [(3,)], lambda a: np.concatenate([a, _mp(part)])
    tenth = _mp(torch.tensor([0.1], dtype=torch.float64))
    yield ops.Pad((1,), (2,), 0.1), [(3,)], lambda a: np.concatenate([tenth, a, tenth, tenth])


class _AffineView:
    """The harness's view of an affine operator's rule: its interval and crossing (no parameters)."""

    parameters = 0

    def __init__(self, layer):
        self.rule = rule_for(layer)

    def interval(self, layer, inputs):
        return self.rule.forward_interval(layer, inputs)

    def backward(self, layer, A, inputs, alpha=None):
        return self.rule.backward(layer, A, inputs, alpha)


@pytest.mark.parametrize("case", [*_exact_cases(), *_unrounded_constant_cases()],
                         ids=lambda case: type(case[0]).__name__)
def test_affine_operators_hold_exactly(case):
    """Every affine operator's interval and crossing are exact up to rounding: a bound moved inward
    by 1e-4 fails here at the box's corners (the intervals of a sum or a product reach their ends
    there)."""
    layer, shapes, exact = case
    rng = np.random.default_rng(5)

    def box(width, center=0.0):
        return [(c - w, c + w) for c, w in ((rng.normal(size=s) + center, rng.uniform(0, width, size=s)) for s in shapes)]

    boxes = [box(1.0), box(1e-7), box(0.0), box(3.0, 1e3), box(0.5, -2.0)]
    assert check_multi_input(_AffineView(layer), layer, exact, boxes) > 0
