"""The linear functions that forward linear bounds carry per tensor (:mod:`assay.bounds.forward`).

Each element of a tensor has a lower and an upper linear function of the input (coefficients,
constants and error budgets, see :class:`LinearFunctions`); every stage kind maps them through
itself (its ``forward_step``, :mod:`assay.bounds.stages`). A leaf module: the stages and the
forward pass both import it.
"""

from __future__ import annotations

import torch


def contract(a: torch.Tensor, v: torch.Tensor, columns=None) -> torch.Tensor:
    """``Σ_j a[:, j, …] · v[:, j]``: coefficients (B, n, *shape) against a vector (B, n) per domain,
    giving (B, *shape), as one batched matrix product. Each entry is a sum of n products, as in the
    element-wise form it replaces, so the same rounding bounds (any order, Higham §3.1) cover it;
    with few inputs it is far faster than reducing the small input dimension of a large tensor.
    With ``columns`` (a :class:`~assay.bounds.forward_columns.ColumnMap`), ``a`` holds grouped
    columns (B, G, *shape) and the contraction reads each group's member (same products)."""
    if columns is not None:
        return columns.contract(a, v)
    batch, n = a.shape[:2]
    return torch.bmm(v.unsqueeze(1), a.reshape(batch, n, -1)).reshape(batch, *a.shape[2:])


class LinearFunctions:
    """Coefficients (B, n_in, *shape), constants (B, *shape) and error budgets of both sides;
    with ``columns`` (a :class:`~assay.bounds.forward_columns.ColumnMap`) the coefficients are
    grouped columns (B, G, *shape) instead (see :mod:`assay.bounds.forward_columns`)."""

    def __init__(self, a_lo, c_lo, e_lo, a_hi, c_hi, e_hi, columns=None):
        self.a_lo, self.c_lo, self.e_lo = a_lo, c_lo, e_lo
        self.a_hi, self.c_hi, self.e_hi = a_hi, c_hi, e_hi
        self.columns = columns

    @property
    def shared(self) -> bool:
        """Both sides have the same coefficient tensor (one object): maps compute it once."""
        return self.a_lo is self.a_hi

    def magnitude(self, input_magnitude: torch.Tensor, absolute: torch.Tensor | None = None) -> torch.Tensor:
        """≥ |a·x| + |c| of both sides over the domain: (B, *shape). ``absolute``: ``|a|`` of a
        shared coefficient tensor if the caller has it. Remembered for the same tensors (the
        stage that reads a ReLU's input asks again after its concretisation did)."""
        key = (input_magnitude, self.a_lo, self.a_hi, self.c_lo, self.c_hi)
        memo = getattr(self, "_magnitude", None)
        if memo is not None and all(x is y for x, y in zip(memo[0], key)):
            return memo[1]
        if absolute is None:
            absolute = self.a_lo.abs() if self.shared else torch.maximum(self.a_lo.abs(), self.a_hi.abs())
        value = contract(absolute, input_magnitude, self.columns) + torch.maximum(self.c_lo.abs(), self.c_hi.abs())
        self._magnitude = (key, value)
        return value

    def padded(self, n: int) -> LinearFunctions:
        """The same functions over ``n`` columns: zero coefficients on the columns added after
        the present ones (error symbols introduced downstream of this tensor)."""
        extra = n - self.a_lo.shape[1]
        if extra <= 0:
            return self
        pad = lambda a: torch.cat([a, a.new_zeros(a.shape[0], extra, *a.shape[2:])], 1)  # noqa: E731
        a_lo = pad(self.a_lo)
        a_hi = a_lo if self.shared else pad(self.a_hi)
        return LinearFunctions(a_lo, self.c_lo, self.e_lo, a_hi, self.c_hi, self.e_hi, self.columns)


def constant_functions(low: torch.Tensor, high: torch.Tensor, n: int) -> LinearFunctions:
    """Constant functions ``low ≤ z ≤ high`` (no coefficient on the input): (B, *shape) bounds."""
    zeros = torch.zeros(low.shape[0], n, *low.shape[1:], dtype=low.dtype)
    nothing = torch.zeros_like(low)
    return LinearFunctions(zeros, low, nothing, zeros, high, nothing)
