"""ReLU splitting's scores: PREMAP2's Table I heuristics computed by hand on a small network."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from assay.errors import OptionError
from assay.nn import Linear, Network, ReLU
from assay.preimage import approximate_preimage
from assay.preimage.relu_refinement import DEFAULT_HEURISTIC_WEIGHTS, ReluPreimageRefinement, heuristic_weights_for
from assay.sets import argmax_is

F64 = torch.float64


def _network() -> Network:
    """z = W1 x + b1 over x ∈ [−1, 1]²: z0 ∈ [−0.5, 1.5], z1 ∈ [−1.5, 0.5], z2 ∈ [−1.8, 2.2] (exact:
    one layer); the row y0 − y1 weighs relu(z) by (2, −1, 0.5)."""
    W1 = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]], dtype=F64)
    b1 = torch.tensor([0.5, -0.5, 0.2], dtype=F64)
    W2 = torch.tensor([[2.0, -1.0, 0.5], [0.0, 0.0, 0.0]], dtype=F64)
    return Network((Linear(W1, b1), ReLU(), Linear(W2, torch.tensor([0.1, 0.0], dtype=F64))), (2,))


def _strategy(kind: str, weights) -> ReluPreimageRefinement:
    C = torch.tensor([[1.0, -1.0]], dtype=F64)
    d = torch.zeros(1, dtype=F64)
    return ReluPreimageRefinement(_network(), C, d, kind, lower=-torch.ones(2, dtype=F64), upper=torch.ones(2, dtype=F64),
                                  pool=400, method="crown", alpha_iterations=0, rng=torch.Generator().manual_seed(0),
                                  heuristic_weights=weights)


@pytest.mark.parametrize("kind", ["under", "over"])
def test_table_one_scores_by_hand(kind):
    strategy = _strategy(kind, None)
    root = strategy.root()
    scores = strategy.split_scores(root)[0].numpy()
    lower, upper = np.array([-0.5, -1.5, -1.8]), np.array([1.5, 0.5, 2.2])
    # Λ: the row's weight on relu(z_j) times the slope a lower bound takes: CROWN's lower slope
    # (1 where u > −l) for a weight ≥ 0, the chord's u/(u − l) for a weight < 0. An over-approximation
    # bounds −(y0 − y1) from below: the weights flip sign and so do the slopes taken.
    weights = np.array([2.0, -1.0, 0.5]) * (1 if kind == "under" else -1)
    chord = upper / (upper - lower)
    lam = np.abs(weights * np.where(weights >= 0, (upper > -lower).astype(float), chord))
    z = strategy.pre[0][strategy.guide].numpy()  # the root holds every guide sample of the pool
    depth = np.array([(-z[z[:, j] < 0, j]).mean() for j in range(3)])
    parts = {
        "extra": lam * depth,
        "area": lam * lower**2,
        "under": lam * np.abs(lower),
        "gap": upper * (-lower) / (upper - lower),
    }
    expected = sum(DEFAULT_HEURISTIC_WEIGHTS[name] * value / value.max() for name, value in parts.items())
    # Every neuron is crossed by the 200 guide samples: no `stable` bonus.
    assert ((z < 0).any(0) & (z > 0).any(0)).all()
    np.testing.assert_allclose(scores, expected, rtol=1e-9, atol=1e-11)


def test_stable_bonus_and_presets():
    strategy = _strategy("under", {"extra": 0.0, "area": 0.0, "under": 0.0, "gap": 0.0, "stable": 1.0})
    root = strategy.root()
    assert np.allclose(strategy.split_scores(root)[0].numpy(), 1e-12)  # no neuron is stable on the samples
    old = _strategy("under", "sensitivity")
    assert old.weights["sensitivity"] == 1.0 and old.weights["extra"] == 0.0
    assert heuristic_weights_for({"gap": 2})["gap"] == 2.0 and heuristic_weights_for(None) == DEFAULT_HEURISTIC_WEIGHTS
    for bad, match in ((("nope"), "preset"), ({"extra": -1}, "≥ 0"), ({"area ": 1}, "unknown")):
        with pytest.raises(OptionError, match=match):
            heuristic_weights_for(bad)


def test_split_neuron_is_the_best_scored_and_the_result_sound():
    """One round of ReLU splitting splits the neuron with the highest score (z2 by hand: area, under and
    gap all peak there), and the approximation survives sampling."""
    network = _network()
    strategy = _strategy("under", None)
    root = strategy.root()
    best = int(strategy.split_scores(root)[0].argmax())
    assert best == 2
    result = approximate_preimage(network, (-torch.ones(2, dtype=F64), torch.ones(2, dtype=F64)), argmax_is(0, 2),
                                  branching="relu", method="crown", samples=200, max_pieces=2, rng=0, check_samples=0)
    assert result.pieces and all({split[:2] for split in piece.splits} == {(0, 2)} for piece in result.pieces)
    x = np.random.default_rng(1).uniform(-1, 1, size=(20_000, 2))
    kept = network.forward(torch.as_tensor(x)).argmax(1).numpy() == 0
    assert not (result.contains(x) & ~kept).any()


def test_tiny_preimage_grows_the_measuring_pool_and_stays_sound():
    """A preimage of about 2 % of the box: 2000 pool points leave ~24 preimage points to measure, so the
    pool gains measuring points (decided on the guide half); volumes stay right and nothing unsound is kept."""
    network = _network()
    box = (-torch.ones(2, dtype=F64), torch.ones(2, dtype=F64))
    spec = (torch.tensor([[1.0, -1.0]], dtype=F64), torch.tensor([-3.6], dtype=F64))
    common = dict(kind="under", branching="relu", samples=200, pool=2000, time_limit=5, rng=3, check_samples=0)
    fixed = approximate_preimage(network, box, spec, min_preimage_samples=0, **common)
    grown = approximate_preimage(network, box, spec, min_preimage_samples=300, **common)
    assert fixed.stats["pool"] == 2000 and 2000 < grown.stats["pool"] <= 16 * 2000
    x = np.random.default_rng(4).uniform(-1, 1, size=(200_000, 2))
    y = network.forward(torch.as_tensor(x)).numpy()
    inside = y[:, 0] - y[:, 1] - 3.6 >= 0
    assert 0.002 < inside.mean() < 0.03
    contained = grown.contains(x)
    assert not (contained & ~inside).any()
    share, estimate = contained.mean() * 4, grown.approximation_volume
    assert estimate.low - 0.01 <= share <= estimate.high + 0.01
    preimage = grown.preimage_volume
    assert preimage.low - 0.01 <= inside.mean() * 4 <= preimage.high + 0.01
