"""Feature types of an encoded input: continuous, one-hot, ordinal (thermometer) and immutable.

A counterfactual is searched in the model's *encoded* input space (what the network reads).
:class:`FeatureTypes` says which encoded variables belong together and what values they may take:

* **continuous** variables take any value in ``[lower[i], upper[i]]`` (min-max scaled data:
  ``[0, 1]``, the default);
* a **one-hot** group (a categorical feature with k values) is k binary variables with exactly one
  equal to 1;
* an **ordinal** group (a feature with k ordered levels) is a thermometer code of k binary
  variables: level v is ``[1]*(v+1) + [0]*(k-v-1)`` (the first bit is always 1, the bits never
  increase), as in the published robust-CE experiments;
* **immutable** variables (or groups) keep the value of the input being explained.

Every encoded variable not in a group is continuous. The ℓ1 distance of a counterfactual may weigh
the variables (``cost``): the published robust-CE runs count each original feature once, a changed
category 1, a thermometer level 1/(k−1), a continuous value its change (:meth:`FeatureTypes.with_feature_cost`).
A spec can be read from JSON (:meth:`FeatureTypes.from_json`), e.g. ``{"size": 7, "one_hot": [[3, 4,
5]], "ordinal": [], "immutable": [0], "lower": [...], "upper": [...], "names": [...], "cost": [...]}``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from assay.errors import DataError, SpecError

__all__ = ["FeatureTypes"]

# A value within this distance of 0 or 1 counts as that bit when a point is checked.
_BIT_TOLERANCE = 1e-6


def _group_tuple(groups, what: str) -> tuple[tuple[int, ...], ...]:
    out = []
    for group in groups or ():
        try:
            members = tuple(int(i) for i in group)
        except (TypeError, ValueError):
            raise SpecError(f"each {what} group must be a list of variable indices; got {group!r}") from None
        if len(members) < 2:
            raise SpecError(f"a {what} group needs at least 2 variables; got {list(members)}")
        out.append(members)
    return tuple(out)


# The largest encoded input a spec file may declare (a guard against absurd sizes before arrays are built).
_MAX_SIZE = 10_000_000


@dataclass(frozen=True, eq=False)
class FeatureTypes:
    """Which encoded variables are continuous, one-hot, ordinal or immutable, and their bounds.

    Attributes:
        size: the number of encoded variables (the network's input size).
        one_hot: groups of variable indices, each a one-hot categorical feature.
        ordinal: groups of variable indices, each a thermometer-coded ordinal feature.
        immutable: variable indices that must keep the explained input's value (a variable of a
            group makes the whole group immutable).
        lower, upper: bounds of every variable (binary variables are always within [0, 1]);
            default 0 and 1 (min-max scaled data).
        names: optional names of the variables, for messages and printing.
        cost: per-variable weights of the ℓ1 distance, ``Σ_i cost_i·|x′_i − x_i|`` (positive, finite;
            default 1 each: the plain ℓ1). The ℓ∞ distance ignores them.
    """

    size: int
    one_hot: tuple[tuple[int, ...], ...] = ()
    ordinal: tuple[tuple[int, ...], ...] = ()
    immutable: tuple[int, ...] = ()
    lower: np.ndarray | None = None
    upper: np.ndarray | None = None
    names: tuple[str, ...] | None = None
    cost: np.ndarray | None = None
    _group_of: dict = field(init=False, repr=False)

    def __post_init__(self):
        size = int(self.size)
        if size < 1:
            raise SpecError(f"FeatureTypes needs size ≥ 1 (the number of encoded variables); got {self.size}")
        one_hot = _group_tuple(self.one_hot, "one_hot")
        ordinal = _group_tuple(self.ordinal, "ordinal")
        immutable = tuple(sorted({int(i) for i in self.immutable}))
        seen: dict[int, str] = {}
        group_of: dict[int, tuple[int, ...]] = {}
        for kind, groups in (("one_hot", one_hot), ("ordinal", ordinal)):
            for group in groups:
                for i in group:
                    if not 0 <= i < size:
                        raise SpecError(f"the {kind} group {list(group)} names variable {i}, outside 0..{size - 1}")
                    if i in seen:
                        raise SpecError(f"variable {i} is in two groups ({seen[i]} and {kind}); each variable belongs to at most one")
                    seen[i] = kind
                    group_of[i] = group
        for i in immutable:
            if not 0 <= i < size:
                raise SpecError(f"immutable variable {i} is outside 0..{size - 1}")
        lower = np.zeros(size) if self.lower is None else np.asarray(self.lower, dtype=np.float64).reshape(-1)
        upper = np.ones(size) if self.upper is None else np.asarray(self.upper, dtype=np.float64).reshape(-1)
        for name, bound in (("lower", lower), ("upper", upper)):
            if bound.shape != (size,):
                raise SpecError(f"FeatureTypes.{name} needs {size} values (one per encoded variable); got {bound.shape[0]}")
            if not np.isfinite(bound).all():
                raise SpecError(f"FeatureTypes.{name} must be finite (the MILP needs bounded variables); "
                                f"variable {int(np.flatnonzero(~np.isfinite(bound))[0])} is not")
        if (lower > upper).any():
            i = int(np.flatnonzero(lower > upper)[0])
            raise SpecError(f"variable {i} has lower bound {lower[i]} above its upper bound {upper[i]}")
        binary = np.array(sorted(group_of), dtype=int)
        if binary.size:
            lower, upper = lower.copy(), upper.copy()
            lower[binary], upper[binary] = 0.0, 1.0
        names = None if self.names is None else tuple(str(n) for n in self.names)
        if names is not None and len(names) != size:
            raise SpecError(f"FeatureTypes.names needs {size} names; got {len(names)}")
        cost = np.ones(size) if self.cost is None else np.asarray(self.cost, dtype=np.float64).reshape(-1)
        if cost.shape != (size,):
            raise SpecError(f"FeatureTypes.cost needs {size} values (one weight per encoded variable); got {cost.shape[0]}")
        if not (np.isfinite(cost).all() and (cost > 0).all()):
            i = int(np.flatnonzero(~(np.isfinite(cost) & (cost > 0)))[0])
            raise SpecError(f"FeatureTypes.cost must be positive and finite (a weight of the ℓ1 distance); "
                            f"variable {i} has {cost[i]}")
        object.__setattr__(self, "size", size)
        object.__setattr__(self, "one_hot", one_hot)
        object.__setattr__(self, "ordinal", ordinal)
        object.__setattr__(self, "immutable", immutable)
        object.__setattr__(self, "lower", lower)
        object.__setattr__(self, "upper", upper)
        object.__setattr__(self, "names", names)
        object.__setattr__(self, "cost", cost)
        object.__setattr__(self, "_group_of", group_of)

    # ------------------------------------------------------------------ construction
    @classmethod
    def continuous(cls, size: int, lower=0.0, upper=1.0, immutable=()) -> FeatureTypes:
        """Every variable continuous in ``[lower, upper]`` (scalars or one value per variable)."""
        return cls(size, lower=np.broadcast_to(np.asarray(lower, float), (int(size),)),
                   upper=np.broadcast_to(np.asarray(upper, float), (int(size),)), immutable=tuple(immutable))

    @classmethod
    def from_json(cls, source) -> FeatureTypes:
        """Read a spec from a JSON file path or a dict (keys as the attributes; only ``size`` is required)."""
        where = "the feature spec"
        if isinstance(source, (str, Path)):
            where = str(source)
            try:
                source = json.loads(Path(source).read_bytes().decode("utf-8-sig"))
            except FileNotFoundError:
                raise DataError(f"{where}: no such file; pass a JSON feature spec with --features") from None
            except OSError as exc:
                raise DataError(f"{where}: cannot be read ({exc.strerror or exc}); pass a JSON feature spec file") from exc
            except UnicodeDecodeError as exc:
                raise SpecError(f"{where}: not UTF-8 text; save the feature spec as UTF-8 JSON") from exc
            except (json.JSONDecodeError, RecursionError) as exc:
                raise SpecError(f"{where}: not valid JSON ({str(exc)[:100]}); see the README's cfx section for the "
                                "format") from None
        if not isinstance(source, dict) or "size" not in source:
            raise SpecError(f"{where}: a feature spec is a JSON object with at least 'size' (the number of encoded variables)")
        unknown = set(source) - {"size", "one_hot", "ordinal", "immutable", "lower", "upper", "names", "cost"}
        if unknown:
            raise SpecError(f"{where}: unknown keys {sorted(unknown)}; the keys are size, one_hot, ordinal, immutable, "
                            "lower, upper, names, cost")
        size = source["size"]
        if isinstance(size, bool) or not isinstance(size, int) or not 1 <= size <= _MAX_SIZE:
            raise SpecError(f"{where}: 'size' must be the number of encoded variables, an integer in 1..{_MAX_SIZE:,}; "
                            f"got {str(size)[:40]}")
        try:
            return cls(**source)
        except SpecError as exc:
            raise SpecError(f"{where}: {exc}") from None
        except (TypeError, ValueError, OverflowError) as exc:  # a value of the wrong JSON type, e.g. "lower": "x"
            raise SpecError(f"{where}: a value has the wrong type ({str(exc)[:100]}); groups and immutable are lists "
                            "of variable indices, lower, upper and cost lists of numbers, names a list of "
                            "strings") from exc

    def to_json(self) -> dict:
        return {
            "size": self.size, "one_hot": [list(g) for g in self.one_hot], "ordinal": [list(g) for g in self.ordinal],
            "immutable": list(self.immutable), "lower": self.lower.tolist(), "upper": self.upper.tolist(),
            "names": None if self.names is None else list(self.names), "cost": self.cost.tolist(),
        }

    def with_feature_cost(self) -> FeatureTypes:
        """This spec with the published robust-CE runs' ℓ1 cost: each original feature counts the same,
        a continuous variable its change, a one-hot group 1 when the category changes (1/2 per bit,
        two bits flip), a k-level thermometer code 1/(k−1) per level moved (per bit). Their MILP
        minimises this sum over the features (robust-ce-inn, ``OptSolver.set_objective_l1_l0``)."""
        cost = np.ones(self.size)
        for group in self.one_hot:
            cost[list(group)] = 0.5
        for group in self.ordinal:
            cost[list(group)] = 1.0 / (len(group) - 1)
        return FeatureTypes(self.size, self.one_hot, self.ordinal, self.immutable, self.lower, self.upper, self.names,
                            cost)

    # ------------------------------------------------------------------ facts
    @property
    def groups(self) -> tuple[tuple[int, ...], ...]:
        return self.one_hot + self.ordinal

    def is_binary(self, i: int) -> bool:
        return i in self._group_of

    @property
    def weighted(self) -> bool:
        """Whether ``cost`` weighs the ℓ1 distance unevenly (the searches' ℓ1-ball speed-ups then step aside)."""
        return bool((self.cost != 1.0).any())

    def frozen_variables(self) -> np.ndarray:
        """Indices of the variables that must keep the explained input's value (immutables, whole groups)."""
        frozen = set(self.immutable)
        for i in self.immutable:
            frozen.update(self._group_of.get(i, ()))
        return np.array(sorted(frozen), dtype=int)

    def name(self, i: int) -> str:
        return self.names[i] if self.names is not None else f"x[{i}]"

    # ------------------------------------------------------------------ checks
    def violations(self, x, reference=None, tolerance: float = _BIT_TOLERANCE) -> list[str]:
        """Every way ``x`` breaks the spec (bounds, encodings, immutables against ``reference``)."""
        x = np.asarray(x, dtype=np.float64).reshape(-1)
        if x.shape != (self.size,):
            return [f"the point has {x.size} values, but the feature spec has {self.size} variables"]
        problems = []
        for i in np.flatnonzero((x < self.lower - tolerance) | (x > self.upper + tolerance)):
            problems.append(f"{self.name(i)} = {x[i]:.6g} is outside [{self.lower[i]:.6g}, {self.upper[i]:.6g}]")
        for i in self._group_of:
            if min(abs(x[i]), abs(x[i] - 1)) > tolerance:
                problems.append(f"{self.name(i)} = {x[i]:.6g} must be 0 or 1 (it belongs to a one-hot/ordinal group)")
        for group in self.one_hot:
            if abs(x[list(group)].sum() - 1) > tolerance * len(group):
                problems.append(f"one-hot group {list(group)} has {x[list(group)].sum():.6g} ones, not exactly one")
        for group in self.ordinal:
            bits = x[list(group)]
            if bits[0] < 1 - tolerance or (np.diff(bits) > tolerance).any():
                problems.append(f"ordinal group {list(group)} = {bits.round(6).tolist()} is not a thermometer code "
                                "(first bit 1, bits never increasing)")
        if reference is not None:
            reference = np.asarray(reference, dtype=np.float64).reshape(-1)
            for i in self.frozen_variables():
                if abs(x[i] - reference[i]) > tolerance:
                    problems.append(f"immutable {self.name(i)} changed from {reference[i]:.6g} to {x[i]:.6g}")
        return problems

    def check_input(self, x, where: str = "the input") -> np.ndarray:
        """``x`` as a float64 vector, or a DataError listing what is wrong with it."""
        x = np.asarray(x, dtype=np.float64).reshape(-1)
        if x.shape != (self.size,):
            raise DataError(f"{where} has {x.size} values, but the model and feature spec take {self.size}")
        if not np.isfinite(x).all():
            raise DataError(f"{where} has NaN or infinite values at {np.flatnonzero(~np.isfinite(x)).tolist()}")
        problems = self.violations(x)
        if problems:
            raise DataError(f"{where} does not respect the feature spec: " + "; ".join(problems[:5])
                            + ("; …" if len(problems) > 5 else "") + " (fix the input or the --features spec)")
        return x

    def snap(self, x) -> np.ndarray:
        """Round a solver's near-feasible point onto the spec: bits to 0/1, values into their bounds."""
        x = np.clip(np.asarray(x, dtype=np.float64).reshape(-1).copy(), self.lower, self.upper)
        for group in self.one_hot:
            idx = list(group)
            bits = np.zeros(len(idx))
            bits[int(np.argmax(x[idx]))] = 1.0
            x[idx] = bits
        for group in self.ordinal:
            idx = list(group)
            bits = (x[idx] > 0.5).astype(float)
            bits[0] = 1.0
            x[idx] = np.minimum.accumulate(bits)
        return x

    def distance(self, x, x_prime, norm: str = "l1") -> float:
        """‖x′ − x‖ over the encoded variables: ``"l1"`` weighted by ``cost``, or ``"linf"``."""
        diff = np.abs(np.asarray(x_prime, float).reshape(-1) - np.asarray(x, float).reshape(-1))
        return float((self.cost * diff).sum() if norm == "l1" else diff.max(initial=0.0))
