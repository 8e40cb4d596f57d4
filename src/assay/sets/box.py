"""Axis-aligned boxes of inputs: the input sets of every analysis."""

from __future__ import annotations

import operator
from dataclasses import dataclass

import numpy as np
import torch

from assay.errors import DataError, SpecError

__all__ = ["Box"]


def as_float64(values, what: str) -> torch.Tensor:
    """A detached float64 tensor copy of ``values`` (numbers, lists, numpy or torch).

    Raises DataError naming ``what`` when the values are not numeric or ragged.
    """
    try:
        if torch.is_tensor(values):
            tensor = values.detach()
        else:
            tensor = torch.as_tensor(np.asarray(values, dtype=np.float64))
    except (TypeError, ValueError) as exc:
        raise DataError(f"{what} must be numbers (a list, numpy array or tensor): {exc}") from exc
    return tensor.to(device="cpu", dtype=torch.float64).clone()


def _as_index(value, what: str) -> int:
    """``value`` as a Python int (numpy ints accepted, bools and floats rejected)."""
    try:
        if isinstance(value, bool):
            raise TypeError
        return operator.index(value)
    except TypeError:
        raise SpecError(f"{what} must be an integer; got {value!r}") from None


def _flat_position(index: int, shape: tuple[int, ...]) -> str:
    """Element ``index`` of the flattened shape as a readable position, e.g. ``element 7 (index (1, 3))``."""
    if len(shape) <= 1:
        return f"element {index}"
    return f"element {index} (index {tuple(int(i) for i in np.unravel_index(index, shape))})"


