"""A product of two tensors crossed through its factors' linear bounds in the network's input.

McCormick's planes (:class:`~assay.bounds.rules.bilinear.Product`) see each factor as an interval.
Where both factors are close to affine functions of a small input ``x`` (a dynamical system's
state: lsnc's Lyapunov decrease ``(x' − x)ᵀP(x' + x)``, whose factors are CROWN-tight), the
product is close to a quadratic form in ``x``, and the interval view loses its curvature: on
lsnc's open boxes the decrease is nearly convex in x (box-scaled Hessian eigenvalues +0.1…+0.5
against −0.003…−0.016), and McCormick's slack was most of the bound's gap.

**The crossing.** Each factor ``f ∈ {a, b}`` of ``y = a ⊙ b`` (vectors of n elements) gets CROWN
linear bounds ``L_f(x) ≤ f ≤ U_f(x)`` on the box (a backward walk from the factor,
:func:`~assay.bounds.crown.backsubstitute`, whose ReLUs and products take parallel sides, a band
of constant height: :func:`_banded_relu`, :func:`_banded_products`); ``m_f = (L_f + U_f)/2`` and
``e_f = f − m_f(x)``, which lies in an interval ``[e_lo, e_hi]`` (the linear bounds' gap, small
where they are tight). Exactly,

    Σ_i A_i a_i b_i = Σ_i A_i m_a m_b  +  Σ_i A_i m_a e_b  +  Σ_i A_i e_a b_i.

The first sum is a quadratic form ``xᵀQx + hᵀx + k``. ``Q`` splits into its positive semidefinite
part ``Q⁺`` (its eigenvalues clipped at 0), crossed by the tangent plane at the form's minimiser
over the box (exact there; :func:`~assay.bounds.rules.quadratic.tangent_plane`), and the rest
``R = Q − Q⁺`` (small where the form is nearly convex), each term ``R_jk x_j x_k`` by the
McCormick plane (the tangent for ``R_jj ≥ 0``, the chord below 0) anchored nearest that point.
In the two other sums ``e`` is taken at its worst end for each value of the other factor
(``m_a`` over the box, or ``b`` in its interval): a minimum of two lines, concave, so its chord
over that factor's interval lies below it; the chord's slope on ``b`` goes through ``b``'s
linear bounds. Everything lands on the input: the crossing's coefficients
go to tensor 0 (:attr:`~assay.bounds.rules.base.Crossing.on_input`), none to the factors.

Each row takes this crossing or McCormick's, whichever gives the higher lower bound over the box
once McCormick's coefficients on the factors are carried through the same linear bounds (both are
sound; the comparison only chooses).

**Floating point.** The factors' linear bounds carry :func:`~assay.bounds.crown.concretize`'s
margin in their offsets (sound as functions, not only at the box's minimum); every interval of a
linear function over the box is widened by γ of its absolute terms; the form's ``Q``, ``h``, ``k``
and the pieces built from them are charged γ of their absolute sums times the box's magnitudes;
the tangent plane is checked by a Cholesky residual (see :mod:`~assay.bounds.rules.quadratic`).

Used where both factors are vectors of at most :data:`MAX_ELEMENTS` elements, the input has at
most :data:`MAX_INPUTS` elements, only affine layers follow the product (its rows are the
output's: no intermediate bound walks through it, so it is crossed once per bound computation),
the plan is float64, and the walk runs to the input without grouped rows or forks (otherwise
McCormick's planes).
"""

from __future__ import annotations

import math
import weakref

import torch

from assay.bounds.rules.multi import gamma, settled, underflow
from assay.bounds.rules.quadratic import box_minimiser, distinct_rows, spread_rows, tangent_plane

__all__ = ["MAX_ELEMENTS", "MAX_INPUTS", "linearizable", "linearized_crossing"]

MAX_ELEMENTS = 64
MAX_INPUTS = 16


