"""Result values of the KNN fairness certifier: :class:`Status`, :class:`Counterexample`, :class:`Certificate`."""

from __future__ import annotations

import enum
import json
from dataclasses import dataclass, field


class Status(str, enum.Enum):
    """Verdict for one input. ``Status.CERTIFIED == "certified"`` holds (a ``str`` enum)."""

    CERTIFIED = "certified"
    UNKNOWN = "unknown"
    FALSIFIED = "falsified"

    def __str__(self) -> str:  # pragma: no cover - trivial
        return self.value


@dataclass(frozen=True)
class Counterexample:
    """A biased-label scenario that changes the decision, confirmed by re-running the plain learner.

    ``flipped_rows`` index the ``train_X`` the certifier was given (before any down-sampling);
    ``new_labels`` are their labels in the scenario; ``input`` is the individual fed to the learner
    (protected values substituted, moved within the ε-box); ``k`` is the K cross-validation chose on
    the flipped labels and ``decision`` the vote it gave (≠ the certificate's ``prediction``).
    """

    flipped_rows: tuple[int, ...]
    new_labels: tuple[int, ...]
    input: tuple[float, ...]
    protected_values: tuple[float, ...]
    k: int
    decision: int

    def to_json(self) -> dict:
        return {
            "flipped_rows": list(self.flipped_rows),
            "new_labels": list(self.new_labels),
            "input": list(self.input),
            "protected_values": list(self.protected_values),
            "k": self.k,
            "decision": self.decision,
        }


@dataclass(frozen=True)
class Certificate:
    """Verdict of :func:`assay.fairness.knn.certify` for one input.

    * ``status`` — ``certified``: for every way of flipping at most ``flips`` training labels (within
      the flip restrictions), every protected combination and every point of the ε-box, the learner
      (K re-chosen by cross-validation) returns ``prediction``; ``falsified``: ``counterexample`` is
      such a scenario with another decision, confirmed by the plain learner; ``unknown`` otherwise.
    * ``prediction`` — the learner's decision for the input on the given labels.
    * ``k_default`` — the K cross-validation chooses on the given labels; ``k_possible`` — the Ks it
      may choose under ``flips`` flips (sound over-approximation; exact in ``method="exact"``).
    * ``min_flips_to_change`` — per candidate K (``k_candidates`` order), a lower bound on the flips
      the prediction step needs to change the decision (``None``: impossible); exact without ε.
    * ``method`` — ``"exact"`` (every flip set enumerated, cross-validation re-run for each) or
      ``"bounds"`` (cross-validation errors bounded).
    * ``seconds`` — time spent on this input (the one-off cross-validation analysis is excluded once
      :meth:`KnnFairnessCertifier.prepare` or ``certify_many`` has run it).
    """

    status: Status
    prediction: int
    flips: int
    k_default: int
    k_candidates: tuple[int, ...]
    k_possible: tuple[int, ...]
    min_flips_to_change: tuple[int | None, ...]
    method: str
    protected: tuple[int, ...] = ()
    epsilon: tuple[tuple[int, float], ...] = ()
    counterexample: Counterexample | None = None
    seconds: float = 0.0
    stats: dict = field(default_factory=dict)

    @property
    def certified(self) -> bool:
        return self.status == Status.CERTIFIED

    def to_json(self) -> dict:
        return {
            "status": self.status.value,
            "prediction": self.prediction,
            "flips": self.flips,
            "k_default": self.k_default,
            "k_candidates": list(self.k_candidates),
            "k_possible": list(self.k_possible),
            "min_flips_to_change": list(self.min_flips_to_change),
            "method": self.method,
            "protected": list(self.protected),
            "epsilon": {str(c): r for c, r in self.epsilon},
            "counterexample": None if self.counterexample is None else self.counterexample.to_json(),
            "seconds": self.seconds,
            "stats": dict(self.stats),
        }

    def __str__(self) -> str:
        return json.dumps(self.to_json())
