"""The bound rules of Sin and Cos: sound (checked exactly with mpmath) over intervals of every
width — tiny, across the multiples of π/2 where the curvature or the monotonicity changes, wider
than 2π — and at large magnitudes; and as tight as CROWN's lines where CROWN's lines are optimal."""

from __future__ import annotations

import math

import mpmath
import pytest
import torch

from assay.bounds.rules import rule_for
from assay.bounds.rules.trigonometric import CosRule, SinRule
from assay.nn.ops.activation import Cos, Sin
from tests.bounds.rules.harness import check_alpha_sides, check_elementwise, straddling_intervals, tiny_intervals

LAYERS = [pytest.param(Sin(), mpmath.sin, id="sin"), pytest.param(Cos(), mpmath.cos, id="cos")]
HALF_PI = math.pi / 2
# where sin/cos change from rising to falling or from convex to concave
FORM_CHANGES = [k * HALF_PI for k in range(-4, 5)]
# the multiple of π/2 nearest to 1e4, and 1e4 itself: range reduction matters there
FAR = round(1e4 / HALF_PI) * HALF_PI


def _relax(layer, lower, upper, alpha=None, dtype=torch.float64):
    low = torch.tensor([lower], dtype=dtype)
    high = torch.tensor([upper], dtype=dtype)
    pair = None if alpha is None else (torch.full_like(low, alpha), torch.full_like(low, alpha))
    return rule_for(layer).relax(layer, low, high, pair)


def test_registered():
    assert isinstance(rule_for(Sin()), SinRule)
    assert isinstance(rule_for(Cos()), CosRule)


@pytest.mark.parametrize(("layer", "exact"), LAYERS)
def test_sound_on_wide_and_large_intervals(layer, exact):
    intervals = [(-1.0, 2.0), (0.2, 1.2), (3.0, 9.2), (-7.0, -0.8), (-6.0, 0.2), (0.0, 6.2799),
                 (-10.0, 10.0), (-1e3, 1e3), (1e4, 1e4 + 0.1), (FAR - 0.3, FAR + 0.2), (FAR - 3.0, FAR + 2.5),
                 (1e6, 1e6 + 1.0), (-1e5 - 2.0, -1e5), (1e15, 1e15 + 0.5)]
    check_elementwise(rule_for(layer), layer, exact, intervals, count=16)


@pytest.mark.parametrize(("layer", "exact"), LAYERS)
def test_sound_on_tiny_intervals(layer, exact):
    points = FORM_CHANGES[2:7] + [0.3, 1e4, FAR, -FAR]
    check_elementwise(rule_for(layer), layer, exact, tiny_intervals(points), count=8)


@pytest.mark.parametrize(("layer", "exact"), LAYERS)
def test_sound_across_every_form_change(layer, exact):
    intervals = straddling_intervals(FORM_CHANGES[1:8] + [FAR], widths=(1e-4, 0.5, 2.5))
    check_elementwise(rule_for(layer), layer, exact, intervals, count=8)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_interval_has_the_exact_extremes(dtype):
    low, high = rule_for(Sin()).interval(Sin(), torch.tensor([[0.2, 1.0, 4.0, 1e4]], dtype=dtype),
                                         torch.tensor([[1.2, 2.0, 5.0, 1e4 + 0.1]], dtype=dtype))
    lower = [0.2, 1.0, 4.0, float(torch.tensor(1e4, dtype=dtype))]
    upper = [1.2, 2.0, 5.0, float(torch.tensor(1e4 + 0.1, dtype=dtype))]
    expected_low = [math.sin(lower[0]), min(math.sin(1.0), math.sin(2.0)), -1.0,
                    min(math.sin(lower[3]), math.sin(upper[3]))]
    expected_high = [math.sin(1.2), 1.0, max(math.sin(4.0), math.sin(5.0)), max(math.sin(lower[3]), math.sin(upper[3]))]
    slack = 1e-6 if dtype == torch.float32 else 1e-12
    assert low[0].tolist() == pytest.approx(expected_low, abs=slack)
    assert high[0].tolist() == pytest.approx(expected_high, abs=slack)


def test_wider_than_two_pi_is_the_constant_pair():
    relaxation = _relax(Sin(), [-1.0, 1e4, -math.inf], [6.3, 1e4 + 7.0, math.inf])
    assert relaxation.lower_slope.tolist() == [[0.0] * 3] and relaxation.upper_slope.tolist() == [[0.0] * 3]
    assert relaxation.lower_intercept.tolist() == [[-1.0] * 3] and relaxation.upper_intercept.tolist() == [[1.0] * 3]


