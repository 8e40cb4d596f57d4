"""Forward linear bounds through one operator (:func:`assay.bounds.forward.forward_bounds`: the
crossings :mod:`assay.bounds.stages.operator` applies to an element-wise rule's relaxation and to
an affine operator's map, and a ReLU's), checked exactly by the falsification harness.

A network of one operator on a vector input, each element on its own interval: the output's
forward functions ``a·x + c ∓ e`` (the coefficients as stored, the budget ``e`` subtracted
outwards) are read as a relaxation and sampled at the harness's points — the ends, points
1e-6 from them, the next floats, a grid and random points — in mpmath. Sampling the network
only at random points misses a function moved inward by 1e-4, since the lines touch ``f`` at
single points (the ends of a chord, a tangent point): this test does not.
"""

from __future__ import annotations

import math

import mpmath
import numpy as np
import pytest
import torch

from assay.bounds import plan_for
from assay.bounds.forward import forward_bounds
from assay.bounds.rules import rule_for
from assay.bounds.rules.base import Crossing, Relaxation
from assay.nn import Network, ReLU
from assay.nn.ops.activation import Abs, Clip, Cos, Exp, Floor, LeakyRelu, Log, Pow, Reciprocal, Sigmoid, Sign, Sin, Sqrt, Tanh
from tests.bounds.rules.harness import check_elementwise, check_multi_input, straddling_intervals, tiny_intervals
from tests.bounds.rules.test_linear import _exact_cases, _unrounded_constant_cases


class ForwardCrossing:
    """The harness's view of an operator's forward crossing: ``interval`` is the rule's own,
    ``relax`` the forward functions of the output of ``Network((layer,), (n,))`` on the box
    ``[lower, upper]`` (one sample, n elements), as per-element lines in float64."""

    parameters = 0

    def __init__(self, layer, symbols: bool = False):
        self.rule, self.symbols = rule_for(layer), symbols

    def interval(self, layer, lower, upper):
        if isinstance(layer, ReLU):  # the engine's own stage: its interval is the clamp
            return lower.clamp(min=0), upper.clamp(min=0)
        return self.rule.interval(layer, lower, upper)

    def relax(self, layer, lower, upper, alpha=None):
        n = lower.shape[1]
        plan = plan_for(Network((layer,), (n,)), lower.dtype)
        cuts = {}
        forward_bounds(plan, lower, upper, lambda position, low, high, members=None: (low, high), keep={1}, cuts=cuts,
                       symbols=self.symbols)
        # with error symbols, each side's least value over them goes into its budget
        cut = cuts[1].folded()
        f, columns = cut.functions, cut.columns[0]  # coefficients on the varying inputs `columns`
        assert tuple(f.a_lo.shape) == (1, columns.numel(), n)
        slopes = []
        for a in (f.a_lo[0], f.a_hi[0]):
            slope = torch.zeros(n, dtype=torch.float64)
            for j, i in enumerate(columns.tolist()):  # element i's function reads input i only
                others = torch.cat([a[j, :i], a[j, i + 1:]])
                assert not others.any(), "an element-wise operator's functions read other elements"
                slope[i] = float(a[j, i])
            slopes.append(slope.reshape(1, n))
        down = torch.full((1, n), -math.inf, dtype=torch.float64)
        # c ∓ e in float64, rounded outwards (the stored floats of either dtype convert exactly)
        low = torch.nextafter(f.c_lo.double() - f.e_lo.double(), down)
        high = torch.nextafter(f.c_hi.double() + f.e_hi.double(), -down)
        return Relaxation(slopes[0], low, slopes[1], high)


def _sigmoid(z):
    return 1 / (1 + mpmath.exp(-z))


def _log(z):
    if z < 0:
        return None
    return -mpmath.inf if z == 0 else mpmath.log(z)


def _power(p):
    def exact(z):
        if z == 0:
            return None if p < 0 else mpmath.mpf(0)
        if z < 0 and not float(p).is_integer():
            return None
        return z ** (int(p) if float(p).is_integer() else mpmath.mpf(p))

    return exact


def _clip(lo, hi):
    return lambda z: min(max(z, mpmath.mpf(lo)), mpmath.mpf(hi))


def _leaky(a):
    return lambda z: z if z >= 0 else a * z


def _relu(z):
    return max(z, mpmath.mpf(0))


