"""The monitoring section of ``assay demo``: a loan model's decisions watched for similar applicants treated differently.

A stream of synthetic loan applications (four features scaled to [0, 1]) is decided by a simple
scoring rule that also, unfairly, denies the youngest applicants. :class:`~assay.monitor.Monitor`
(L∞, ε = 0.05) reports every decision that has a *witness*: an earlier applicant within ε with the
other decision. The section returns the counts and the pair whose inputs are closest.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np

__all__ = ["demo_section", "FEATURES"]

FEATURES = ("income", "debt ratio", "years employed", "age")
_DECISIONS = 5000
_EPSILON = 0.05


def _decide(rows: np.ndarray) -> np.ndarray:
    """The deployed model: approve when the score clears 0.15, except for the youngest applicants."""
    score = 0.6 * rows[:, 0] - 0.5 * rows[:, 1] + 0.2 * rows[:, 2]
    return np.where((score > 0.15) & (rows[:, 3] >= 0.1), "approve", "deny")


def demo_section(progress: Callable[[str], None] | None = None, seed: int = 0) -> dict:
    """Monitor 5,000 synthetic decisions; return the counts and the closest witness pair (JSON-able).

    ``seconds`` is the monitoring work; ``one_off_seconds`` the time spent loading (or compiling
    once) compiled kernels during it (0 while the history fits the numpy scan index).
    """
    from assay.monitor import Monitor
    from assay.monitor.warmup import seconds_spent

    (progress or (lambda stage: None))("monitoring a stream of loan decisions")
    rows = np.random.default_rng(seed).random((_DECISIONS, len(FEATURES)))
    decisions = _decide(rows)
    monitor = Monitor(_EPSILON, "linf")
    one_off = seconds_spent()
    started = time.perf_counter()
    found = monitor.observe_batch(rows, decisions)
    # Loading (or compiling, the first time) the compiled kernels is not monitoring work: shown apart.
    one_off = seconds_spent() - one_off
    seconds = time.perf_counter() - started - one_off
    closest = min((w for w in found if w.count), key=lambda w: (w.distances.min(), w.decision), default=None)
    pair = None
    if closest is not None:
        earlier = int(closest.ids[np.argmin(closest.distances)])
        pair = {"ids": [earlier, closest.decision], "distance": float(closest.distances.min()),
                "inputs": [rows[earlier].tolist(), rows[closest.decision].tolist()],
                "decisions": [str(decisions[earlier]), str(decisions[closest.decision])]}
    stats = monitor.stats
    return {"decisions": stats.decisions, "epsilon": _EPSILON, "metric": "linf", "features": list(FEATURES),
            "flagged": stats.flagged, "pairs": stats.pairs, "seconds": seconds, "one_off_seconds": one_off,
            "index": monitor.index.name, "closest_pair": pair}
