"""The bound rules of Sigmoid and Tanh: sound (checked exactly with mpmath by the harness) on wide,
tiny, inflection-straddling and saturated intervals, and as tight as CROWN's lines."""

from __future__ import annotations

import mpmath
import pytest
import torch

from assay.bounds.rules import curvature, rule_for
from assay.nn.ops.activation import Sigmoid, Tanh
from tests.bounds.rules.harness import check_elementwise, straddling_intervals, tiny_intervals


def _sigmoid(z):
    return 1 / (1 + mpmath.exp(-z))


def _d_sigmoid(z):
    s = _sigmoid(z)
    return s * (1 - s)


def _d_tanh(z):
    return 1 - mpmath.tanh(z) ** 2


CASES = [pytest.param(Sigmoid(), _sigmoid, id="sigmoid"), pytest.param(Tanh(), mpmath.tanh, id="tanh")]
DERIVATIVES = {Sigmoid: _d_sigmoid, Tanh: _d_tanh}

WIDE = [(-8.0, -0.5), (0.5, 8.0), (-6.0, 6.0), (-3.0, 10.0), (-20.0, 1.0), (-0.1, 8.0), (-1e4, 1e4), (-1e30, 3e30)]
# float32 sigmoid saturates to exactly 1 above ~17 and its derivative underflows below ~-88
LARGE = [(30.0, 40.0), (-40.0, -30.0), (88.0, 120.0), (-120.0, -88.0), (1e6, 1e7), (-1e7, -1e6), (-40.0, 35.0)]


@pytest.mark.parametrize("layer, exact", CASES)
@pytest.mark.parametrize("intervals", [
    pytest.param(WIDE, id="wide"),
    pytest.param(tiny_intervals([0.0, -2.0, 2.0, 35.0, -35.0]) + [(0.0, 0.0), (3.0, 3.0)], id="tiny"),
    pytest.param(straddling_intervals([0.0]), id="across-0"),
    pytest.param(LARGE, id="large"),
])
def test_sound(layer, exact, intervals):
    assert check_elementwise(rule_for(layer), layer, exact, intervals, count=24) > 0


def _relax(layer, lower, upper, alpha=None):
    l = torch.tensor([[lower]], dtype=torch.float64)
    u = torch.tensor([[upper]], dtype=torch.float64)
    pair = None if alpha is None else (torch.full_like(l, alpha[0]), torch.full_like(l, alpha[1]))
    r = rule_for(layer).relax(layer, l, u, pair)
    return tuple(float(x) for x in (r.lower_slope, r.lower_intercept, r.upper_slope, r.upper_intercept))


def _f(layer, z):
    return float(_sigmoid(mpmath.mpf(z)) if isinstance(layer, Sigmoid) else mpmath.tanh(mpmath.mpf(z)))


@pytest.mark.parametrize("layer, lower, upper", [(Sigmoid(), -3.0, -1.0), (Tanh(), -2.5, -0.2)])
def test_convex_side_is_chord_above_and_tangent_below(layer, lower, upper):
    ls, li, us, ui = _relax(layer, lower, upper, alpha=(0.3, 0.3))
    for z in (lower, upper):  # the chord passes through both ends
        assert us * z + ui == pytest.approx(_f(layer, z), abs=1e-12)
    t = lower + 0.3 * (upper - lower)  # the tangent touches at the alpha point
    assert ls == pytest.approx(float(DERIVATIVES[type(layer)](mpmath.mpf(t))), abs=1e-12)
    assert ls * t + li == pytest.approx(_f(layer, t), abs=1e-12)


@pytest.mark.parametrize("layer, lower, upper", [(Sigmoid(), 1.0, 3.0), (Tanh(), 0.2, 2.5)])
def test_concave_side_is_tangent_above_and_chord_below(layer, lower, upper):
    ls, li, us, ui = _relax(layer, lower, upper)  # default: tangent at the midpoint
    for z in (lower, upper):
        assert ls * z + li == pytest.approx(_f(layer, z), abs=1e-12)
    t = (lower + upper) / 2
    assert us == pytest.approx(float(DERIVATIVES[type(layer)](mpmath.mpf(t))), abs=1e-12)
    assert us * t + ui == pytest.approx(_f(layer, t), abs=1e-12)


def _touching_point(layer, anchor, bracket):
    """mpmath: the d where the tangent of f at d passes through (anchor, f(anchor))."""
    f = _sigmoid if isinstance(layer, Sigmoid) else mpmath.tanh
    df = DERIVATIVES[type(layer)]
    a = mpmath.mpf(anchor)
    return mpmath.findroot(lambda d: f(d) + df(d) * (a - d) - f(a), bracket, solver="bisect", verify=False)


@pytest.mark.parametrize("layer, lower, upper", [(Sigmoid(), -2.0, 3.0), (Tanh(), -1.5, 2.0), (Sigmoid(), -7.0, 9.0)])
def test_across_zero_the_tangents_pass_through_the_ends(layer, lower, upper):
    """CROWN's lines across the inflection point: above, the tangent through (lower, f(lower));
    below, the one through (upper, f(upper)) — slopes equal to mpmath's to 1e-9."""
    ls, li, us, ui = _relax(layer, lower, upper)
    d_up = _touching_point(layer, lower, (0, upper))
    d_low = _touching_point(layer, upper, (lower, 0))
    df = DERIVATIVES[type(layer)]
    assert us == pytest.approx(float(df(d_up)), abs=1e-9)
    assert us * lower + ui == pytest.approx(_f(layer, lower), abs=1e-9)
    assert ls == pytest.approx(float(df(d_low)), abs=1e-9)
    assert ls * upper + li == pytest.approx(_f(layer, upper), abs=1e-9)


