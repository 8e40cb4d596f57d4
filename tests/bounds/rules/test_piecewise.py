"""The bound rules of Abs, LeakyRelu, Clip and Sign: sound (checked exactly with mpmath) on every
kind of interval — stable pieces, across each kink or jump, tiny, large — and exact or as tight as
CROWN's lines where those are optimal."""

from __future__ import annotations

import math

import mpmath
import pytest
import torch

from assay.bounds.rules import rule_for
from assay.bounds.rules.piecewise import AbsRule, ClipRule, LeakyReluRule, SignRule
from assay.nn.ops.activation import Abs, Clip, LeakyRelu, Sign
from tests.bounds.rules.harness import check_alpha_sides, check_elementwise, straddling_intervals, tiny_intervals


def _leaky(alpha):
    return lambda z: z if z >= 0 else mpmath.mpf(alpha) * z


def _clip(lower, upper):
    def exact(z):
        if lower is not None and z < lower:
            return mpmath.mpf(lower)
        if upper is not None and z > upper:
            return mpmath.mpf(upper)
        return z
    return exact


CASES = [
    pytest.param(Abs(), abs, [0.0], id="abs"),
    pytest.param(Sign(), mpmath.sign, [0.0], id="sign"),
    *(pytest.param(LeakyRelu(alpha=a), _leaky(a), [0.0], id=f"leaky{a}") for a in (0.01, 0.0, -0.5, 1.0, 2.5)),
    *(pytest.param(Clip(lower=lo, upper=hi), _clip(lo, hi), [p for p in (lo, hi) if p is not None] or [0.0],
                   id=f"clip[{lo},{hi}]")
      for lo, hi in ((0.1, 0.7), (None, 0.3), (-0.2, None), (None, None), (0.5, 0.5))),
]


def _relax(layer, lower, upper, alpha=None, dtype=torch.float64):
    low = torch.tensor([lower], dtype=dtype)
    high = torch.tensor([upper], dtype=dtype)
    pair = None if alpha is None else (torch.full_like(low, alpha), torch.full_like(low, alpha))
    return rule_for(layer).relax(layer, low, high, pair)


def _line(relaxation, side: str, k: int = 0) -> tuple[float, float]:
    return (getattr(relaxation, f"{side}_slope")[0, k].item(), getattr(relaxation, f"{side}_intercept")[0, k].item())


def test_registered():
    assert isinstance(rule_for(Abs()), AbsRule)
    assert isinstance(rule_for(Sign()), SignRule)
    assert isinstance(rule_for(LeakyRelu()), LeakyReluRule)
    assert isinstance(rule_for(Clip(lower=0.0, upper=1.0)), ClipRule)


@pytest.mark.parametrize(("layer", "exact", "kinks"), CASES)
def test_exact_functions_match_the_forward(layer, exact, kinks):
    """The mpmath functions below are the layers' (so the soundness checks check the right thing)."""
    z = torch.tensor([-3.0, -0.7, -0.2, 0.0, 0.1, 0.3, 0.5, 0.7, 2.0, *kinks], dtype=torch.float64)
    assert layer.forward(z).tolist() == [float(exact(mpmath.mpf(v))) for v in z.tolist()]


@pytest.mark.parametrize(("layer", "exact", "kinks"), CASES)
def test_sound_everywhere(layer, exact, kinks):
    intervals = [(-3.0, 2.0), (-2.0, -1.0), (1.0, 3.0), (0.0, 1.0), (-1.0, 0.0), (0.0, 0.0), (0.3, 0.3),
                 (-1e4, 1e4 + 0.1), (1e4, 1e4 + 0.1), (-1e30, -1e29), (-1e-30, 1e-31)]
    intervals += tiny_intervals(kinks) + straddling_intervals(kinks, widths=(1e-4, 0.3, 2.0))
    if len(kinks) == 2:  # across both corners of a clip
        intervals += [(kinks[0] - 1.0, kinks[1] + 1.0), (kinks[0] - 0.01, kinks[1] + 1e-3), (kinks[0] - 1e-7, kinks[1] + 1e-7)]
    check_elementwise(rule_for(layer), layer, exact, intervals, count=8)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_stable_pieces_are_exact(dtype):
    cases = [(Abs(), 1.0, 2.0, 1.0, 0.0), (Abs(), -3.0, -1.0, -1.0, 0.0), (LeakyRelu(alpha=0.3), 0.5, 4.0, 1.0, 0.0),
             (LeakyRelu(alpha=0.5), -4.0, -1.0, 0.5, 0.0), (Clip(lower=-1.0, upper=1.0), -0.5, 0.5, 1.0, 0.0),
             (Clip(lower=-1.0, upper=1.0), 2.0, 3.0, 0.0, 1.0), (Sign(), 0.25, 8.0, 0.0, 1.0), (Sign(), -8.0, -1.0, 0.0, -1.0)]
    for layer, lower, upper, slope, intercept in cases:
        relaxation = _relax(layer, [lower], [upper], dtype=dtype)
        assert _line(relaxation, "lower") == (slope, intercept), layer
        assert _line(relaxation, "upper") == (slope, intercept), layer
        low, high = rule_for(layer).interval(layer, torch.tensor([[lower]], dtype=dtype), torch.tensor([[upper]], dtype=dtype))
        assert (low.item(), high.item()) == tuple(sorted((slope * lower + intercept, slope * upper + intercept))), layer


