"""The bound rule of Floor: sound (checked exactly with mpmath) on intervals inside one cell, across
one or many integers, tiny ones at and next to integers, huge and unbounded ones; exact inside a
cell, the lines ``z − 1`` and ``z`` across integers, α moving each side's slope in [0, 1]."""

from __future__ import annotations

import math

import mpmath
import pytest
import torch

from assay.bounds.rules import rule_for
from assay.bounds.rules.steps import FloorRule
from assay.nn.ops.activation import Floor
from tests.bounds.rules.harness import check_alpha_sides, check_elementwise, straddling_intervals, tiny_intervals

INTEGERS = [0.0, 1.0, -1.0, 3.0, -7.0, 2.0 ** 30]


def _relax(lower, upper, alpha=None, dtype=torch.float64):
    low, high = torch.tensor([lower], dtype=dtype), torch.tensor([upper], dtype=dtype)
    pair = None if alpha is None else (torch.full_like(low, alpha), torch.full_like(low, alpha))
    return rule_for(Floor()).relax(Floor(), low, high, pair)


def test_registered_and_forward_is_floor():
    assert isinstance(rule_for(Floor()), FloorRule)
    z = torch.tensor([-2.5, -1.0, -1e-9, 0.0, 1e-9, 0.999, 1.0, 7.5], dtype=torch.float64)
    assert Floor().forward(z).tolist() == [float(mpmath.floor(mpmath.mpf(v))) for v in z.tolist()]


def test_sound_everywhere():
    intervals = [(0.1, 0.9), (-0.9, -0.1), (0.0, 0.0), (2.0, 2.0), (0.5, 0.5), (-3.0, 2.0), (0.3, 1.7),
                 (-1e4, 1e4 + 0.1), (1e4 + 0.2, 1e4 + 0.3), (-1e30, -1e29), (2.0 ** 52 - 3, 2.0 ** 53 + 8),
                 (-1e-30, 1e-31), (0.9999999, 1.0000001), (-6.283185307179586, 6.283185307179586)]
    intervals += tiny_intervals(INTEGERS) + straddling_intervals(INTEGERS, widths=(1e-6, 0.3, 2.0, 40.0))
    checked = check_elementwise(rule_for(Floor()), Floor(), mpmath.floor, intervals, count=8)
    assert checked > 1000


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_exact_inside_one_cell(dtype):
    for lower, upper, cell in [(0.25, 0.75, 0.0), (-2.0, -1.5, -2.0), (3.0, 3.0, 3.0), (5.0, 5.999, 5.0)]:
        relaxation = _relax([lower], [upper], 0.3, dtype)
        for side in ("lower", "upper"):
            assert getattr(relaxation, f"{side}_slope").item() == 0.0
            assert getattr(relaxation, f"{side}_intercept").item() == cell
        low, high = rule_for(Floor()).interval(Floor(), torch.tensor([[lower]], dtype=dtype),
                                               torch.tensor([[upper]], dtype=dtype))
        assert (low.item(), high.item()) == (cell, cell)


def test_across_integers_the_lines_are_z_minus_one_and_z():
    relaxation = _relax([-0.5, 0.3, -3.5], [0.5, 4.2, 10.0])
    assert relaxation.lower_slope[0].tolist() == [1.0] * 3 and relaxation.upper_slope[0].tolist() == [1.0] * 3
    assert relaxation.upper_intercept[0].tolist() == pytest.approx([0.0] * 3, abs=1e-12)
    assert relaxation.lower_intercept[0].tolist() == pytest.approx([-1.0] * 3, abs=1e-12)
    low, high = rule_for(Floor()).interval(Floor(), torch.tensor([[-0.5, 0.3]]), torch.tensor([[0.5, 4.2]]))
    assert low.tolist() == [[-1.0, 0.0]] and high.tolist() == [[0.0, 4.0]]


def test_alpha_flat_lines_are_the_interval():
    relaxation = _relax([0.3], [4.2], alpha=0.0)
    assert relaxation.lower_slope.item() == 0.0 and relaxation.upper_slope.item() == 0.0
    assert relaxation.lower_intercept.item() == pytest.approx(0.0, abs=1e-12)
    assert relaxation.upper_intercept.item() == pytest.approx(4.0, abs=1e-12)


def test_unbounded_ends_keep_slope_one():
    relaxation = _relax([-math.inf, 0.5, -math.inf], [0.5, math.inf, math.inf])
    assert relaxation.lower_slope[0].tolist() == [1.0] * 3 and relaxation.upper_slope[0].tolist() == [1.0] * 3
    assert relaxation.lower_intercept[0].tolist() == [-1.0] * 3 and relaxation.upper_intercept[0].tolist() == [0.0] * 3


def test_alpha_for_one_side_only_and_nan_alpha():
    lower = torch.tensor([[-1.5, 0.2, 3.0]], dtype=torch.float64)
    upper = torch.tensor([[2.5, 0.7, 9.0]], dtype=torch.float64)
    check_alpha_sides(rule_for(Floor()), Floor(), lower, upper)


def test_alpha_per_row():
    lower = torch.tensor([[-1.0, 0.2]], dtype=torch.float64)
    upper = torch.tensor([[2.0, 0.5]], dtype=torch.float64)
    alpha = torch.full((1, 3, 2), 0.4, dtype=torch.float64, requires_grad=True)
    relaxation = rule_for(Floor()).relax(Floor(), lower, upper, (alpha, alpha))
    assert relaxation.lower_slope.shape == (1, 3, 2)
    assert relaxation.lower_slope[0, :, 1].tolist() == [0.0] * 3  # one cell: exact, alpha unused
    (relaxation.lower_slope * 2.0 + relaxation.lower_intercept).sum().backward()
    assert torch.isfinite(alpha.grad).all()
