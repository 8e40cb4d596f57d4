"""Normalise what a caller asks into *unsafe conjunctions* over boxes.

A verification problem is a list of :class:`UnsafeQuery`: an input box and a disjunction of
conjunctions of closed half-spaces ``C·y + d ≥ 0`` on the outputs that must be unreachable
(rows carry the number of their conjunction in ``groups``). The property holds iff every
query is infeasible. Each query also keeps the exact predicate that a
concrete output must satisfy to count as a counterexample (the closure used for bounding can
be larger than the true violation set when the property was given as a required region).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from assay.errors import SpecError
from assay.nn.network import Network


@dataclass(frozen=True, eq=False)
class UnsafeQuery:
    """``lower``/``upper``: (n_in,) float64 bounds of the input (flat); ``C`` (m, n_out), ``d`` (m,);
    ``groups`` (m,): the conjunction each row belongs to (0 … G−1). The unsafe set is
    ∪_g {y : C_i·y + d_i ≥ 0 for every row i of group g}.

    ``violates(y)`` maps outputs (N, n_out) to a bool tensor (N,): True where y truly violates.
    ``index`` names the original query (VNN-LIB query number) for reports.
    """

    lower: torch.Tensor
    upper: torch.Tensor
    C: torch.Tensor
    d: torch.Tensor
    groups: torch.Tensor
    violates: Callable[[torch.Tensor], torch.Tensor]
    index: int = 0

    @property
    def num_groups(self) -> int:
        return int(self.groups.max()) + 1

    def group_margin(self, values: torch.Tensor) -> torch.Tensor:
        """max over groups of min over the group's rows: (N, m) → (N,). ≥ 0 iff in the unsafe set."""
        per_group = [values[:, self.groups == g].amin(1) for g in range(self.num_groups)]
        return torch.stack(per_group, 1).amax(1)


def _box_bounds(network: Network, input_set) -> tuple[torch.Tensor, torch.Tensor]:
    if hasattr(input_set, "bounding_box") and not hasattr(input_set, "lower"):
        raise SpecError("verify needs a box input set; bound the polytope with its bounding_box() explicitly if intended")
    lower = torch.as_tensor(input_set.lower, dtype=torch.float64).reshape(-1)
    upper = torch.as_tensor(input_set.upper, dtype=torch.float64).reshape(-1)
    if lower.numel() != network.input_size:
        raise SpecError(
            f"the input set has {lower.numel()} values, but {network.source} takes {network.input_size} inputs "
            f"(shape {network.input_shape})"
        )
    return lower, upper


def from_unsafe(network: Network, input_set, unsafe, index: int = 0) -> list[UnsafeQuery]:
    """The query "no x in input_set has f(x) in ``unsafe``" (an OutputSpec: OR of conjunctions)."""
    lower, upper = _box_bounds(network, input_set)
    rows, offsets, groups = [], [], []
    for number, conjunction in enumerate(unsafe.conjunctions):
        C = torch.as_tensor(conjunction.C, dtype=torch.float64)
        _check_outputs(network, C)
        rows.append(C)
        offsets.append(torch.as_tensor(conjunction.d, dtype=torch.float64).reshape(-1))
        groups.append(torch.full((C.shape[0],), number, dtype=torch.long))
    C, d, groups = torch.cat(rows), torch.cat(offsets), torch.cat(groups)
    return [UnsafeQuery(lower, upper, C, d, groups, _violation_test(C, d, groups), index)]


def _violation_test(C: torch.Tensor, d: torch.Tensor, groups: torch.Tensor) -> Callable[[torch.Tensor], torch.Tensor]:
    """``violates`` of an unsafe OR of conjunctions: y (N, n_out) → (N,) True where every row of some group holds."""

    def violates(y: torch.Tensor) -> torch.Tensor:
        values = y.reshape(y.shape[0], -1).to(torch.float64) @ C.T + d
        return torch.stack([(values[:, groups == g] >= 0).all(1) for g in range(int(groups.max()) + 1)], 1).any(1)

    return violates