def test_across_zero_alpha_moves_the_touching_point_to_the_end():
    layer = Sigmoid()
    ls, li, us, ui = _relax(layer, -2.0, 3.0, alpha=(0.0, 1.0))  # tangents at the interval's ends
    assert us == pytest.approx(float(_d_sigmoid(mpmath.mpf(3))), abs=1e-12)
    assert us * 3 + ui == pytest.approx(_f(layer, 3.0), abs=1e-12)
    assert ls == pytest.approx(float(_d_sigmoid(mpmath.mpf(-2))), abs=1e-12)
    assert ls * -2 + li == pytest.approx(_f(layer, -2.0), abs=1e-12)


def test_across_zero_near_the_inflection_the_chord_is_above():
    """Just right of 0 the tangent through (lower, f(lower)) would touch beyond upper: the chord."""
    layer = Sigmoid()
    ls, li, us, ui = _relax(layer, -1.0, 0.2)
    for z in (-1.0, 0.2):
        assert us * z + ui == pytest.approx(_f(layer, z), abs=1e-12)


def test_float32_lines_are_close_to_float64():
    """float32's margins cost little: the gap at the touching ends stays below 1e-5."""
    layer = Tanh()
    l32, u32 = torch.tensor([[-1.5, -3.0]]), torch.tensor([[2.0, -1.0]])
    r = rule_for(layer).relax(layer, l32, u32)
    z = torch.tensor([[-1.5, -3.0]], dtype=torch.float64)
    gap = r.upper_slope.double() * z + r.upper_intercept.double() - torch.tanh(z)
    assert gap.abs().max() < 1e-5


def test_interval_is_the_values_at_the_ends_clipped_to_the_range():
    layer = Sigmoid()
    lo, hi = rule_for(layer).interval(layer, torch.tensor([[-1.0, 30.0]], dtype=torch.float64),
                                      torch.tensor([[2.0, 40.0]], dtype=torch.float64))
    assert float(lo[0, 0]) == pytest.approx(_f(layer, -1.0), abs=1e-14)
    assert float(hi[0, 0]) == pytest.approx(_f(layer, 2.0), abs=1e-14)
    assert float(hi[0, 1]) <= 1.0


def test_alpha_with_a_spec_dimension_gives_one_relaxation_per_row():
    """α-CROWN passes alphas of shape (B, S, *shape): each row's lines are those of its own alpha,
    and gradients reach the alphas."""
    layer = Sigmoid()
    torch.manual_seed(0)
    lower = torch.tensor([[-3.0, -1.0, 0.5], [-2.0, 1.0, -8.0]], dtype=torch.float64)
    upper = lower + torch.tensor([[2.0, 4.0, 1.0], [1.0, 0.5, 10.0]], dtype=torch.float64)
    alphas = tuple(torch.rand(2, 4, 3, dtype=torch.float64, requires_grad=True) for _ in range(2))
    r = rule_for(layer).relax(layer, lower, upper, alphas)
    assert r.lower_slope.shape == (2, 4, 3) and r.upper_intercept.shape == (2, 4, 3)
    one = rule_for(layer).relax(layer, lower, upper, (alphas[0][:, 2].detach(), alphas[1][:, 2].detach()))
    # (equal up to the last bits: torch's vectorised and scalar kernels may round differently)
    assert torch.allclose(r.lower_slope[:, 2].detach(), one.lower_slope, rtol=1e-12, atol=1e-15)
    assert torch.allclose(r.upper_intercept[:, 2].detach(), one.upper_intercept, rtol=1e-12, atol=1e-15)
    (r.lower_slope.sum() + r.lower_intercept.sum() + r.upper_slope.sum() + r.upper_intercept.sum()).backward()
    assert all(torch.isfinite(a.grad).all() for a in alphas)
    assert any(a.grad.abs().sum() > 0 for a in alphas)


@pytest.mark.parametrize("where", ["start", "random"])
def test_sound_whatever_the_touching_point_search_returns(monkeypatch, where):
    """The search for the tangents through the ends only picks slopes: replace it by a wrong answer
    (the inflection point, or a random point of the concave part, always "found") and the lines
    must still be sound — only looser."""
    generator = torch.Generator().manual_seed(0)

    def wrong(curve, anchor, lo, hi):
        share = torch.zeros_like(lo) if where == "start" else torch.rand(lo.shape, generator=generator, dtype=lo.dtype)
        return lo + share * (hi - lo), torch.ones_like(lo, dtype=torch.bool)

    monkeypatch.setattr(curvature, "_touching_point", wrong)
    intervals = straddling_intervals([0.0], (0.3, 2.0, 8.0))
    for layer, exact in ((Sigmoid(), _sigmoid), (Tanh(), mpmath.tanh)):
        assert check_elementwise(rule_for(layer), layer, exact, intervals, count=8, alphas=(None, 0.5)) > 0