@dataclass(frozen=True, eq=False)
class Box:
    """The closed set {x : lower ≤ x ≤ upper} (elementwise, any shape), stored as float64 tensors.

    ``lower`` and ``upper`` may be numbers, nested lists, numpy arrays or tensors; they are copied
    to CPU float64 (so later edits of the caller's arrays cannot change the box). Infinite bounds
    are allowed (an unbounded box) but :meth:`sample` refuses them.

    Raises:
        DataError: non-numeric or NaN bounds.
        SpecError: lower and upper of different shapes, or some lower > upper (an empty box).
    """

    lower: torch.Tensor
    upper: torch.Tensor

    def __post_init__(self):
        lower = as_float64(self.lower, "the box's lower bounds")
        upper = as_float64(self.upper, "the box's upper bounds")
        if lower.shape != upper.shape:
            raise SpecError(
                f"a box needs lower and upper bounds of one shape; got {tuple(lower.shape)} and {tuple(upper.shape)}: "
                "give one bound per element"
            )
        for name, bound in (("lower", lower), ("upper", upper)):
            if torch.isnan(bound).any():
                index = int(torch.isnan(bound).reshape(-1).nonzero()[0])
                raise DataError(f"the box's {name} bound of {_flat_position(index, tuple(bound.shape))} is NaN; give every element a number")
        if (lower > upper).any():
            index = int((lower > upper).reshape(-1).nonzero()[0])
            raise SpecError(
                f"the box is empty: {_flat_position(index, tuple(lower.shape))} has lower bound "
                f"{lower.reshape(-1)[index].item()!r} above its upper bound {upper.reshape(-1)[index].item()!r}; swap or fix them"
            )
        object.__setattr__(self, "lower", lower)
        object.__setattr__(self, "upper", upper)

    @classmethod
    def from_checked(cls, lower: torch.Tensor, upper: torch.Tensor) -> Box:
        """A box of float64 CPU tensors that the caller has already checked (one shape, no NaN,
        ``lower ≤ upper``) and that nothing else writes to: no copy and no check (a reader that
        checks the bounds of thousands of boxes at once in one array)."""
        box = object.__new__(cls)
        object.__setattr__(box, "lower", lower)
        object.__setattr__(box, "upper", upper)
        return box

    # ------------------------------------------------------------------ properties
    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.lower.shape)

    @property
    def dim(self) -> int:
        """The number of elements (the product of ``shape``)."""
        return self.lower.numel()

    @property
    def center(self) -> torch.Tensor:
        return (self.lower + self.upper) / 2

    @property
    def width(self) -> torch.Tensor:
        """upper − lower, elementwise."""
        return self.upper - self.lower

    @property
    def radius(self) -> torch.Tensor:
        """Half the width: the ℓ∞ radius around :attr:`center` per element."""
        return self.width / 2

    # ------------------------------------------------------------------ constructors
    @classmethod
    def around(cls, center, epsilon, lower=None, upper=None) -> "Box":
        """The ℓ∞ ball {x : |x − center| ≤ epsilon} clipped to the domain [lower, upper] when given.

        Args:
            center: the ball's center (any shape).
            epsilon: a radius ≥ 0, a number or an array broadcastable to ``center`` (per element).
            lower, upper: optional domain bounds (numbers or arrays broadcastable to ``center``).
        Raises:
            SpecError: a negative or NaN epsilon, or a center farther than epsilon outside the domain
                (the clipped ball would be empty).
        """
        center = as_float64(center, "the center")
        radius = as_float64(epsilon, "epsilon")
        if torch.isnan(radius).any() or (radius < 0).any():
            raise SpecError(f"epsilon must be ≥ 0; got {epsilon!r}")
        try:
            low, high = center - radius, center + radius
            if lower is not None:
                low = torch.maximum(low, as_float64(lower, "the domain's lower bounds").expand_as(low))
            if upper is not None:
                high = torch.minimum(high, as_float64(upper, "the domain's upper bounds").expand_as(high))
        except RuntimeError as exc:
            raise SpecError(f"epsilon and the domain bounds must broadcast to the center's shape {tuple(center.shape)}: {exc}") from exc
        if (low > high).any():
            index = int((low > high).reshape(-1).nonzero()[0])
            value = center.reshape(-1)[index].item()
            raise SpecError(
                f"the center's {_flat_position(index, tuple(center.shape))} (value {value!r}) lies farther than epsilon "
                "outside the domain [lower, upper], so the clipped ball is empty; move the center into the domain"
            )
        return cls(low, high)

    # ------------------------------------------------------------------ operations
    def contains(self, x, tol: float = 0.0):
        """Whether x lies in the box, widened by ``tol`` on every side.

        Args:
            x: one point of shape :attr:`shape`, or a batch of shape (N, *shape).
            tol: a slack ≥ 0 added to both sides (e.g. for rounding in a forward pass).
        Returns:
            a bool for one point; a (N,) bool tensor for a batch.
        """
        x = as_float64(x, "the points")
        if tuple(x.shape) == self.shape:
            return bool(((x >= self.lower - tol) & (x <= self.upper + tol)).all())
        if x.dim() != len(self.shape) + 1 or tuple(x.shape[1:]) != self.shape:
            raise DataError(f"points of shape {tuple(x.shape)} do not fit a box of shape {self.shape}; pass {self.shape} or (N, *{self.shape})")
        inside = (x >= self.lower - tol) & (x <= self.upper + tol)
        return inside.reshape(x.shape[0], -1).all(1)

    def sample(self, n: int, rng: np.random.Generator) -> torch.Tensor:
        """``n`` points drawn uniformly from the box: a float64 tensor (n, *shape), every point inside."""
        n = _as_index(n, "the number of samples")
        if n < 0:
            raise SpecError(f"the number of samples must be ≥ 0; got {n}")
        if not (torch.isfinite(self.lower).all() and torch.isfinite(self.upper).all()):
            raise SpecError("cannot sample uniformly from an unbounded box; give every element finite bounds")
        u = torch.as_tensor(rng.uniform(size=(n, *self.shape)), dtype=torch.float64)
        # lower + width·u can round just past upper; clamping keeps every sample in the box.
        return torch.minimum(torch.maximum(self.lower + self.width * u, self.lower), self.upper)

    def split(self, dim: int, at: float | None = None) -> tuple["Box", "Box"]:
        """Two boxes that cover this one, cut along flat element ``dim`` at ``at`` (default: its midpoint).

        Both halves contain the cut (closed boxes), so their union is exactly this box.
        """
        dim = _as_index(dim, "the split element")
        if not 0 <= dim < self.dim:
            raise SpecError(f"cannot split along element {dim}: the box has {self.dim} elements (0 … {self.dim - 1})")
        flat_lower, flat_upper = self.lower.reshape(-1), self.upper.reshape(-1)
        low, high = flat_lower[dim].item(), flat_upper[dim].item()
        cut = (low + high) / 2 if at is None else float(at)
        if not low <= cut <= high:
            raise SpecError(f"the split point {cut!r} lies outside element {dim}'s range [{low!r}, {high!r}]")
        left_upper, right_lower = flat_upper.clone(), flat_lower.clone()
        left_upper[dim], right_lower[dim] = cut, cut
        return Box(self.lower, left_upper.reshape(self.shape)), Box(right_lower.reshape(self.shape), self.upper)

    def intersect(self, other: "Box") -> "Box":
        """The box of points in both boxes; SpecError if the shapes differ or the boxes are disjoint."""
        if not isinstance(other, Box):
            raise SpecError(f"a box can only be intersected with another Box; got {type(other).__name__}")
        if other.shape != self.shape:
            raise SpecError(f"cannot intersect boxes of shapes {self.shape} and {other.shape}; reshape one first")
        lower, upper = torch.maximum(self.lower, other.lower), torch.minimum(self.upper, other.upper)
        if (lower > upper).any():
            index = int((lower > upper).reshape(-1).nonzero()[0])
            raise SpecError(f"the boxes do not intersect: their ranges of {_flat_position(index, self.shape)} are disjoint")
        return Box(lower, upper)

    def reshape(self, *shape) -> "Box":
        """The same box with its elements arranged in ``shape`` (same element count; row-major)."""
        shape = tuple(shape[0]) if len(shape) == 1 and isinstance(shape[0], (tuple, list, torch.Size)) else shape
        try:
            return Box(self.lower.reshape(shape), self.upper.reshape(shape))
        except RuntimeError as exc:
            raise SpecError(f"cannot reshape a box of shape {self.shape} ({self.dim} elements) to {shape}") from exc

    def to_json(self) -> dict:
        """``{"shape": [...], "lower": nested list, "upper": nested list}`` (infinite bounds become ±inf floats)."""
        return {"shape": list(self.shape), "lower": self.lower.tolist(), "upper": self.upper.tolist()}

    def __repr__(self) -> str:
        widest = self.width.max().item() if self.dim else 0.0
        return f"Box(shape={self.shape}, max width {widest:.3g})"
