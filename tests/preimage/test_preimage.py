"""Preimage approximation: every certificate is attacked with samples, volumes checked exactly in 2-D.

Under-approximations: no sampled point the result contains may leave the output region.
Over-approximations: every sampled point that maps into the output region must be contained.
"""

from __future__ import annotations

import functools
import json

import numpy as np
import pytest
import torch

from assay.errors import OptionError, SpecError
from assay.nn import Conv2d, Flatten, Linear, Network, ReLU, load
from assay.preimage import approximate_preimage
from assay.sets import Box, all_of, any_of, argmax_is, patch_region, sunbeam_region
from tests.preimage.exact import one_hidden_layer_preimage_area, polytope_area
from tests.verify.networks import random_relu_network

CHECK_SAMPLES = 100_000


def _in_region(network, x, C, d) -> np.ndarray:
    y = network.forward(torch.as_tensor(x)).reshape(len(x), -1)
    return ((y @ C.T + d) >= 0).all(1).numpy()


def _uniform(lower, upper, count, rng) -> np.ndarray:
    lower, upper = np.asarray(lower, dtype=np.float64), np.asarray(upper, dtype=np.float64)
    return lower + rng.random((count, *lower.shape)) * (upper - lower)


def _attack(result, network, lower, upper, rng) -> tuple[np.ndarray, np.ndarray]:
    """Sample the region; fail on any point that refutes the approximation. Returns (inside, contained)."""
    x = _uniform(lower, upper, CHECK_SAMPLES, rng)
    inside = _in_region(network, x, result.C, result.d)
    contained = result.contains(x)
    if result.kind == "under":
        assert not (contained & ~inside).any(), "a contained point leaves the output region"
    else:
        assert not (inside & ~contained).any(), "a preimage point lies outside the over-approximation"
    return inside, contained


def _volume_agrees(result, contained, slack_sigmas: float = 4.0) -> None:
    """The share of uniform samples the result contains agrees with its reported volume."""
    share = contained.mean()
    volume = share * result.region_volume
    sampling = slack_sigmas * result.region_volume * np.sqrt(max(share * (1 - share), 1e-12) / len(contained))
    estimate = result.approximation_volume
    assert estimate.low - sampling <= volume <= estimate.high + sampling, (volume, estimate)