def linearizable(network, index: int) -> bool:
    """Whether the product layer ``index`` reads two distinct vectors of one shape, at most
    :data:`MAX_ELEMENTS` elements, in a network of at most :data:`MAX_INPUTS` inputs."""
    reads = network.sources[index]
    if len(reads) != 2 or reads[0] == reads[1] or 0 in reads:
        return False
    shape = tuple(network.shapes[index + 1])
    if len(shape) != 1 or shape[0] > MAX_ELEMENTS or any(tuple(network.shapes[r]) != shape for r in reads):
        return False
    return 0 < math.prod(network.input_shape) <= MAX_INPUTS and _only_affine_after(network, index)


def _only_affine_after(network, index: int) -> bool:
    """Whether every layer the product's output reaches is affine: its rows are the output's own
    (no intermediate bound of a later operator walks through it, and no α changes the rows' A)."""
    from assay.bounds.rules import rule_for

    reached = {index + 1}
    for later in range(index + 1, len(network.layers)):
        if any(s in reached for s in network.sources[later]):
            rule = rule_for(network.layers[later])
            if rule is None or not rule.linear:
                return False
            reached.add(later + 1)
    return True


def _box_range(coefficients, constant, lower, upper):
    """Sound ``[min, max]`` over the box of ``coefficients·x + constant`` (…, n) and (…,), with the
    box (…, n) broadcasting; the exact extremes lie inside (γ of the absolute terms added)."""
    low = torch.minimum(coefficients * lower, coefficients * upper).sum(-1) + constant
    high = torch.maximum(coefficients * lower, coefficients * upper).sum(-1) + constant
    magnitude = torch.maximum(lower.abs(), upper.abs())
    slack = gamma(coefficients.shape[-1] + 4, torch.float64) * ((coefficients.abs() * magnitude).sum(-1) + constant.abs()) \
        + 4 * coefficients.shape[-1] * underflow(torch.float64)
    return low - slack, high + slack


# Per stage (weakly held): the last factor lines computed and the tensors they were computed from.
_LINES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def factor_lines(stage, walk):
    """Per factor of ``stage``: ``(lower A (B, n, d), lower b (B, n), upper A, upper b)`` with
    ``lower A·x + lower b ≤ factor ≤ upper A·x + upper b`` exactly for every x of the box (d
    inputs), from a CROWN walk of the factor with the walk's bounds and ReLU relaxation. Kept for
    the same bound tensors (α-CROWN's iterations and the many walks of one bound computation)."""
    from assay.bounds.crown import backsubstitute, concretize
    from assay.bounds.ibp import center_radius

    keys = [walk.bounds[0]] + [walk.bounds[s] for s in stage.sources]
    key = tuple((t, t._version) for pair in keys for t in pair)
    kept = _LINES.get(stage)
    if kept is not None and len(kept[0]) == len(key) and all(a is b and v == w for (a, v), (b, w) in zip(kept[0], key)):
        return kept[1]
    lower, upper = walk.bounds[0]
    batch = lower.shape[0]
    center, radius = center_radius(lower.reshape(batch, -1), upper.reshape(batch, -1))
    lines = []
    with torch.no_grad():
        for source in stage.sources:
            n = walk.bounds[source][0][0].numel()
            eye = torch.eye(n, dtype=walk.plan.dtype)
            C = torch.cat([eye, -eye]).unsqueeze(0).expand(batch, 2 * n, n)
            d = torch.zeros(batch, 2 * n, dtype=walk.plan.dtype)
            back = backsubstitute(walk.plan, source, C.reshape(batch, 2 * n, *walk.bounds[source][0].shape[1:]), d,
                                  walk.bounds, walk.deltas, relax=_banded_relu,
                                  operator_alphas=_banded_products(walk.plan, source, batch))
            _, margin = concretize(walk.plan, back, center.reshape(lower.shape), radius.reshape(lower.shape))
            A = back.A.reshape(batch, 2 * n, -1)
            b = back.b - margin
            lines.append((A[:, :n], b[:, :n], -A[:, n:], -b[:, n:]))
    _LINES[stage] = (key, lines)
    return lines


