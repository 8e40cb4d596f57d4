"""Output specifications: half-spaces ``C·y + d ≥ 0``, conjunctions and disjunctions of them.

An :class:`OutputSpec` is a *region of outputs* — an OR of ANDs. Whether the region is what
must hold or what must not happen is the caller's choice, and it is always explicit at the
call site: ``verify(spec=...)`` (required region) versus ``verify(unsafe=...)`` (forbidden region,
e.g. a VNN-LIB query's ``unsafe_outputs``).
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import product

import torch

from assay.errors import SpecError
from assay.sets.box import as_float64

__all__ = [
    "HalfSpaces", "OutputSpec", "argmax_is", "output_at_least", "untargeted_robustness", "targeted_robustness",
    "any_of", "all_of", "negation_closure",
]


@dataclass(frozen=True, eq=False)
class HalfSpaces:
    """The conjunction of rows ``C_i · y + d_i ≥ 0`` (closed). C (m, n_out), d (m,), float64."""

    C: torch.Tensor
    d: torch.Tensor

    def __post_init__(self):
        C = as_float64(self.C, "the half-spaces' C")
        C = C.reshape(1, -1) if C.dim() == 1 else C
        d = as_float64(self.d, "the half-spaces' d").reshape(-1)
        if C.dim() != 2 or C.shape[0] != d.shape[0] or C.shape[0] == 0:
            raise SpecError(f"half-spaces need C of shape (m ≥ 1, n_out) and d of shape (m,); got {tuple(C.shape)}, {tuple(d.shape)}")
        if not (torch.isfinite(C).all() and torch.isfinite(d).all()):
            raise SpecError("the half-spaces' C and d must be finite numbers")
        object.__setattr__(self, "C", C)
        object.__setattr__(self, "d", d)

    @property
    def num_outputs(self) -> int:
        return self.C.shape[1]

    def contains(self, y):
        """y (n_out,) or (N, n_out) → bool / (N,) bool: every row ≥ 0."""
        y = as_float64(y, "the outputs")
        values = y.reshape(-1, self.num_outputs) @ self.C.T + self.d
        inside = (values >= 0).all(1)
        return bool(inside[0]) if y.dim() == 1 else inside

    def to_json(self) -> dict:
        return {"C": self.C.tolist(), "d": self.d.tolist()}


@dataclass(frozen=True, eq=False)
class OutputSpec:
    """The disjunction (OR) of its conjunctions of half-spaces."""

    conjunctions: tuple[HalfSpaces, ...]

    def __post_init__(self):
        conjunctions = tuple(self.conjunctions)
        if not conjunctions:
            raise SpecError("an output specification needs at least one conjunction")
        widths = {c.num_outputs for c in conjunctions}
        if len(widths) != 1:
            raise SpecError(f"the conjunctions constrain different numbers of outputs: {sorted(widths)}")
        object.__setattr__(self, "conjunctions", conjunctions)

    @property
    def num_outputs(self) -> int:
        return self.conjunctions[0].num_outputs

    def rows(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """All rows stacked: C (m, n_out), d (m,), and each row's conjunction number (m,)."""
        C = torch.cat([c.C for c in self.conjunctions])
        d = torch.cat([c.d for c in self.conjunctions])
        index = torch.cat([torch.full((c.C.shape[0],), k, dtype=torch.long) for k, c in enumerate(self.conjunctions)])
        return C, d, index

    def contains(self, y):
        y = as_float64(y, "the outputs")
        inside = torch.stack([torch.as_tensor(c.contains(y)) for c in self.conjunctions]).any(0)
        return bool(inside) if y.dim() == 1 else inside

    def to_json(self) -> dict:
        return {"any_of": [c.to_json() for c in self.conjunctions]}


def _conjunction(C, d) -> OutputSpec:
    return OutputSpec((HalfSpaces(C, d),))


def _check_index(i: int, num_outputs: int, what: str):
    if not (isinstance(num_outputs, int) and num_outputs >= 1):
        raise SpecError(f"num_outputs must be a positive integer; got {num_outputs!r}")
    if not (isinstance(i, int) and 0 <= i < num_outputs):
        raise SpecError(f"{what} must be an output index in 0 … {num_outputs - 1}; got {i!r}")


def argmax_is(k: int, num_outputs: int) -> OutputSpec:
    """y_k ≥ y_j for every j ≠ k (one conjunction of num_outputs − 1 rows)."""
    _check_index(k, num_outputs, "the class")
    others = [j for j in range(num_outputs) if j != k]
    C = torch.zeros(len(others), num_outputs, dtype=torch.float64)
    for row, j in enumerate(others):
        C[row, k], C[row, j] = 1.0, -1.0
    return _conjunction(C, torch.zeros(len(others)))


def output_at_least(i: int, j: int, num_outputs: int) -> OutputSpec:
    """y_i ≥ y_j."""
    _check_index(i, num_outputs, "i")
    _check_index(j, num_outputs, "j")
    C = torch.zeros(1, num_outputs, dtype=torch.float64)
    C[0, i] += 1.0
    C[0, j] -= 1.0
    return _conjunction(C, torch.zeros(1))


def untargeted_robustness(label: int, num_outputs: int) -> OutputSpec:
    """The required region of untargeted robustness: the label stays the argmax."""
    return argmax_is(label, num_outputs)


def targeted_robustness(label: int, target: int, num_outputs: int) -> OutputSpec:
    """The required region of targeted robustness: the label stays at least the target's score."""
    if label == target:
        raise SpecError("targeted robustness needs a target class different from the label")
    return output_at_least(label, target, num_outputs)


def any_of(*specs: OutputSpec) -> OutputSpec:
    """The OR of specifications."""
    if not specs:
        raise SpecError("any_of needs at least one specification")
    return OutputSpec(tuple(c for spec in specs for c in spec.conjunctions))


def all_of(*specs: OutputSpec) -> OutputSpec:
    """The AND of specifications (distributed over their ORs)."""
    if not specs:
        raise SpecError("all_of needs at least one specification")
    conjunctions = []
    for combination in product(*(spec.conjunctions for spec in specs)):
        conjunctions.append(HalfSpaces(torch.cat([c.C for c in combination]), torch.cat([c.d for c in combination])))
    return OutputSpec(tuple(conjunctions))


def negation_closure(spec: OutputSpec) -> OutputSpec:
    """The closure of the complement of one conjunction: OR over its rows of −(C_i y + d_i) ≥ 0.

    It contains the true complement (where some row is < 0) plus the conjunction's boundary;
    callers that need the strict complement re-check points.
    """
    if len(spec.conjunctions) != 1:
        raise SpecError("negation_closure takes a single conjunction; negate a disjunction row by row with all_of")
    c = spec.conjunctions[0]
    return OutputSpec(tuple(HalfSpaces(-c.C[i:i + 1], -c.d[i:i + 1]) for i in range(c.C.shape[0])))
