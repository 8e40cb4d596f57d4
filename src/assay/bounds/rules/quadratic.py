"""A product of a tensor with an affine image of itself, ``y = s ⊙ (W s + c)``: crossed as the
quadratic form it is where that form is convex.

Covered: ``s ⊙ s`` (``W = I``, ``c = 0``), ``s ⊙ (W s + c)`` of a ``Linear`` layer reading ``s``
(a quadratic Lyapunov function ``V(x) = xᵀPx`` is ``ReduceSum(x ⊙ (P x))``), and ``s ⊙ (a·s + b)``
of an element-wise ``Affine``, in either order; ``s`` a vector of at most :data:`MAX_ELEMENTS`
elements. :func:`quadratic_partner` recognises the pattern when the plan is built.

**The form.** For a row's coefficients ``A`` on ``y``, exactly
``A·y = Σ_i A_i s_i (W s + c)_i = sᵀQs + hᵀs`` with ``Q = (diag(A) W + Wᵀ diag(A)) / 2`` and
``h = A ⊙ c``. McCormick's planes on the two factors (:class:`~assay.bounds.rules.bilinear.Product`)
ignore that ``W s + c`` is a function of ``s``; where ``Q`` is positive semidefinite the form is
convex and lies above each of its tangent planes:

    sᵀQs ≥ 2pᵀQs − pᵀQp     (the gap is (s − p)ᵀQ(s − p) ≥ 0)

for every point ``p``. ``p`` is the form's minimiser over the box of ``s`` (a few projected
Newton steps, :func:`box_minimiser`; any ``p`` is sound), which makes the lower bound of the form
alone exact: on lsnc's Lyapunov function this bound is the least value of V over the box,
where McCormick's planes lose ``(s − l)ᵀ|…|(s − l)``-sized slack. Rows whose ``Q`` is not
positive semidefinite (a concave or indefinite form: no plane under it is exact anywhere in
general) keep McCormick's planes, as do every row in a float32 plan.

**Floating point** (float64, unit roundoff u). ``M = fl(A_i W_ij)`` and ``Q̂ = fl(M + Mᵀ)/2``
(symmetric by construction) differ from ``Q`` by at most ``E_Q = γ₃(|M| + |Mᵀ|)/2``; ``ĥ`` from
``h`` by ``γ₁|ĥ|``. The tangent identity ``sᵀQ̂s = 2pᵀQ̂s − pᵀQ̂p + δᵀQ̂δ`` (``δ = s − p``) is
exact for symmetric ``Q̂``. Positive semidefiniteness is not taken from the factorisation's
success: with ``L`` the computed Cholesky factor of ``Q̂ + τI``, ``F = Q̂ − LLᵀ`` gives
``δᵀQ̂δ = |Lᵀδ|² + δᵀFδ ≥ −rᵀ|F|r`` (``|δ_i| ≤ r_i`` on the box), with ``|F|`` bounded by the
computed residual plus ``γ_n|L||L|ᵀ`` (the τ shift shows up in it, as ``−τ`` on the diagonal).
The coefficients ``k = 2Q̂p + ĥ`` and offset ``−pᵀQ̂p`` are charged ``γ_{n+2}`` of their absolute
sums. Summed over the box's magnitudes ``m``, these make the crossing's rounding (doubled, for
the rounding of the sum itself).
"""

from __future__ import annotations

import torch

from assay.bounds.rounding import unit_roundoff
from assay.bounds.rules.multi import gamma, settled, underflow

__all__ = ["MAX_ELEMENTS", "quadratic_partner", "box_minimiser", "tangent_plane", "tangent_crossing", "distinct_rows"]

# The form's matrix is n × n per row and box: beyond this many elements McCormick's planes stay.
MAX_ELEMENTS = 64
# Projected Newton steps of the box minimiser (6 inputs: 2–3 suffice; any point is sound).
NEWTON_STEPS = 6


def quadratic_partner(network, index: int):
    """For the product layer ``index`` (``y = a · b``): ``(order, W, c)`` when one factor is an
    affine image ``W s + c`` of the other, ``s`` (``order`` 0: ``s`` is the first factor), as
    float64 tensors (n × n, n); else None. Both factors and the product have ``s``'s shape, a
    vector of at most :data:`MAX_ELEMENTS` elements."""
    from assay.bounds.rules import rule_for

    reads = network.sources[index]
    if len(reads) != 2:
        return None
    shape = tuple(network.shapes[index + 1])
    if len(shape) != 1 or shape[0] > MAX_ELEMENTS or any(tuple(network.shapes[r]) != shape for r in reads):
        return None
    n = shape[0]
    a, b = reads
    if a == b:
        return 0, torch.eye(n, dtype=torch.float64), torch.zeros(n, dtype=torch.float64)
    for order, (s, t) in enumerate(((a, b), (b, a))):
        if t == 0 or tuple(network.sources[t - 1]) != (s,):
            continue
        layer = network.layers[t - 1]
        rule = rule_for(layer)
        found = None if rule is None else rule.vector_map(layer, n)
        if found is not None:
            return order, *found
    return None


