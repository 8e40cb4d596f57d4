"""H-polytopes {x : A x ≤ b} over flat inputs."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from scipy.optimize import linprog

from assay.errors import SpecError
from assay.sets.box import Box, as_float64

__all__ = ["HPolytope"]

# LP solutions carry the solver's tolerance: bounding boxes are widened by this much (relative
# to the magnitude of the bound, plus an absolute floor) so that they contain the polytope.
_RELATIVE_MARGIN = 1e-6
_ABSOLUTE_MARGIN = 1e-6


@dataclass(frozen=True, eq=False)
class HPolytope:
    """{x ∈ R^n : A x ≤ b}; A (m, n), b (m,), float64."""

    A: torch.Tensor
    b: torch.Tensor

    def __post_init__(self):
        A, b = as_float64(self.A, "the polytope's A"), as_float64(self.b, "the polytope's b").reshape(-1)
        if A.dim() != 2 or A.shape[0] != b.shape[0]:
            raise SpecError(f"a polytope needs A of shape (m, n) and b of shape (m,); got {tuple(A.shape)} and {tuple(b.shape)}")
        if not (torch.isfinite(A).all() and torch.isfinite(b).all()):
            raise SpecError("the polytope's A and b must be finite numbers")
        object.__setattr__(self, "A", A)
        object.__setattr__(self, "b", b)

    @property
    def dim(self) -> int:
        return self.A.shape[1]

    @classmethod
    def from_box(cls, box: Box) -> "HPolytope":
        n = box.dim
        eye = torch.eye(n, dtype=torch.float64)
        return cls(torch.cat([eye, -eye]), torch.cat([box.upper.reshape(-1), -box.lower.reshape(-1)]))

    def contains(self, x, tol: float = 0.0):
        x = as_float64(x, "the points")
        single = x.dim() == 1
        values = x.reshape(-1, self.dim) @ self.A.T - self.b
        inside = (values <= tol).all(1)
        return bool(inside[0]) if single else inside

    def bounding_box(self) -> Box:
        """The smallest box containing the polytope, by 2n LPs (HiGHS), widened outwards for the
        LP tolerance. SpecError if the polytope is empty or unbounded."""
        n = self.dim
        A, b = self.A.numpy(), self.b.numpy()
        lower, upper = np.empty(n), np.empty(n)
        for j in range(n):
            for sign, out in ((1.0, lower), (-1.0, upper)):
                c = np.zeros(n)
                c[j] = sign
                result = linprog(c, A_ub=A, b_ub=b, bounds=[(None, None)] * n, method="highs")
                if result.status == 2:
                    raise SpecError("the polytope is empty (its constraints A x ≤ b have no solution)")
                if result.status == 3:
                    raise SpecError(f"the polytope is unbounded along input {j}; add bounds on every input")
                if result.status != 0:
                    raise SpecError(f"the LP bounding input {j} failed: {result.message}")
                out[j] = sign * result.fun
        margin = _RELATIVE_MARGIN * np.maximum(np.abs(lower), np.abs(upper)) + _ABSOLUTE_MARGIN
        return Box(torch.as_tensor(lower - margin), torch.as_tensor(upper + margin))
