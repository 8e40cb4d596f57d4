"""The demo behind ``assay demo`` (``make demo``): certify a small digits classifier end to end.

Trains a ReLU MLP with scikit-learn on its bundled 8×8 digits (pixels scaled to [0, 1]; no file
is read besides what scikit-learn ships), loads it with :func:`assay.nn.load`, and for each ε
bounds the L∞ ball of radius ε (clipped to [0, 1]) around the first correctly classified test
images with each bound method. An image is *certified* when every margin
``y_label − y_j`` (j ≠ label) has a lower bound > 0 over its ball, which proves no input of the
ball changes the prediction. A PGD attack looks for the opposite: a point of the ball whose
float64 forward pass has ``y_j ≥ y_label`` (*falsified*). Certified and falsified images must be
disjoint; the demo raises if they are not (it doubles as a soundness check).
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass

import torch

from assay._validate import check_choice, check_float, check_int
from assay.bounds.methods import method_names
from assay.errors import OptionError

__all__ = ["run_demo", "DemoResult", "DemoRow", "DEFAULT_EPSILONS"]

DEFAULT_EPSILONS = (0.01, 0.03, 0.05, 0.1)
_METHODS = method_names()


@dataclass(frozen=True)
class DemoRow:
    """One line of the demo table: a method (or the attack) at one ε.

    ``certified`` is None for the attack row, ``falsified`` None for bound methods.
    """

    epsilon: float
    method: str
    images: int
    certified: int | None
    falsified: int | None
    seconds: float


@dataclass(frozen=True)
class DemoResult:
    """Everything the demo measured: the model, its accuracy, and one row per (ε, method)."""

    hidden_layers: tuple[int, ...]
    parameters: int
    train_seconds: float
    test_accuracy: float
    images: int
    rows: tuple[DemoRow, ...]
    total_seconds: float

    def to_json(self) -> dict:
        return asdict(self) | {"rows": [asdict(row) for row in self.rows]}


def run_demo(
    epsilons: Sequence[float] = DEFAULT_EPSILONS,
    images: int = 100,
    methods: Sequence[str] = ("ibp", "crown", "alpha"),
    hidden_layers: Sequence[int] = (32, 32),
    attack_steps: int = 50,
    attack_restarts: int = 4,
    seed: int = 0,
    progress: Callable[[str], None] | None = None,
) -> DemoResult:
    """Train, load and certify a digits MLP; see the module docstring.

    Args:
        epsilons: L∞ radii on [0, 1] pixels.
        images: how many correctly classified test images to certify (the first ones, in order).
        methods: bound methods (``"ibp"``, ``"crown"``, ``"alpha"``, ``"beta"``).
        hidden_layers: widths of the MLP's hidden ReLU layers.
        attack_steps, attack_restarts: PGD budget per image (restarts start at random points).
        seed: seeds the train/test split, the MLP's initialisation and the attack's starts.
        progress: optional callable receiving a short description of each stage.

    Returns:
        :class:`DemoResult`. Soundness: a certified count comes from sound bounds in float64;
        a falsified count only from points re-checked by a float64 forward pass.
    """
    for epsilon in epsilons:
        check_float(epsilon, "epsilons", "run_demo", minimum=0.0, strict=True)
    if not epsilons:
        raise OptionError("the `epsilons` option of run_demo needs at least one radius")
    check_int(images, "images", "run_demo", minimum=1)
    for method in methods:
        check_choice(method, "methods", "run_demo", _METHODS)
    check_int(attack_steps, "attack_steps", "run_demo", minimum=1)
    check_int(attack_restarts, "attack_restarts", "run_demo", minimum=0)
    report = progress or (lambda stage: None)
    started = time.perf_counter()

    report("training a ReLU MLP on scikit-learn's digits")
    network, x_test, y_test, accuracy, train_seconds = _train(tuple(hidden_layers), seed)
    with torch.no_grad():
        predicted = network.forward(x_test).argmax(1)
    chosen = torch.nonzero(predicted == y_test).flatten()[:images]
    x, labels = x_test[chosen], y_test[chosen]
    margins = _margin_rows(labels, network.output_size)

    from assay.bounds import compute_bounds

    # The first call of each method pays torch's one-off start-up costs: keep them out of the table.
    report("warming up")
    warm = (x - epsilons[0]).clamp(0, 1), (x + epsilons[0]).clamp(0, 1)
    for method in methods:
        compute_bounds(network, warm, margins, method, dtype="float64", sides="lower")

    rows = []
    for epsilon in epsilons:
        lower, upper = (x - epsilon).clamp(0, 1), (x + epsilon).clamp(0, 1)
        certified_sets = {}
        for method in methods:
            report(f"ε = {epsilon:g}: {method} bounds")
            tic = time.perf_counter()
            bounds = compute_bounds(network, (lower, upper), margins, method, dtype="float64", sides="lower")
            certified = (bounds.lower > 0).all(1)
            rows.append(DemoRow(float(epsilon), method, len(x), int(certified.sum()), None, time.perf_counter() - tic))
            certified_sets[method] = certified
        report(f"ε = {epsilon:g}: PGD attack")
        tic = time.perf_counter()
        falsified = _pgd(network, lower, upper, margins, attack_steps, attack_restarts, seed)
        rows.append(DemoRow(float(epsilon), "pgd", len(x), None, int(falsified.sum()), time.perf_counter() - tic))
        for method, certified in certified_sets.items():
            if (certified & falsified).any():
                image = int(torch.nonzero(certified & falsified)[0])
                raise RuntimeError(
                    f"soundness bug: {method} certified image {int(chosen[image])} at ε = {epsilon}, "
                    "but PGD found a violating point re-checked by a forward pass"
                )
    return DemoResult(tuple(int(w) for w in hidden_layers), network.num_parameters, train_seconds, accuracy, len(x),
                      tuple(rows), time.perf_counter() - started)


def _train(hidden_layers: tuple[int, ...], seed: int):
    from sklearn.datasets import load_digits
    from sklearn.exceptions import ConvergenceWarning
    from sklearn.model_selection import train_test_split
    from sklearn.neural_network import MLPClassifier

    from assay.nn import load

    features, targets = load_digits(return_X_y=True)
    features = features / 16.0  # 4-bit gray levels → [0, 1]
    x_train, x_test, y_train, y_test = train_test_split(features, targets, test_size=0.3, random_state=seed,
                                                        stratify=targets)
    tic = time.perf_counter()
    classifier = MLPClassifier(hidden_layer_sizes=hidden_layers, random_state=seed, max_iter=300)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        classifier.fit(x_train, y_train)
    train_seconds = time.perf_counter() - tic
    accuracy = float(classifier.score(x_test, y_test))
    network = load(classifier)
    return network, torch.as_tensor(x_test), torch.as_tensor(y_test), accuracy, train_seconds


def _margin_rows(labels: torch.Tensor, classes: int) -> torch.Tensor:
    """Spec rows ``e_label − e_j`` for every j ≠ label: (B, classes − 1, classes) float64."""
    eye = torch.eye(classes, dtype=torch.float64)
    others = torch.arange(classes)
    return torch.stack([eye[label] - eye[others[others != label]] for label in labels.tolist()])


def _pgd(network, lower, upper, margins, steps: int, restarts: int, seed: int) -> torch.Tensor:
    """True for each image where a point of its box with a margin ≤ 0 was found and re-checked."""
    falsified = torch.zeros(lower.shape[0], dtype=torch.bool)
    if restarts == 0:
        return falsified
    model = network.to_torch()
    generator = torch.Generator().manual_seed(seed)
    step = (upper - lower).amax(1, keepdim=True) / 8
    for _ in range(restarts):
        point = lower + (upper - lower) * torch.rand(lower.shape, generator=generator, dtype=torch.float64)
        for _ in range(steps):
            point.requires_grad_(True)
            worst = torch.einsum("bsk,bk->bs", margins, model(point)).amin(1)
            (gradient,) = torch.autograd.grad(worst.sum(), point)
            with torch.no_grad():
                point = torch.minimum(torch.maximum(point - step * gradient.sign(), lower), upper)
        with torch.no_grad():  # the plain forward pass decides, not the attack's own model
            outputs = network.forward(point, dtype="float64")
            falsified |= torch.einsum("bsk,bk->bs", margins, outputs).amin(1) <= 0
    return falsified