@pytest.mark.parametrize("kind", ["under", "over"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_random_networks_sound_under_sampling(kind, seed):
    network = random_relu_network(seed, widths=(3, 16, 16, 3))
    lower, upper = -np.ones(3), np.ones(3)
    result = approximate_preimage(network, (torch.as_tensor(lower), torch.as_tensor(upper)), argmax_is(0, 3),
                                  kind=kind, threshold=0.85 if kind == "under" else 1.15, samples=500, time_limit=6,
                                  method="crown" if seed == 2 else "alpha", rng=seed)
    # Seed 1's preimage is tiny (about 0.15 % of the box): its ratio's confidence bound may not pass
    # the threshold in time (large pieces no sample hit keep their doubt until bounds clear them).
    assert result.status in ("reached", "time_limit"), result.status
    rng = np.random.default_rng(100 + seed)
    inside, contained = _attack(result, network, lower, upper, rng)
    _volume_agrees(result, contained)
    if inside.any() and result.status == "reached":
        ratio = contained.sum() / inside.sum()
        assert (ratio >= 0.8) if kind == "under" else (ratio <= 1.2)


def _conv_network(seed: int) -> Network:
    generator = torch.Generator().manual_seed(seed)
    conv = Conv2d(torch.randn(3, 1, 3, 3, generator=generator, dtype=torch.float64) / 3,
                  torch.randn(3, generator=generator, dtype=torch.float64) * 0.1)
    head = Linear(torch.randn(3, 3 * 4 * 4, generator=generator, dtype=torch.float64) / 7,
                  torch.randn(3, generator=generator, dtype=torch.float64) * 0.1)
    return Network((conv, ReLU(), Flatten(), head), (1, 6, 6))


@pytest.mark.parametrize("kind", ["under", "over"])
def test_conv_network_patch_region_sound(kind):
    network = _conv_network(3)
    image = torch.rand(1, 6, 6, generator=torch.Generator().manual_seed(4), dtype=torch.float64)
    label = int(network.forward(image).argmax())
    region = patch_region(image, 2, 1, 2, 2)
    result = approximate_preimage(network, region, argmax_is(label, 3), kind=kind, samples=400, time_limit=20, rng=5)
    assert result.region.dim == 4  # only the patch's pixels are free
    rng = np.random.default_rng(6)
    inside, contained = _attack(result, network, region.lower.numpy(), region.upper.numpy(), rng)
    _volume_agrees(result, contained)
    # A point off the region (a fixed pixel changed) is never contained.
    moved = image.clone()
    moved[0, 0, 0] += 0.5
    assert not result.contains(moved)


def test_sunbeam_region_only_brightens():
    network = _conv_network(7)
    image = torch.rand(1, 6, 6, generator=torch.Generator().manual_seed(8), dtype=torch.float64) * 0.8
    mask = torch.zeros(6, 6, dtype=torch.bool)
    mask[1:3, 3:5] = True
    region = sunbeam_region(image, mask)
    assert torch.equal(region.lower, image) and (region.upper[0][mask] == 1).all()
    label = int(network.forward(image).argmax())
    result = approximate_preimage(network, region, argmax_is(label, 3), kind="under", samples=400, time_limit=20, rng=9)
    _attack(result, network, region.lower.numpy(), region.upper.numpy(), np.random.default_rng(10))
    assert result.contains(image)  # the unbrightened image keeps its label: it is in the preimage (corner of the box)
    darker = image.clone()
    darker[0][mask] -= 0.01
    assert not result.contains(darker)


def _heads(num_outputs: int, heads):
    """argmax = winner within each head (start, size, winner): one conjunction."""
    return all_of(*(argmax_is(start + winner, num_outputs, range(start, start + size)) for start, size, winner in heads))


CONTROL = {
    "auto_park": ("model_auto_park_auto_park_model_20.onnx", [-0.5, -0.5], [0.5, 0.5], [(0, 4, 0)], 0.9, 1.1),
    "vcas": ("VCAS_21_VertCAS_1.onnx", [-0.5, -0.5, 0.149, -0.5], [0.5, 0.5, 0.151, 0.5], [(0, 9, 0)], 0.9, 1.1),
    "cartpole": ("cartpole.onnx", [-1, 0, -0.2, -2], [1, 2, 0, 0], [(0, 2, 0)], 0.75, 1.25),
    "lunarlander": ("lunarlander.onnx", [-1, 0, 0, -2, -1, -0.1, 0.9, 0.9], [0, 1, 2, 0, 0, 0.1, 1, 1], [(0, 4, 1)], 0.75, 1.25),
}


DUBINS = ("dubinsrejoin.onnx", [-0.2, 0, -1, 0, 0.4, -0.1, 0.2, -0.5], [0, 0.5, 0, 0.2, 0.6, 0.1, 0.5, 0.5],
          [(0, 4, 0), (4, 4, 0)], 0.75, 1.25)


@pytest.mark.data
@pytest.mark.parametrize("kind,task", [(kind, task) for task in sorted(CONTROL) for kind in ("under", "over")]
                         + [("over", "dubinsrejoin")])  # its under-approximation takes ~10 s: the benchmark runs it
def test_control_networks_sound(data_dir, task, kind):
    name, lower, upper, heads, under, over = CONTROL.get(task, DUBINS)
    network = load(data_dir / "premap" / name)
    spec = _heads(network.output_size, heads)
    box = (torch.tensor(lower, dtype=torch.float64), torch.tensor(upper, dtype=torch.float64))
    result = approximate_preimage(network, box, spec, kind=kind, threshold=under if kind == "under" else over,
                                  samples=1000, time_limit=30, rng=11)
    assert result.status == "reached"
    inside, contained = _attack(result, network, lower, upper, np.random.default_rng(12))
    _volume_agrees(result, contained)
    # The independent check on fresh samples of the whole box agrees with the per-piece estimates.
    low, high = result.check["ratio_interval"]
    assert low <= result.ratio_interval[1] and result.ratio_interval[0] <= high, (result.check, result.ratio_interval)


@pytest.mark.data
@pytest.mark.parametrize("kind", ["under", "over"])
def test_auto_park_volumes_agree_with_exact_polygon_areas(data_dir, kind):
    network = load(data_dir / "premap" / "model_auto_park_auto_park_model_20.onnx")
    first, _, second = network.layers
    lower, upper = np.array([-0.5, -0.5]), np.array([0.5, 0.5])
    spec = argmax_is(0, 4).conjunctions[0]
    result = approximate_preimage(network, (torch.as_tensor(lower), torch.as_tensor(upper)), spec, kind=kind,
                                  threshold=0.98 if kind == "under" else 1.02, samples=2000, time_limit=30, rng=13)
    exact_preimage = one_hidden_layer_preimage_area(first.weight.numpy(), first.bias.numpy(), second.weight.numpy(),
                                                    second.bias.numpy(), spec.C.numpy(), spec.d.numpy(), lower, upper)
    exact_approximation = sum(polytope_area(p.lower.numpy(), p.upper.numpy(), p.A.numpy(), p.b.numpy()) for p in result.pieces)
    for estimate, exact in ((result.preimage_volume, exact_preimage), (result.approximation_volume, exact_approximation)):
        assert estimate.low <= exact <= estimate.high, (estimate, exact)
    # The approximation is on the right side of the preimage, exactly.
    assert exact_approximation <= exact_preimage + 1e-9 if kind == "under" else exact_approximation >= exact_preimage - 1e-9
    for piece in result.pieces:  # and each piece's own (exact binomial) interval holds its exact area
        area = polytope_area(piece.lower.numpy(), piece.upper.numpy(), piece.A.numpy(), piece.b.numpy())
        interval = piece.fractions(0.9999)["approximation"]
        assert interval.low - 1e-12 <= area <= interval.high + 1e-12


def _sliver_network(centre: float, half_width: float) -> Network:
    """y0 = 1 − |z0 − centre| / half_width, y1 = 0: argmax 0 only on a sliver of the square."""
    scale = 1.0 / half_width
    first = Linear(torch.tensor([[1.0, 0.0], [-1.0, 0.0]], dtype=torch.float64),
                   torch.tensor([-centre, centre], dtype=torch.float64))
    second = Linear(torch.tensor([[-scale, -scale], [0.0, 0.0]], dtype=torch.float64), torch.tensor([1.0, 0.0], dtype=torch.float64))
    return Network((first, ReLU(), second), (2,))


def test_over_approximation_keeps_pieces_no_sample_landed_in():
    # The preimage is a sliver 2e-4 wide: with 10 samples per piece hardly any sample hits it, and a
    # piece must not be dropped for that (only when bounds prove it empty).
    network = _sliver_network(0.3137, 1e-4)
    result = approximate_preimage(network, (torch.zeros(2), torch.ones(2)), argmax_is(0, 2), kind="over", samples=10,
                                  threshold=1.0, time_limit=3, max_pieces=64, rng=14)
    on_sliver = np.column_stack([np.full(1000, 0.3137), np.linspace(0, 1, 1000)])
    assert _in_region(network, on_sliver, result.C, result.d).all()
    assert result.contains(on_sliver).all()


def test_under_approximation_on_the_boundary_and_the_json_needs_no_assay():
    network = random_relu_network(21, widths=(2, 12, 12, 3))
    result = approximate_preimage(network, (-torch.ones(2), torch.ones(2)), argmax_is(1, 3), kind="under",
                                  samples=500, time_limit=20, rng=15)
    payload = json.loads(json.dumps(result.to_json()))
    rng = np.random.default_rng(16)
    x = _uniform(-np.ones(2), np.ones(2), 20_000, rng)
    mine = np.zeros(len(x), dtype=bool)
    for piece in payload["pieces"]:  # membership from the JSON alone, with the documented margin
        lo, hi = np.array(piece["box"]["lower"]), np.array(piece["box"]["upper"])
        A, b = np.array(piece["A"]).reshape(-1, 2), np.array(piece["b"])
        value = x @ A.T + b
        margin = 1e-12 * (np.abs(x) @ np.abs(A).T + np.abs(b))
        mine |= ((x >= lo) & (x <= hi)).all(1) & (value >= margin).all(1)
    contained = result.contains(x)
    assert (mine == contained).mean() > 0.9999
    # Points a hair inside and outside piece boundaries: contained points always map into the region.
    for piece in result.pieces[:5]:
        A, b = piece.A.numpy(), piece.b.numpy()
        for row, offset in zip(A, b):
            if not np.any(row):
                continue
            point = (piece.lower.numpy() + piece.upper.numpy()) / 2
            step = row / (row @ row)
            on_face = point - (row @ point + offset) * step
            for shift in (-1e-9, 1e-9, 1e-5):
                probe = on_face + shift * step
                if result.contains(probe):
                    assert _in_region(network, probe[None], result.C, result.d).all()


def test_time_limit_expires_with_a_valid_approximation():
    network = random_relu_network(31, widths=(4, 32, 32, 4))
    box = (-torch.ones(4), torch.ones(4))
    result = approximate_preimage(network, box, argmax_is(2, 4), kind="under", threshold=0.9999, samples=300,
                                  time_limit=1.0, rng=17)
    assert result.status == "time_limit" and result.ratio < 0.9999
    _attack(result, network, -np.ones(4), np.ones(4), np.random.default_rng(18))
    assert result.history and result.history[-1][0] >= 1.0


def test_bad_input_is_a_clear_error():
    network = random_relu_network(0, widths=(3, 8, 3))
    with pytest.raises(SpecError, match="3 inputs"):
        approximate_preimage(network, (torch.zeros(2), torch.ones(2)), argmax_is(0, 3))
    with pytest.raises(SpecError, match="above upper"):
        approximate_preimage(network, (torch.ones(3), torch.zeros(3)), argmax_is(0, 3))
    with pytest.raises(Exception, match="NaN"):
        approximate_preimage(network, (torch.tensor([0.0, float("nan"), 0.0]), torch.ones(3)), argmax_is(0, 3))
    with pytest.raises(SpecError, match="class k"):
        approximate_preimage(network, (torch.zeros(3), torch.ones(3)), argmax_is(5, 3))
    with pytest.raises(SpecError, match="network has 3"):
        approximate_preimage(network, (torch.zeros(3), torch.ones(3)), argmax_is(0, 4))
    with pytest.raises(SpecError, match="one conjunction"):
        approximate_preimage(network, (torch.zeros(3), torch.ones(3)), any_of(argmax_is(0, 3), argmax_is(1, 3)))
    with pytest.raises(OptionError, match="at most 1"):
        approximate_preimage(network, (torch.zeros(3), torch.ones(3)), argmax_is(0, 3), threshold=1.2)
    with pytest.raises(OptionError, match="kind"):
        approximate_preimage(network, (torch.zeros(3), torch.ones(3)), argmax_is(0, 3), kind="inner")
    with pytest.raises(SpecError, match="single point"):
        approximate_preimage(network, Box(torch.zeros(3), torch.zeros(3)), argmax_is(0, 3))


def test_ctrl_c_returns_the_approximation_reached_so_far():
    import os
    import signal

    network = random_relu_network(31, widths=(4, 32, 32, 4))
    rounds = []
    before = signal.getsignal(signal.SIGINT)  # default_int_handler, or SIG_IGN in a background job

    def progress(state):
        rounds.append(state["ratio"])
        if len(rounds) == 3:
            os.kill(os.getpid(), signal.SIGINT)  # as Ctrl-C would: the run stops after this round

    result = approximate_preimage(network, (-torch.ones(4), torch.ones(4)), argmax_is(2, 4), kind="under",
                                  threshold=0.9999, samples=300, time_limit=60, progress=progress, rng=19)
    assert result.status == "interrupted" and len(rounds) == 3 and result.pieces
    _attack(result, network, -np.ones(4), np.ones(4), np.random.default_rng(20))
    assert signal.getsignal(signal.SIGINT) == before  # the handler is put back


@functools.cache
def _digits_network():
    """The demo's digits MLP and its test images, trained once per test process (the tests only read them)."""
    from assay.demo import _train

    network, x_test, y_test, _, _ = _train((32, 32), 0)
    return network, x_test


def _digits_patch(size: int = 3):
    network, x_test = _digits_network()
    image = x_test[4].reshape(1, 8, 8)
    label = int(network.forward(x_test[4]).argmax())
    region = patch_region(image, 2, 3, size, size)
    return network, image, label, (region.lower.reshape(-1), region.upper.reshape(-1))


@pytest.mark.parametrize("kind", ["under", "over"])
def test_relu_splitting_sound_on_a_digit_patch(kind):
    network, image, label, region = _digits_patch()
    result = approximate_preimage(network, region, argmax_is(label, 10), kind=kind, branching="relu", samples=1000,
                                  threshold=0.85 if kind == "under" else 1.15, time_limit=15, rng=21)
    assert result.stats["branching"] == "relu" and any(p.splits for p in result.pieces)
    inside, contained = _attack(result, network, region[0].numpy(), region[1].numpy(), np.random.default_rng(22))
    _volume_agrees(result, contained)
    low, high = result.check["ratio_interval"]
    assert low <= result.ratio_interval[1] and result.ratio_interval[0] <= high


def test_relu_split_pieces_are_checkable_from_the_json():
    """Membership from the JSON and a plain forward pass (numpy, the layers' weights): box, the
    split signs of the pre-activations, and A x + b ≥ margin."""
    network, image, label, region = _digits_patch()
    result = approximate_preimage(network, region, argmax_is(label, 10), kind="under", branching="relu", samples=500,
                                  time_limit=10, rng=23)
    payload = json.loads(json.dumps(result.to_json()))
    rng = np.random.default_rng(24)
    free = np.array(payload["free_inputs"])
    x = np.repeat(image.reshape(1, -1).numpy(), 5000, 0)
    x[:, free] = rng.random((5000, free.size))
    pre, h = [], x
    for layer in network.layers:  # Linear, ReLU, Linear, ReLU, Linear
        if hasattr(layer, "weight"):
            h = h @ layer.weight.numpy().T + layer.bias.numpy()
        else:
            pre.append(h)
            h = np.maximum(h, 0)
    mine = np.zeros(len(x), dtype=bool)
    for piece in payload["pieces"]:
        ok = ((x >= np.array(piece["box"]["lower"])) & (x <= np.array(piece["box"]["upper"]))).all(1)
        for layer, neuron, sign in piece["splits"]:
            ok &= (pre[layer][:, neuron] >= 0) if sign > 0 else (pre[layer][:, neuron] <= 0)
        A, b = np.array(piece["A"]), np.array(piece["b"])
        ok &= (x @ A.T + b >= 1e-12 * (np.abs(x) @ np.abs(A).T + np.abs(b))).all(1)
        mine |= ok
    assert (mine == result.contains(x)).mean() > 0.999 and mine.any()
    assert not (mine & (h.argmax(1) != label)).any()


def test_branching_choice_and_heuristic_weights():
    network, image, label, region = _digits_patch(2)
    assert approximate_preimage(network, region, argmax_is(label, 10), time_limit=2, rng=0).stats["branching"] == "input"
    with pytest.raises(OptionError, match="heuristic_weights"):
        approximate_preimage(network, region, argmax_is(label, 10), branching="relu", heuristic_weights={"extras": 1.0})
    with pytest.raises(OptionError, match="branching"):
        approximate_preimage(network, region, argmax_is(label, 10), branching="neurons")
