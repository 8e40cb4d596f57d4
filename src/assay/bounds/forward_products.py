"""Forward linear bounds through a product one of whose factors the boxes fix.

A set network (nn4sys' mscn) multiplies every element of a set by its mask and divides the sum
by the mask count; the boxes of its properties fix both. The product's interval would drop
every coefficient there, and with it the forward bounds of the layers after the pooling; as a
scaling of the other factor's functions the bounds keep them (mscn_dual 960: its search's
second-round boxes, 818 → 924 of 1,024 refuted). :func:`scaled_product` is asked by an operator
stage's forward step (:mod:`assay.bounds.stages.operator`) before it falls back to the product's
interval; it reads the functions through their attributes only (``a_lo, c_lo, e_lo, a_hi,
c_hi, e_hi, columns``) and builds its result with their own class.
"""

from __future__ import annotations

import torch

# A factor within this relative half-width of one value in every domain scales the other
# factor's functions; a wider one leaves the product to its interval.
POINT_FACTOR_WIDTH = 1e-6


def scaled_product(stage, sources: list, bounds: list[tuple], input_magnitude: torch.Tensor):
    """Both functions through ``x · z`` or ``x / z`` (``stage``'s rule has ``fixed_factor_product``
    "Mul" or "Div"; it reads ``sources``' functions with concrete ``bounds``) where one factor ``z`` (the divisor for Div)
    lies in ``[m − r, m + r]`` with ``r ≤`` :data:`POINT_FACTOR_WIDTH` ``· |m|`` in every domain
    (a Div's ``z`` away from 0, read as ``x · (1/z)`` with ``1/z``'s interval rounded outwards)
    and ``x`` has the output's shape; None otherwise (the caller takes the product's interval).

    ``x·z = m·x + x·(z − m)`` with ``|x·(z − m)| ≤ X·r`` (``X``: the larger magnitude of x's
    bounds), and each side of ``m·x`` is m times the side of x its sign asks for
    (:func:`scaled`)."""
    kind = getattr(stage.rule, "fixed_factor_product", None)  # the rule says whether it is such a product
    if kind is None or any(getattr(f, "columns", None) is not None for f in sources):
        return None
    out_shape = tuple(stage.out_shape)
    for k in ((1, 0) if kind == "Mul" else (1,)):  # which source may be the fixed factor z
        x, (zl, zu) = sources[1 - k], bounds[k]
        if tuple(x.c_lo.shape[1:]) != out_shape:
            continue
        u = _unit(zl.dtype)
        if kind == "Div":
            if not bool(((zl > 0) | (zu < 0)).all()):
                return None
            ql, qu = 1 / zu, 1 / zl  # 1/z is decreasing on each side of 0
            zl, zu = ql - 4 * u * ql.abs(), qu + 4 * u * qu.abs()
        m = (zl + zu) / 2
        r = torch.maximum(zu - m, m - zl) * (1 + 4 * u)
        if bool((r <= POINT_FACTOR_WIDTH * m.abs()).all()):
            # z's shape right-aligned against the output's (numpy broadcasting per sample)
            m, r = (t.reshape(t.shape[0], *(1,) * (len(out_shape) + 1 - t.dim()), *t.shape[1:]).expand(-1, *out_shape)
                    for t in (m, r))
            xl, xu = bounds[1 - k]
            return scaled(x, m, torch.maximum(xl.abs(), xu.abs()) * r * (1 + 4 * u), input_magnitude)
    return None


def scaled(f, m: torch.Tensor, spread: torch.Tensor, input_magnitude: torch.Tensor):
    """``m · f`` element-wise (``m``: (B, *shape); ``f``'s coefficients (B, n, *shape) on n inputs
    of magnitude ``input_magnitude`` (B, n)), each side widened by ``spread``: for m ≥ 0 each
    side is m times the same side of f, for m < 0 the other side. The budgets take the rounding
    of the products ``m·a`` and ``m·c`` (4u of their magnitudes over the domain) and of their own
    sum, as the forward pass charges a ReLU's slopes."""
    u = _unit(m.dtype)
    rising = m >= 0
    magnitude = m.abs()

    def side(same, other):
        a = torch.where(rising.unsqueeze(1), same[0], other[0])
        c = torch.where(rising, same[1], other[1])
        e = torch.where(rising, same[2], other[2])
        batch, n = a.shape[:2]  # Σ_j |a_j|·max|x_j| per element, as one batched product
        coefficients = torch.bmm(input_magnitude.unsqueeze(1), a.abs().reshape(batch, n, -1)).reshape(c.shape)
        budget = (e * magnitude * (1 + 2 * u) + 4 * u * magnitude * (coefficients + c.abs()) + spread) * (1 + 4 * u)
        return a * m.unsqueeze(1), c * m, budget

    low, high = (f.a_lo, f.c_lo, f.e_lo), (f.a_hi, f.c_hi, f.e_hi)
    return type(f)(*side(low, high), *side(high, low))


def _unit(dtype: torch.dtype) -> float:
    return float(torch.finfo(dtype).eps) / 2.0
