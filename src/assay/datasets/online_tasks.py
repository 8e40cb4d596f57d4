"""Reproducible tasks for online verification: networks, input boxes, properties, weight updates.

Online verification (Wei & Liu, "Online Verification of Deep Neural Networks under Domain Shift
or Network Updates") re-checks ``f_t(X(t)) ⊆ Y(t)`` at every time step ``t`` while the input
domain ``X(t)`` drifts or the network ``f_t`` is updated. This module builds the tasks such a
benchmark runs; it verifies nothing itself.

* :func:`motion_task` → :class:`MotionTask`: the paper's robotics task, regenerated. A ReLU MLP
  predicts the next three 3-D velocities of a smooth motion from the last three; the input
  domain grows a little every step (:meth:`MotionTask.box`), and :func:`sgd_updates` gives a
  sequence of networks after one SGD step each on new motion data.
* :func:`digits_task` → :class:`DigitsTask`: a small convolutional classifier of scikit-learn's
  8×8 digits, with ℓ∞ balls around images that are dimmed a little every step
  (:meth:`DigitsTask.dimmed_box`).

Every task is trained on the spot with torch, from a seed, on one thread: the same seed gives the
same weights (for one torch build and CPU). The caller's global torch random state and thread
count are left as they were. Networks are :class:`~assay.nn.Network` values (float64 parameters).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np
import torch

from assay.nn import Conv2d, Flatten, Linear, Network, ReLU
from assay.sets import Box, HalfSpaces, OutputSpec, argmax_is
from assay.threads import torch_threads

__all__ = [
    "MotionTask", "motion_task", "sgd_updates", "motion_spec", "motion_reparametrisation", "motion_velocities",
    "DigitsTask", "digits_task",
]

# ---------------------------------------------------------------------------------------------
# motion task
# ---------------------------------------------------------------------------------------------

MOTION_HIDDEN = (100, 100, 100, 100)
"""Widths of the motion network's hidden ReLU layers (the paper's 4 × 100)."""

MOTION_SPEED_LIMIT = 5.0
"""The output property's bound on every predicted velocity component: |v̂_i| ≤ 5."""

MOTION_JUMP_LIMIT = 10.0
"""The output property's bound on successive differences of predicted velocities (per component)."""

MOTION_DIFF_BOUND = 0.1
"""The bound of the input domain on successive differences of past velocities (per component)."""

# The generator: per sample and axis, v(t) = Σ_k a_k sin(w_k t + φ_k) with Σ a_k ≤ _MAX_AMPLITUDE
# and w_k ≤ _MAX_FREQUENCY, so |v| ≤ 0.9 < 1 and |v(t) − v(t−1)| ≤ Σ a_k w_k ≤ 0.081 < 0.1.
_COMPONENTS = 3
_MAX_AMPLITUDE = 0.9
_MIN_FREQUENCY, _MAX_FREQUENCY = 0.01, 0.09
_TRAIN_SAMPLES = 4096
_TRAIN_STEPS = 800
_TRAIN_BATCH = 256
_TRAIN_LR = 1e-3
_UPDATE_BATCH = 64
_DRIFT_PER_STEP = 0.002  # relative growth of the update data's frequencies per update step


def motion_velocities(n: int, rng: np.random.Generator, length: int = 6, frequency_scale: float = 1.0) -> np.ndarray:
    """``n`` windows of ``length`` successive 3-D velocities of random smooth motions.

    Each window and axis is an independent sum of three sinusoids sampled at unit steps,
    ``v(t) = Σ_k a_k sin(w_k t + φ_k)``, with random amplitudes summing to at most 0.9,
    frequencies in [0.01, 0.09]·``frequency_scale`` and phases in [0, 2π). With
    ``frequency_scale`` = 1 every velocity has ‖v‖∞ ≤ 0.9 < 1 and every successive difference
    ‖v_t − v_{t−1}‖∞ ≤ 0.081 < 0.1.

    Returns:
        float64 array of shape ``(n, length, 3)``: ``[:, j]`` is the velocity at time step j.
    """
    shape = (n, 1, 3, _COMPONENTS)
    weights = rng.uniform(0.1, 1.0, size=shape)
    amplitudes = weights / weights.sum(-1, keepdims=True) * rng.uniform(0.2, _MAX_AMPLITUDE, size=(n, 1, 3, 1))
    frequencies = rng.uniform(_MIN_FREQUENCY, _MAX_FREQUENCY, size=shape) * frequency_scale
    phases = rng.uniform(0.0, 2 * np.pi, size=shape)
    t = np.arange(length, dtype=np.float64).reshape(1, length, 1, 1)
    return (amplitudes * np.sin(frequencies * t + phases)).sum(-1)


