"""Axis-aligned boxes of inputs: the input sets of every analysis."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from assay.errors import DataError, SpecError

__all__ = ["Box"]


def as_float64(values, what: str) -> torch.Tensor:
    """A float64 tensor copy of ``values`` (numbers, lists, numpy or torch); DataError if not numeric."""
    try:
        tensor = torch.as_tensor(np.asarray(values, dtype=np.float64) if not torch.is_tensor(values) else values)
    except (TypeError, ValueError) as exc:
        raise DataError(f"{what} must be numeric: {exc}") from exc
    return tensor.to(torch.float64).clone()


@dataclass(frozen=True, eq=False)
class Box:
    """The set {x : lower ≤ x ≤ upper} (elementwise, any shape), stored in float64.

    Raises DataError for NaN bounds and SpecError for mismatched shapes or lower > upper.
    """

    lower: torch.Tensor
    upper: torch.Tensor

    def __post_init__(self):
        lower, upper = as_float64(self.lower, "the box's lower bounds"), as_float64(self.upper, "the box's upper bounds")
        if lower.shape != upper.shape:
            raise SpecError(f"a box needs lower and upper bounds of one shape; got {tuple(lower.shape)} and {tuple(upper.shape)}")
        if torch.isnan(lower).any() or torch.isnan(upper).any():
            raise DataError("the box has NaN bounds; give every element a number")
        if (lower > upper).any():
            index = int((lower > upper).reshape(-1).nonzero()[0])
            raise SpecError(
                f"the box is empty: element {index} has lower bound {lower.reshape(-1)[index].item()} above its upper "
                f"bound {upper.reshape(-1)[index].item()}"
            )
        object.__setattr__(self, "lower", lower)
        object.__setattr__(self, "upper", upper)

    # ------------------------------------------------------------------ properties
    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.lower.shape)

    @property
    def dim(self) -> int:
        """The number of elements."""
        return self.lower.numel()

    @property
    def center(self) -> torch.Tensor:
        return (self.lower + self.upper) / 2

    @property
    def width(self) -> torch.Tensor:
        return self.upper - self.lower

    @property
    def radius(self) -> torch.Tensor:
        return self.width / 2

    # ------------------------------------------------------------------ constructors
    @classmethod
    def around(cls, center, epsilon: float, lower=None, upper=None) -> "Box":
        """The ℓ∞ ball of radius ``epsilon`` around ``center``, clipped to [lower, upper] when given."""
        center = as_float64(center, "the center")
        if not epsilon >= 0:
            raise SpecError(f"epsilon must be ≥ 0; got {epsilon}")
        low, high = center - epsilon, center + epsilon
        if lower is not None:
            low = torch.maximum(low, as_float64(lower, "the domain's lower bounds").expand_as(low))
        if upper is not None:
            high = torch.minimum(high, as_float64(upper, "the domain's upper bounds").expand_as(high))
        return cls(low, high)

    # ------------------------------------------------------------------ operations
    def contains(self, x, tol: float = 0.0):
        """Whether x (of shape ``shape``, or a batch (N, *shape)) lies in the box (± tol)."""
        x = as_float64(x, "the points")
        inside = (x >= self.lower - tol) & (x <= self.upper + tol)
        if x.shape == self.lower.shape:
            return bool(inside.all())
        return inside.reshape(x.shape[0], -1).all(1)

    def sample(self, n: int, rng: np.random.Generator) -> torch.Tensor:
        """n uniform points in the box: (n, *shape)."""
        u = torch.as_tensor(rng.uniform(size=(n, *self.shape)))
        return self.lower + self.width * u

    def split(self, dim: int, at: float | None = None) -> tuple["Box", "Box"]:
        """Two boxes cut at ``at`` (default: the midpoint) along flat element ``dim``."""
        if not 0 <= dim < self.dim:
            raise SpecError(f"cannot split along element {dim}: the box has {self.dim} elements")
        flat_lower, flat_upper = self.lower.reshape(-1), self.upper.reshape(-1)
        cut = (flat_lower[dim] + flat_upper[dim]) / 2 if at is None else torch.tensor(float(at), dtype=torch.float64)
        if not flat_lower[dim] <= cut <= flat_upper[dim]:
            raise SpecError(f"split point {float(cut)} lies outside [{flat_lower[dim].item()}, {flat_upper[dim].item()}]")
        left_upper, right_lower = flat_upper.clone(), flat_lower.clone()
        left_upper[dim], right_lower[dim] = cut, cut
        return Box(self.lower, left_upper.reshape(self.shape)), Box(right_lower.reshape(self.shape), self.upper)

    def intersect(self, other: "Box") -> "Box":
        if other.shape != self.shape:
            raise SpecError(f"cannot intersect boxes of shapes {self.shape} and {other.shape}")
        lower, upper = torch.maximum(self.lower, other.lower), torch.minimum(self.upper, other.upper)
        if (lower > upper).any():
            raise SpecError("the boxes do not intersect")
        return Box(lower, upper)

    def reshape(self, *shape) -> "Box":
        shape = shape[0] if len(shape) == 1 and isinstance(shape[0], (tuple, list)) else shape
        try:
            return Box(self.lower.reshape(shape), self.upper.reshape(shape))
        except RuntimeError as exc:
            raise SpecError(f"cannot reshape a box of shape {self.shape} to {tuple(shape)}") from exc

    def to_json(self) -> dict:
        return {"lower": self.lower.tolist(), "upper": self.upper.tolist()}

    def __repr__(self) -> str:
        return f"Box(shape={self.shape}, width max {self.width.max().item() if self.dim else 0:.3g})"
