"""The bound rule of Softmax, checked exactly with mpmath."""

from __future__ import annotations

import math

import mpmath
import numpy as np
import pytest
import torch

import assay.bounds.rules.softmax as softmax_module
from assay.bounds.rules import rule_for
from assay.bounds.rules.softmax import SoftmaxRule, _curvature_remainder, _subdivided_offset, box_interval
from assay.nn.ops.softmax import Softmax
from tests.bounds.rules.harness import alpha_gradients, check_multi_input, check_unbounded_inputs, runs_on_meta


def box(rng, shape, center=0.0, width=1.0, scale=1.0):
    c = (rng.normal(size=shape) + center) * scale
    w = rng.uniform(0.0, width, size=shape) * scale
    return c - w, c + w


def tiny(rng, shape, width=1e-7):
    c = rng.normal(size=shape)
    return c - width / 2, c + width / 2


def exact(axis):
    def f(x):
        moved = np.moveaxis(x, axis, -1)
        out = np.empty(moved.shape, dtype=object)
        for index in np.ndindex(moved.shape[:-1]):
            e = [mpmath.exp(v) for v in moved[index]]
            total = mpmath.fsum(e)
            out[index] = np.array([v / total for v in e], dtype=object)
        return np.moveaxis(out, -1, axis)

    return f


def test_softmax_over_wide_tiny_and_large_boxes(rng):
    layer = Softmax(0)
    assert isinstance(rule_for(layer), SoftmaxRule)
    boxes = [[box(rng, (4,))], [tiny(rng, (4,))], [box(rng, (4,), width=0.05)], [box(rng, (4,), width=0.2)],
             [(np.array([0.0, 0.1, -0.1, 0.05]) - 0.1, np.array([0.0, 0.1, -0.1, 0.05]) + 0.1)], [box(rng, (4,), scale=30.0)], [box(rng, (4,), scale=1e30)], [box(rng, (4,), scale=1e-30)],
             [box(rng, (4,), width=0.0)], [(np.array([-1.0, 0.0, 50.0, 49.0]), np.array([1.0, 0.5, 60.0, 49.5]))]]
    assert check_multi_input(rule_for(layer), layer, exact(0), boxes) > 0


@pytest.mark.parametrize("axis, shape", [(1, (2, 3)), (0, (3, 2)), (1, (2, 3, 2))])
def test_softmax_along_any_axis(rng, axis, shape):
    layer = Softmax(axis)
    boxes = [[box(rng, shape, width=0.3)], [tiny(rng, shape)]]
    assert check_multi_input(rule_for(layer), layer, exact(axis), boxes, count=4) > 0


def test_softmax_interval_is_the_corner_formula():
    lower, upper = torch.tensor([[0.0, -1.0, 1.0]], dtype=torch.float64), torch.tensor([[1.0, 0.0, 1.5]], dtype=torch.float64)
    lo, hi = rule_for(Softmax(0)).interval(Softmax(0), [(lower, upper)])
    e = np.exp
    expected_lo = [1 / (1 + e(0 - 0) + e(1.5 - 0)), 1 / (1 + e(1 - -1) + e(1.5 - -1)), 1 / (1 + e(1 - 1) + e(0 - 1))]
    expected_hi = [1 / (1 + e(-1 - 1) + e(1 - 1)), 1 / (1 + e(0 - 0) + e(1 - 0)), 1 / (1 + e(0 - 1.5) + e(-1 - 1.5))]
    assert lo[0].tolist() == pytest.approx(expected_lo, rel=1e-12) and hi[0].tolist() == pytest.approx(expected_hi, rel=1e-12)


