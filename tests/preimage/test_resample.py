"""Adaptive resampling of ReLU-split pieces' guide points (assay.preimage.resample)."""

from __future__ import annotations

import numpy as np
import torch

from assay.nn import Linear, Network, ReLU
from assay.preimage import approximate_preimage
from assay.preimage.relu_refinement import ReluPreimageRefinement
from assay.preimage.resample import sample_piece
from assay.sets import argmax_is
from tests.verify.networks import random_relu_network

F64 = torch.float64


def _signs(network: Network, z: torch.Tensor) -> torch.Tensor:
    """Flat pre-activations by a plain forward pass, layer by layer (independent of the sampler's helper)."""
    out, x = [], z.to(F64)
    for layer in network.layers:
        if isinstance(layer, ReLU):
            out.append(x)
            x = x.clamp(min=0)
        else:
            assert isinstance(layer, Linear)
            x = x @ layer.weight.to(F64).T + layer.bias.to(F64)
    return torch.cat(out, 1)


def _holds(pre: torch.Tensor, split: torch.Tensor) -> torch.Tensor:
    return (((split > 0) & (pre >= 0)) | ((split < 0) & (pre < 0)) | (split == 0)).all(1)


def _wedge_network() -> Network:
    """2-D; ReLU 0: x0 + x1 − 1.9, ReLU 1: x0 − x1 (then a second layer so the piece has two layers)."""
    W1 = torch.tensor([[1.0, 1.0], [1.0, -1.0]], dtype=F64)
    b1 = torch.tensor([-1.9, 0.0], dtype=F64)
    W2 = torch.tensor([[1.0, 1.0], [1.0, -2.0]], dtype=F64)
    return Network((Linear(W1, b1), ReLU(), Linear(W2, torch.zeros(2, dtype=F64)), ReLU(),
                    Linear(torch.eye(2, dtype=F64), torch.zeros(2, dtype=F64))), (2,))


def test_fresh_points_satisfy_a_deep_split_history():
    network = random_relu_network(5, widths=(4, 16, 16, 3))
    lower, upper = -torch.ones(4, dtype=F64), torch.ones(4, dtype=F64)
    x0 = torch.tensor([[0.3, -0.2, 0.5, 0.1]], dtype=F64)
    pre = _signs(network, x0)[0]
    split = torch.zeros_like(pre, dtype=torch.int8)
    chosen = torch.tensor([1, 4, 7, 16, 19, 25, 30])  # both layers
    split[chosen] = torch.where(pre[chosen] >= 0, 1, -1).to(torch.int8)
    fresh = sample_piece(network, lower, upper, split, 500, x0, torch.Generator().manual_seed(0), max_draws=200_000)
    assert fresh.z.shape[0] == 500
    assert bool(_holds(_signs(network, fresh.z), split).all())
    assert torch.allclose(fresh.pre, _signs(network, fresh.z))
    assert bool(((fresh.z >= lower) & (fresh.z <= upper)).all())


def test_tiny_acceptance_takes_hit_and_run_and_stays_uniform():
    network = _wedge_network()
    lower, upper = torch.zeros(2, dtype=F64), torch.ones(2, dtype=F64)
    split = torch.tensor([1, 1, 0, 0], dtype=torch.int8)  # x0 + x1 ≥ 1.9 and x0 ≥ x1: 0.25 % of the box
    big = torch.rand(2_000_000, 2, generator=torch.Generator().manual_seed(1), dtype=F64)
    reference = big[_holds(_signs(network, big), split)]
    assert 4000 < reference.shape[0] < 6000
    fresh = sample_piece(network, lower, upper, split, 2000, reference[:20], torch.Generator().manual_seed(2),
                         max_draws=400_000)
    assert fresh.hit_and_run and fresh.accepted_by_rejection < 50 and fresh.z.shape[0] == 2000
    assert bool(_holds(_signs(network, fresh.z), split).all())
    # Spread over the wedge: same mean and spread as the large rejection sample (wedge width 0.1).
    assert torch.allclose(fresh.z.mean(0), reference.mean(0), atol=0.006)
    assert torch.allclose(fresh.z.std(0), reference.std(0), atol=0.006)
    assert fresh.z.unique(dim=0).shape[0] > 1500