def test_abs_across_zero_is_the_chord_above_and_the_adaptive_line_below():
    relaxation = _relax(Abs(), [-1.0, -3.0], [3.0, 1.0])
    for k, (lower, upper) in enumerate([(-1.0, 3.0), (-3.0, 1.0)]):
        chord = (upper + lower) / (upper - lower)
        slope, intercept = _line(relaxation, "upper", k)
        assert slope == pytest.approx(chord, abs=1e-12) and intercept == pytest.approx(-lower - chord * lower, abs=1e-12)
        assert _line(relaxation, "lower", k) == (1.0 if upper > -lower else -1.0, 0.0)
    assert _line(_relax(Abs(), [-1.0], [3.0], alpha=0.25), "lower") == (-0.5, 0.0)


@pytest.mark.parametrize("alpha", [0.01, -0.5, 2.5])
def test_leaky_relu_across_zero(alpha):
    """Convex (alpha ≤ 1): chord above, a line through 0 with slope in [alpha, 1] below; concave
    (alpha > 1): the other way round."""
    relaxation = _relax(LeakyRelu(alpha=alpha), [-2.0], [1.0], 0.5)
    chord = (1.0 + 2.0 * alpha) / 3.0
    free_slope = (alpha + 1.0) / 2
    chord_line = (pytest.approx(chord, abs=1e-12), pytest.approx(1.0 - chord, abs=1e-12))
    free_line = (pytest.approx(free_slope, abs=1e-12), pytest.approx(0.0, abs=1e-12))
    convex = alpha <= 1
    assert _line(relaxation, "upper") == (chord_line if convex else free_line)
    assert _line(relaxation, "lower") == (free_line if convex else chord_line)


def test_clip_across_corners():
    layer = Clip(lower=0.1, upper=0.7)
    relaxation = _relax(layer, [-1.0, -1.0, 0.5], [2.0, 0.3, 2.0])
    # across both corners: the line through (l, 0.1) and the upper corner above, through the
    # lower corner and (u, 0.7) below
    assert _line(relaxation, "upper", 0) == (pytest.approx(0.6 / 1.7, abs=1e-12), pytest.approx(0.1 + 0.6 / 1.7, abs=1e-12))
    assert _line(relaxation, "lower", 0) == (pytest.approx(0.6 / 1.9, abs=1e-12), pytest.approx(0.1 - 0.06 / 1.9, abs=1e-12))
    # across the lower corner only: chord above, the flat side below (the interval lies mostly left of it)
    assert _line(relaxation, "upper", 1) == (pytest.approx(0.2 / 1.3, abs=1e-12), pytest.approx(0.1 + 0.2 / 1.3, abs=1e-12))
    assert _line(relaxation, "lower", 1) == (0.0, 0.1)
    # across the upper corner only (mostly right of it): flat above, chord below
    assert _line(relaxation, "upper", 2) == (0.0, 0.7)
    assert _line(relaxation, "lower", 2) == (pytest.approx(0.2 / 1.5, abs=1e-12), pytest.approx(0.5 - 0.1 / 1.5, abs=1e-12))


