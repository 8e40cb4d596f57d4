"""The bound rules of Exp, Log, Reciprocal, Sqrt and Pow: sound (checked exactly with mpmath by the
harness) on wide, tiny, form-changing and extreme intervals, unbounded where the function is, and
as tight as the chord and tangent lines."""

from __future__ import annotations

import math

import mpmath
import pytest
import torch

from assay.bounds.rules import rule_for
from assay.nn.ops.activation import Exp, Log, Pow, Reciprocal, Sqrt
from tests.bounds.rules.harness import check_elementwise, straddling_intervals, tiny_intervals


def _power(p: float):
    """Exact ``z^p`` as torch computes it: None where it is NaN (negative base, non-integer p; and
    ``0`` for odd negative p, whose sign follows the float's signed zero)."""
    integral = float(p).is_integer()

    def exact(z):
        if z == 0:
            if p > 0:
                return mpmath.mpf(0)
            if p == 0:
                return mpmath.mpf(1)
            return None if integral and int(p) % 2 else mpmath.inf
        if z < 0 and not integral:
            return None
        return z ** (int(p) if integral else mpmath.mpf(p))

    return exact


def _log(z):
    if z < 0:
        return None
    return -mpmath.inf if z == 0 else mpmath.log(z)


COUNT = 12  # sample points per interval (the harness adds the ends and their neighbours)

EXP = [(-5.0, 3.0), (0.0, 1.0), (-80.0, 80.0), (-1e4, 1e4), (85.0, 95.0), (88.0, 89.0), (700.0, 720.0),
       (-120.0, -80.0), (-800.0, -700.0)] + tiny_intervals([0.0, 1.0, 50.0, 88.7])
LOG = [(1e-3, 10.0), (0.5, 2.0), (1e-30, 1.0), (0.0, 1.0), (0.0, 0.0), (-1.0, 1.0), (-2.0, -1.0), (1e30, 1e35),
       (1.0, 1.0)] + tiny_intervals([1.0, 1e-3, 0.0])
RECIPROCAL = [(1.0, 2.0), (-2.0, -1.0), (1e-3, 10.0), (-10.0, -1e-3), (0.0, 1.0), (-1.0, 0.0), (1e-30, 1.0),
              (1e30, 1e35), (-1e35, -1e30)] + tiny_intervals([0.0, 1.0, -1.0]) + straddling_intervals([0.0], (1e-4, 1.0))
SQRT = [(0.0, 1.0), (1.0, 100.0), (1e-30, 1e-20), (-1.0, 1.0), (-1.0, 0.0), (1e30, 1e35)] + tiny_intervals([0.0, 1.0])
POW = [(-3.0, 2.0), (0.5, 4.0), (-4.0, -0.5), (0.0, 3.0), (-2.0, 0.0), (1e-20, 1e-10), (1e10, 1e12), (1e13, 1e14)] \
    + tiny_intervals([0.0, 1.0, -1.0]) + straddling_intervals([0.0], (1e-4, 2.0))


@pytest.mark.parametrize("layer, exact, intervals", [
    pytest.param(Exp(), mpmath.exp, EXP, id="exp"),
    pytest.param(Log(), _log, LOG, id="log"),
    pytest.param(Reciprocal(), _power(-1), RECIPROCAL, id="reciprocal"),
    pytest.param(Sqrt(), _power(0.5), SQRT, id="sqrt"),
])
def test_sound(layer, exact, intervals):
    assert check_elementwise(rule_for(layer), layer, exact, intervals, count=COUNT) > 0


@pytest.mark.parametrize("p", [0.0, 1.0, 2.0, 3.0, 4.0, 5.0, -1.0, -2.0, -3.0, -0.5, 0.5, 1.5, 0.3])
def test_pow_sound(p):
    layer = Pow(p)
    assert check_elementwise(rule_for(layer), layer, _power(p), POW, count=8, alphas=(None, 0.0, 1.0)) > 0


def _relax(layer, lower, upper, alpha=None):
    l = torch.tensor([[lower]], dtype=torch.float64)
    u = torch.tensor([[upper]], dtype=torch.float64)
    pair = None if alpha is None else (torch.full_like(l, alpha), torch.full_like(l, alpha))
    r = rule_for(layer).relax(layer, l, u, pair)
    return tuple(float(x) for x in (r.lower_slope, r.lower_intercept, r.upper_slope, r.upper_intercept))


def _interval(layer, lower, upper, dtype=torch.float64):
    lo, hi = rule_for(layer).interval(layer, torch.tensor([[lower]], dtype=dtype), torch.tensor([[upper]], dtype=dtype))
    return float(lo), float(hi)


# (layer, interval, f, f', convex?): the chord is above a convex piece and below a concave one
PIECES = [
    pytest.param(Exp(), (0.0, 1.0), math.exp, math.exp, True, id="exp"),
    pytest.param(Log(), (1.0, 4.0), math.log, lambda z: 1 / z, False, id="log"),
    pytest.param(Reciprocal(), (0.5, 2.0), lambda z: 1 / z, lambda z: -1 / z**2, True, id="reciprocal>0"),
    pytest.param(Reciprocal(), (-2.0, -0.5), lambda z: 1 / z, lambda z: -1 / z**2, False, id="reciprocal<0"),
    pytest.param(Sqrt(), (1.0, 4.0), math.sqrt, lambda z: 0.5 / math.sqrt(z), False, id="sqrt"),
    pytest.param(Pow(2), (-1.0, 2.0), lambda z: z**2, lambda z: 2 * z, True, id="square"),
    pytest.param(Pow(-2), (-3.0, -1.0), lambda z: z**-2, lambda z: -2 * z**-3, True, id="z^-2<0"),
    pytest.param(Pow(-3), (-3.0, -1.0), lambda z: z**-3, lambda z: -3 * z**-4, False, id="z^-3<0"),
    pytest.param(Pow(0.3), (0.5, 3.0), lambda z: z**0.3, lambda z: 0.3 * z**-0.7, False, id="z^0.3"),
    pytest.param(Pow(2.5), (0.5, 3.0), lambda z: z**2.5, lambda z: 2.5 * z**1.5, True, id="z^2.5"),
    pytest.param(Pow(-0.5), (0.5, 3.0), lambda z: z**-0.5, lambda z: -0.5 * z**-1.5, True, id="z^-0.5"),
]


