"""The sum of two tensors (a residual connection) and its rules."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from assay.bounds.linear_functions import LinearFunctions
from assay.bounds.rounding import unit_roundoff
from assay.bounds.stages.base import Stage


@dataclass(frozen=True, eq=False)
class AddStage(Stage):
    """``y = a + b`` for two earlier tensors of one shape (a residual connection)."""

    index: int
    shape: tuple[int, ...]
    sources: tuple[int, ...] = ()

    windowed: ClassVar[bool] = True

    def window(self, sources):
        """The union of both summands' windows (None where their strides differ)."""
        out = sources[0]
        for other in sources[1:]:
            if any(x.stride != y.stride for x, y in zip(out, other)):
                return None
            out = tuple(type(x)(x.stride, min(x.lo, y.lo), max(x.hi, y.hi)) for x, y in zip(out, other))
        return out

    def interval(self, bounds, delta: float = 0.0):
        return add_interval(*bounds[self.sources[0]], *bounds[self.sources[1]])

    def crown_step(self, walk, position: int, A: torch.Tensor) -> None:
        _cross_add(walk, position, self, A)

    def forward_step(self, state, position: int):
        return _add(state.functions[self.sources[0]], state.functions[self.sources[1]], state.input_magnitude)

    def backward_magnitude(self, G: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return (G, G)

    def forward_magnitude(self, values) -> torch.Tensor:
        return values[0] + values[1]

    def linear_form(self, forms):
        (coef, offset), (other_coef, other_offset) = forms
        return coef + other_coef, offset + other_offset


def add_interval(lower_a, upper_a, lower_b, upper_b) -> tuple[torch.Tensor, torch.Tensor]:
    """[a] + [b], widened by the rounding of one addition (u · magnitude per element)."""
    lower, upper = lower_a + lower_b, upper_a + upper_b
    u = unit_roundoff(lower.dtype)
    return lower - 2 * u * lower.abs(), upper + 2 * u * upper.abs()


def _cross_add(walk, position: int, stage: AddStage, A: torch.Tensor) -> None:
    if walk.rounding:
        walk.error = walk.settle(position + 1, A, None)
    for source in stage.sources:
        walk.send(source, A)


def _add(f: LinearFunctions, g: LinearFunctions, input_magnitude) -> LinearFunctions:
    """The sum of two tensors' linear functions (a residual connection).

    The computed coefficient and constant sums are each within u·|sum| of the exact ones, so the
    budgets grow by 4u times both magnitudes (generous for the budgets' own rounding).
    """
    u = unit_roundoff(f.c_lo.dtype)
    rounding = 4 * u * (f.magnitude(input_magnitude) + g.magnitude(input_magnitude))
    a_lo = f.a_lo + g.a_lo
    a_hi = a_lo if f.shared and g.shared else f.a_hi + g.a_hi
    return LinearFunctions(a_lo, f.c_lo + g.c_lo, (f.e_lo + g.e_lo) * (1 + 4 * u) + rounding,
                            a_hi, f.c_hi + g.c_hi, (f.e_hi + g.e_hi) * (1 + 4 * u) + rounding)
