"""The counterexample search's two PGD schedules, on real MNIST properties the competition's
tools falsified in about a second (VNN-COMP 2022 mnist_fc rows 51 and 53)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import assay.nn as nn
from assay.sets import read_vnnlib
from assay.verify import attack
from assay.verify.problem import from_unsafe


def _query(data_dir, prop):
    folder = data_dir / "vnncomp" / "mnist_fc"
    network = nn.load(folder / "onnx" / "mnist-net_256x4.onnx")
    unsafe = read_vnnlib(folder / "vnnlib" / prop, network.input_size, network.output_size).queries[0]
    return network, from_unsafe(network, unsafe.input_set, unsafe.unsafe_outputs, 0)[0]


@pytest.mark.data
@pytest.mark.parametrize("prop", ["prop_6_0.05.vnnlib", "prop_8_0.05.vnnlib"])
def test_the_coarse_schedule_finds_what_the_fine_one_misses(data_dir, prop):
    network, query = _query(data_dir, prop)
    width = query.upper - query.lower
    starts = torch.cat([((query.lower + query.upper) / 2).unsqueeze(0),
                        query.lower + width * torch.as_tensor(np.random.default_rng(0).uniform(size=(31, width.numel())))])
    box = query.lower.expand_as(starts), query.upper.expand_as(starts)
    fine, _ = attack.pgd(network, query, *box, starts, 50)
    assert attack.confirm(network, query, fine) is None, "the fine schedule alone now finds it: the test proves nothing"
    found = attack.search(network, query, np.random.default_rng(0))
    assert found is not None
    x, y = found
    assert ((x >= query.lower) & (x <= query.upper)).all()
    assert bool(query.violates(network.forward(x.reshape(1, *network.input_shape)).reshape(1, -1))[0])


@pytest.mark.data
@pytest.mark.parametrize("network_file,prop", [("Convnet_avgpool.onnx", "avgpool_specs/prop_4_0.02.vnnlib"),
                                               ("Convnet_maxpool.onnx", "maxpool_specs/prop_14_0.004.vnnlib")])
def test_pgd_from_the_centre_decides_violated_eps_balls_before_any_bound(data_dir, network_file, prop):
    """VNN-COMP 2021 verivital rows 4 and 54: the sampling phase of the search took 30 s and the
    lowered MaxPool's root bound 48 s before finding these; PGD from the image itself takes < 1 s."""
    from assay.verify import VerificationStatus, verify_vnnlib

    folder = data_dir / "vnncomp" / "verivital"
    network = nn.load(folder / network_file)
    property_ = read_vnnlib(folder / "specs" / prop, network.input_size, network.output_size)
    query = from_unsafe(network, property_.queries[0].input_set, property_.queries[0].unsafe_outputs, 0)[0]
    found = attack.from_center(network, query)
    assert found is not None
    x, _ = found
    assert ((x >= query.lower) & (x <= query.upper)).all()
    assert bool(query.violates(network.forward(x.reshape(1, *network.input_shape)).reshape(1, -1))[0])
    result = verify_vnnlib(network, property_, timeout=60)
    assert result.status is VerificationStatus.VIOLATED and result.stats.bound_calls == 0