@pytest.mark.parametrize("alpha", [None, 0.3])
@pytest.mark.parametrize("layer, bounds, f, df, convex", PIECES)
def test_one_piece_is_chord_and_tangent(layer, bounds, f, df, convex, alpha):
    lower, upper = bounds
    ls, li, us, ui = _relax(layer, lower, upper, alpha)
    chord, tangent = ((us, ui), (ls, li)) if convex else ((ls, li), (us, ui))
    for z in bounds:
        assert chord[0] * z + chord[1] == pytest.approx(f(z), rel=1e-12, abs=1e-12)
    t = lower + (0.5 if alpha is None else alpha) * (upper - lower)
    assert tangent[0] == pytest.approx(df(t), rel=1e-12)
    assert tangent[0] * t + tangent[1] == pytest.approx(f(t), rel=1e-12, abs=1e-12)


def test_odd_power_across_zero_takes_the_tangents_through_the_ends():
    """x³ on [−1, 2]: below, the tangent through (−1, −1) touches at ½ (2d³ + 3d² − 1 = 0);
    above, the one through (2, 8) touches at −1 (the chord)."""
    ls, li, us, ui = _relax(Pow(3), -1.0, 2.0)
    assert (ls, li) == pytest.approx((0.75, -0.25), abs=1e-9)
    assert (us, ui) == pytest.approx((3.0, 2.0), abs=1e-9)


def test_exp_beyond_float32_range_is_unbounded_above_only():
    """e^z overflows float32 above ~88.7: the exact value is above every float32, so the upper side
    is +inf; the lower side keeps a tangent where e^t is finite, or the largest float."""
    layer = Exp()
    lower, upper = torch.tensor([[80.0, 89.0]]), torch.tensor([[95.0, 90.0]])
    r = rule_for(layer).relax(layer, lower, upper)
    lo, hi = rule_for(layer).interval(layer, lower, upper)
    assert torch.isinf(hi).all() and torch.isinf(r.upper_intercept).all()
    assert torch.isfinite(lo).all() and float(lo[0, 1]) > 3e38
    assert float(r.lower_slope[0, 0]) > 1e35  # a real tangent, below 88.7
    assert torch.isfinite(r.lower_intercept).all()


@pytest.mark.parametrize("layer, lower, upper, low_bounded, up_bounded", [
    pytest.param(Log(), 0.0, 1.0, False, True, id="log-from-0"),
    pytest.param(Log(), -1.0, 1.0, False, False, id="log-below-0"),
    pytest.param(Sqrt(), -1.0, 4.0, False, False, id="sqrt-below-0"),
    pytest.param(Pow(1.5), -1.0, 4.0, False, False, id="z^1.5-below-0"),
    pytest.param(Reciprocal(), -1.0, 2.0, False, False, id="reciprocal-across-0"),
    pytest.param(Reciprocal(), 0.0, 2.0, False, False, id="reciprocal-from-0"),
    pytest.param(Pow(-2), -1.0, 2.0, True, False, id="z^-2-across-0"),
    pytest.param(Pow(-0.5), 0.0, 2.0, True, False, id="z^-0.5-from-0"),
])
def test_unbounded_sides(layer, lower, upper, low_bounded, up_bounded):
    ls, li, us, ui = _relax(layer, lower, upper)
    lo, hi = _interval(layer, lower, upper)
    assert (math.isfinite(li), math.isfinite(lo)) == (low_bounded, low_bounded)
    assert (math.isfinite(ui), math.isfinite(hi)) == (up_bounded, up_bounded)
    assert math.isfinite(ls) and math.isfinite(us)
    if not low_bounded:
        assert ls == 0 and li == -math.inf
    if not up_bounded:
        assert us == 0 and ui == math.inf


def test_even_negative_power_across_zero_keeps_its_smaller_end_value_below():
    ls, li, us, ui = _relax(Pow(-2), -1.0, 2.0)
    assert (ls, li) == (0.0, pytest.approx(0.25, rel=1e-12))


@pytest.mark.parametrize("p, bounds, expected", [
    (2.0, (-1.0, 2.0), (0.0, 4.0)), (2.0, (-3.0, -2.0), (4.0, 9.0)), (3.0, (-2.0, 1.0), (-8.0, 1.0)),
    (-1.0, (0.5, 4.0), (0.25, 2.0)), (0.5, (4.0, 9.0), (2.0, 3.0)), (0.0, (-1.0, 1.0), (1.0, 1.0)),
])
def test_pow_interval(p, bounds, expected):
    assert _interval(Pow(p), *bounds) == pytest.approx(expected, rel=1e-12, abs=1e-300)


def test_constant_and_identity_powers_are_exact():
    assert _relax(Pow(0), -2.0, 3.0) == (0.0, 1.0, 0.0, 1.0)
    assert _relax(Pow(1), -2.0, 3.0) == (1.0, 0.0, 1.0, 0.0)
