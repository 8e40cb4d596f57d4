"""Products of a vector with an affine image of itself (``s ⊙ (W s + c)``, ``s ⊙ s``), crossed as
their quadratic form (:mod:`assay.bounds.rules.quadratic`): the crossing is checked exactly (in
rationals) at the box's corners, points 1e-6 from its ends, random points and the tangent point
itself, for convex, concave and indefinite forms, tiny and large boxes."""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest
import torch
from scipy.optimize import minimize

from assay.bounds import compute_bounds
from assay.bounds.plan import plan_for
from assay.bounds.rules.bilinear import Product, QuadraticProduct
from assay.bounds.rules.quadratic import box_minimiser, quadratic_partner
from assay.nn import Linear, Network, ops

MUL = ops.Binary("Mul")


def _points(lower: np.ndarray, upper: np.ndarray, rng, extra=()) -> list[np.ndarray]:
    """Corners (all of them for n ≤ 6), points 1e-6 inside the ends, random points, ``extra``."""
    n = lower.shape[0]
    points = []
    for bits in range(min(2 ** n, 64)):
        points.append(np.where([(bits >> i) & 1 for i in range(n)], upper, lower))
    inside = np.minimum(1e-6, (upper - lower) / 2)
    for _ in range(8):
        points.append(np.where(rng.random(n) < 0.5, lower + inside, upper - inside))
    for _ in range(16):
        points.append(lower + (upper - lower) * rng.random(n))
    points.extend(np.clip(p, lower, upper) for p in extra)
    return points


def _exact_check(rule: QuadraticProduct, A: torch.Tensor, lower: torch.Tensor, upper: torch.Tensor, rng) -> int:
    """``A·y ≥ coefficients·(s, W s + c) + offset − rounding`` in rationals at every point; returns
    how many rows took the tangent plane (coefficient 0 on ``W s + c``)."""
    W, c = rule.W.numpy(), rule.c.numpy()
    # the image's interval (for McCormick's rows): sound bounds of W s + c over the box
    Wp, Wn = np.clip(W, 0, None), np.clip(W, None, 0)
    lo_s, hi_s = lower.numpy(), upper.numpy()
    img_lo = Wp @ lo_s.T + Wn @ hi_s.T
    img_hi = Wp @ hi_s.T + Wn @ lo_s.T
    slack = 1e-9 * (np.abs(W) @ np.maximum(np.abs(lo_s), np.abs(hi_s)).T + np.abs(c)[:, None]) + 1e-300
    img = (torch.tensor((img_lo + c[:, None] - slack).T), torch.tensor((img_hi + c[:, None] + slack).T))
    s_bounds = (lower, upper)
    inputs = [s_bounds, img] if rule.order == 0 else [img, s_bounds]
    crossing = rule.backward(MUL, A, inputs, None)
    on_s, on_img = crossing.coefficients if rule.order == 0 else crossing.coefficients[::-1]
    tangent_rows = 0
    Wf = [[Fraction(float(v)) for v in row] for row in W]
    cf = [Fraction(float(v)) for v in c]
    for b in range(A.shape[0]):
        lo, hi = lower[b].numpy(), upper[b].numpy()
        for r in range(A.shape[1]):
            a = A[b, r].numpy()
            Q = (a[:, None] * W + (a[:, None] * W).T) / 2
            extra = []
            if np.all(np.linalg.eigvalsh(Q) > -1e-12):
                p = box_minimiser(torch.tensor(Q), torch.tensor(a * c), lower[b:b + 1], upper[b:b + 1])[0].numpy()
                extra = [p, np.nextafter(p, np.inf), np.nextafter(p, -np.inf)]
            offset, owed = float(crossing.offset[b, r]), float(crossing.rounding[b, r])
            if offset == -np.inf:
                continue
            ks, ki = on_s[b, r].numpy(), on_img[b, r].numpy()
            tangent_rows += int(np.all(ki == 0) and np.any(a != 0))
            for x in _points(lo, hi, rng, extra):
                s = [Fraction(float(v)) for v in x]
                y_img = [sum(Wf[i][j] * s[j] for j in range(len(s))) + cf[i] for i in range(len(s))]
                value = sum(Fraction(float(a[i])) * s[i] * y_img[i] for i in range(len(s)))
                bound = sum(Fraction(float(ks[i])) * s[i] + Fraction(float(ki[i])) * y_img[i] for i in range(len(s)))
                bound += Fraction(offset) - Fraction(owed)
                assert value >= bound, (b, r, x, float(value - bound))
    return tangent_rows


def _psd(rng, n, scale=1.0):
    R = rng.normal(size=(n, n)) * scale
    return R.T @ R + 0.01 * np.eye(n)


def _boxes(rng, n, count, center=0.0, width=1.0):
    c = rng.normal(size=(count, n)) + center
    w = rng.uniform(0, width, size=(count, n))
    return torch.tensor(c - w), torch.tensor(c + w)


def _rows(rng, n, batch):
    """Rows of every kind: all +1 (convex), all −1 (concave), random signs, zeros, positive scales."""
    rows = [np.ones(n), -np.ones(n), rng.normal(size=n), np.zeros(n), rng.uniform(0.1, 2.0, size=n)]
    one = np.zeros(n)
    one[0] = 3.0
    rows.append(one)
    return torch.tensor(np.stack([rows] * batch))


