"""Small random KNN-fairness problems for the soundness tests (explicit generators, no global seeds)."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass
class Problem:
    X: np.ndarray
    y: np.ndarray
    tests: np.ndarray
    ks: list[int]
    folds: int
    flips: int
    protected: list[int] = field(default_factory=list)
    class_weights: dict | None = None
    down_sample: bool = False
    flippable: np.ndarray | None = None
    direction: tuple[int, int] | None = None

    @property
    def learner(self) -> dict:
        return dict(k_candidates=self.ks, folds=self.folds, class_weights=self.class_weights, down_sample=self.down_sample)

    @property
    def restrictions(self) -> dict:
        return dict(flippable=self.flippable, direction=self.direction)


def random_problem(rng: np.random.Generator) -> Problem:
    """Grid-valued features (many distance ties), labels driven by columns 1.., a binary protected column 0."""
    n_rows = int(rng.integers(18, 32))
    d = int(rng.integers(3, 5))
    n_classes = int(rng.choice([2, 2, 3]))

    def draw(rows):
        X = np.concatenate([rng.integers(0, 2, size=(rows, 1)), rng.integers(0, 4, size=(rows, d - 1))], axis=1).astype(float)
        if rng.random() < 0.5:
            X[:, 1:] += rng.normal(0, 0.2, size=(rows, d - 1)).round(1)
        return X

    X = draw(n_rows)
    score = X[:, 1:].sum(axis=1) + rng.normal(0, 0.5, n_rows)
    y = np.digitize(score, np.quantile(score, np.linspace(0, 1, n_classes + 1)[1:-1]))
    y[:n_classes] = np.arange(n_classes)
    weights = {0: int(rng.choice([1, 2])), 1: 1} if n_classes == 2 else None
    problem = Problem(
        X=X, y=y, tests=draw(6),
        ks=sorted(rng.choice(np.arange(1, 9), size=int(rng.integers(2, 4)), replace=False).tolist()),
        folds=int(rng.choice([3, 4, 5])), flips=int(rng.choice([1, 1, 2, 3])),
        protected=[0] if rng.random() < 0.5 else [], class_weights=weights,
        down_sample=bool(rng.random() < 0.3) and weights is not None)
    r = rng.random()
    if r < 0.15 and n_classes == 2:
        problem.direction = (1, 0)
    elif r < 0.3:
        problem.flippable = rng.random(n_rows) < 0.6
    return problem


def load_split(data_dir, name: str):
    """The authors' split: four arrays stored one after another (X_train, y_train, X_test, y_test)."""
    with open(data_dir / "knn" / "splits" / f"{name}-10.npy", "rb") as handle:
        return [np.load(handle) for _ in range(4)]


def report_lines(request, lines: list[str]) -> None:
    """Write a module's tally to the terminal at its end (past pytest's output capture)."""
    reporter = request.config.pluginmanager.get_plugin("terminalreporter")
    capture = request.config.pluginmanager.get_plugin("capturemanager")
    if reporter is not None and capture is not None:
        with capture.global_and_fixture_disabled():
            reporter.write_line("\n".join(lines))
    else:  # pragma: no cover
        print("\n".join(lines))
