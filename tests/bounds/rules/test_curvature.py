"""The clearing steps every curvature-based rule rests on, checked exactly with mpmath: a line of
*any* slope cleared over a concave piece from one touching point, and a line cleared at a point."""

from __future__ import annotations

import mpmath
import numpy as np
import pytest
import torch

from assay.bounds.rules import rule_for
from assay.bounds.rules.convex import power_curve
from assay.bounds.rules.curvature import clear_concave, clear_point
from assay.bounds.rules.s_shaped import SIGMOID
from assay.nn.ops import activation

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


def _exact(layer):
    named = {activation.Sigmoid: _sigmoid, activation.Tanh: mpmath.tanh, activation.Exp: mpmath.exp,
             activation.Log: lambda z: mpmath.log(z) if z > 0 else None}
    if type(layer) in named:
        return named[type(layer)]
    p = {activation.Reciprocal: -1, activation.Sqrt: 0.5}.get(type(layer), getattr(layer, "exponent", None))
    return lambda z: None if (z < 0 and not float(p).is_integer()) or z == 0 else z ** mpmath.mpf(p)


@pytest.mark.parametrize("name", ["Sigmoid", "Tanh", "Exp", "Log", "Reciprocal", "Sqrt", "Pow2", "Pow3", "Pow-2", "Pow0.5"])
def test_infinite_ends_give_sound_finite_slopes(name):
    """Bounds of ±inf (an unbounded input) still give finite slopes and sound sides (constants
    where no line can do better)."""
    layer = activation.Pow(float(name[3:])) if name.startswith("Pow") else getattr(activation, name)()
    inf = float("inf")
    ends = [(-inf, 2.0), (1.0, inf), (-inf, inf), (-inf, -3.0), (0.5, inf)]
    for dtype in (torch.float32, torch.float64):
        lower = torch.tensor([[a for a, _ in ends]], dtype=dtype)
        upper = torch.tensor([[b for _, b in ends]], dtype=dtype)
        r = rule_for(layer).relax(layer, lower, upper)
        lo, hi = rule_for(layer).interval(layer, lower, upper)
        assert torch.isfinite(r.lower_slope).all() and torch.isfinite(r.upper_slope).all()
        exact = _exact(layer)
        for k, (a, b) in enumerate(ends):
            for z in (-1e30, -50.0, -3.0, 0.7, 2.0, 60.0, 1e30):
                y = exact(mpmath.mpf(z)) if a <= z <= b else None
                if y is None:
                    continue
                below = [float(x[0, k]) for x in (r.lower_slope, r.lower_intercept)]
                above = [float(x[0, k]) for x in (r.upper_slope, r.upper_intercept)]
                assert float(lo[0, k]) <= y <= float(hi[0, k])
                assert below[1] == -inf or mpmath.mpf(below[0]) * z + mpmath.mpf(below[1]) <= y
                assert above[1] == inf or y <= mpmath.mpf(above[0]) * z + mpmath.mpf(above[1])