GENERAL = [(-1.0, 2.0), (0.2, 1.2), (-7.0, -0.8), (-3.0, 3.0), (1.5, 1.5), (-0.4, 0.1)]
POSITIVE = [(0.5, 2.0), (1e-3, 0.1), (3.0, 40.0), (0.7, 0.7001), (1.0, 1.0)]
CASES = [
    pytest.param(Sigmoid(), _sigmoid, GENERAL + straddling_intervals([0.0, 2.0]), id="sigmoid"),
    pytest.param(Tanh(), mpmath.tanh, GENERAL + straddling_intervals([0.0, -1.0]), id="tanh"),
    pytest.param(Exp(), mpmath.exp, GENERAL + [(5.0, 9.0)], id="exp"),
    pytest.param(Log(), _log, POSITIVE + [(-1.0, 2.0)], id="log"),
    pytest.param(Reciprocal(), _power(-1.0), POSITIVE + [(-4.0, -0.25), (-1.0, 1.0)], id="reciprocal"),
    pytest.param(Sqrt(), _power(0.5), POSITIVE + [(0.0, 2.0)], id="sqrt"),
    pytest.param(Pow(3.0), _power(3.0), GENERAL, id="cube"),
    pytest.param(Pow(2.0), _power(2.0), GENERAL, id="square"),
    pytest.param(Sin(), mpmath.sin, GENERAL + [(3.0, 9.2), (1e4, 1e4 + 0.1)], id="sin"),
    pytest.param(Cos(), mpmath.cos, GENERAL + [(3.0, 9.2), (-10.0, 10.0)], id="cos"),
    pytest.param(Abs(), abs, GENERAL + tiny_intervals([0.0]), id="abs"),
    pytest.param(Sign(), mpmath.sign, GENERAL + [(0.0, 1.0), (-1.0, 0.0), (0.0, 0.0)], id="sign"),
    pytest.param(LeakyRelu(alpha=0.1), _leaky(0.1), GENERAL, id="leaky"),
    pytest.param(Clip(lower=-1.0, upper=0.5), _clip(-1.0, 0.5), GENERAL + straddling_intervals([-1.0, 0.5]),
                 id="clip"),
    pytest.param(Floor(), mpmath.floor, GENERAL + [(0.1, 0.9), (-2.5, 7.25), (2.0, 2.0)], id="floor"),
]


@pytest.mark.parametrize(("layer", "exact", "intervals"), CASES)
def test_forward_functions_of_an_element_wise_operator_hold_exactly(layer, exact, intervals):
    checked = check_elementwise(ForwardCrossing(layer), layer, exact, intervals, alphas=(None,), count=12)
    assert checked > 20 * len(intervals)


@pytest.mark.parametrize("symbols", [False, True], ids=["sides", "symbols"])
def test_forward_functions_of_a_relu_hold_exactly(symbols):
    """A ReLU's forward step: CROWN's lines on each side, or one error symbol per unstable neuron
    (DeepZ's parallel lines, ``λz`` and ``λz + m``, once the symbol is folded into the budgets)."""
    intervals = GENERAL + straddling_intervals([0.0], widths=(1e-6, 0.3, 5.0)) + [(0.0, 1.0), (-1.0, 0.0)]
    checked = check_elementwise(ForwardCrossing(ReLU(), symbols), ReLU(), _relu, intervals, alphas=(None,), count=12)
    assert checked > 20 * len(intervals)


class ForwardRows:
    """The harness's view of the forward functions of ``Network((layer,), input shape)`` as a
    crossing of its one input: rows ``A`` on the output through the output's functions
    (:meth:`~assay.bounds.forward.Cut.substitute`: ``A·y ≥ A_x·x + offset − owed``)."""

    parameters = 0

    def interval(self, layer, inputs):
        return rule_for(layer).forward_interval(layer, inputs)

    def backward(self, layer, A, inputs, alpha=None):
        (lower, upper), = inputs
        plan = plan_for(Network((layer,), tuple(lower.shape[1:])), lower.dtype)
        cuts = {}
        forward_bounds(plan, lower, upper, lambda position, low, high: (low, high), keep={1}, cuts=cuts)
        coefficients, offset, owed = cuts[1].substitute(A)
        return Crossing((coefficients,), offset, owed)


@pytest.mark.parametrize("case", [case for case in (*_exact_cases(), *_unrounded_constant_cases()) if len(case[1]) == 1],
                         ids=lambda case: type(case[0]).__name__)
def test_forward_functions_of_an_affine_operator_hold_exactly(case):
    """Both functions through an affine operator (``L m ∓ |L| w``, or moved as they are), rows of
    both signs substituted, checked at the box's corners and inside."""
    layer, (shape,), exact = case
    rng = np.random.default_rng(6)

    def box(width, center=0.0):
        c, w = rng.normal(size=shape) + center, rng.uniform(0, width, size=shape)
        return [(c - w, c + w)]

    boxes = [box(1.0), box(1e-7), box(0.0), box(3.0, 1e3)]
    assert check_multi_input(ForwardRows(), layer, exact, boxes) > 0
