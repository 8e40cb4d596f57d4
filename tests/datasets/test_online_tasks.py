"""assay.datasets.online_tasks: the generated tasks of online verification (networks, boxes, specs, updates).

The tasks are trained once per module (a few seconds each); the determinism tests train each
twice more, with the same procedure cut short (a few steps show a missing seed as well as the whole run).
"""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
import torch

import assay.datasets
import assay.datasets.online_tasks as online_tasks
from assay.datasets import (
    DigitsTask,
    MotionTask,
    digits_task,
    motion_reparametrisation,
    motion_spec,
    motion_task,
    motion_velocities,
    sgd_updates,
)
from assay.nn import Conv2d, Flatten, Linear, Network, ReLU
from assay.sets import Box, argmax_is

NEW_NAMES = {"MotionTask", "motion_task", "sgd_updates", "motion_spec", "motion_reparametrisation", "motion_velocities",
             "DigitsTask", "digits_task"}


def parameters(network: Network) -> list[torch.Tensor]:
    return [t for layer in network.layers if isinstance(layer, (Linear, Conv2d)) for t in (layer.weight, layer.bias)]


def same_weights(a: Network, b: Network) -> bool:
    return len(parameters(a)) == len(parameters(b)) and all(torch.equal(x, y) for x, y in zip(parameters(a), parameters(b)))


def after_seed(caller_seed: int, make_task):
    """The task for seed 0, built after the caller seeded torch with ``caller_seed`` (it must not matter)."""
    torch.manual_seed(caller_seed)
    return make_task(0)


@pytest.fixture(scope="module")
def motion() -> MotionTask:
    state, threads = torch.get_rng_state(), torch.get_num_threads()
    task = motion_task(0)
    assert torch.equal(torch.get_rng_state(), state) and torch.get_num_threads() == threads  # caller's state untouched
    return task


@pytest.fixture(scope="module")
def digits() -> DigitsTask:
    return digits_task(0)


# ---------------------------------------------------------------------- package
def test_names_are_exported_documented_and_lazy():
    assert NEW_NAMES <= set(assay.datasets.__all__)
    for name in NEW_NAMES:
        assert getattr(assay.datasets, name).__doc__, name
    code = "import sys, assay.datasets; assert 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)


# ---------------------------------------------------------------------- motion task
def test_motion_data_is_smooth_and_bounded():
    v = motion_velocities(500, np.random.default_rng(3), length=40)
    assert v.shape == (500, 40, 3)
    assert np.abs(v).max() < 1 and np.abs(np.diff(v, axis=1)).max() < 0.1


def test_motion_shapes(motion):
    network = motion.network
    assert network.input_shape == (9,) and network.output_shape == (9,)
    kinds = [type(layer) for layer in network.layers]
    assert kinds == [Linear, ReLU] * 4 + [Linear]
    assert [layer.weight.shape[0] for layer in network.layers if isinstance(layer, Linear)] == [100] * 4 + [9]
    assert motion.raw_network.input_shape == (9,) and [type(x) for x in motion.raw_network.layers] == kinds
    assert motion.reparametrisation.shape == (9, 9) and motion.reparametrisation.dtype == torch.float64
    assert np.array_equal(motion.reparametrisation.numpy(), motion_reparametrisation())
    assert motion.train_seconds > 0


def test_motion_is_deterministic(monkeypatch):
    monkeypatch.setattr(online_tasks, "_TRAIN_STEPS", 20)
    first, again = after_seed(1, motion_task), after_seed(2, motion_task)
    assert same_weights(again.network, first.network) and same_weights(again.raw_network, first.raw_network)


def test_reparametrisation_identity(motion, rng):
    z = torch.as_tensor(rng.uniform(-1.5, 1.5, size=(200, 9)))
    x = z @ motion.reparametrisation.T
    assert torch.allclose(motion.network(z), motion.raw_network(x), rtol=0, atol=1e-10)
    assert torch.equal(motion.to_raw(z), x)
    # x = (v_{t-2}, v_{t-1}, v_t) from z = (v_t, d1, d2)
    v_t, d1, d2 = z[:, 0:3], z[:, 3:6], z[:, 6:9]
    assert torch.allclose(x, torch.cat([v_t - d1 - d2, v_t - d1, v_t], 1), rtol=0, atol=1e-15)
    # the hidden layers are shared; only the first weight is folded
    assert torch.equal(motion.network.layers[0].bias, motion.raw_network.layers[0].bias)
    assert torch.allclose(motion.network.layers[0].weight, motion.raw_network.layers[0].weight @ motion.reparametrisation)


def test_box_growth(motion):
    box = motion.box()
    assert isinstance(box, Box) and box.shape == (9,)
    assert box.upper.tolist() == [1.0] * 3 + [0.1] * 6 and torch.equal(box.lower, -box.upper)
    later = motion.box(50, growth=0.01)
    assert torch.allclose(later.upper, torch.tensor([1.5] * 3 + [0.1] * 6, dtype=torch.float64))
    assert torch.equal(later.lower, -later.upper)
    assert torch.allclose(motion.box(7).upper[:3], torch.full((3,), 1.007, dtype=torch.float64))