def factor_intervals(stage, walk):
    """The factors' intervals: the walk's bounds, narrowed to their linear bounds' range over the
    box (the plan does not refine a tensor only such products read, see
    :attr:`~assay.bounds.plan.Plan.lined_tensors`; their lines bound it instead)."""
    lower, upper = (t.reshape(t.shape[0], -1).to(torch.float64) for t in walk.bounds[0])
    L3, U3 = lower.unsqueeze(1), upper.unsqueeze(1)
    out = []
    for source, (LA, Lb, UA, Ub) in zip(stage.sources, factor_lines(stage, walk)):
        lo, hi = walk.bounds[source]
        line_lo, line_hi = _box_range(LA, Lb, L3, U3)[0], _box_range(UA, Ub, L3, U3)[1]
        lo = torch.maximum(lo, line_lo.reshape(lo.shape).to(lo.dtype))
        hi = torch.minimum(hi, line_hi.reshape(hi.shape).to(hi.dtype))
        out.append((lo, torch.maximum(hi, lo)))
    return out


def _banded_products(plan, tensor: int, batch: int) -> dict:
    """McCormick's α = 1/2 for the products a factor's walk crosses: the mean of each side's two
    planes, parallel to the other side's, a band of constant height (half the corners' spread)
    where α = 1 leaves a gap that reaches the whole spread at one corner (any α is sound)."""
    alphas = {}
    for position, stage in enumerate(plan.stages[:tensor]):
        if getattr(stage, "general", False) and getattr(stage.rule, "fixed_factor_product", None) == "Mul":
            alphas[position] = (torch.full((batch, *stage.out_shape), 0.5, dtype=plan.dtype),)
    return alphas


def _banded_relu(lower: torch.Tensor, upper: torch.Tensor):
    """ReLU's relaxation with the lower slope equal to the chord's (any slope in [0, 1] is sound):
    the two sides are parallel, a band of constant height (the triangle's), so a factor's lower and
    upper lines stay close to parallel and their gap, which bounds ``e``, stays near the relaxation's
    own error instead of growing to a pre-activation bound at a corner of the box."""
    from assay.bounds.relaxation import ReluRelaxation, relax_relu

    relaxation = relax_relu(lower, upper)
    slope = torch.where(relaxation.unstable, relaxation.upper_slope, relaxation.lower_slope)
    return ReluRelaxation(slope, relaxation.upper_slope, relaxation.upper_intercept, relaxation.unstable)


def _anchored_products(R, p, lower, upper):
    """Lower planes of ``xᵀRx`` (R symmetric (K, d, d)) over the box, term by term: ``R_jk x_j x_k ≥
    R_jk (β x_j + α x_k − αβ)`` with anchors ``(α, β)`` at the box's corners (same side where
    ``R_jk > 0``, opposite sides below 0; for ``j = k`` the tangent at ``p`` or the chord) nearest
    to ``p``. Returns (coefficients (K, d), offset (K,), owed rounding (K,))."""
    d = R.shape[-1]
    lj, uj, pj = (t.unsqueeze(-1).expand(-1, d, d) for t in (lower, upper, p))  # value of x_j on row j
    lk, uk, pk = (t.unsqueeze(-2).expand(-1, d, d) for t in (lower, upper, p))  # value of x_k on column k
    positive = R >= 0
    # same side: (l, l) or (u, u); opposite: (l, u) or (u, l); the one whose gap at p is smaller
    low_first = torch.where(positive, (pj - lj) * (pk - lk) <= (uj - pj) * (uk - pk),
                            (pj - lj) * (uk - pk) <= (uj - pj) * (pk - lk))
    alpha = torch.where(low_first, lj, uj)
    beta = torch.where(positive, torch.where(low_first, lk, uk), torch.where(low_first, uk, lk))
    diagonal = torch.eye(d, dtype=torch.bool).expand_as(R)
    alpha = torch.where(diagonal & positive, pj, torch.where(diagonal, lj, alpha))
    beta = torch.where(diagonal & positive, pk, torch.where(diagonal, uk, beta))
    coefficients = (R * beta).sum(-1) + (R * alpha).sum(-2)
    offset = -(R * alpha * beta).sum((-1, -2))
    with torch.no_grad():
        m = torch.maximum(lower.abs(), upper.abs())
        absR = R.detach().abs()
        owed = gamma(2 * d + 4, torch.float64) * (((absR * beta.abs()).sum(-1) + (absR * alpha.abs()).sum(-2)) * m
                                                  ).sum(-1)
        owed = owed + gamma(d * d + 4, torch.float64) * (absR * alpha.abs() * beta.abs()).sum((-1, -2))
    return coefficients, offset, owed