def from_vnnlib_queries(network: Network, queries) -> list[UnsafeQuery]:
    """:func:`from_unsafe` of every :class:`~assay.sets.CounterexampleQuery` (``index``: its
    position), built in bulk: the queries with one structure (rows per conjunction) share one
    stacked array of boxes, rows and offsets (viewed query by query) and one ``groups`` tensor.
    The same queries as calling :func:`from_unsafe` on each, at a fraction of the cost where a
    VNN-LIB disjunction lists 120,000 cases (nn4sys' lindex_60000)."""
    by_structure: dict[tuple, list[int]] = {}
    for number, query in enumerate(queries):
        structure = tuple(tuple(c.C.shape) for c in query.unsafe_outputs.conjunctions)
        by_structure.setdefault(structure, []).append(number)
    made: list[UnsafeQuery | None] = [None] * len(queries)
    for structure, members in by_structure.items():
        for shape in structure:
            _check_outputs(network, torch.empty(shape))
        boxes = [queries[k].input_set for k in members]
        lower = torch.stack([_flat(b.lower) for b in boxes]).to(torch.float64)
        upper = torch.stack([_flat(b.upper) for b in boxes]).to(torch.float64)
        if lower.shape[1] != network.input_size:
            _box_bounds(network, boxes[0])  # says what does not fit
        parts = [queries[k].unsafe_outputs.conjunctions for k in members]
        C = torch.cat([c.C for conjunctions in parts for c in conjunctions]).to(torch.float64)
        d = torch.cat([_flat(c.d) for conjunctions in parts for c in conjunctions]).to(torch.float64)
        rows = sum(shape[0] for shape in structure)
        C, d = C.reshape(len(members), rows, -1), d.reshape(len(members), rows)
        groups = torch.repeat_interleave(torch.arange(len(structure)), torch.tensor([shape[0] for shape in structure]))
        for k, low, high, rows_C, rows_d in zip(members, lower.unbind(0), upper.unbind(0), C.unbind(0), d.unbind(0)):
            made[k] = UnsafeQuery(low, high, rows_C, rows_d, groups, _violation_test(rows_C, rows_d, groups), k)
    return made


def _flat(tensor: torch.Tensor) -> torch.Tensor:
    return tensor if tensor.dim() == 1 else tensor.reshape(-1)  # (a view costs microseconds, 120,000 times)


def from_required(network: Network, input_set, spec) -> list[UnsafeQuery]:
    """Queries for "every x in input_set has f(x) in ``spec``" (an OutputSpec that must hold).

    The violation set is the complement of ``spec``; for bounding we use the closure of each
    violated row (−(C_i y + d_i) ≥ 0), and a point counts as a counterexample only if it
    lies strictly outside ``spec``.
    """
    lower, upper = _box_bounds(network, input_set)
    if len(spec.conjunctions) != 1:
        raise SpecError(
            "verify(spec=...) takes a required region that is one conjunction of half-spaces; for a disjunction, "
            "pass its complement as unsafe=... instead"
        )
    conjunction = spec.conjunctions[0]
    C = torch.as_tensor(conjunction.C, dtype=torch.float64)
    d = torch.as_tensor(conjunction.d, dtype=torch.float64)
    _check_outputs(network, C)

    def outside(y: torch.Tensor) -> torch.Tensor:
        return ((y.reshape(y.shape[0], -1).to(torch.float64) @ C.T + d) < 0).any(1)

    # The violation set: a disjunction of single closed half-spaces, one per violated row.
    return [UnsafeQuery(lower, upper, -C, -d, torch.arange(C.shape[0]), outside, 0)]


def _check_outputs(network: Network, C: torch.Tensor):
    if C.shape[1] != network.output_size:
        raise SpecError(
            f"the property constrains {C.shape[1]} outputs, but {network.source} has {network.output_size}"
        )
