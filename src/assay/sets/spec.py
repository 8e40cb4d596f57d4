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

from assay.errors import DataError, SpecError
from assay.sets.box import _as_index, as_float64

# all_of distributes AND over OR: the number of conjunctions is the product of the operands'.
_MAX_CONJUNCTIONS = 100_000

__all__ = [
    "HalfSpaces", "OutputSpec", "argmax_is", "output_at_least", "untargeted_robustness", "targeted_robustness",
    "any_of", "all_of", "negation_closure",
]


@dataclass(frozen=True, eq=False)
class HalfSpaces:
    """The conjunction (AND) of closed half-spaces ``C_i · y + d_i ≥ 0``.

    C is (m ≥ 1, n_out) and d is (m,), both float64; a 1-D C is read as one row. A row of zeros
    with d = 0 is the always-true constraint (used for "no constraint on the outputs").
    Raises SpecError for shapes that do not fit, DataError for NaN or infinite entries.
    """

    C: torch.Tensor
    d: torch.Tensor

    def __post_init__(self):
        C = as_float64(self.C, "the half-spaces' C")
        C = C.reshape(1, -1) if C.dim() == 1 else C
        d = as_float64(self.d, "the half-spaces' d").reshape(-1)
        if C.dim() != 2 or C.shape[0] != d.shape[0] or C.shape[0] == 0 or C.shape[1] == 0:
            raise SpecError(
                f"half-spaces need C of shape (m ≥ 1, n_out ≥ 1) and d of shape (m,); got {tuple(C.shape)} and {tuple(d.shape)}"
            )
        if not (torch.isfinite(C).all() and torch.isfinite(d).all()):
            raise DataError("the half-spaces' C and d must be finite numbers (no NaN or inf)")
        object.__setattr__(self, "C", C)
        object.__setattr__(self, "d", d)

    @classmethod
    def from_checked(cls, C: torch.Tensor, d: torch.Tensor) -> HalfSpaces:
        """Half-spaces of float64 CPU tensors C (m ≥ 1, n_out ≥ 1) and d (m,), finite, that the
        caller has already checked and that nothing else writes to: no copy and no check (a
        reader that checks the rows of thousands of conjunctions at once in one array)."""
        half_spaces = object.__new__(cls)
        object.__setattr__(half_spaces, "C", C)
        object.__setattr__(half_spaces, "d", d)
        return half_spaces

    @property
    def num_outputs(self) -> int:
        return self.C.shape[1]

    @property
    def num_rows(self) -> int:
        return self.C.shape[0]

    def contains(self, y):
        """Whether every row holds: y (n_out,) → bool; y (N, n_out) → (N,) bool tensor."""
        y = _as_outputs(y, self.num_outputs)
        inside = ((y.reshape(-1, self.num_outputs) @ self.C.T + self.d) >= 0).all(1)
        return bool(inside[0]) if y.dim() == 1 else inside

    def to_json(self) -> dict:
        return {"C": self.C.tolist(), "d": self.d.tolist()}


def _as_outputs(y, num_outputs: int) -> torch.Tensor:
    y = as_float64(y, "the outputs")
    if y.dim() not in (1, 2) or y.shape[-1] != num_outputs:
        raise DataError(f"outputs of shape {tuple(y.shape)} do not fit a specification over {num_outputs} outputs; pass ({num_outputs},) or (N, {num_outputs})")
    return y


