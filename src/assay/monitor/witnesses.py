"""The monitor's answer for one decision: the earlier decisions that witness a violation."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["Witnesses"]


def _frozen(array: np.ndarray) -> np.ndarray:
    array = np.array(array, copy=True)
    array.flags.writeable = False
    return array


_NO_IDS = np.empty(0, dtype=np.int64)
_NO_IDS.flags.writeable = False
_NO_DISTANCES = np.empty(0, dtype=np.float64)
_NO_DISTANCES.flags.writeable = False


@dataclass(frozen=True, eq=False)
class Witnesses:
    """Earlier decisions ``(x', y')`` with ``d_X(x, x') ≤ ε`` and a different output, for decision ``decision``.

    Attributes:
        decision: the id of this decision (0 for the first observed, then 1, 2, ...).
        ids: int64 ids of the witnesses, ascending (read-only). Empty in count-only mode.
        distances: float64 canonical input distances ``d_X(x, x')``, aligned with ``ids``.
        count: how many witnesses exist in the monitored history — exact even when ``ids`` is
            capped or omitted.
        incomplete: True when ``ids`` lists fewer than ``count`` witnesses (witness cap or
            count-only mode); the ones listed are then the nearest, ties broken by smaller id.
    """

    decision: int
    ids: np.ndarray
    distances: np.ndarray
    count: int
    incomplete: bool = False

    def __post_init__(self):
        ids = _frozen(np.asarray(self.ids, dtype=np.int64).reshape(-1))
        distances = _frozen(np.asarray(self.distances, dtype=np.float64).reshape(-1))
        if ids.shape != distances.shape:
            raise ValueError(f"Witnesses got {ids.size} ids but {distances.size} distances")
        if ids.size > self.count or (ids.size < self.count) != bool(self.incomplete):
            raise ValueError(f"Witnesses lists {ids.size} of {self.count} witnesses but incomplete={self.incomplete}")
        object.__setattr__(self, "ids", ids)
        object.__setattr__(self, "distances", distances)
        object.__setattr__(self, "decision", int(self.decision))
        object.__setattr__(self, "count", int(self.count))
        object.__setattr__(self, "incomplete", bool(self.incomplete))

    @classmethod
    def _trusted(cls, decision: int, ids: np.ndarray | None, distances: np.ndarray | None, count: int, incomplete: bool) -> "Witnesses":
        """Build without the checks and copies of ``__init__`` (the monitor's hot path).

        The caller guarantees int64/float64 1-D arrays of equal length that nothing else will
        write to, ascending ids, and a consistent ``count`` / ``incomplete``; None means empty.
        """
        self = object.__new__(cls)
        if ids is None:
            ids, distances = _NO_IDS, _NO_DISTANCES
        else:
            ids.flags.writeable = False
            distances.flags.writeable = False
        self.__dict__.update(decision=decision, ids=ids, distances=distances, count=count, incomplete=incomplete)
        return self

    @property
    def flagged(self) -> bool:
        """Whether this decision has at least one witness (it violates the property)."""
        return self.count > 0

    def __len__(self) -> int:
        return self.count

    def __eq__(self, other) -> bool:
        if not isinstance(other, Witnesses):
            return NotImplemented
        return (
            self.decision == other.decision
            and self.count == other.count
            and self.incomplete == other.incomplete
            and np.array_equal(self.ids, other.ids)
            and np.array_equal(self.distances, other.distances)
        )

    __hash__ = None

    def to_json(self) -> dict:
        return {
            "decision": self.decision,
            "count": self.count,
            "incomplete": self.incomplete,
            "ids": self.ids.tolist(),
            "distances": self.distances.tolist(),
        }
