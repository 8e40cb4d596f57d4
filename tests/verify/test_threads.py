"""Which networks assay runs on one torch thread by default (:func:`one_thread_suffices`): small
tensors gain nothing from threads, large ones do, whatever the parameter count; and the library's
entry points (verify, compute_bounds), not only the command line, run so and give the caller's
setting back."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from assay.bounds import compute_bounds
from assay.errors import OptionError
from assay.nn import Conv2d, Flatten, Linear, Network, ReLU
from assay.sets import Box, argmax_is
from assay.threads import torch_threads
from assay.verify import VerifyOptions, verify
from assay.verify.options import SMALL_NETWORK_ELEMENTS, SMALL_NETWORK_PARAMETERS, one_thread_suffices


def test_a_small_dense_network_runs_on_one_thread():
    rng = np.random.default_rng(0)
    network = Network((Linear(rng.normal(size=(50, 5)), np.zeros(50)), ReLU(), Linear(rng.normal(size=(5, 50)), np.zeros(5))),
                      (5,))
    assert one_thread_suffices(network)


def test_few_weights_over_large_images_get_threads():
    """A TinyYOLO-like shape: 3×3 convolutions of 8 channels over 120×120 images (a few hundred
    weights, over 100,000 tensor elements)."""
    rng = np.random.default_rng(0)
    network = Network((Conv2d(rng.normal(size=(8, 3, 3, 3)), np.zeros(8), padding=1), ReLU(),
                       Conv2d(rng.normal(size=(1, 8, 3, 3)), np.zeros(1), stride=4), Flatten()), (3, 120, 120))
    assert network.num_parameters < SMALL_NETWORK_PARAMETERS
    assert sum(int(np.prod(shape)) for shape in network.shapes) >= SMALL_NETWORK_ELEMENTS
    assert not one_thread_suffices(network)


def test_many_parameters_get_threads():
    rng = np.random.default_rng(0)
    network = Network((Linear(rng.normal(size=(400, 300)), np.zeros(400)), ReLU(), Linear(rng.normal(size=(2, 400)), np.zeros(2))),
                      (300,))
    assert network.num_parameters >= SMALL_NETWORK_PARAMETERS
    assert not one_thread_suffices(network)


def test_many_small_layers_run_on_one_thread():
    """A transformer-like network: over 100,000 parameters in all, none of its products large
    (vit_2023's 116,000 parameters sit in matrices of at most 9,264)."""
    rng = np.random.default_rng(0)
    layers = []
    for _ in range(14):
        layers += [Linear(rng.normal(size=(90, 90)), np.zeros(90)), ReLU()]
    network = Network(tuple(layers), (90,))
    assert network.num_parameters >= SMALL_NETWORK_PARAMETERS
    assert one_thread_suffices(network)


def _small_network() -> Network:
    rng = np.random.default_rng(1)
    return Network((Linear(rng.normal(size=(20, 4)), rng.normal(size=20)), ReLU(),
                    Linear(rng.normal(size=(3, 20)), rng.normal(size=3))), (4,))


@pytest.fixture
def two_threads():
    """The caller's setting during the test: two torch threads (restored afterwards)."""
    previous = torch.get_num_threads()
    torch.set_num_threads(2)
    yield 2
    torch.set_num_threads(previous)


def _threads_seen_by_the_optimisation(network) -> int:
    seen = []

    def objective(linear, lower):  # called inside compute_bounds's optimisation
        seen.append(torch.get_num_threads())
        return lower.sum(1)

    box = Box(-torch.ones(network.input_size, dtype=torch.float64), torch.ones(network.input_size, dtype=torch.float64))
    compute_bounds(network, box, method="alpha", objective=objective)
    assert seen
    return seen[0]


def test_compute_bounds_runs_a_small_network_on_one_thread_and_restores_the_callers_setting(two_threads):
    assert _threads_seen_by_the_optimisation(_small_network()) == 1
    assert torch.get_num_threads() == two_threads


def test_compute_bounds_keeps_the_callers_threads_for_a_large_network(two_threads):
    rng = np.random.default_rng(0)
    network = Network((Linear(rng.normal(size=(400, 300)) / 20, np.zeros(400)), ReLU(),
                       Linear(rng.normal(size=(2, 400)) / 20, np.zeros(2))), (300,))
    assert _threads_seen_by_the_optimisation(network) == two_threads


def test_verify_runs_on_the_threads_asked_for_and_restores_them(two_threads, monkeypatch):
    import assay.verify.api as api

    network = _small_network()
    box = Box(torch.full((4,), -0.5, dtype=torch.float64), torch.full((4,), 0.5, dtype=torch.float64))
    seen, search = [], api._run

    def spied(*args, **kwargs):  # the whole search (attack, bounds, branching) runs in here
        seen.append(torch.get_num_threads())
        return search(*args, **kwargs)

    monkeypatch.setattr(api, "_run", spied)
    label = int(network.forward(torch.zeros(1, 4, dtype=torch.float64)).argmax())
    for threads, expected in ((None, 1), (3, 3)):
        seen.clear()
        result = verify(network, box, argmax_is(label, 3), timeout=30, threads=threads)
        assert result.status.value in ("holds", "violated")
        assert seen == [expected]
        assert torch.get_num_threads() == two_threads


def test_the_callers_threads_come_back_when_the_call_fails(two_threads):
    network = _small_network()
    with pytest.raises(OptionError):
        compute_bounds(network, Box(torch.zeros(4), torch.ones(4)), method="no such method")
    assert torch.get_num_threads() == two_threads
    with pytest.raises(RuntimeError), torch_threads(1):
        assert torch.get_num_threads() == 1
        raise RuntimeError("inside")
    assert torch.get_num_threads() == two_threads


@pytest.mark.parametrize("threads", [0, -1, 1.5, True])
def test_a_bad_thread_count_is_an_option_error(threads):
    with pytest.raises(OptionError, match="threads"):
        VerifyOptions(threads=threads)


def test_a_caller_can_choose_the_threads_for_a_block_or_the_process(two_threads):
    from assay.threads import set_threads, use_threads

    network = _small_network()
    with use_threads(3):
        assert torch.get_num_threads() == 3
        assert _threads_seen_by_the_optimisation(network) == 3
        with use_threads(1):
            assert _threads_seen_by_the_optimisation(network) == 1
        assert _threads_seen_by_the_optimisation(network) == 3
    assert torch.get_num_threads() == two_threads
    assert _threads_seen_by_the_optimisation(network) == 1
    try:
        set_threads(2)
        assert _threads_seen_by_the_optimisation(network) == 2
    finally:
        set_threads(None)
    assert _threads_seen_by_the_optimisation(network) == 1
    with pytest.raises(OptionError, match="thread count"):
        with use_threads(0):
            pass
