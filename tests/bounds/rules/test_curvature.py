"""The clearing steps every curvature-based rule rests on, checked exactly with mpmath: a line of
*any* slope cleared over a concave piece from one touching point, and a line cleared at a point."""

from __future__ import annotations

import mpmath
import numpy as np
import pytest
import torch

from assay.bounds.rules.convex import power_curve
from assay.bounds.rules.curvature import clear_concave, clear_point
from assay.bounds.rules.s_shaped import SIGMOID

mpmath.mp.prec = 200


def _sigmoid(z):
    return 1 / (1 + mpmath.exp(-z))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_clear_concave_holds_for_any_slope_and_touching_point(dtype):
    """σ is concave on [0.5, 6]: whatever the slope (far from σ'(t) on either side) and the
    touching point, the cleared line is ≥ σ on the whole piece, and touches it where s = σ'(t)."""
    a, b = 0.5, 6.0
    points = torch.tensor([a, 1.0, 2.5, b], dtype=dtype)
    slopes = torch.tensor([-0.5, 0.0, 0.05, 0.3], dtype=dtype)
    t, s = (x.reshape(-1) for x in torch.meshgrid(points, slopes, indexing="ij"))
    lower, upper = torch.full_like(t, a), torch.full_like(t, b)
    intercept = clear_concave(SIGMOID, s, t, lower, upper)
    zs = np.linspace(a, b, 201).astype(np.float32 if dtype == torch.float32 else np.float64).tolist()
    for slope, c in zip(s.tolist(), intercept.tolist()):
        worst = min(mpmath.mpf(slope) * mpmath.mpf(z) + mpmath.mpf(c) - _sigmoid(mpmath.mpf(z)) for z in zs)
        assert worst >= 0, f"slope {slope}: the line dips {mpmath.nstr(-worst, 5)} below σ"
    # with the tangent's own slope the line is the tangent (up to the error margins)
    tangent = clear_concave(SIGMOID, SIGMOID.slope(t), t, lower, upper)
    gap = SIGMOID.slope(t) * t + tangent - torch.sigmoid(t)
    assert gap.abs().max() < (1e-5 if dtype == torch.float32 else 1e-13)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_clear_point_is_just_above_the_value(dtype):
    z = torch.tensor([-3.0, 0.0, 2.0, 40.0], dtype=dtype)
    slope = torch.tensor([0.1, -2.0, 7.0, 1e-3], dtype=dtype)
    intercept = clear_point(SIGMOID, slope, z)
    for zi, si, ci in zip(z.tolist(), slope.tolist(), intercept.tolist()):
        gap = mpmath.mpf(si) * mpmath.mpf(zi) + mpmath.mpf(ci) - _sigmoid(mpmath.mpf(zi))
        assert 0 <= gap < (1e-5 if dtype == torch.float32 else 1e-13)


def test_overflow_gives_up_the_side():
    """A line whose terms overflow is not trusted: intercept +inf (the rules then fall back)."""
    cube = power_curve(3.0)
    z = torch.tensor([1e30, 2.0])
    assert clear_point(cube, torch.tensor([1.0, 3e38]), z).isinf().all()
    assert clear_concave(cube.negated(), torch.tensor([0.0, 0.0]), z, z, z).isinf().tolist() == [True, False]