@dataclass(frozen=True, eq=False)
class OutputSpec:
    """A region of outputs: the disjunction (OR) of its conjunctions (ANDs) of half-spaces.

    ``y`` is in the region iff for some conjunction every row ``C_i · y + d_i ≥ 0``. Every
    conjunction constrains the same number of outputs. Whether the region is required or
    forbidden is the caller's to say (see the module docstring).
    """

    conjunctions: tuple[HalfSpaces, ...]

    def __post_init__(self):
        if isinstance(self.conjunctions, HalfSpaces):
            raise SpecError("OutputSpec takes a tuple of HalfSpaces; wrap a single one as OutputSpec((half_spaces,))")
        conjunctions = tuple(self.conjunctions)
        if not conjunctions:
            raise SpecError("an output specification needs at least one conjunction")
        for number, conjunction in enumerate(conjunctions):
            if not isinstance(conjunction, HalfSpaces):
                raise SpecError(f"conjunction {number} of the output specification is a {type(conjunction).__name__}, not HalfSpaces")
        widths = sorted({c.num_outputs for c in conjunctions})
        if len(widths) != 1:
            raise SpecError(f"the conjunctions constrain different numbers of outputs ({widths}); give every C the same number of columns")
        object.__setattr__(self, "conjunctions", conjunctions)

    @classmethod
    def from_checked(cls, conjunctions: tuple[HalfSpaces, ...]) -> OutputSpec:
        """The region of a non-empty tuple of HalfSpaces with one number of outputs that the caller
        has already checked: no check (a reader that builds thousands of regions at once)."""
        spec = object.__new__(cls)
        object.__setattr__(spec, "conjunctions", conjunctions)
        return spec

    @property
    def num_outputs(self) -> int:
        return self.conjunctions[0].num_outputs

    def rows(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """All rows stacked: ``C`` float64 (m, n_out), ``d`` float64 (m,), ``groups`` int64 (m,).

        ``groups[i]`` is the number of the conjunction row ``i`` belongs to (0, 1, …, ascending), so
        the region is the union over g of {y : C_i y + d_i ≥ 0 for every i with groups[i] = g}.
        There is at least one row (a conjunction has m ≥ 1 rows).
        """
        C = torch.cat([c.C for c in self.conjunctions])
        d = torch.cat([c.d for c in self.conjunctions])
        index = torch.cat([torch.full((c.C.shape[0],), k, dtype=torch.long) for k, c in enumerate(self.conjunctions)])
        return C, d, index

    @property
    def num_rows(self) -> int:
        return sum(c.num_rows for c in self.conjunctions)

    def contains(self, y):
        """Whether some conjunction holds: y (n_out,) → bool; y (N, n_out) → (N,) bool tensor."""
        y = _as_outputs(y, self.num_outputs)
        inside = torch.stack([torch.as_tensor(c.contains(y)) for c in self.conjunctions]).any(0)
        return bool(inside) if y.dim() == 1 else inside

    def to_json(self) -> dict:
        return {"any_of": [c.to_json() for c in self.conjunctions]}


def _conjunction(C, d) -> OutputSpec:
    return OutputSpec((HalfSpaces(C, d),))


def _check_num_outputs(num_outputs) -> int:
    num_outputs = _as_index(num_outputs, "num_outputs")
    if num_outputs < 1:
        raise SpecError(f"num_outputs must be ≥ 1; got {num_outputs}")
    return num_outputs


def _check_output(i, num_outputs: int, what: str) -> int:
    i = _as_index(i, what)
    if not 0 <= i < num_outputs:
        raise SpecError(f"{what} must be an output index in 0 … {num_outputs - 1} (the network has {num_outputs} outputs); got {i}")
    return i


def _specs(specs, owner: str) -> tuple[OutputSpec, ...]:
    """The operands of any_of / all_of: OutputSpec or HalfSpaces, all over one number of outputs."""
    if not specs:
        raise SpecError(f"{owner} needs at least one specification")
    specs = tuple(OutputSpec((s,)) if isinstance(s, HalfSpaces) else s for s in specs)
    for number, spec in enumerate(specs):
        if not isinstance(spec, OutputSpec):
            raise SpecError(f"argument {number} of {owner} is a {type(spec).__name__}; pass OutputSpec or HalfSpaces values")
    widths = [spec.num_outputs for spec in specs]
    if len(set(widths)) != 1:
        raise SpecError(f"{owner} got specifications over different numbers of outputs {widths}; build them with one num_outputs")
    return specs


def argmax_is(k: int, num_outputs: int, among=None) -> OutputSpec:
    """The region where output k is a maximum: y_k − y_j ≥ 0 for every j ≠ k (one conjunction).

    ``among``: only these outputs compete (k must be one of them), e.g. one head of a network
    with several heads: ``all_of(argmax_is(0, 8, range(4)), argmax_is(4, 8, range(4, 8)))``.
    Default: every output.

    Closed: ties count as "argmax is k". A sound "holds" for this region therefore allows ties;
    callers that need a strict winner check the margin themselves. With one output the region is
    everything (a single all-zero row).
    """
    num_outputs = _check_num_outputs(num_outputs)
    k = _check_output(k, num_outputs, "the class k")
    candidates = range(num_outputs) if among is None else [_check_output(j, num_outputs, "an output of `among`") for j in among]
    if k not in candidates:
        raise SpecError(f"the class k={k} must be one of the outputs it competes with (among={list(candidates)})")
    others = [j for j in candidates if j != k]
    if not others:
        return _conjunction(torch.zeros(1, num_outputs), torch.zeros(1))
    C = torch.zeros(len(others), num_outputs, dtype=torch.float64)
    for row, j in enumerate(others):
        C[row, k], C[row, j] = 1.0, -1.0
    return _conjunction(C, torch.zeros(len(others)))


def output_at_least(i: int, j: int, num_outputs: int) -> OutputSpec:
    """The region y_i ≥ y_j (one row y_i − y_j ≥ 0; all outputs when i == j)."""
    num_outputs = _check_num_outputs(num_outputs)
    i = _check_output(i, num_outputs, "i")
    j = _check_output(j, num_outputs, "j")
    C = torch.zeros(1, num_outputs, dtype=torch.float64)
    C[0, i] += 1.0
    C[0, j] -= 1.0
    return _conjunction(C, torch.zeros(1))


def untargeted_robustness(label: int, num_outputs: int) -> OutputSpec:
    """The *required* region of untargeted robustness: ``label`` stays an argmax (= :func:`argmax_is`)."""
    return argmax_is(label, num_outputs)


def targeted_robustness(label: int, target: int, num_outputs: int) -> OutputSpec:
    """The *required* region of targeted robustness: y_label − y_target ≥ 0 (the target never beats the label)."""
    if _as_index(label, "label") == _as_index(target, "target"):
        raise SpecError(f"targeted robustness needs a target class different from the label; both are {label}")
    return output_at_least(label, target, num_outputs)


def any_of(*specs: OutputSpec) -> OutputSpec:
    """The OR of specifications (their conjunctions, concatenated in order)."""
    specs = _specs(specs, "any_of")
    return OutputSpec(tuple(c for spec in specs for c in spec.conjunctions))


def all_of(*specs: OutputSpec) -> OutputSpec:
    """The AND of specifications, distributed over their ORs.

    ``all_of(a1 ∨ a2, b)`` is ``(a1 ∧ b) ∨ (a2 ∧ b)``: the result has the product of the operands'
    numbers of conjunctions (SpecError beyond 100,000).
    """
    specs = _specs(specs, "all_of")
    total = 1
    for spec in specs:
        total *= len(spec.conjunctions)
    if total > _MAX_CONJUNCTIONS:
        raise SpecError(f"all_of would expand to {total} conjunctions (more than {_MAX_CONJUNCTIONS}); simplify the specification")
    conjunctions = tuple(
        HalfSpaces(torch.cat([c.C for c in combination]), torch.cat([c.d for c in combination]))
        for combination in product(*(spec.conjunctions for spec in specs))
    )
    return OutputSpec(conjunctions)


def negation_closure(spec: OutputSpec | HalfSpaces) -> OutputSpec:
    """The closure of the complement of one conjunction: the OR over its rows of −(C_i·y + d_i) ≥ 0.

    The complement {y : some row < 0} is open; this returns its closure, which also contains the
    conjunction's boundary (rows = 0). Over-approximating the complement is the sound direction
    for proving that y stays *inside* the conjunction ("no output lies in the closure" implies
    "no output leaves the region"); a point found in the closure may lie on the boundary, so
    callers re-check counterexamples with strict inequalities.
    """
    if isinstance(spec, HalfSpaces):
        spec = OutputSpec((spec,))
    if not isinstance(spec, OutputSpec):
        raise SpecError(f"negation_closure takes an OutputSpec or HalfSpaces; got {type(spec).__name__}")
    if len(spec.conjunctions) != 1:
        raise SpecError(
            f"negation_closure takes a single conjunction, got {len(spec.conjunctions)}; the complement of a disjunction "
            "is all_of(negation_closure(c) for each conjunction c)"
        )
    c = spec.conjunctions[0]
    return OutputSpec(tuple(HalfSpaces(-c.C[i:i + 1], -c.d[i:i + 1]) for i in range(c.num_rows)))
