"""The verifier's wall-clock deadline, shared by every phase of a search.

A timeout is a promise to the caller: ``verify(..., timeout=T)`` returns within about T
seconds whatever the network. Every phase therefore checks the same :class:`Deadline`: the
counterexample search between sample chunks and PGD steps, α/β-CROWN between iterations
(every iterate is a sound bound, so stopping early only loosens it), leaf LPs between LPs,
and branch and bound between rounds, whose batches a :class:`Deadline` sizes so that one
round ends well before the deadline (a round of 1,024 boxes takes seconds on a 3×100 network).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

# A round may use at most this share of the time left: the rest absorbs the misestimate of its
# cost (the first rounds of a search are estimated from few samples).
_ROUND_SHARE = 0.5


@dataclass
class Deadline:
    """``at``: a ``time.monotonic()`` instant (``math.inf`` for none)."""

    at: float = math.inf
    _seconds_per_domain: float = field(default=0.0, repr=False)

    @classmethod
    def after(cls, seconds: float) -> Deadline:
        return cls(time.monotonic() + seconds)

    def passed(self) -> bool:
        return time.monotonic() > self.at

    def remaining(self) -> float:
        return self.at - time.monotonic()

    def share(self, fraction: float) -> Deadline:
        """A deadline ``fraction`` of the time left from now (a step that must leave the rest to
        what follows it); never later than this one, and none where this one is none."""
        now = time.monotonic()
        return Deadline(min(self.at, now + fraction * (self.at - now)))

    def batch(self, largest: int) -> int:
        """How many domains the next round may bound: ``largest`` until a cost is known, then
        as many as fit in half the time left (at least 1)."""
        if self._seconds_per_domain <= 0 or math.isinf(self.at):
            return largest
        fitting = _ROUND_SHARE * self.remaining() / self._seconds_per_domain
        return int(max(1, min(largest, fitting)))

    def record(self, domains: int, seconds: float) -> None:
        """Learn the cost of a round that bounded ``domains`` domains in ``seconds``."""
        if domains > 0:
            # The most expensive rate seen recently: rounds get cheaper as boxes shrink, rarely dearer.
            rate = seconds / domains
            self._seconds_per_domain = max(rate, 0.5 * self._seconds_per_domain)
