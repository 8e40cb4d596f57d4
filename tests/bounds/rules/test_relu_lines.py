"""CROWN's ReLU relaxation (:func:`assay.bounds.relaxation.relax_relu`) checked exactly, as the
harness checks the other operators' lines: at the interval's ends, points within 1e-6 of them,
the next floats inward, a grid and random points, ``lower_slope · x ≤ relu(x) ≤ chord_slope · x
+ intercept`` holds in mpmath (200 bits) from the stored float coefficients, in float32 and
float64, on wide, tiny (1e-7), lopsided and large intervals and on those that straddle 0. Every
other test of the ReLU rule samples whole networks; this one fails when the chord's intercept
moves inward by 1e-4, wherever the interval lies."""

from __future__ import annotations

import mpmath
import numpy as np
import pytest
import torch

from assay.bounds.relaxation import relax_relu
from tests.bounds.rules.harness import DTYPES, sample_points, straddling_intervals, tiny_intervals

INTERVALS = [
    *straddling_intervals([0.0]),
    *tiny_intervals([0.0, -3e-8, 5e-8, 1.0, -2.0]),
    (-1.0, 1e-9), (-1e-9, 1.0), (-1e-3, 1e3), (-1e3, 1e-3), (-5e4, 7e4),
    (0.5, 2.0), (-2.0, -0.5), (0.0, 3.0), (-3.0, 0.0), (-1.0, 1.0),
]


def _mp(value) -> mpmath.mpf:
    return mpmath.mpf(float(value))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_relu_lines_hold_exactly(dtype):
    rng = np.random.default_rng(0)
    lower = torch.tensor([lo for lo, _ in INTERVALS], dtype=torch.float64).to(dtype)
    upper = torch.tensor([hi for _, hi in INTERVALS], dtype=torch.float64).to(dtype)
    upper = torch.maximum(upper, lower)
    relaxation = relax_relu(lower.unsqueeze(0), upper.unsqueeze(0))
    lower_slope, chord_slope, intercept = (t[0] for t in (relaxation.lower_slope, relaxation.upper_slope,
                                                           relaxation.upper_intercept))
    checked = 0
    for k, (lo, hi) in enumerate(zip(lower.tolist(), upper.tolist())):
        for x in sample_points(lo, hi, dtype, rng):
            value = max(_mp(x), mpmath.mpf(0))
            below = _mp(lower_slope[k]) * _mp(x)
            above = _mp(chord_slope[k]) * _mp(x) + _mp(intercept[k])
            assert below <= value, f"lower line {float(lower_slope[k])}·x above relu at x={x} on [{lo}, {hi}] ({dtype})"
            assert value <= above, (f"upper line {float(chord_slope[k])}·x + {float(intercept[k])} below relu by "
                                    f"{mpmath.nstr(value - above, 5)} at x={x} on [{lo}, {hi}] ({dtype})")
            checked += 1
    assert checked > 20 * len(INTERVALS)

