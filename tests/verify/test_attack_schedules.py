"""The counterexample search's two PGD schedules, on real MNIST properties the competition's
tools falsified in about a second (VNN-COMP 2022 mnist_fc rows 51 and 53)."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch

import assay.nn as nn
from assay.nn import Linear, Network, ReLU
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


def _bump_network(n: int) -> Network:
    """y = 10 relu(Σx − (n − ½)) − 0.01 relu(Σx) − ½ on [0, 1]^n: unsafe (y ≥ 0) only within
    ½ (in Σx) of the all-ones corner; elsewhere the gradient points to the all-zeros corner."""
    ones = torch.ones(1, n, dtype=torch.float64)
    return Network((Linear(torch.cat([ones, ones]), torch.tensor([-(n - 0.5), 0.0], dtype=torch.float64)), ReLU(),
                    Linear(torch.tensor([[10.0, -0.01]], dtype=torch.float64), torch.tensor([-0.5], dtype=torch.float64))),
                   (n,))


def test_pgd_starts_where_the_roots_linear_bounds_peak():
    """A violation in a corner that neither the centre's gradient, sampling nor random restarts
    reach (it needs every one of 50 inputs near 1); the root's linear upper bound peaks there."""
    from assay.verify import VerificationStatus, verify
    from assay.verify.relu_split import conjunction_searches, root_corners

    n = 50
    network = _bump_network(n)
    box = SimpleNamespace(lower=torch.zeros(n, dtype=torch.float64), upper=torch.ones(n, dtype=torch.float64))
    unsafe = SimpleNamespace(conjunctions=(SimpleNamespace(C=torch.tensor([[1.0]], dtype=torch.float64),
                                                           d=torch.tensor([0.0], dtype=torch.float64)),))
    query = from_unsafe(network, box, unsafe, 0)[0]
    assert attack.search(network, query, np.random.default_rng(0)) is None, "found unguided: the test proves nothing"
    corners = root_corners(conjunction_searches(network, query))
    assert corners.shape == (1, n) and bool((corners == 1).all())
    found = attack.search(network, query, np.random.default_rng(0), guides=corners)
    assert found is not None
    assert bool(query.violates(network.forward(found[0].reshape(1, n)).reshape(1, -1))[0])
    result = verify(network, box, unsafe=unsafe, timeout=60, strategy="relu")
    assert result.status is VerificationStatus.VIOLATED and result.stats.domains == 0


@pytest.mark.parametrize("seed", range(3))
def test_root_corners_attain_the_linear_upper_bounds(seed):
    """Each corner is where its row's linear upper bound is largest over the box: the bound's
    value there is Σ|A| + b (checked by 10,000 random points, none higher)."""
    from assay.verify.relu_split import conjunction_searches, root_corners
    from tests.verify.networks import random_relu_network

    network = random_relu_network(seed, (6, 12, 12, 3))
    box = SimpleNamespace(lower=-torch.ones(6, dtype=torch.float64), upper=torch.ones(6, dtype=torch.float64))
    C = torch.tensor([[1.0, -1.0, 0.0], [0.0, 1.0, -1.0]], dtype=torch.float64)
    # two conjunctions of one row each, so that neither is refuted by the other's bound
    unsafe = SimpleNamespace(conjunctions=tuple(SimpleNamespace(C=C[i:i + 1], d=torch.tensor([5.0], dtype=torch.float64))
                                                for i in range(2)))
    query = from_unsafe(network, box, unsafe, 0)[0]
    plans = conjunction_searches(network, query)
    corners = root_corners(plans)
    open_plans = [plan for plan, _ in plans if not plan.refuted_at_root]
    assert len(open_plans) == len(corners) > 0
    points = -1 + 2 * torch.as_tensor(np.random.default_rng(seed).uniform(size=(10_000, 6)))
    for plan, corner in zip(open_plans, corners):
        A, b = plan.root_bounds.linear.upper_A.reshape(-1), plan.root_bounds.linear.upper_b.reshape(-1)
        at_corner = float(A @ corner + b)
        assert at_corner == pytest.approx(float(A.abs().sum() + b), abs=1e-9)  # max over [−1, 1]^6
        assert float((points @ A + b).max()) <= at_corner + 1e-12


@pytest.mark.data
def test_mnist_256x6_violation_found_from_the_roots_corners(data_dir):
    """VNN-COMP 2022 mnist_fc row 76 (256x6 prop_1, ε 0.05): PGD from the centre and random
    starts stalls at margin −0.8; α,β-CROWN falsified it in 1 s. From the corners where the
    root's linear bounds peak, the attack finds it before any branching."""
    from assay.verify import VerificationStatus, verify_vnnlib

    folder = data_dir / "vnncomp" / "mnist_fc"
    network = nn.load(folder / "onnx" / "mnist-net_256x6.onnx")
    property_ = read_vnnlib(folder / "vnnlib" / "prop_1_0.05.vnnlib", network.input_size, network.output_size)
    query = from_unsafe(network, property_.queries[0].input_set, property_.queries[0].unsafe_outputs, 0)[0]
    assert attack.search(network, query, np.random.default_rng(0)) is None, "found unguided: the test proves nothing"
    result = verify_vnnlib(network, property_, timeout=120)
    assert result.status is VerificationStatus.VIOLATED and result.stats.domains == 0
    x = result.counterexample.input.reshape(1, -1)
    assert ((x >= query.lower) & (x <= query.upper)).all()
    assert bool(query.violates(network.forward(x.reshape(1, *network.input_shape)).reshape(1, -1))[0])