@pytest.mark.parametrize("case", ["linear", "square", "affine", "linear_second"])
def test_crossing_is_sound_exactly(case):
    rng = np.random.default_rng(7)
    n = 4
    if case in ("linear", "linear_second"):
        rule = QuadraticProduct(1 if case == "linear_second" else 0, torch.tensor(_psd(rng, n)), torch.tensor(rng.normal(size=n)))
    elif case == "square":
        rule = QuadraticProduct(0, torch.eye(n, dtype=torch.float64), torch.zeros(n, dtype=torch.float64))
    else:
        rule = QuadraticProduct(0, torch.diag(torch.tensor(rng.uniform(0.2, 2.0, size=n))), torch.tensor(rng.normal(size=n)))
    boxes = [_boxes(rng, n, 3), _boxes(rng, n, 2, width=1e-7), _boxes(rng, n, 1, width=1e-13),
             _boxes(rng, n, 2, center=300.0, width=50.0)]
    lower = torch.cat([b[0] for b in boxes])
    upper = torch.cat([b[1] for b in boxes])
    A = _rows(rng, n, lower.shape[0])
    tangent = _exact_check(rule, A, lower, upper, rng)
    assert tangent >= lower.shape[0]  # the all-ones rows at least (convex: W positive definite)


def test_tangent_is_exact_for_a_convex_form():
    """V(s) = sᵀPs over a box: the lower bound is V's least value there (the minimiser's tangent
    plane), where McCormick's planes fall short; a box holding 0 gets 0."""
    rng = np.random.default_rng(3)
    n = 5
    P = torch.tensor(_psd(rng, n))
    net = _lyapunov(P)
    lower, upper = _boxes(rng, n, 6, width=0.8)
    lower[0], upper[0] = -torch.rand(n, dtype=torch.float64), torch.rand(n, dtype=torch.float64)
    bounds = compute_bounds(net, (lower, upper), method="crown", dtype="float64")
    x = lower.unsqueeze(1) + (upper - lower).unsqueeze(1) * torch.rand(6, 2_000, n, dtype=torch.float64)
    V = net.forward(x.reshape(-1, n)).reshape(6, -1)
    assert (bounds.lower[:, 0] <= V.amin(1)).all()
    assert (bounds.upper[:, 0] >= V.amax(1)).all()
    assert -1e-9 < bounds.lower[0, 0] <= 0.0  # the box holds the minimiser 0
    Pn = P.numpy()
    for b in range(1, 6):  # elsewhere the least value, as a quasi-Newton solver finds it
        l, u = lower[b].numpy(), upper[b].numpy()
        least = minimize(lambda v: v @ Pn @ v, (l + u) / 2, jac=lambda v: 2 * Pn @ v, bounds=list(zip(l, u)),
                         method="L-BFGS-B", options={"ftol": 1e-15, "gtol": 1e-12}).fun
        assert least - 1e-9 * (1 + abs(least)) <= float(bounds.lower[b, 0]) <= least
    float32 = compute_bounds(net, (lower, upper), method="crown", dtype="float32")  # McCormick's planes
    assert (float32.lower[1:, 0].double() <= bounds.lower[1:, 0] + 1e-9).all()
    assert (float32.lower[1:, 0].double() < bounds.lower[1:, 0] - 1e-3).any()


def _lyapunov(P: torch.Tensor) -> Network:
    """(n,) → Linear P → x ⊙ (P x) → sum: V(x) = xᵀPx, as lsnc's networks compute it."""
    n = P.shape[0]
    layers = (Linear(P, torch.zeros(n, dtype=torch.float64)), MUL, ops.Reduce("sum", (0,)))
    return Network(layers, (n,), sources=((0,), (0, 1), (2,)))


def test_networks_use_it_only_where_it_applies():
    P = torch.tensor(_psd(np.random.default_rng(0), 3))
    net = _lyapunov(P)
    assert isinstance(plan_for(net, torch.float64).stages[1].rule, QuadraticProduct)
    assert type(plan_for(net, torch.float32).stages[1].rule) is Product
    assert quadratic_partner(net, 1)[0] == 0
    # two slices of one tensor are not an affine image of each other
    layers = (Linear(torch.eye(4, dtype=torch.float64), torch.zeros(4, dtype=torch.float64)),
              ops.Slice((0,), (0,), (2,), (1,)), ops.Slice((0,), (2,), (4,), (1,)), MUL)
    other = Network(layers, (4,), sources=((0,), (1,), (1,), (2, 3)))
    assert quadratic_partner(other, 3) is None
    assert not isinstance(plan_for(other, torch.float64).stages[3].rule, QuadraticProduct)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("method", ["crown", "alpha"])
def test_network_bounds_contain_samples(dtype, method):
    rng = np.random.default_rng(11)
    n = 4
    for W in (torch.tensor(_psd(rng, n)), torch.tensor(rng.normal(size=(n, n)))):  # convex, indefinite
        net = _lyapunov(W)
        lower, upper = _boxes(rng, n, 4, width=0.5)
        bounds = compute_bounds(net, (lower, upper), method=method, dtype=dtype)
        x = lower.unsqueeze(1) + (upper - lower).unsqueeze(1) * torch.rand(4, 5000, n, dtype=torch.float64)
        V = net.forward(x.reshape(-1, n)).reshape(4, -1)
        assert (bounds.lower[:, 0].double() <= V.amin(1)).all()
        assert (bounds.upper[:, 0].double() >= V.amax(1)).all()