def test_box_covers_the_motion_data(motion):
    v = torch.as_tensor(motion_velocities(1000, np.random.default_rng(1), length=3))
    z = torch.cat([v[:, 2], v[:, 2] - v[:, 1], v[:, 1] - v[:, 0]], 1)
    assert bool(motion.box().contains(z).all())
    assert torch.allclose(motion.to_raw(z), v.reshape(-1, 9), rtol=0, atol=1e-12)


def test_spec_rows_and_samples(motion, rng):
    spec = motion_spec()
    assert len(spec.conjunctions) == 1 and spec.num_outputs == 9 and spec.num_rows == 30
    inside = torch.zeros(9, dtype=torch.float64)
    assert spec.contains(inside) and spec.contains(torch.full((9,), 4.9, dtype=torch.float64))
    assert not spec.contains(torch.tensor([5.1] + [0.0] * 8))  # a speed over 5
    # the jump limit of 10 is implied by the speed limit of 5 except on the boundary: check the rows directly
    C, d, _ = spec.rows()
    jumps = C[18:]
    assert torch.equal(jumps.abs().sum(1), torch.full((12,), 2.0, dtype=torch.float64)) and torch.equal(d[18:], torch.full((12,), 10.0, dtype=torch.float64))
    # the trained network satisfies the property on samples of box(0) (the verifier proves it in full)
    outputs = motion.network(motion.box().sample(5000, rng))
    assert bool(motion.spec.contains(outputs).all())


def test_sgd_updates_change_all_weights_deterministically(motion):
    updates = sgd_updates(motion.network, 3, lr=1e-3, seed=0)
    assert len(updates) == 3
    for network in updates:
        assert network.input_shape == (9,) and network.output_shape == (9,)
        assert [type(layer) for layer in network.layers] == [type(layer) for layer in motion.network.layers]
    previous = motion.network
    for network in updates:
        for before, after in zip(parameters(previous), parameters(network)):
            assert not torch.equal(before, after)
        previous = network
    assert all(same_weights(a, b) for a, b in zip(updates, motion.sgd_updates(3, lr=1e-3, seed=0)))
    assert same_weights(updates[0], sgd_updates(motion.network, 1, lr=1e-3, seed=0)[0])  # later steps leave it alone
    assert not same_weights(updates[0], sgd_updates(motion.network, 1, seed=1)[0])
    assert sgd_updates(motion.network, 0) == []
    # small steps: the updated network stays close to the original
    z = motion.box().sample(100, np.random.default_rng(0))
    assert (updates[-1](z) - motion.network(z)).abs().max() < 0.1


def test_sgd_updates_last_layer_only(motion):
    updates = sgd_updates(motion.network, 2, last_layer_only=True)
    for network in updates:
        before, after = parameters(motion.network), parameters(network)
        assert all(torch.equal(x, y) for x, y in zip(before[:-2], after[:-2]))
        assert not torch.equal(before[-2], after[-2]) and not torch.equal(before[-1], after[-1])


# ---------------------------------------------------------------------- digits task
def test_digits_shapes_and_accuracy(digits):
    network = digits.network
    assert network.input_shape == (1, 8, 8) and network.output_shape == (10,)
    assert [type(layer) for layer in network.layers] == [Conv2d, ReLU, Conv2d, ReLU, Flatten, Linear, ReLU, Linear]
    assert digits.test_accuracy > 0.9
    assert digits.test_images.shape[1:] == (1, 8, 8) and digits.test_images.min() >= 0 and digits.test_images.max() <= 1
    assert len(digits.default_images) >= 3 and all(0 <= i < len(digits.correct) for i in digits.default_images)


def test_digits_is_deterministic(monkeypatch):
    monkeypatch.setattr(online_tasks, "_DIGITS_EPOCHS", 2)
    first, again = after_seed(1, digits_task), after_seed(2, digits_task)
    assert same_weights(again.network, first.network) and again.test_accuracy == first.test_accuracy


def test_digits_images_are_correctly_classified(digits):
    for index in range(10):
        image, label = digits.image(index)
        assert image.shape == (1, 8, 8) and image.dtype == torch.float64
        assert int(digits.network(image).argmax()) == label
        spec = digits.spec(index)
        assert torch.equal(spec.rows()[0], argmax_is(label, 10).rows()[0]) and spec.contains(digits.network(image))
    with pytest.raises(IndexError):
        digits.image(len(digits.correct))


@pytest.mark.parametrize("step", [0, 1, 5, 300])
def test_dimmed_box(digits, step):
    image, _ = digits.image(2)
    box = digits.dimmed_box(2, step)
    dimmed = torch.clamp(image - step / 256, min=0.0)
    assert box.shape == (1, 8, 8)
    assert box.lower.min() >= 0 and box.upper.max() <= 1
    assert box.contains(dimmed)
    assert torch.allclose(box.upper, torch.clamp(dimmed + 2 / 256, max=1.0)) and torch.allclose(box.lower, torch.clamp(dimmed - 2 / 256, min=0.0))
    wide = digits.dimmed_box(2, step, dim=0.01, radius=0.05)
    assert wide.contains(torch.clamp(image - step * 0.01, min=0.0)) and wide.lower.min() >= 0 and wide.upper.max() <= 1