def test_draw_cap_holds():
    network = _wedge_network()
    split = torch.tensor([1, 1, 0, 0], dtype=torch.int8)
    start = torch.tensor([[0.97, 0.95]], dtype=F64)
    fresh = sample_piece(network, torch.zeros(2, dtype=F64), torch.ones(2, dtype=F64), split, 10_000, start,
                         torch.Generator().manual_seed(3), max_draws=3000)
    assert fresh.draws <= 3000 and fresh.z.shape[0] < 10_000


def _children_guides_hold(strategy: ReluPreimageRefinement, children) -> int:
    fresh = 0
    for c, piece in enumerate(children.tags["id"].tolist()):
        members = strategy._members[piece]
        split = torch.cat([s[c].reshape(-1) for s in children.splits])
        pre = _signs(strategy.network, strategy.z[members])
        assert bool(_holds(pre, split).all())
        fresh += int((members >= strategy.pool_size).sum())
    return fresh


def test_strategy_tops_up_children_and_leaves_the_measuring_half_alone():
    network = random_relu_network(7, widths=(3, 12, 12, 3))
    C = torch.tensor([[1.0, -1.0, 0.0], [1.0, 0.0, -1.0]], dtype=F64)  # argmax is 0
    d = torch.zeros(2, dtype=F64)

    def run(resample: bool):
        strategy = ReluPreimageRefinement(network, C, d, "under", lower=-torch.ones(3, dtype=F64),
                                          upper=torch.ones(3, dtype=F64), pool=1000, method="crown",
                                          alpha_iterations=0, rng=torch.Generator().manual_seed(0), samples=400,
                                          resample=resample)
        branches = strategy.root()
        fresh, measured = 0, []
        for _ in range(3):
            bounded = strategy.bound(branches, None, None)
            open_ = ~bounded.closed
            if not open_.any():
                break
            branches = strategy.split(bounded, open_)
            fresh += _children_guides_hold(strategy, branches)
            measured.append(sorted(branches.tags["n"].tolist()))
        return strategy, fresh, measured

    on, fresh_on, measured_on = run(True)
    off, fresh_off, measured_off = run(False)
    assert fresh_on > 0 and on.resampled["points"] > 0 and fresh_off == 0
    # The measuring counts (volumes) are the pool's, with or without fresh guide points.
    assert measured_on[0] == measured_off[0]
    assert int((~on.guide[: on.pool_size]).sum()) == on.measure_size == off.measure_size


def test_a_run_with_resampling_is_reproducible():
    network = random_relu_network(31, widths=(4, 32, 32, 4))
    box = (-torch.ones(4), torch.ones(4))

    def run():
        return approximate_preimage(network, box, argmax_is(2, 4), kind="under", threshold=0.9999, samples=200,
                                    branching="relu", max_pieces=24, time_limit=60, check_samples=2000,
                                    resample=True, rng=np.random.default_rng(5))

    first, second = run(), run()
    assert first.stats["resampled"]["points"] > 0
    assert first.stats["resampled"] == second.stats["resampled"]
    one, two = first.to_json(), second.to_json()
    assert one["pieces"] == two["pieces"]


def test_under_approximation_with_resampling_is_sound_and_measured_by_the_pool():
    """10⁵ uniform points: none contained outside the preimage; the contained share agrees with the
    reported approximation volume (the pool's measuring half) within its interval."""
    network = random_relu_network(31, widths=(4, 32, 32, 4))
    result = approximate_preimage(network, (-torch.ones(4), torch.ones(4)), argmax_is(2, 4), kind="under",
                                  threshold=0.9, samples=300, branching="relu", time_limit=60, max_pieces=40,
                                  check_samples=0,
                                  resample=True, rng=np.random.default_rng(6))
    assert result.stats["resampled"]["points"] > 0 and any(p.splits for p in result.pieces)
    x = np.random.default_rng(7).uniform(-1, 1, (100_000, 4))
    contained = result.contains(x)
    y = network.forward(torch.as_tensor(x)).numpy()
    assert (y[contained].argmax(1) == 2).all()
    share = contained.mean()
    volume, estimate = share * result.region_volume, result.approximation_volume
    sampling = 4 * result.region_volume * np.sqrt(max(share * (1 - share), 1e-12) / len(contained))
    assert estimate.low - sampling <= volume <= estimate.high + sampling, (volume, estimate)
