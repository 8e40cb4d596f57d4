"""H-polytopes {x : A x ≤ b} over flat inputs, and their sound bounding boxes."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from assay._lp import linprog
from assay.errors import DataError, SpecError
from assay.sets.box import Box, as_float64

__all__ = ["HPolytope"]

# HiGHS stops at its feasibility tolerances (1e-7 by default); we ask for 1e-9 and then widen each
# LP bound outwards by far more than that (relative to the bound's magnitude, plus an absolute
# floor), so the returned box contains the polytope for well-scaled constraints (entries of A
# and b of order 1e-3 … 1e3).
_LP_TOLERANCE = 1e-9
_RELATIVE_MARGIN = 1e-7
_ABSOLUTE_MARGIN = 1e-7
_HIGHS_OPTIONS = {"primal_feasibility_tolerance": _LP_TOLERANCE, "dual_feasibility_tolerance": _LP_TOLERANCE}

# scipy.optimize.linprog's status codes.
_OPTIMAL, _INFEASIBLE, _UNBOUNDED = 0, 2, 3


@dataclass(frozen=True, eq=False)
class HPolytope:
    """The closed polytope {x ∈ R^n : A x ≤ b} over flat inputs; A (m, n) and b (m,) float64.

    The polytope may be empty or unbounded as a value; :meth:`bounding_box` reports either.
    Raises SpecError for shapes that do not fit, DataError for non-finite entries.
    """

    A: torch.Tensor
    b: torch.Tensor

    def __post_init__(self):
        A = as_float64(self.A, "the polytope's A")
        b = as_float64(self.b, "the polytope's b").reshape(-1)
        if A.dim() != 2 or A.shape[0] != b.shape[0] or A.shape[1] == 0:
            raise SpecError(
                f"a polytope needs A of shape (m, n ≥ 1) and b of shape (m,); got {tuple(A.shape)} and {tuple(b.shape)}"
            )
        if not (torch.isfinite(A).all() and torch.isfinite(b).all()):
            raise DataError("the polytope's A and b must be finite numbers (no NaN or inf); drop or fix those rows")
        object.__setattr__(self, "A", A)
        object.__setattr__(self, "b", b)

    @property
    def dim(self) -> int:
        """The number of input variables n."""
        return self.A.shape[1]

    @property
    def num_constraints(self) -> int:
        return self.A.shape[0]

    @classmethod
    def from_box(cls, box: Box) -> "HPolytope":
        """The box as 2n constraints ``x ≤ upper`` and ``−x ≤ −lower`` over its flattened elements."""
        if not (torch.isfinite(box.lower).all() and torch.isfinite(box.upper).all()):
            raise SpecError("only a box with finite bounds can be written as a polytope A x ≤ b")
        eye = torch.eye(box.dim, dtype=torch.float64)
        return cls(torch.cat([eye, -eye]), torch.cat([box.upper.reshape(-1), -box.lower.reshape(-1)]))

    def contains(self, x, tol: float = 0.0):
        """Whether x satisfies every row within ``tol`` (A x ≤ b + tol).

        Args:
            x: one point (n,) or a batch (N, n).
        Returns:
            a bool for one point, a (N,) bool tensor for a batch.
        """
        x = as_float64(x, "the points")
        if x.dim() not in (1, 2) or x.shape[-1] != self.dim:
            raise DataError(f"points of shape {tuple(x.shape)} do not fit a polytope over {self.dim} inputs; pass ({self.dim},) or (N, {self.dim})")
        inside = ((x.reshape(-1, self.dim) @ self.A.T - self.b) <= tol).all(1)
        return bool(inside[0]) if x.dim() == 1 else inside

    def bounding_box(self) -> Box:
        """The smallest box containing the polytope, widened outwards so that it is sound.

        Solves one feasibility LP and 2n bound LPs with HiGHS (scipy.optimize.linprog). LP
        solutions carry the solver's tolerance, so every bound is moved outwards by
        1e-7·|bound| + 1e-7: the box contains the polytope (for well-scaled A and b), at the
        price of being that much looser than the exact one.

        Raises:
            SpecError: the polytope is empty or unbounded (naming the unbounded input), or an LP failed.
        """
        A, b = self.A.numpy(), self.b.numpy()
        free = [(None, None)] * self.dim
        feasibility = linprog(np.zeros(self.dim), A_ub=A, b_ub=b, bounds=free, method="highs", options=_HIGHS_OPTIONS)
        if feasibility.status == _INFEASIBLE:
            raise SpecError("the polytope is empty: its constraints A x ≤ b have no common solution; check the signs of A and b")
        lower, upper = np.empty(self.dim), np.empty(self.dim)
        for j in range(self.dim):
            lower[j] = self._extreme(A, b, j, sign=1.0)
            upper[j] = -self._extreme(A, b, j, sign=-1.0)
        margin = _RELATIVE_MARGIN * np.maximum(np.abs(lower), np.abs(upper)) + _ABSOLUTE_MARGIN
        return Box(torch.as_tensor(lower - margin), torch.as_tensor(upper + margin))

    def _extreme(self, A: np.ndarray, b: np.ndarray, j: int, sign: float) -> float:
        """min over the polytope of sign·x_j."""
        objective = np.zeros(self.dim)
        objective[j] = sign
        result = linprog(objective, A_ub=A, b_ub=b, bounds=[(None, None)] * self.dim, method="highs", options=_HIGHS_OPTIONS)
        if result.status == _UNBOUNDED:
            side = "below" if sign > 0 else "above"
            raise SpecError(f"the polytope is unbounded: input {j} is not bounded {side}; add a constraint bounding it")
        if result.status == _INFEASIBLE:
            raise SpecError("the polytope is empty: its constraints A x ≤ b have no common solution; check the signs of A and b")
        if result.status != _OPTIMAL:
            raise SpecError(f"the LP bounding input {j} of the polytope failed ({result.message}); rescale A and b")
        return float(result.fun)

    def to_json(self) -> dict:
        return {"A": self.A.tolist(), "b": self.b.tolist()}

    def __repr__(self) -> str:
        return f"HPolytope(dim={self.dim}, constraints={self.num_constraints})"