def test_small_boxes_get_slopes_tighter_than_the_interval():
    """On a box of width 1e-3 the linear bound is within a few 1e-6 of the true minimum of A·y
    over the box, well below the interval's own looseness."""
    rng = np.random.default_rng(5)
    centre = rng.normal(size=(1, 5))
    lower, upper = torch.tensor(centre - 1e-3), torch.tensor(centre + 1e-3)
    layer = Softmax(0)
    A = torch.tensor(rng.normal(size=(1, 3, 5)))
    crossing = rule_for(layer).backward(layer, A, [(lower, upper)])
    lo, hi = rule_for(layer).interval(layer, [(lower, upper)])
    coefficients = crossing.coefficients[0]
    bound = (torch.minimum(coefficients * lower.unsqueeze(1), coefficients * upper.unsqueeze(1)).sum(-1)
             + crossing.offset - crossing.rounding)[0]
    interval_bound = (A.clamp(min=0) * lo.unsqueeze(1) + A.clamp(max=0) * hi.unsqueeze(1)).sum(-1)[0]
    corners = torch.tensor(np.array(np.meshgrid(*[[0.0, 1.0]] * 5)).reshape(5, -1).T)
    points = lower + corners * (upper - lower)
    values = (torch.softmax(points, -1).unsqueeze(0) * A[0].unsqueeze(1)).sum(-1).amin(-1)  # min over corners
    assert (bound > interval_bound).all()
    assert (values - bound < 5e-6).all() and (values - bound >= 0).all()


def test_alpha_moves_the_expansion_point():
    torch.manual_seed(0)
    layer = Softmax(0)
    x = torch.randn(1, 5, dtype=torch.float64)
    grad, *bounds = alpha_gradients(rule_for(layer), layer, [(x - 0.01, x + 0.01)], torch.randn(1, 2, 5, dtype=torch.float64))
    assert torch.isfinite(grad).all() and (grad != 0).any()
    assert all(g is not None and torch.isfinite(g).all() for g in bounds)


def test_rule_makes_no_tensor_off_the_inputs_device():
    runs_on_meta(rule_for(Softmax(1)), Softmax(1), [(2, 3)])


def test_unbounded_inputs_give_trivial_bounds_not_nan():
    check_unbounded_inputs(rule_for(Softmax(0)), Softmax(0), [(3,)])


def test_halved_boxes_are_sound_on_groups_of_five(rng):
    """Groups of 5 (a ViT's tokens) on boxes from 1e-4 to 2 wide: the halved boxes' offset
    (taken where it beats the whole box's, i.e. on the wider boxes) holds at every sample."""
    layer = Softmax(0)
    boxes = [[box(rng, (5,), width=w)] for w in (1e-4, 1e-2, 0.2, 0.5, 1.0)] + [[tiny(rng, (5,), 1e-6)]]
    assert check_multi_input(rule_for(layer), layer, exact(0), boxes, count=6) > 0


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("width", [1e-4, 1e-2, 0.3, 1.0])
def test_halved_offset_lies_below_every_sampled_point(dtype, width):
    """``A·y(x) ≥ slopes·x + offset − rounding`` at the corners, a 4⁵ grid and random points of
    each group's box, for tiny to wide boxes, in both dtypes (float64 evaluation: the gaps checked
    are far above its error); the offset is at most a little below the sampled minimum on tiny
    boxes (it is tight there)."""
    gen = np.random.default_rng(7)
    centre = gen.normal(size=(1, 1, 3, 5))
    lower = torch.tensor(centre - width / 2 * gen.uniform(0.2, 1.0, size=centre.shape), dtype=dtype)
    upper = torch.tensor(centre + width / 2 * gen.uniform(0.2, 1.0, size=centre.shape), dtype=dtype)
    a = torch.tensor(gen.normal(size=(1, 4, 3, 5)) * 3, dtype=dtype)
    yc = torch.softmax((lower + upper) / 2, -1)
    slopes = yc * (a - (a * yc).sum(-1, keepdim=True))
    offset, rounding = _subdivided_offset(a, a.clamp(min=0), a.clamp(max=0), lower, upper, slopes)
    grid = torch.tensor(np.array(np.meshgrid(*[np.linspace(0, 1, 4)] * 5)).reshape(5, -1).T)
    fractions = torch.cat([grid, torch.tensor(gen.uniform(size=(300, 5)))])  # the grid holds the corners
    low, high = lower.double().unsqueeze(-2), upper.double().unsqueeze(-2)
    points = low + (high - low) * fractions  # (1, 1, 3, P, 5)
    values = (a.double().unsqueeze(-2) * torch.softmax(points, -1)).sum(-1) - (slopes.double().unsqueeze(-2) * points).sum(-1)
    least = values.amin(-1)  # (1, 4, 3)
    bound = offset.double() - rounding.double()
    assert (bound <= least - 1e-12 * (1 + least.abs())).all(), (least - bound).min()
    if width <= 1e-4 and dtype == torch.float64:
        assert (least - bound < 1e-7).all()


