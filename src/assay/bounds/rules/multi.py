"""What the rules of multi-input operators share: broadcasting coefficients back to an input,
exact interval products, and the trivial bound for rows whose arithmetic left the floats.

Every function here is sound in floating point in the sense of :mod:`assay.bounds.rules.base`:
intervals are widened for their own rounding, and :func:`settled` never lets a row with a
non-finite number through as anything but the trivial bound ``−inf``.
"""

from __future__ import annotations

import torch

from assay.bounds.plan import gamma
from assay.bounds.rules.base import Crossing

__all__ = ["parameter", "aligned_bounds", "sum_to", "product_corners", "interval_sum", "settled", "gamma", "underflow"]


def underflow(dtype: torch.dtype) -> float:
    """An absolute bound, with room to spare, on what one rounding near 0 (a product or a sum
    falling into the subnormals) can lose: the smallest normal number."""
    return float(torch.finfo(dtype).tiny)


def parameter(alpha, index: int, A: torch.Tensor, default: float) -> torch.Tensor:
    """The rule's ``index``-th optimisable parameter, clamped to [0, 1] (any value there is
    sound), with ``A``'s number of dimensions: ``(B, S, *out)`` given per row, ``(B, 1, *out)``
    given per output ``(B, *out)``, ones in front of anything shorter; ``default`` (a scalar)
    where ``alpha`` is None."""
    if alpha is None:
        return torch.full((1,) * A.dim(), default, dtype=A.dtype, device=A.device)
    a = alpha[index].to(A.dtype).clamp(0.0, 1.0)
    if a.dim() == A.dim() - 1:  # per output, shared by the rows
        return a.unsqueeze(1)
    return a.reshape(*(1,) * (A.dim() - a.dim()), *a.shape)


def aligned_bounds(inputs) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """The ``(lower, upper)`` pairs of ``inputs`` with unit dimensions inserted after the batch so
    that every pair has the rank of the highest-rank input (numpy broadcasting of the samples, as
    :func:`assay.nn.ops.arith.aligned` does for the forward pass)."""
    rank = max(lower.dim() for lower, _ in inputs)

    def lift(x):
        return x.reshape(x.shape[0], *(1,) * (rank - x.dim()), *x.shape[1:])

    return [(lift(lower), lift(upper)) for lower, upper in inputs]


def sum_to(coefficients: torch.Tensor, aligned_shape, shape) -> torch.Tensor:
    """Coefficients of rows ``(B, S, *out)`` on a broadcast input: summed over the dimensions the
    input was broadcast along (its ``aligned_shape`` has 1 where ``out`` does not), then
    reshaped to the input's own sample ``shape`` → ``(B, S, *shape)``."""
    dims = [d + 2 for d, (size, out) in enumerate(zip(aligned_shape, coefficients.shape[2:])) if size == 1 and out != 1]
    if dims:
        coefficients = coefficients.sum(dim=dims, keepdim=True)
    return coefficients.reshape(coefficients.shape[0], coefficients.shape[1], *shape)


def product_corners(xl, xu, zl, zu) -> tuple[torch.Tensor, torch.Tensor]:
    """The smallest and largest of the four corner products ``x·z`` (computed, not yet widened).

    A corner ``0·(±inf)`` counts as 0: along the edge where the bounded factor is exactly 0 the
    product is 0, and the values near that corner are covered by the other corners."""
    corners = torch.stack([xl * zl, xl * zu, xu * zl, xu * zu])
    corners = torch.nan_to_num(corners, nan=0.0, posinf=torch.inf, neginf=-torch.inf)
    return corners.amin(0), corners.amax(0)


def interval_sum(lo: torch.Tensor, hi: torch.Tensor, dim: int | None, products: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    """``[Σ lo, Σ hi]`` over ``dim`` (None: no sum) of terms that are each the rounded result of
    ``products`` roundings (1 for a product of two floats), widened so that it holds the sum of
    the exact terms: the error is at most γ_{n+products} of the sum of magnitudes, plus an
    underflow allowance per term. A computed ``+inf`` lower end (overflow) becomes the largest
    float, a ``−inf`` upper end the most negative; NaN (inf − inf) becomes unbounded."""
    dtype = lo.dtype
    n = 1 if dim is None else lo.shape[dim]

    def total(t):
        return t if dim is None else t.sum(dim)

    g = gamma(n + products, dtype)
    low, high = total(lo), total(hi)
    low = low - g * total(lo.abs()) - n * underflow(dtype) * 4
    high = high + g * total(hi.abs()) + n * underflow(dtype) * 4
    big = torch.finfo(dtype).max
    # (nan_to_num's own default would turn the infinite ends into the largest floats)
    low = torch.where(low == torch.inf, torch.full_like(low, big), low)
    low = torch.where(torch.isnan(low), torch.full_like(low, -torch.inf), low)
    high = torch.where(high == -torch.inf, torch.full_like(high, -big), high)
    high = torch.where(torch.isnan(high), torch.full_like(high, torch.inf), high)
    return low, high


def settled(coefficients, offset: torch.Tensor, rounding: torch.Tensor) -> Crossing:
    """A :class:`Crossing`, where every row with a non-finite coefficient or rounding, or a NaN
    or ``+inf`` offset, becomes the trivial bound (coefficients 0, offset ``−inf``, rounding 0),
    and a row whose offset is ``−inf`` keeps it (its bound is ``−inf`` whatever the rest)."""
    bad = ~torch.isfinite(rounding) | torch.isnan(offset) | (offset == torch.inf)
    for c in coefficients:
        bad = bad | ~torch.isfinite(c).reshape(c.shape[0], c.shape[1], -1).all(-1)
    unbounded = bad | (offset == -torch.inf)
    kept = []
    for c in coefficients:
        mask = unbounded.reshape(*unbounded.shape, *(1,) * (c.dim() - 2))
        kept.append(torch.where(mask, torch.zeros_like(c), c))
    offset = torch.where(unbounded, torch.full_like(offset, -torch.inf), offset)
    rounding = torch.where(unbounded, torch.zeros_like(rounding), rounding)
    return Crossing(tuple(kept), offset, rounding)
