"""Which networks `assay verify` runs on one torch thread by default (:func:`one_thread_suffices`):
small tensors gain nothing from threads, large ones do, whatever the parameter count."""

from __future__ import annotations

import numpy as np

from assay.nn import Conv2d, Flatten, Linear, Network, ReLU
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