def box_minimiser(Q: torch.Tensor, h: torch.Tensor, lower: torch.Tensor, upper: torch.Tensor,
                  steps: int = NEWTON_STEPS) -> torch.Tensor:
    """A point of the box ``[lower, upper]`` (…, n) where the convex form ``pᵀQp + hᵀp`` (Q (…, n, n)
    positive semidefinite) is low: projected Newton steps on the variables not held at a bound,
    keeping the point whose tangent plane has the highest minimum over the box. A heuristic's
    output: every point gives a sound tangent plane."""
    n = Q.shape[-1]
    eye = torch.eye(n, dtype=Q.dtype)
    scale = Q.abs().amax((-1, -2), keepdim=True)
    H = 2 * Q + (1e-9 * scale + 1e-300) * eye  # a positive definite Hessian where Q is singular

    def value(p):
        g = 2 * (Q @ p.unsqueeze(-1)).squeeze(-1) + h
        tangent = (p * ((Q @ p.unsqueeze(-1)).squeeze(-1) + h)).sum(-1)
        return tangent + torch.minimum(g * (lower - p), g * (upper - p)).sum(-1), g

    p = torch.linalg.solve_ex(H, -h.unsqueeze(-1))[0].squeeze(-1)
    p = torch.where(torch.isfinite(p), p, (lower + upper) / 2)
    p = torch.minimum(torch.maximum(p, lower), upper)
    best_value, g = value(p)
    best = p
    for _ in range(steps):
        held = ((p <= lower) & (g > 0)) | ((p >= upper) & (g < 0))
        free = ~held
        pair = free.unsqueeze(-1) & free.unsqueeze(-2)
        step = torch.linalg.solve_ex(torch.where(pair, H, eye), torch.where(free, -g, 0.0).unsqueeze(-1))[0].squeeze(-1)
        step = torch.where(torch.isfinite(step), step, torch.zeros_like(step))
        p = torch.minimum(torch.maximum(p + step, lower), upper)
        v, g = value(p)
        better = v > best_value
        best = torch.where(better.unsqueeze(-1), p, best)
        best_value = torch.where(better, v, best_value)
    return best


def tangent_plane(Q: torch.Tensor, p: torch.Tensor, lower: torch.Tensor, upper: torch.Tensor):
    """The tangent plane of ``sᵀQs`` (Q symmetric (K, n, n), as computed) at ``p`` (K, n) over the box
    ``[lower, upper]``: ``(k, o, owed, convex)`` with ``sᵀQs ≥ k·s + o − owed`` exactly for every s
    of the box where ``convex`` (Q + τI has a Cholesky factor; elsewhere the values are not a
    bound). ``k = 2Qp`` and ``o = −pᵀQp`` (differentiable in Q); ``owed`` charges the residual
    ``|Q − LLᵀ|`` over the box's offsets from p and the rounding of k and o."""
    n = Q.shape[-1]
    Qd = Q.detach()
    with torch.no_grad():
        scale = Qd.abs().amax((-1, -2))
        tau = 8 * n * unit_roundoff(torch.float64) * scale + underflow(torch.float64)
        eye = torch.eye(n, dtype=torch.float64)
        L, info = torch.linalg.cholesky_ex(Qd + tau[:, None, None] * eye)
        convex = (info == 0) & torch.isfinite(Qd).all(-1).all(-1)
        L = torch.where(convex[:, None, None], L, torch.zeros_like(L))
        # |F| = |Q − LLᵀ|: the computed residual, its own rounding, and the product's
        residual = (Qd - L @ L.transpose(-1, -2)).abs() * (1 + 2 * unit_roundoff(torch.float64))
        residual = residual + gamma(n + 2, torch.float64) * (L.abs() @ L.abs().transpose(-1, -2))
        r = torch.maximum(p - lower, upper - p)  # |s − p| on the box
        m = torch.maximum(lower.abs(), upper.abs())  # |s| on the box
        quad = lambda v, X: (v.unsqueeze(-2) @ X @ v.unsqueeze(-1)).reshape(-1)  # noqa: E731
        gn = gamma(n + 2, torch.float64)
        owed = quad(r, residual) + gn * (2 * (Qd.abs() @ p.abs().unsqueeze(-1)).squeeze(-1) * m).sum(-1) \
            + gn * quad(p.abs(), Qd.abs())
    p = p.to(Q.dtype)
    Qp = (Q @ p.unsqueeze(-1)).squeeze(-1)
    return 2 * Qp, -(p * Qp).sum(-1), owed, convex