def _worst_end_chord(w, m, e):
    """A line under ``w_i m_i e_i`` for every ``m_i ∈ [m_lo, m_hi]`` and ``e_i ∈ [e_lo, e_hi]``:
    ``φ(m) = min(w m e_lo, w m e_hi)`` is concave in m, so its chord over m's interval lies below it.
    Returns (slope (K, n), offset (K,): Σ_i of the intercepts), the intercepts lowered by the
    rounding of φ at both ends and of the chord itself, so ``Σ_i w_i m_i e_i ≥ slope·m + offset``
    holds exactly (the sum of the offsets is the caller's to charge)."""
    (m_lo, m_hi), (e_lo, e_hi) = m, e
    phi_lo = torch.minimum(w * m_lo * e_lo, w * m_lo * e_hi)
    phi_hi = torch.minimum(w * m_hi * e_lo, w * m_hi * e_hi)
    width = m_hi - m_lo
    slope = torch.where(width > 0, (phi_hi - phi_lo) / torch.where(width > 0, width, torch.ones_like(width)),
                        torch.zeros_like(width))
    at_lo, at_hi = phi_lo - slope * m_lo, phi_hi - slope * m_hi
    with torch.no_grad():
        e_mag = torch.maximum(e_lo.abs(), e_hi.abs())
        w_abs = w.detach().abs()

        def margin(m_end, at):  # φ's two roundings, the slope's product and the subtraction
            return gamma(4, torch.float64) * (w_abs * m_end.abs() * e_mag + slope.detach().abs() * m_end.abs()
                                              + at.detach().abs()) + 4 * underflow(torch.float64)

        low = torch.minimum(at_lo.detach() - margin(m_lo, at_lo), at_hi.detach() - margin(m_hi, at_hi))
    # the intercept: the lower of the two ends' (each made sound), as a differentiable value
    intercept = torch.minimum(at_lo, at_hi) - (torch.minimum(at_lo.detach(), at_hi.detach()) - low)
    return slope, intercept.sum(-1)


def _positive_part(Q):
    """``Q⁺``: the eigenvalues of symmetric Q clipped at 0 (any symmetric matrix is sound here: the
    tangent plane checks its own semidefiniteness, and ``R = Q − Q⁺`` takes the rest)."""
    values, vectors = torch.linalg.eigh(Q)
    positive = (vectors * values.clamp(min=0).unsqueeze(-2)) @ vectors.transpose(-1, -2)
    return (positive + positive.transpose(-1, -2)) / 2