def test_sign_across_zero_pivots_on_the_jump():
    relaxation = _relax(Sign(), [-1.0, -4.0, 0.0], [4.0, 1.0, 2.0])
    assert _line(relaxation, "lower", 0) == (pytest.approx(0.5, abs=1e-12), pytest.approx(-1.0, abs=1e-12))  # −1 + 2z/u
    assert _line(relaxation, "upper", 0) == (0.0, 1.0)
    assert _line(relaxation, "upper", 1) == (pytest.approx(0.5, abs=1e-12), pytest.approx(1.0, abs=1e-12))  # 1 + 2z/|l|
    assert _line(relaxation, "lower", 1) == (0.0, -1.0)
    assert _line(relaxation, "lower", 2) == (pytest.approx(0.5, abs=1e-12), pytest.approx(0.0, abs=1e-12))  # z/u: sign(0) = 0
    assert _line(_relax(Sign(), [-1.0], [4.0], alpha=0.5), "lower") == (pytest.approx(0.25), pytest.approx(-1.0))


def test_unbounded_sides_have_zero_slope_and_infinite_intercept():
    relaxation = _relax(Abs(), [-math.inf, -1.0, -math.inf], [1.0, math.inf, math.inf])
    # a half-line keeps the slope of its infinite piece (−z + 2 ≥ |z| on (−inf, 1]); the whole
    # line has no upper line
    assert relaxation.upper_intercept[0].tolist() == [2.0, 2.0, math.inf]
    assert relaxation.upper_slope[0].tolist() == [-1.0, 1.0, 0.0]
    assert relaxation.lower_intercept[0].tolist() == [0.0, 0.0, 0.0]
    for part in (relaxation.lower_slope, relaxation.upper_slope):
        assert torch.isfinite(part).all()
    low, high = rule_for(Sign()).interval(Sign(), torch.tensor([[-math.inf]]), torch.tensor([[math.inf]]))
    assert (low.item(), high.item()) == (-1.0, 1.0)


@pytest.mark.parametrize(("layer", "exact", "kinks"), CASES)
def test_mixed_intervals_in_one_tensor_match_one_at_a_time(layer, exact, kinks):
    lower = [kinks[0] - 1.0, kinks[0] + 0.5, kinks[0] - 2.0, kinks[-1] - 0.1, -5.0, kinks[0]]
    upper = [kinks[0] + 2.0, kinks[0] + 0.6, kinks[0] - 1.0, kinks[-1] + 3.0, 5.0, kinks[0]]
    together = _relax(layer, lower, upper, 0.3, dtype=torch.float32)
    for k, (l, u) in enumerate(zip(lower, upper)):
        alone = _relax(layer, [l], [u], 0.3, dtype=torch.float32)
        for side in ("lower", "upper"):
            assert _line(together, side, k) == _line(alone, side), (side, l, u)


def test_alpha_per_row_and_its_gradient():
    """α-CROWN passes (B, S, *shape) slopes and differentiates the lines with respect to them."""
    lower = torch.tensor([[-1.0, -2.0]], dtype=torch.float64)
    upper = torch.tensor([[2.0, 0.5]], dtype=torch.float64)
    alpha = torch.full((1, 3, 2), 0.4, dtype=torch.float64, requires_grad=True)
    relaxation = rule_for(Abs()).relax(Abs(), lower, upper, (alpha, alpha))
    assert relaxation.lower_slope.shape == (1, 3, 2)
    (relaxation.lower_slope * 2.0 + relaxation.lower_intercept).sum().backward()
    assert alpha.grad.tolist() == [[[4.0, 4.0]] * 3]



@pytest.mark.parametrize(("layer", "exact", "kinks"), CASES)
def test_alpha_for_one_side_only_and_nan_alpha(layer, exact, kinks):
    lower = torch.tensor([[kinks[0] - 1.0, kinks[0] - 0.5, kinks[-1] - 0.5]], dtype=torch.float64)
    upper = torch.tensor([[kinks[-1] + 2.0, kinks[0] + 0.5, kinks[-1] + 0.5]], dtype=torch.float64)
    check_alpha_sides(rule_for(layer), layer, lower, upper)


def test_sound_where_a_product_underflows():
    """Halving a float near the smallest normal rounds (the result is subnormal): such a product
    is not exact and is charged (the rule once took every power-of-two product as exact)."""
    smallest = 2.2250738585072014e-308
    odd = -math.nextafter(smallest, 1.0)  # its last bit is lost when halved
    intervals = [(odd, odd), (odd - 2e-323, odd), (-1.5 * smallest - 5e-324, 1e-310)]
    for slope in (0.5, -0.5):
        layer = LeakyRelu(alpha=slope)
        check_elementwise(rule_for(layer), layer, _leaky(slope), intervals, count=8)