def test_halved_boxes_tighten_wide_groups(monkeypatch):
    """On boxes 0.5 wide the halved boxes' offset beats the whole box's on most rows (about a
    third of the remainder there); with no coordinate halved the two coincide."""
    gen = np.random.default_rng(3)
    centre = gen.normal(size=(1, 5))
    lower, upper = torch.tensor(centre - 0.25), torch.tensor(centre + 0.25)
    layer = Softmax(0)
    A = torch.tensor(gen.normal(size=(1, 8, 5)))

    def bound():
        crossing = rule_for(layer).backward(layer, A, [(lower, upper)])
        coefficients = crossing.coefficients[0]
        return (torch.minimum(coefficients * lower.unsqueeze(1), coefficients * upper.unsqueeze(1)).sum(-1)
                + crossing.offset - crossing.rounding)[0]

    halved = bound()
    monkeypatch.setattr(softmax_module, "_SPLIT_DIMS", 0)
    whole = bound()
    assert (halved >= whole).all() and (halved > whole + 1e-3).sum() >= 6


@pytest.mark.parametrize("width", [1e-3, 0.3, 1.5])
def test_curvature_remainder_bounds_the_hessian_form(width):
    """``−½·dᵀ·H(ξ)·d ≤ _curvature_remainder`` for points ξ of the box and steps |d| ≤ r, the
    Hessian of ``A·softmax`` by autograd (not the identity the bound rests on); and the bound is
    below :func:`_taylor_remainder`'s on most rows."""
    gen = np.random.default_rng(11)
    centre = gen.normal(size=(1, 1, 2, 5))
    half = width / 2 * gen.uniform(0.3, 1.0, size=centre.shape)
    lower, upper = torch.tensor(centre - half), torch.tensor(centre + half)
    a = torch.tensor(gen.normal(size=(1, 6, 2, 5)) * 2)
    lo, hi = box_interval(lower, upper)
    positive, negative = a.clamp(min=0), a.clamp(max=0)
    t_lo = a - softmax_module._dot_above(positive, negative, lo, hi).unsqueeze(-1)
    t_hi = a - softmax_module._dot_below(positive, negative, lo, hi).unsqueeze(-1)
    radius = (upper - lower) / 2
    bound = _curvature_remainder(lo, hi, t_lo, radius)  # (1, 6, 2)
    worst = torch.full_like(bound, -math.inf)
    for _ in range(40):
        xi = lower + (upper - lower) * torch.tensor(gen.uniform(size=lower.shape))
        d = radius * torch.tensor(gen.choice([-1.0, 1.0], size=(1, 6, 2, 5)) * gen.uniform(0.5, 1.0, size=(1, 6, 2, 5)))
        for s in range(6):
            for g in range(2):
                H = torch.autograd.functional.hessian(lambda x, s=s, g=g: (a[0, s, g] * torch.softmax(x, -1)).sum(),
                                                      xi[0, 0, g])
                worst[0, s, g] = max(worst[0, s, g], float(-0.5 * d[0, s, g] @ H @ d[0, s, g]))
    assert (worst <= bound).all(), (worst - bound).max()
    taylor = softmax_module._taylor_remainder(lo, hi, t_lo, t_hi, radius)
    assert (bound <= taylor).float().mean() >= 0.5
