"""Reading the ``alpha`` argument of :meth:`ElementwiseRule.relax` the same way in every rule."""

from __future__ import annotations

import torch

__all__ = ["split_alpha"]


def split_alpha(alpha, lower: torch.Tensor, upper: torch.Tensor):
    """``(alpha_lower, alpha_upper, lower, upper)`` from ``relax``'s arguments.

    ``alpha`` is None or a pair (lower line's, upper line's), either entry None (that side takes
    its default). Where a given alpha has one more dimension than the bounds — α-CROWN's
    per-row slopes, ``(B, S, *shape)`` against ``(B, *shape)`` — the bounds get a row dimension
    ``(B, 1, *shape)`` so that everything broadcasts to the rows.
    """
    alpha_lower, alpha_upper = (None, None) if alpha is None else alpha
    given = [a for a in (alpha_lower, alpha_upper) if a is not None]
    if given and max(a.dim() for a in given) > lower.dim():
        lower, upper = lower.unsqueeze(1), upper.unsqueeze(1)
    return alpha_lower, alpha_upper, lower, upper