def motion_reparametrisation() -> np.ndarray:
    """The matrix T (9, 9) with raw input ``x = T @ z``.

    ``x = (v_{t−2}, v_{t−1}, v_t)`` (the raw network's input) and
    ``z = (v_t, d1 = v_t − v_{t−1}, d2 = v_{t−1} − v_{t−2})`` (the task network's input), so
    ``v_{t−1} = v_t − d1`` and ``v_{t−2} = v_t − d1 − d2``.
    """
    eye, zero = np.eye(3), np.zeros((3, 3))
    return np.block([
        [eye, -eye, -eye],   # v_{t−2}
        [eye, -eye, zero],   # v_{t−1}
        [eye, zero, zero],   # v_t
    ])


def _motion_samples(n: int, rng: np.random.Generator, frequency_scale: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """Reparametrised inputs z (n, 9) and targets (v_{t+1}, v_{t+2}, v_{t+3}) (n, 9), float64."""
    v = motion_velocities(n, rng, 6, frequency_scale)
    past, future = v[:, :3], v[:, 3:]
    z = np.concatenate([past[:, 2], past[:, 2] - past[:, 1], past[:, 1] - past[:, 0]], axis=1)
    return torch.as_tensor(z), torch.as_tensor(future.reshape(n, 9))


@contextmanager
def _seeded_single_thread(seed: int) -> Iterator[None]:
    """Run the body with ``torch.manual_seed(seed)`` on one intra-op thread; restore both afterwards.

    One thread makes training fast on small layers (no thread hand-offs, no contention with
    other processes) and its results independent of the machine's thread count.
    """
    with torch.random.fork_rng(devices=[]), torch_threads(1):
        torch.manual_seed(seed)
        yield


def _network_from_torch(model: torch.nn.Sequential, input_shape, source: str) -> Network:
    """A Network with copies of the parameters of ``model`` (float64 tensors would otherwise be shared)."""
    layers = []
    for module in model:
        if isinstance(module, torch.nn.Linear):
            layers.append(Linear(module.weight.detach().clone(), module.bias.detach().clone()))
        elif isinstance(module, torch.nn.Conv2d):
            layers.append(Conv2d(module.weight.detach().clone(), module.bias.detach().clone(), module.stride, module.padding))
        elif isinstance(module, torch.nn.ReLU):
            layers.append(ReLU())
        elif isinstance(module, torch.nn.Flatten):
            layers.append(Flatten())
        else:  # pragma: no cover - the tasks build only the modules above
            raise TypeError(f"unexpected module {type(module).__name__}")
    return Network(layers=tuple(layers), input_shape=tuple(input_shape), source=source)


def _fold_input_map(network: Network, T: torch.Tensor, source: str) -> Network:
    """``network`` composed with ``x = T z``: the first Linear's weight W becomes W T (bias unchanged)."""
    first = network.layers[0]
    folded = Linear(first.weight @ T, first.bias)
    return Network(layers=(folded, *network.layers[1:]), input_shape=(T.shape[1],), source=source)


def motion_spec() -> OutputSpec:
    """The motion task's required output region (one conjunction of 30 rows ``C y + d ≥ 0``).

    Outputs ``y = (v̂_{t+1}, v̂_{t+2}, v̂_{t+3})`` (9 values). Rows, in order:

    * 18 rows ``5 − y_i ≥ 0`` and ``y_i + 5 ≥ 0`` (i = 0 … 8, alternating): |v̂_i| ≤ 5;
    * 12 rows ``10 − (y_{i+3} − y_i) ≥ 0`` and ``(y_{i+3} − y_i) + 10 ≥ 0`` (i = 0 … 5,
      alternating): |v̂_{t+2} − v̂_{t+1}| ≤ 10 and |v̂_{t+3} − v̂_{t+2}| ≤ 10 per component.

    The paper also bounds |v̂_{t+1} − v_t|, which involves the input v_t; an output specification
    cannot see inputs, so that difference is left out.
    """
    rows, offsets = [], []
    eye = np.eye(9)
    for i in range(9):
        rows += [-eye[i], eye[i]]
        offsets += [MOTION_SPEED_LIMIT, MOTION_SPEED_LIMIT]
    for i in range(6):
        jump = eye[i + 3] - eye[i]
        rows += [-jump, jump]
        offsets += [MOTION_JUMP_LIMIT, MOTION_JUMP_LIMIT]
    return OutputSpec((HalfSpaces(np.array(rows), np.array(offsets)),))


@dataclass(frozen=True, eq=False)
class MotionTask:
    """The regenerated robotics task of Wei & Liu (see :func:`motion_task`).

    Attributes:
        network: the task network f(z): 9 reparametrised inputs ``z = (v_t, d1, d2)`` → 4 × 100
            ReLUs → 9 outputs ``(v̂_{t+1}, v̂_{t+2}, v̂_{t+3})``. It equals
            ``raw_network(reparametrisation @ z)``.
        raw_network: the same network on raw inputs ``x = (v_{t−2}, v_{t−1}, v_t)``.
        reparametrisation: T, float64 tensor (9, 9) with ``x = T @ z``.
        spec: the required output region Y (:func:`motion_spec`), one conjunction.
        train_seconds: how long training took.
    """

    network: Network
    raw_network: Network
    reparametrisation: torch.Tensor
    spec: OutputSpec
    train_seconds: float = 0.0

    def box(self, step: int = 0, growth: float = 1e-3) -> Box:
        """The input domain X(step) over z: a Box of shape (9,).

        ``z[0:3] = v_t`` lies in ``[−(1 + step·growth), 1 + step·growth]``; the differences
        ``z[3:9] = (d1, d2)`` stay in [−0.1, 0.1].

        At step 0 the box covers every input with ‖v_t‖∞ ≤ 1 and ‖v_{t−j} − v_{t−j−1}‖∞ ≤ 0.1
        (j = 0, 1). It relaxes the constraint ‖v_{t−1}‖∞, ‖v_{t−2}‖∞ ≤ 1 on the older velocities
        (they may reach 1.1 and 1.2): a superset of the paper's X, so "holds" over the box is
        sound for the paper's X.
        """
        bound = 1.0 + int(step) * float(growth)
        if bound <= 0:
            raise ValueError(f"the box at step {step} with growth {growth} is empty")
        upper = np.array([bound] * 3 + [MOTION_DIFF_BOUND] * 6)
        return Box(-upper, upper)

    def sgd_updates(self, steps: int, lr: float = 1e-3, seed: int = 0, last_layer_only: bool = False) -> list[Network]:
        """:func:`sgd_updates` starting from :attr:`network`."""
        return sgd_updates(self.network, steps, lr=lr, seed=seed, last_layer_only=last_layer_only)

    def to_raw(self, z) -> torch.Tensor:
        """Raw inputs ``x = T z`` for z of shape (9,) or (N, 9), as float64."""
        z = torch.as_tensor(z, dtype=torch.float64)
        return z @ self.reparametrisation.T


def motion_task(seed: int = 0) -> MotionTask:
    """Train the motion network and build the task (a few seconds on 2 CPU cores).

    Training data: 4096 windows of :func:`motion_velocities` (random smooth motions with
    ‖v‖∞ < 1 and successive differences < 0.1), drawn from ``numpy.random.default_rng(seed)``.
    The raw network (9 → 100 → 100 → 100 → 100 → 9, ReLU) is initialised after
    ``torch.manual_seed(seed)`` and trained in float32 with Adam (lr 1e-3, 800 steps on minibatches
    of 256 drawn with a seeded generator, mean squared error) to map ``(v_{t−2}, v_{t−1}, v_t)`` to ``(v_{t+1}, v_{t+2}, v_{t+3})``.
    The map ``x = T z`` (:func:`motion_reparametrisation`) is then folded into the first layer.

    Returns:
        :class:`MotionTask`. For seed 0, ``assay.verify.verify(task.network, task.box(0),
        spec=task.spec, timeout=60)`` returns HOLDS (under a second on one thread, input
        splitting); the smallest row value on sampled inputs is about 3.8, while neither IBP
        (lowest row bound ≈ −171) nor CROWN (≈ −6.8) over the whole box proves it alone.
    """
    T = motion_reparametrisation()
    rng = np.random.default_rng(seed)
    z, y = _motion_samples(_TRAIN_SAMPLES, rng)
    x = z @ torch.as_tensor(T).T
    started = time.perf_counter()
    with _seeded_single_thread(seed):
        widths = (9, *MOTION_HIDDEN)
        modules = []
        for n_in, n_out in zip(widths[:-1], widths[1:]):
            modules += [torch.nn.Linear(n_in, n_out), torch.nn.ReLU()]
        model = torch.nn.Sequential(*modules, torch.nn.Linear(widths[-1], 9))
        optimiser = torch.optim.Adam(model.parameters(), lr=_TRAIN_LR)
        x32, y32 = x.float(), y.float()
        generator = torch.Generator().manual_seed(seed)
        for _ in range(_TRAIN_STEPS):
            batch = torch.randint(len(x32), (_TRAIN_BATCH,), generator=generator)
            optimiser.zero_grad()
            loss = torch.nn.functional.mse_loss(model(x32[batch]), y32[batch])
            loss.backward()
            optimiser.step()
    train_seconds = time.perf_counter() - started
    raw = _network_from_torch(model, (9,), "motion task (raw inputs v_{t-2}, v_{t-1}, v_t)")
    T = torch.as_tensor(T)
    network = _fold_input_map(raw, T, "motion task")
    return MotionTask(network, raw, T, motion_spec(), train_seconds)


def sgd_updates(network: Network, steps: int, lr: float = 1e-3, seed: int = 0,
                last_layer_only: bool = False) -> list[Network]:
    """A weight-update sequence: one plain SGD step per time step on fresh motion data.

    Args:
        network: the starting network, on reparametrised inputs z (e.g. ``motion_task().network``
            or a network this function returned); it is not modified.
        steps: the number of updates (≥ 0).
        lr: the SGD learning rate.
        seed: seeds the data (``numpy.random.default_rng(seed)``); the sequence is deterministic.
        last_layer_only: update only the last Linear layer's weight and bias (fine-tuning);
            every other parameter stays bit-identical.

    At update k (1 … steps) the minibatch is 64 fresh windows of :func:`motion_velocities`
    whose frequencies are scaled by ``1 + 0.002·k`` (a slowly drifting motion: from about
    k = 115 on, successive differences of the data may exceed the box's 0.1), mapped to z;
    the loss is the mean squared error of the predicted next three velocities, computed in
    float64 on the network itself (trained directly on z, no re-folding).

    Returns:
        ``steps`` networks: the network after updates 1, …, steps, each with the same layers
        and input shape (9,) as ``network``.
    """
    steps = int(steps)
    if steps < 0:
        raise ValueError(f"steps must be ≥ 0; got {steps}")
    rng = np.random.default_rng(seed)
    model = network.to_torch()
    linears = [m for m in model if isinstance(m, torch.nn.Linear)]
    trained = list(linears[-1].parameters()) if last_layer_only else list(model.parameters())
    for parameter in model.parameters():
        parameter.requires_grad_(False)
    for parameter in trained:
        parameter.requires_grad_(True)
    optimiser = torch.optim.SGD(trained, lr=lr)
    networks = []
    with _seeded_single_thread(seed):
        for k in range(1, steps + 1):
            z, y = _motion_samples(_UPDATE_BATCH, rng, 1.0 + _DRIFT_PER_STEP * k)
            optimiser.zero_grad()
            loss = torch.nn.functional.mse_loss(model(z), y)
            loss.backward()
            optimiser.step()
            networks.append(_network_from_torch(model, network.input_shape, f"{network.source}, SGD update {k}"))
    return networks


# ---------------------------------------------------------------------------------------------
# digits task
# ---------------------------------------------------------------------------------------------

_DIGITS_TEST_SIZE = 0.3
_DIGITS_EPOCHS = 60
_DIGITS_BATCH = 64
_DIGITS_LR = 3e-3


@dataclass(frozen=True, eq=False)
class DigitsTask:
    """A small convolutional digits classifier with dimming input domains (see :func:`digits_task`).

    Images are scikit-learn's 8×8 digits with pixels scaled to [0, 1], shape (1, 8, 8).
    Image *indices* count the correctly classified test images: ``image(0)`` is the first test
    image (in the test split's order) that the network classifies correctly.

    Attributes:
        network: Conv2d(1→4, 3×3, pad 1) → ReLU → Conv2d(4→8, 3×3, stride 2, pad 1) → ReLU →
            Flatten → Linear(128→32) → ReLU → Linear(32→10); input shape (1, 8, 8), 10 logits.
        test_images: float64 tensor (N, 1, 8, 8), the whole test split.
        test_labels: int64 tensor (N,).
        correct: int64 tensor of the positions in the test split that are classified correctly,
            in order; index i of the methods means test image ``correct[i]``.
        test_accuracy: the fraction of the test split classified correctly.
        default_images: indices (into ``correct``) whose ``spec`` was verified to hold over
            ``dimmed_box(i, 0)`` with the default dim and radius for the default seed 0.
        train_seconds: how long training took.
    """

    network: Network
    test_images: torch.Tensor
    test_labels: torch.Tensor
    correct: torch.Tensor
    test_accuracy: float
    default_images: tuple[int, ...] = ()
    train_seconds: float = 0.0

    def _position(self, index: int) -> int:
        index = int(index)
        if not 0 <= index < len(self.correct):
            raise IndexError(f"image index {index} out of range: {len(self.correct)} test images are classified correctly")
        return int(self.correct[index])

    def image(self, index: int) -> tuple[torch.Tensor, int]:
        """The ``index``-th correctly classified test image (float64, (1, 8, 8), in [0, 1]) and its label."""
        position = self._position(index)
        return self.test_images[position].clone(), int(self.test_labels[position])

    def dimmed_box(self, index: int, step: int = 0, dim: float = 1 / 256, radius: float = 2 / 256) -> Box:
        """The input domain at time step ``step``: a Box of shape (1, 8, 8) inside [0, 1].

        The image x is dimmed to ``x_step = max(x − step·dim, 0)`` (pixelwise, clipped at 0) and
        the box is the ℓ∞ ball of ``radius`` around ``x_step`` clipped to [0, 1]; it contains
        ``x_step``.
        """
        x, _ = self.image(index)
        dimmed = torch.clamp(x - int(step) * float(dim), min=0.0)
        return Box.around(dimmed, float(radius), 0.0, 1.0)

    def spec(self, index: int) -> OutputSpec:
        """The required output region: the label of image ``index`` stays an argmax (:func:`~assay.sets.argmax_is`)."""
        return argmax_is(self.image(index)[1], 10)


# Seed 0: assay.verify.verify(network, dimmed_box(i, 0), spec=spec(i), strategy="relu", timeout=30)
# returned HOLDS for each of the first ten correctly classified test images (about 4 s each on
# one thread, mostly the counterexample search; CROWN alone already proves them at radius 2/256).
_DIGITS_DEFAULT_IMAGES: dict[int, tuple[int, ...]] = {0: tuple(range(10))}


def digits_task(seed: int = 0) -> DigitsTask:
    """Train the convolutional digits classifier and build the task (a few seconds on 2 CPU cores).

    Data: ``sklearn.datasets.load_digits`` with pixels divided by 16, split 70/30 stratified with
    ``random_state=seed``. Training: ``torch.manual_seed(seed)``, float32, Adam (lr 3e-3),
    60 epochs of minibatches of 64 (shuffled by a seeded generator), cross-entropy.

    Returns:
        :class:`DigitsTask`; ``default_images`` is filled for seed 0 (empty for other seeds).
    """
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    features, targets = load_digits(return_X_y=True)
    images = features.reshape(-1, 1, 8, 8) / 16.0
    x_train, x_test, y_train, y_test = train_test_split(images, targets, test_size=_DIGITS_TEST_SIZE,
                                                        random_state=seed, stratify=targets)
    x_train32 = torch.as_tensor(x_train, dtype=torch.float32)
    y_train = torch.as_tensor(y_train, dtype=torch.long)
    started = time.perf_counter()
    with _seeded_single_thread(seed):
        model = torch.nn.Sequential(
            torch.nn.Conv2d(1, 4, 3, stride=1, padding=1), torch.nn.ReLU(),
            torch.nn.Conv2d(4, 8, 3, stride=2, padding=1), torch.nn.ReLU(),
            torch.nn.Flatten(), torch.nn.Linear(128, 32), torch.nn.ReLU(), torch.nn.Linear(32, 10),
        )
        optimiser = torch.optim.Adam(model.parameters(), lr=_DIGITS_LR)
        generator = torch.Generator().manual_seed(seed)
        for _ in range(_DIGITS_EPOCHS):
            order = torch.randperm(len(x_train32), generator=generator)
            for start in range(0, len(order), _DIGITS_BATCH):
                batch = order[start:start + _DIGITS_BATCH]
                optimiser.zero_grad()
                loss = torch.nn.functional.cross_entropy(model(x_train32[batch]), y_train[batch])
                loss.backward()
                optimiser.step()
    train_seconds = time.perf_counter() - started
    network = _network_from_torch(model, (1, 8, 8), "digits task (conv)")
    test_images = torch.as_tensor(x_test, dtype=torch.float64)
    test_labels = torch.as_tensor(y_test, dtype=torch.long)
    predicted = network.forward(test_images).argmax(1)
    hits = predicted == test_labels
    correct = torch.nonzero(hits).reshape(-1)
    return DigitsTask(network, test_images, test_labels, correct, float(hits.double().mean()),
                      _DIGITS_DEFAULT_IMAGES.get(int(seed), ()), train_seconds)