def test_concave_piece_upper_is_the_midpoint_tangent_lower_the_chord():
    lower, upper = 0.2, 1.2  # sin is concave on [0, π]
    relaxation = _relax(Sin(), [lower], [upper])
    middle = (lower + upper) / 2
    assert relaxation.upper_slope.item() == pytest.approx(math.cos(middle), abs=1e-9)
    assert relaxation.upper_intercept.item() == pytest.approx(math.sin(middle) - math.cos(middle) * middle, abs=1e-9)
    chord = (math.sin(upper) - math.sin(lower)) / (upper - lower)
    assert relaxation.lower_slope.item() == pytest.approx(chord, abs=1e-9)
    assert relaxation.lower_intercept.item() == pytest.approx(math.sin(lower) - chord * lower, abs=1e-9)


@pytest.mark.parametrize("alpha", [0.0, 0.25, 1.0])
def test_alpha_picks_the_tangent_point_on_a_convex_piece(alpha):
    lower, upper = 2.0, 4.0  # cos is convex on [π/2, 3π/2]: the lower line is a tangent
    relaxation = _relax(Cos(), [lower], [upper], alpha)
    t = lower + alpha * (upper - lower)
    assert relaxation.lower_slope.item() == pytest.approx(-math.sin(t), abs=1e-12)
    assert relaxation.lower_intercept.item() == pytest.approx(math.cos(t) + math.sin(t) * t, abs=1e-9)
    chord = (math.cos(upper) - math.cos(lower)) / (upper - lower)
    assert relaxation.upper_slope.item() == pytest.approx(chord, abs=1e-9)


def _mean(relaxation, side: str, lower: float, upper: float) -> float:
    slope = getattr(relaxation, f"{side}_slope").item()
    return slope * (lower + upper) / 2 + getattr(relaxation, f"{side}_intercept").item()


@pytest.mark.parametrize(("lower", "upper"), [(-1.0, 2.0), (-2.5, 0.5), (1.0, 5.0), (FAR - 2.0, FAR + 1.0)])
def test_default_line_across_pieces_has_the_least_mean(lower, upper):
    """Across pieces the default slope minimises the area between line and curve: no slope that
    alpha can choose gives a line with a smaller mean (and the chord is no better either)."""
    default = _relax(Sin(), [lower], [upper])
    for alpha in torch.linspace(0, 1, 41).tolist():
        other = _relax(Sin(), [lower], [upper], alpha)
        assert _mean(default, "upper", lower, upper) <= _mean(other, "upper", lower, upper) + 1e-9
        assert _mean(default, "lower", lower, upper) >= _mean(other, "lower", lower, upper) - 1e-9
    constant_high = rule_for(Sin()).interval(Sin(), *(torch.tensor([[x]], dtype=torch.float64) for x in (lower, upper)))[1]
    assert _mean(default, "upper", lower, upper) < constant_high.item() - 1e-3


def test_mixed_intervals_in_one_tensor_match_one_at_a_time():
    lower = [0.2, -1.0, 3.0, 1e4, -20.0, 0.5]
    upper = [1.2, 2.0, 9.5, 1e4 + 0.1, 20.0, 0.5]
    together = _relax(Cos(), lower, upper, dtype=torch.float32)
    for k, (l, u) in enumerate(zip(lower, upper)):
        alone = _relax(Cos(), [l], [u], dtype=torch.float32)
        for name in ("lower_slope", "lower_intercept", "upper_slope", "upper_intercept"):
            assert getattr(together, name)[0, k].item() == getattr(alone, name)[0, 0].item(), (name, l, u)


def test_alpha_per_row_and_its_gradient():
    """α-CROWN passes (B, S, *shape) slopes and differentiates the lines with respect to them."""
    lower = torch.tensor([[-1.0, 0.5]], dtype=torch.float64)
    upper = torch.tensor([[2.0, 2.5]], dtype=torch.float64)
    alpha = torch.full((1, 3, 2), 0.4, dtype=torch.float64, requires_grad=True)
    relaxation = rule_for(Sin()).relax(Sin(), lower, upper, (alpha, alpha))
    assert relaxation.upper_slope.shape == (1, 3, 2) and relaxation.lower_intercept.shape == (1, 3, 2)
    (relaxation.upper_slope + relaxation.upper_intercept).sum().backward()
    assert torch.isfinite(alpha.grad).all() and alpha.grad.abs().sum() > 0



@pytest.mark.parametrize(("layer", "exact"), LAYERS)
def test_alpha_for_one_side_only_and_nan_alpha(layer, exact):
    check_alpha_sides(rule_for(layer), layer, torch.tensor([[-1.0, 0.2, 2.0]], dtype=torch.float64),
                      torch.tensor([[2.0, 1.2, 4.5]], dtype=torch.float64))
