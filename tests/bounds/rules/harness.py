"""Falsification harness for element-wise and multi-input bound rules.

Each check samples an interval densely — its corners, points within 1e-6 of its ends, the
floats next to them, an even grid and random points — evaluates the exact function with mpmath
(200 bits: the float inputs convert exactly) and checks the rule's interval and linear bounds
*exactly* at every sample (the lines are evaluated in mpmath too, from the stored float
coefficients). A violation fails with the interval, the point and the gap.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import mpmath
import numpy as np
import torch

mpmath.mp.prec = 200

DTYPES = (torch.float32, torch.float64)


def _mp(value: float):
    return mpmath.mpf(float(value))


def sample_points(lower: float, upper: float, dtype: torch.dtype, rng: np.random.Generator, count: int = 48):
    """Floats of ``dtype`` in [lower, upper]: ends, ends ± 1e-6 (clipped), the next floats inward,
    a grid and random points."""
    points = {lower, upper}
    for offset in (1e-6, 1e-7, 1e-9):
        points.update({min(upper, lower + offset), max(lower, upper - offset)})
    lo_t = torch.tensor(lower, dtype=dtype)
    hi_t = torch.tensor(upper, dtype=dtype)
    points.add(float(torch.nextafter(lo_t, hi_t)))
    points.add(float(torch.nextafter(hi_t, lo_t)))
    points.update(np.linspace(lower, upper, count).tolist())
    points.update(rng.uniform(lower, upper, count).tolist())
    out = []
    for p in points:
        q = float(torch.tensor(p, dtype=torch.float64).to(dtype))  # a float of the working dtype
        if lower <= q <= upper:
            out.append(q)
    return sorted(set(out))


def _interval_tensors(intervals: Sequence[tuple[float, float]], dtype):
    lower = torch.tensor([l for l, _ in intervals], dtype=torch.float64)
    upper = torch.tensor([u for _, u in intervals], dtype=torch.float64)
    lo, hi = lower.to(dtype), upper.to(dtype)
    # the working-dtype interval must contain the float64 one (round outwards)
    lo = torch.where(lo.to(torch.float64) > lower, torch.nextafter(lo, torch.full_like(lo, -math.inf)), lo)
    hi = torch.where(hi.to(torch.float64) < upper, torch.nextafter(hi, torch.full_like(hi, math.inf)), hi)
    return lo.reshape(1, -1), hi.reshape(1, -1)


def check_elementwise(rule, layer, exact: Callable, intervals: Sequence[tuple[float, float]], *,
                      alphas: Sequence[float | None] = (None, 0.0, 0.3, 1.0), seed: int = 0, count: int = 48) -> int:
    """Check ``rule``'s interval and relaxation of ``layer`` over every interval, in both dtypes.

    ``exact(z: mpf) -> mpf`` is the true function (return None where it is undefined: such
    points are skipped). Returns the number of (point, bound) pairs checked; raises
    AssertionError at the first violation.
    """
    rng = np.random.default_rng(seed)
    checked = 0
    for dtype in DTYPES:
        lower, upper = _interval_tensors(intervals, dtype)
        lo, hi = rule.interval(layer, lower, upper)
        assert lo.shape == lower.shape and hi.shape == lower.shape, (lo.shape, lower.shape)
        relaxations = []
        for alpha in alphas:
            if alpha is not None and rule.parameters == 0:
                continue
            pair = None if alpha is None else tuple(torch.full_like(lower, alpha) for _ in range(2))
            relaxations.append((alpha, rule.relax(layer, lower, upper, pair)))
        for k, (l, u) in enumerate(zip(lower[0].tolist(), upper[0].tolist())):
            for _alpha, r in relaxations:
                for name in ("lower_slope", "upper_slope"):
                    value = getattr(r, name).expand_as(lower)[0, k]
                    assert torch.isfinite(value), (f"{type(layer).__name__} {name} (alpha={alpha}) is {value} on "
                                                   f"[{l}, {u}] ({dtype})")
            for z in sample_points(l, u, dtype, rng, count):
                y = exact(_mp(z))
                if y is None:
                    continue
                low, high = _mp(lo[0, k]), _mp(hi[0, k])
                assert low <= y <= high, (f"{type(layer).__name__} interval [{float(low)!r}, {float(high)!r}] misses "
                                          f"f({z!r}) = {mpmath.nstr(y, 20)} on [{l!r}, {u!r}] ({dtype})")
                checked += 1
                for alpha, r in relaxations:
                    parts = [getattr(r, n).expand_as(lower)[0, k] for n in
                             ("lower_slope", "lower_intercept", "upper_slope", "upper_intercept")]
                    ls, li, us, ui = (_mp(p) for p in parts)
                    below = ls * _mp(z) + li if math.isfinite(float(parts[1])) else -mpmath.inf
                    above = us * _mp(z) + ui if math.isfinite(float(parts[3])) else mpmath.inf
                    assert below <= y, (f"{type(layer).__name__} lower line (alpha={alpha}) is above f at {z!r} by "
                                        f"{mpmath.nstr(below - y, 5)} on [{l!r}, {u!r}] ({dtype})")
                    assert y <= above, (f"{type(layer).__name__} upper line (alpha={alpha}) is below f at {z!r} by "
                                        f"{mpmath.nstr(y - above, 5)} on [{l!r}, {u!r}] ({dtype})")
                    checked += 2
    return checked


def tiny_intervals(points: Sequence[float], width: float = 1e-7) -> list[tuple[float, float]]:
    """Intervals of ``width`` around, just left of and just right of each point."""
    out = []
    for p in points:
        out += [(p - width / 2, p + width / 2), (p - width, p), (p, p + width)]
    return out


def straddling_intervals(points: Sequence[float], widths: Sequence[float] = (1e-4, 0.1, 1.0, 5.0)) -> list[tuple[float, float]]:
    """Intervals across each point, symmetric and lopsided."""
    out = []
    for p in points:
        for w in widths:
            out += [(p - w, p + w), (p - w, p + w / 7), (p - w / 7, p + w)]
    return out


def check_alpha_sides(rule, layer, lower: torch.Tensor, upper: torch.Tensor, value: float = 0.2) -> None:
    """``alpha`` given for one side moves only that side (the other keeps its default), and a NaN
    alpha reads as 0.5 (a diverged optimisation must not make the lines NaN)."""
    alpha = torch.full_like(lower, value)
    default, both = rule.relax(layer, lower, upper), rule.relax(layer, lower, upper, (alpha, alpha))
    for side, pair in (("lower", (alpha, None)), ("upper", (None, alpha))):
        other = "upper" if side == "lower" else "lower"
        one = rule.relax(layer, lower, upper, pair)
        for part in ("slope", "intercept"):
            assert torch.equal(getattr(one, f"{side}_{part}"), getattr(both, f"{side}_{part}")), (side, part)
            assert torch.equal(getattr(one, f"{other}_{part}"), getattr(default, f"{other}_{part}")), (other, part)
    nan = rule.relax(layer, lower, upper, (torch.full_like(lower, math.nan),) * 2)
    middle = rule.relax(layer, lower, upper, (torch.full_like(lower, 0.5),) * 2)
    for name in ("lower_slope", "lower_intercept", "upper_slope", "upper_intercept"):
        assert torch.equal(getattr(nan, name), getattr(middle, name)), name