def linearized_crossing(A, stage, walk, mccormick):
    """The crossing of ``y = a ⊙ b`` for rows ``A`` (B, S, n) through its factors' linear bounds
    (module docstring), for the rows where it beats McCormick's (``mccormick``: that crossing,
    not yet settled). Returns ``(coefficients on a, on b), offset, rounding, on
    the input`` (B, S, d) — settled."""
    (on_a, on_b), offset, rounding = mccormick
    B, S_all, n = A.shape
    first, inverse = distinct_rows(A)  # rows repeated across a disjunction's groups: once each
    A = A[:, first]
    S = A.shape[1]
    xl, xu = (t.reshape(t.shape[0], -1).to(torch.float64) for t in walk.bounds[0])
    with torch.no_grad():
        pick = (A != 0).any(-1).nonzero()
    on_input = torch.zeros(B, S_all, xl.shape[1], dtype=A.dtype)
    if pick.shape[0] == 0:
        return _settle(on_a, on_b, offset, rounding, on_input)
    (aLA, aLb, aUA, aUb), (bLA, bLb, bUA, bUb) = factor_lines(stage, walk)
    (b_lo, b_hi) = factor_intervals(stage, walk)[1]
    box, row = pick[:, 0], pick[:, 1]
    w = A[box, row]  # (K, n)
    l, u = xl[box], xu[box]  # (K, d)
    lb = lambda t: t[box]  # noqa: E731
    ca, da = (lb(aLA) + lb(aUA)) / 2, (lb(aLb) + lb(aUb)) / 2  # (K, n, d), (K, n): m_a
    cb, db = (lb(bLA) + lb(bUA)) / 2, (lb(bLb) + lb(bUb)) / 2
    L3, U3 = l.unsqueeze(1), u.unsqueeze(1)
    with torch.no_grad():
        ea = (_box_range(lb(aLA) - ca, lb(aLb) - da, L3, U3)[0], _box_range(lb(aUA) - ca, lb(aUb) - da, L3, U3)[1])
        eb = (_box_range(lb(bLA) - cb, lb(bLb) - db, L3, U3)[0], _box_range(lb(bUA) - cb, lb(bUb) - db, L3, U3)[1])
        ma = _box_range(ca, da, L3, U3)
    # the quadratic form Σ_i w_i m_a,i m_b,i = xᵀQx + hᵀx + k
    M = torch.einsum("ki,kij,kil->kjl", w, ca, cb)
    Q = (M + M.transpose(-1, -2)) / 2
    h = torch.einsum("ki,kij->kj", w * db, ca) + torch.einsum("ki,kij->kj", w * da, cb)
    k = (w * da * db).sum(-1)
    d = Q.shape[-1]
    with torch.no_grad():
        mag = torch.maximum(l.abs(), u.abs())
        aw = w.detach().abs()
        E_Q = gamma(n + 2, torch.float64) * torch.einsum("ki,kij,kil->kjl", aw, ca.abs(), cb.abs())
        E_Q = (E_Q + E_Q.transpose(-1, -2)) / 2
        owed = (mag.unsqueeze(-2) @ E_Q @ mag.unsqueeze(-1)).reshape(-1)
        owed = owed + gamma(2 * n + 3, torch.float64) * ((torch.einsum("ki,kij->kj", aw * db.abs(), ca.abs())
                                                          + torch.einsum("ki,kij->kj", aw * da.abs(), cb.abs())) * mag).sum(-1)
        owed = owed + gamma(n + 2, torch.float64) * (aw * da.abs() * db.abs()).sum(-1)
        positive = _positive_part(Q.detach())
        p = box_minimiser(positive, h.detach(), l, u)
    Qp = positive.to(Q.dtype)
    R = Q - Qp  # differentiable in A through Q (Q⁺ is a constant: any symmetric part is sound)
    coefficients, constant, tangent_owed, convex = tangent_plane(Qp, p, l, u)
    with torch.no_grad():  # where Q⁺ fails the check, all of Q goes to the term-by-term planes
        R = torch.where(convex[:, None, None], R, Q)
        coefficients = torch.where(convex[:, None], coefficients, torch.zeros_like(coefficients))
        constant = torch.where(convex, constant, torch.zeros_like(constant))
        tangent_owed = torch.where(convex, tangent_owed, torch.zeros_like(tangent_owed))
        owed = owed + tangent_owed + gamma(2, torch.float64) * (mag.unsqueeze(-2) @ R.detach().abs()
                                                                  @ mag.unsqueeze(-1)).reshape(-1)
    if not convex.all():
        R = torch.where(convex[:, None, None], Q - Qp, Q)
    r_coefficients, r_offset, r_owed = _anchored_products(R, p, l, u)
    on_x = h + coefficients + r_coefficients
    total = k + constant + r_offset
    owed = owed + r_owed
    # Σ w_i m_a,i e_b,i and Σ w_i e_a,i b_i: e at its worst end for each value of the other factor,
    # whose chord over that factor's interval lies below (a minimum of two lines is concave)
    c_m, o1 = _worst_end_chord(w, ma, eb)
    on_x = on_x + torch.einsum("ki,kij->kj", c_m, ca)
    total = total + o1 + (c_m * da).sum(-1)
    c_b, o2 = _worst_end_chord(w, (b_lo.reshape(B, -1)[box], b_hi.reshape(B, -1)[box]), ea)
    pos, neg = c_b.clamp(min=0), c_b.clamp(max=0)  # b through its linear bounds
    on_x = on_x + torch.einsum("ki,kij->kj", pos, lb(bLA)) + torch.einsum("ki,kij->kj", neg, lb(bUA))
    total = total + o2 + (pos * lb(bLb) + neg * lb(bUb)).sum(-1)
    with torch.no_grad():
        lines = (c_m.abs().unsqueeze(-1) * ca.abs()).sum(1) + (c_b.abs().unsqueeze(-1) * torch.maximum(
            lb(bLA).abs(), lb(bUA).abs())).sum(1)
        owed = owed + gamma(n + d + 6, torch.float64) * (
            (lines * mag).sum(-1) + (c_m.abs() * da.abs()).sum(-1) + (c_b.abs() * torch.maximum(lb(bLb).abs(), lb(bUb).abs())).sum(-1)
            + (o1.abs() + o2.abs() + total.detach().abs()))
        owed = 2 * owed + 64 * (n + d) ** 2 * underflow(torch.float64)
        # McCormick's rows carried through the same lines, for the choice
        original = first[row]  # the McCormick row each distinct row stands for
        ma_pos, ma_neg = on_a[box, original].clamp(min=0), on_a[box, original].clamp(max=0)
        mb_pos, mb_neg = on_b[box, original].clamp(min=0), on_b[box, original].clamp(max=0)
        m_x = (torch.einsum("ki,kij->kj", ma_pos, lb(aLA)) + torch.einsum("ki,kij->kj", ma_neg, lb(aUA))
               + torch.einsum("ki,kij->kj", mb_pos, lb(bLA)) + torch.einsum("ki,kij->kj", mb_neg, lb(bUA)))
        m_c = ((ma_pos * lb(aLb) + ma_neg * lb(aUb) + mb_pos * lb(bLb) + mb_neg * lb(bUb)).sum(-1)
               + offset[box, original] - rounding[box, original])
        mccormick_value = torch.minimum(m_x * l, m_x * u).sum(-1) + m_c
        value = torch.minimum(on_x.detach() * l, on_x.detach() * u).sum(-1) + total.detach() - owed
        better = convex.new_ones(convex.shape) & (value > mccormick_value) & torch.isfinite(owed)
    if not better.any():
        return _settle(on_a, on_b, offset, rounding, on_input)
    chosen, full_x, full_o, full_r = spread_rows((B, S), box, row, inverse, better, on_x, total, owed,
                                                 (A.dtype, offset.dtype, rounding.dtype))
    keep = chosen.unsqueeze(-1)
    on_a = torch.where(keep, torch.zeros_like(on_a), on_a)
    on_b = torch.where(keep, torch.zeros_like(on_b), on_b)
    on_input = torch.where(keep, full_x, on_input)
    return _settle(on_a, on_b, torch.where(chosen, full_o, offset), torch.where(chosen, full_r, rounding), on_input)


def _settle(on_a, on_b, offset, rounding, on_input):
    crossing = settled((on_a, on_b, on_input), offset, rounding)
    on_a, on_b, on_input = crossing.coefficients
    return (on_a, on_b), crossing.offset, crossing.rounding, on_input

