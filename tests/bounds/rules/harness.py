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
def _outward(values: np.ndarray, dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """``values`` (lower, upper) float64 arrays as ``dtype`` tensors rounded outwards."""
    lower = torch.tensor(values[0], dtype=torch.float64)
    upper = torch.tensor(values[1], dtype=torch.float64)
    lo, hi = lower.to(dtype), upper.to(dtype)
    lo = torch.where(lo.to(torch.float64) > lower, torch.nextafter(lo, torch.full_like(lo, -math.inf)), lo)
    hi = torch.where(hi.to(torch.float64) < upper, torch.nextafter(hi, torch.full_like(hi, math.inf)), hi)
    return lo, hi


def joint_samples(box: Sequence[tuple[torch.Tensor, torch.Tensor]], rng: np.random.Generator, count: int = 12):
    """Points of the joint box of several inputs (each ``(lower, upper)`` of one sample's shape, in
    the working dtype), as lists of float64 arrays holding floats of that dtype: both extreme
    corners, random corners, corners moved inward by 1e-6 and by one float, an even grid (every
    coordinate at one fraction of its interval, and each input at its own) and random points."""
    dtype = box[0][0].dtype
    lows = [lower.to(torch.float64).numpy() for lower, _ in box]
    highs = [upper.to(torch.float64).numpy() for _, upper in box]
    inward_lo = [torch.nextafter(lower, upper).to(torch.float64).numpy() for lower, upper in box]
    inward_hi = [torch.nextafter(upper, lower).to(torch.float64).numpy() for lower, upper in box]
    points = [lows, highs, inward_lo, inward_hi]
    for _ in range(count):  # random corners, and the same corners just inside
        picks = [rng.integers(0, 2, size=l.shape).astype(bool) for l in lows]
        points.append([np.where(p, h, l) for p, l, h in zip(picks, lows, highs)])
        points.append([np.where(p, np.maximum(l, h - 1e-6), np.minimum(h, l + 1e-6)) for p, l, h in zip(picks, lows, highs)])
        points.append([np.where(p, a, b) for p, a, b in zip(picks, inward_hi, inward_lo)])
    def between(l, h, t):  # l + t·(h − l) without overflowing h − l
        return l * (1.0 - t) + h * t

    for t in np.linspace(0.0, 1.0, 5):
        points.append([between(l, h, t) for l, h in zip(lows, highs)])
        points.append([between(l, h, (t + 0.5 * k) % 1.0) for k, (l, h) in enumerate(zip(lows, highs))])
    for _ in range(count):
        points.append([between(l, h, rng.uniform(size=l.shape)) for l, h in zip(lows, highs)])
    out = []
    for point in points:
        cast = [torch.tensor(np.asarray(p, dtype=np.float64)).to(dtype) for p in point]
        cast = [torch.minimum(torch.maximum(c, lower), upper).to(torch.float64).numpy() for c, (lower, upper) in zip(cast, box)]
        out.append(cast)
    return out


def _rows(shape: tuple[int, ...], rng: np.random.Generator, count: int) -> np.ndarray:
    """``count`` rows of coefficients on an output of ``shape``: all positive, all negative, one
    non-zero entry, half zeros, and random of both signs and several magnitudes."""
    size = int(np.prod(shape))
    rows = [np.abs(rng.normal(size=size)) + 0.1, -np.abs(rng.normal(size=size)) - 0.1, np.eye(size)[rng.integers(size)]]
    mixed = rng.normal(size=size)
    mixed[rng.permutation(size)[: size // 2]] = 0.0
    rows.append(mixed)
    while len(rows) < count:
        rows.append(rng.normal(size=size) * 10.0 ** rng.integers(-3, 4))
    return np.stack(rows[:count]).reshape(count, *shape)


def _mp_array(values: np.ndarray) -> np.ndarray:
    out = np.empty(values.shape, dtype=object)
    for index, v in np.ndenumerate(values):
        out[index] = mpmath.mpf(float(v))
    return out


def check_multi_input(rule, layer, exact: Callable, boxes: Sequence[Sequence[tuple]], *,
                      alphas: Sequence[float | str | None] = (None, 0.0, 0.3, 1.0, "random"), rows: int = 6,
                      seed: int = 0, count: int = 8) -> int:
    """Check a multi-input rule's interval and backward crossing of ``layer`` over every box, in
    float32 and float64, exactly.

    ``boxes``: each box is one ``(lower, upper)`` pair of array-likes per input, of that input's
    sample shape (every box of one call has the same shapes; they are checked as one batch).
    ``exact(*xs)``: the true output from object arrays of mpf (one per input) as an object array
    of mpf (numpy broadcasting and ``np.matmul`` work on those), or None to skip the point.
    At every point of :func:`joint_samples` it checks ``lo ≤ y ≤ hi`` and, for ``rows`` rows
    ``A`` of both signs (zeros included) and every alpha (a constant in [0, 1], ``"random"``: an
    independent value per row and output), ``Σ_k coefficients_k · x_k + offset − rounding ≤ A·y``,
    all exactly: a float64 evaluation whose gap is far above its own error bound proves an
    inequality, any closer call is decided in mpmath. Returns the number of checks; raises
    AssertionError at the first violation.
    """
    rng = np.random.default_rng(seed)
    checked = 0
    boxes = [[(np.asarray(l, dtype=np.float64), np.asarray(u, dtype=np.float64)) for l, u in box] for box in boxes]
    for dtype in DTYPES:
        inputs = []
        for k in range(len(boxes[0])):
            pairs = [_outward(box[k], dtype) for box in boxes]
            inputs.append((torch.stack([p[0] for p in pairs]), torch.stack([p[1] for p in pairs])))
        out_shape = tuple(layer.forward(*[lower for lower, _ in inputs]).shape[1:])
        batch = len(boxes)
        lo, hi = rule.interval(layer, inputs)
        assert lo.shape == (batch, *out_shape) and hi.shape == lo.shape, (lo.shape, out_shape)
        assert lo.dtype == dtype and hi.dtype == dtype
        A = torch.tensor(np.stack([_rows(out_shape, rng, rows) for _ in range(batch)]), dtype=dtype)
        crossings = []
        for alpha in alphas:
            if alpha is not None and rule.parameters == 0:
                continue
            if alpha is None:
                pair = None
            elif alpha == "random":
                pair = tuple(torch.tensor(rng.uniform(size=A.shape), dtype=dtype) for _ in range(rule.parameters))
            else:
                pair = tuple(torch.full((batch, *out_shape), alpha, dtype=dtype) for _ in range(rule.parameters))
            crossing = rule.backward(layer, A, inputs, pair)
            assert len(crossing.coefficients) == len(inputs)
            for c, (lower, _) in zip(crossing.coefficients, inputs):
                assert c.shape == (batch, rows, *lower.shape[1:]), (c.shape, lower.shape)
                assert c.dtype == dtype and torch.isfinite(c).all(), f"non-finite coefficients (alpha={alpha}, {dtype})"
            assert crossing.offset.shape == (batch, rows) and crossing.rounding.shape == (batch, rows)
            assert crossing.offset.dtype == dtype and crossing.rounding.dtype == dtype
            assert not torch.isnan(crossing.offset).any() and not (crossing.offset == math.inf).any()
            assert torch.isfinite(crossing.rounding).all() and (crossing.rounding >= 0).all()
            crossings.append((alpha, crossing))
        for b in range(batch):
            box = [(lower[b], upper[b]) for lower, upper in inputs]
            prepared = []  # per (alpha, row): coefficients (float64 holds them exactly), offset, rounding
            for alpha, crossing in crossings:
                for s in range(rows):
                    if float(crossing.offset[b, s]) == -math.inf:
                        continue
                    flat = torch.cat([c[b, s].reshape(-1) for c in crossing.coefficients]).to(torch.float64).numpy()
                    prepared.append((alpha, s, flat, float(crossing.offset[b, s]), float(crossing.rounding[b, s]), []))
            A_rows = A[b].reshape(rows, -1).to(torch.float64).numpy()
            A_mp = [_mp_array(row) for row in A_rows]
            low_mp, high_mp = _mp_array(lo[b].to(torch.float64).numpy()), _mp_array(hi[b].to(torch.float64).numpy())
            for point in joint_samples(box, rng, count):
                xs = [_mp_array(p) for p in point]
                y = exact(*xs)
                if y is None:
                    continue
                y = np.asarray(y, dtype=object).reshape(out_shape)
                for index, value in np.ndenumerate(y):
                    assert low_mp[index] <= value <= high_mp[index], (
                        f"{type(layer).__name__} interval [{float(low_mp[index])!r}, {float(high_mp[index])!r}] misses "
                        f"y{index} = {mpmath.nstr(value, 20)} at {point} ({dtype})")
                    checked += 1
                flat_y = list(y.ravel())
                y_float = np.array([float(v) for v in flat_y])
                x_float = np.concatenate([p.ravel() for p in point])
                flat_x = [v for x in xs for v in x.ravel()]
                for alpha, s, coefficients, offset, rounding, cache in prepared:
                    checked += 1
                    # a float64 gap far above its own error bound (relative 1e-9 of the magnitudes
                    # involved) proves the inequality; any closer call is decided in mpmath
                    with np.errstate(all="ignore"):
                        bound = float(coefficients @ x_float) + offset - rounding
                        target = float(A_rows[s] @ y_float)
                        size = float(np.abs(coefficients) @ np.abs(x_float)) + abs(offset) + rounding \
                            + float(np.abs(A_rows[s]) @ np.abs(y_float))
                    if math.isfinite(size) and target - bound > 1e-9 * size + 1e-300:
                        continue
                    if not cache:
                        cache.append(_mp_array(coefficients))
                    exact_bound = mpmath.fdot(cache[0], flat_x) + _mp(offset) - _mp(rounding)
                    exact_target = mpmath.fdot(A_mp[s], flat_y)
                    assert exact_bound <= exact_target, (
                        f"{type(layer).__name__} crossing (alpha={alpha}, row {s}) exceeds A·y by "
                        f"{mpmath.nstr(exact_bound - exact_target, 5)} at {point} (box {b}, {dtype})")
    return checked


def alpha_gradients(rule, layer, inputs, A: torch.Tensor, value: float = 0.5) -> list[torch.Tensor]:
    """The gradients of the summed bound ``offset − rounding`` plus the coefficients taken at the
    inputs' lower ends (and of the interval's ends) with respect to each of the rule's alphas,
    set to ``value`` per row and output, then to every input bound: what α-CROWN follows (it
    tunes the alphas of earlier layers through the bounds too). Tests check they are finite."""
    inputs = [(lower.detach().clone().requires_grad_(), upper.detach().clone().requires_grad_()) for lower, upper in inputs]
    alphas = tuple(torch.full(A.shape, value, dtype=A.dtype, requires_grad=True) for _ in range(rule.parameters))
    crossing = rule.backward(layer, A, inputs, alphas)
    bound = crossing.offset - crossing.rounding
    for c, (lower, _) in zip(crossing.coefficients, inputs):
        bound = bound + (c * lower.unsqueeze(1)).reshape(c.shape[0], c.shape[1], -1).sum(-1)
    lo, hi = rule.interval(layer, inputs)
    (bound.sum() + lo.sum() - hi.sum()).backward()
    return [a.grad for a in alphas] + [end.grad for pair in inputs for end in pair]


def runs_on_meta(rule, layer, shapes: Sequence[tuple[int, ...]], rows: int = 3) -> None:
    """Run ``rule``'s interval and backward (default and per-row alphas) on tensors of the
    ``meta`` device: a tensor the rule creates on the CPU by accident (a constant without
    ``device=``) would fail to mix with them, and would fail on a GPU too."""
    inputs = [(torch.empty(2, *s, device="meta"), torch.empty(2, *s, device="meta")) for s in shapes]
    out = layer.forward(*[lower for lower, _ in inputs]).shape[1:]
    A = torch.empty(2, rows, *out, device="meta")
    lo, hi = rule.interval(layer, inputs)
    assert lo.device.type == "meta" and hi.device.type == "meta"
    for alpha in (None, tuple(torch.empty(2, rows, *out, device="meta") for _ in range(rule.parameters))):
        crossing = rule.backward(layer, A, inputs, alpha)
        assert all(t.device.type == "meta" for t in (*crossing.coefficients, crossing.offset, crossing.rounding))


def check_unbounded_inputs(rule, layer, shapes: Sequence[tuple[int, ...]], rows: int = 3) -> None:
    """Inputs whose first element has no lower bound and whose last has no upper bound: the
    interval has no NaN and ``lo ≤ hi``, and the crossing's coefficients and rounding are
    finite and its offsets finite or ``−inf`` (never NaN, never ``+inf``), in both dtypes."""
    for dtype in DTYPES:
        inputs = []
        for shape in shapes:
            lower, upper = torch.ones(1, *shape, dtype=dtype), torch.full((1, *shape), 2.0, dtype=dtype)
            lower.view(-1)[0], upper.view(-1)[-1] = -math.inf, math.inf
            inputs.append((lower, upper))
        out = layer.forward(*[lower for lower, _ in inputs]).shape[1:]
        lo, hi = rule.interval(layer, inputs)
        assert not torch.isnan(lo).any() and not torch.isnan(hi).any() and (lo <= hi).all(), (lo, hi)
        A = torch.tensor(np.random.default_rng(0).normal(size=(1, rows, *out)), dtype=dtype)
        crossing = rule.backward(layer, A, inputs)
        assert all(torch.isfinite(c).all() for c in crossing.coefficients) and torch.isfinite(crossing.rounding).all()
        assert not torch.isnan(crossing.offset).any() and not (crossing.offset == math.inf).any()
