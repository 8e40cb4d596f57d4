"""The counterexample search samples in chunks whose float32 tensors fit in a fixed memory budget."""

from __future__ import annotations

import numpy as np
import torch

from assay.nn import Conv2d, Flatten, Linear, Network, ReLU
from assay.verify import attack
from tests.verify.networks import random_relu_network


def test_wide_convolutions_get_small_sample_chunks():
    conv = Conv2d(torch.randn(64, 1, 3, 3, dtype=torch.float64) * 0.1, torch.zeros(64, dtype=torch.float64), padding=(1, 1))
    network = Network((conv, ReLU(), Flatten(), Linear(torch.randn(2, 64 * 48 * 48, dtype=torch.float64) * 1e-3,
                                                        torch.zeros(2, dtype=torch.float64))), (1, 48, 48))
    values = sum(int(np.prod(shape)) for shape in network.shapes)
    chunk = attack._chunk_size(network)
    assert chunk * 4 * values <= attack._SAMPLE_MEMORY < 2 * chunk * 4 * values
    assert attack._chunk_size(random_relu_network(0)) == attack._SAMPLE_CHUNK  # small networks keep the full chunk