def distinct_rows(A: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows of ``A`` (B, S, …) equal on every box are crossed once: ``(first, inverse)`` with
    ``A[:, first[inverse]] == A`` (a disjunction's groups repeat a shared row, as lsnc's 13 groups
    repeat ``V(x) ≤ ρ``)."""
    S = A.shape[1]
    with torch.no_grad():
        flat = A.detach().transpose(0, 1).reshape(S, -1)
        _, inverse = torch.unique(flat, dim=0, return_inverse=True)
        first = torch.full((int(inverse.max()) + 1,), S, dtype=torch.long)
        first = first.scatter_reduce(0, inverse, torch.arange(S), reduce="amin")
    return first, inverse


def spread_rows(shape, box, row, inverse, picked, coefficients, offset, owed, dtypes):
    """Crossings worked out once per (box, distinct row) pair, spread over every row they stand
    for. ``shape``: (B, S) of the distinct rows; ``box``, ``row`` (P,): the pairs; ``inverse``:
    :func:`distinct_rows`'s; ``picked`` (P,) bool: the pairs whose crossing is taken;
    ``coefficients`` (P, d), ``offset`` and ``owed`` (P,): theirs, cast to ``dtypes`` (three).
    Returns (chosen (B, S') bool, coefficients (B, S', d), offset (B, S'), rounding (B, S')) over
    all S' rows; rows not picked are not chosen (and zero)."""
    B, S = shape
    chosen = torch.zeros(B, S, dtype=torch.bool)
    chosen[box[picked], row[picked]] = True
    full_c = torch.zeros(B, S, coefficients.shape[-1], dtype=dtypes[0])
    full_c[box, row] = coefficients.to(dtypes[0])
    full_o = torch.zeros(B, S, dtype=dtypes[1])
    full_o[box, row] = offset.to(dtypes[1])
    full_r = torch.zeros(B, S, dtype=dtypes[2])
    full_r[box, row] = owed.to(dtypes[2])
    return tuple(t[:, inverse] for t in (chosen, full_c, full_o, full_r))


def tangent_crossing(A: torch.Tensor, W: torch.Tensor, c: torch.Tensor, lower: torch.Tensor, upper: torch.Tensor,
                     mccormick):
    """The crossing of ``y = s ⊙ (W s + c)`` for rows ``A`` (B, S, n) where their form is convex,
    merged into ``mccormick`` (``(coefficients on s, coefficients on W s + c), offset, rounding``
    of the other rows, not yet settled). ``lower``, ``upper`` (B, n): the bounds of ``s``.
    Returns the merged crossing, settled (see :func:`~assay.bounds.rules.multi.settled`)."""
    (on_s, on_image), offset, rounding = mccormick
    first, inverse = distinct_rows(A)
    A = A[:, first]
    B, S, n = A.shape
    finite = torch.isfinite(lower).all(1) & torch.isfinite(upper).all(1)  # (B,)
    with torch.no_grad():
        rows = ((A != 0).any(-1) & finite.unsqueeze(1)).nonzero()  # (K, 2): (box, row) pairs to try
    if rows.shape[0] == 0:
        return settled((on_s, on_image), offset, rounding)
    box, row = rows[:, 0], rows[:, 1]
    a = A[box, row]  # (K, n)
    l, u = lower[box].to(torch.float64), upper[box].to(torch.float64)
    W, c = W.to(A.dtype), c.to(A.dtype)
    M = a.unsqueeze(-1) * W  # (K, n, n): A_i W_ij
    Q = (M + M.transpose(-1, -2)) / 2
    h = a * c
    with torch.no_grad():
        p = box_minimiser(Q.detach(), h.detach(), l, u)
    k, o, owed, convex = tangent_plane(Q, p, l, u)
    k = k + h
    with torch.no_grad():
        m = torch.maximum(l.abs(), u.abs())  # |s| on the box
        E_Q = gamma(3, torch.float64) * (M.detach().abs() + M.detach().abs().transpose(-1, -2)) / 2
        owed = owed + (m.unsqueeze(-2) @ E_Q @ m.unsqueeze(-1)).reshape(-1) \
            + gamma(3, torch.float64) * (h.detach().abs() * m).sum(-1)
        owed = 2 * owed + 64 * n * n * underflow(torch.float64)
        convex = convex & torch.isfinite(owed)
    chosen, k_full, o_full, owed_full = spread_rows((B, S), box, row, inverse, convex, k, o, owed,
                                                    (on_s.dtype, offset.dtype, rounding.dtype))
    pick = chosen.unsqueeze(-1)
    on_s = torch.where(pick, k_full, on_s)
    on_image = torch.where(pick, torch.zeros_like(on_image), on_image)
    offset = torch.where(chosen, o_full, offset)
    rounding = torch.where(chosen, owed_full, rounding)
    return settled((on_s, on_image), offset, rounding)
