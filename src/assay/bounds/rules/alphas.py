"""Reading the ``alpha`` argument of :meth:`ElementwiseRule.relax` the same way in every rule."""

from __future__ import annotations

import torch

__all__ = ["split_alpha"]


def split_alpha(alpha, lower: torch.Tensor, upper: torch.Tensor):
    """``(alpha_lower, alpha_upper, lower, upper)`` from ``relax``'s arguments.

    ``alpha`` is None or a pair (lower line's, upper line's), either entry None (that side takes
    its default). Where a given alpha has one more dimension than the bounds — α-CROWN's
    per-row slopes, ``(B, S, *shape)`` against ``(B, *shape)`` — the bounds get a row dimension
    ``(B, 1, *shape)`` so that everything broadcasts to the rows. A NaN alpha reads as 0.5.
    """
    alpha_lower, alpha_upper = (None, None) if alpha is None else alpha
    # any alpha is sound, NaN (a diverged optimisation) included: it counts as the middle
    alpha_lower, alpha_upper = (None if a is None else a.nan_to_num(0.5) for a in (alpha_lower, alpha_upper))
    given = [a for a in (alpha_lower, alpha_upper) if a is not None]
    if given and max(a.dim() for a in given) > lower.dim():
        lower, upper = lower.unsqueeze(1), upper.unsqueeze(1)
    return alpha_lower, alpha_upper, lower, upper
