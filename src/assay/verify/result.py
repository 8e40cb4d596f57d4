"""Values returned by the verifier."""

from __future__ import annotations

import enum
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # this module stays free of torch: the command line reads the statuses
    import torch

    from assay.verify.search import SearchState

__all__ = ["VerificationStatus", "Counterexample", "VerificationResult", "VerificationStats", "UNKNOWN_REASON"]

# What an UNKNOWN means when the verifier gives no reason of its own (VerificationResult.reason).
UNKNOWN_REASON = ("the search ended without a verdict (regions too small to split further, or a numerically "
                  "borderline linear region)")


class VerificationStatus(str, enum.Enum):
    """The verdict. VIOLATED always carries a counterexample re-checked by a plain forward pass.

    ERROR is never returned by :func:`~assay.verify.verify` (which raises an
    :class:`~assay.errors.AssayError` for bad input); batch runs report it for an instance whose
    files could not be read, while the other instances still run.
    """

    HOLDS = "holds"
    VIOLATED = "violated"
    UNKNOWN = "unknown"
    TIMEOUT = "timeout"
    ERROR = "error"


@dataclass(frozen=True)
class VerificationStats:
    """What a verification run did: branches bounded, bound calls, the largest number of pending
    branches, counterexample searches, leaf LPs, queries, the strategy used and wall seconds."""

    domains: int = 0
    bound_calls: int = 0
    max_pending: int = 0
    attacks: int = 0
    leaf_lps: int = 0
    queries: int = 0
    strategy: str = ""
    seconds: float = 0.0

    def to_json(self) -> dict:
        return asdict(self)


@dataclass(frozen=True, eq=False)
class Counterexample:
    """An input in the input set whose float64 forward-pass output violates the property."""

    input: torch.Tensor
    output: torch.Tensor
    query: int = 0

    def to_json(self) -> dict:
        return {"input": self.input.reshape(-1).tolist(), "output": self.output.reshape(-1).tolist(), "query": self.query}


@dataclass(frozen=True, eq=False)
class VerificationResult:
    """Verdict, evidence and statistics of one verification run.

    Attributes:
        status: holds / violated / unknown / timeout.
        counterexample: for VIOLATED, the re-checked input and output; else None.
        stats: domains explored, bound calls, attack restarts, seconds, ...
        searches: the state of every branch-and-bound search run (one per query for input
            splitting, one per conjunction for ReLU splitting, in order): pending and closed
            branches; a TIMEOUT's last search can be resumed from it.
        reason: one line saying why an UNKNOWN is not a verdict where the verifier knows
            more than "the search ended" (a counterexample of assay's forward pass that
            onnxruntime rejects on the original ONNX file); else None.
    """

    status: VerificationStatus
    counterexample: Counterexample | None = None
    stats: VerificationStats = field(default_factory=VerificationStats)
    searches: tuple[SearchState, ...] = ()
    reason: str | None = None

    def __post_init__(self):
        if (self.status is VerificationStatus.VIOLATED) != (self.counterexample is not None):
            raise ValueError("a VIOLATED result needs a counterexample, and only a VIOLATED result may carry one")

    def to_json(self) -> dict:
        return {
            "status": self.status.value,
            "counterexample": None if self.counterexample is None else self.counterexample.to_json(),
            "stats": self.stats.to_json(),
            "searches": [state.to_json() for state in self.searches],
            "reason": self.reason,
        }
