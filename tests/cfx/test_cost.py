"""A weighted ℓ1 cost (``FeatureTypes.cost``): validated, measured, and minimised by every search.

The published robust-CE runs weigh each original feature the same (:meth:`FeatureTypes.with_feature_cost`);
the MILPs must then return the nearest point under that cost. Checked against an enumeration of every
encoding with the continuous variable swept on a dense grid, on a planted case where the weighted and the
plain ℓ1 disagree, and between Algorithm 2's fast search and the paper's loop (and the direct robust MILP).
"""

from __future__ import annotations

import numpy as np
import pytest

from assay.cfx import FeatureTypes, counterfactual, delta_robust, nearest_robust_counterfactual, robust_counterfactual
from assay.cfx._model import predicted_class
from assay.cfx.milp import MIN_MARGIN
from assay.errors import SpecError
from assay.nn import Linear, Network, ReLU
from tests.cfx.nets import cheapest_on_grid, random_mlp

MIXED = FeatureTypes(8, one_hot=[[2, 3, 4]], ordinal=[[5, 6, 7]], immutable=[0]).with_feature_cost()


def test_feature_cost_weighs_each_original_feature_once():
    spec = FeatureTypes(8, one_hot=[[0, 1, 2]], ordinal=[[3, 4, 5, 6]])
    assert FeatureTypes(8).cost.tolist() == [1.0] * 8 and not spec.weighted
    weighted = spec.with_feature_cost()
    assert weighted.weighted
    np.testing.assert_allclose(weighted.cost, [0.5, 0.5, 0.5, 1 / 3, 1 / 3, 1 / 3, 1 / 3, 1.0])
    x = np.array([1, 0, 0, 1, 1, 0, 0, 0.5])
    other_category = np.array([0, 0, 1, 1, 1, 0, 0, 0.5])
    two_levels_up = np.array([1, 0, 0, 1, 1, 1, 1, 0.5])
    assert weighted.distance(x, other_category) == pytest.approx(1.0)
    assert weighted.distance(x, two_levels_up) == pytest.approx(2 / 3)
    assert weighted.distance(x, x + np.eye(8)[7] * 0.2) == pytest.approx(0.2)
    assert spec.distance(x, other_category) == 2.0  # the plain ℓ1 counts both bits
    assert weighted.distance(x, two_levels_up, "linf") == 1.0  # ℓ∞ ignores the cost


def test_bad_costs_are_refused_and_the_cost_survives_json():
    for cost, match in (([1, 0, 1], "positive"), ([1, -1, 1], "positive"), ([1, np.nan, 1], "positive"),
                        ([1, 1], "3 values")):
        with pytest.raises(SpecError, match=match):
            FeatureTypes(3, cost=cost)
    again = FeatureTypes.from_json(MIXED.to_json())
    np.testing.assert_array_equal(again.cost, MIXED.cost)


def test_the_weighted_cost_changes_the_answer_where_the_plain_one_prefers_another():
    """Reaching class 1 takes one thermometer level (plain cost 1, weighted 1/2) or +0.59 of the
    continuous variable (0.59 under both): the two costs must pick different answers."""
    network = Network((Linear(np.array([[0.0, 1.0, 0.0, 1.0]]), np.zeros(1)), ReLU(),
                       Linear(np.array([[1.0]]), np.array([-0.79]))), (4,))
    plain = FeatureTypes(4, ordinal=[[0, 1, 2]])
    x = np.array([1.0, 0.0, 0.0, 0.2])
    by_plain = counterfactual(network, x, features=plain)
    by_weight = counterfactual(network, x, features=plain.with_feature_cost())
    assert by_plain.optimal and by_weight.optimal
    assert by_plain.x_cf[:3].tolist() == [1, 0, 0] and by_plain.x_cf[3] == pytest.approx(0.79 + MIN_MARGIN, abs=1e-6)
    assert by_weight.x_cf.tolist() == [1, 1, 0, 0.2] and by_weight.distance == pytest.approx(0.5)
    assert by_plain.distance == pytest.approx(0.59 + MIN_MARGIN, abs=1e-6)


@pytest.mark.parametrize("seed", range(16))  # 12 feasible, 8 of them change a category or a level
def test_weighted_milp_is_nearest_over_every_encoding_and_a_dense_grid(seed):
    rng = np.random.default_rng(700 + seed)
    network = random_mlp((8, 6, 1), rng)
    x = np.zeros(8)
    x[0], x[1] = rng.uniform(0, 1, 2)
    x[2 + rng.integers(3)] = 1.0
    x[5:5 + 1 + rng.integers(3)] = 1.0
    target = 1 - int(predicted_class(network, x)[0])
    result = counterfactual(network, x, features=MIXED)
    best, step = cheapest_on_grid(network, x, target, MIXED.cost)
    if not np.isfinite(best):
        assert result.status == "infeasible"
        return
    assert result.found and result.optimal and MIXED.violations(result.x_cf, x) == []
    assert predicted_class(network, result.x_cf)[0] == target
    assert result.distance == pytest.approx(MIXED.distance(x, result.x_cf))
    assert result.distance <= best + 1e-9, "the grid found a cheaper counterfactual than the MILP"
    assert result.distance >= best - 2 * step - 1e-9
    assert result.lower_bound <= result.distance + 1e-9


@pytest.mark.parametrize("seed", range(4))
def test_weighted_robust_searches_agree_and_are_proven(seed):
    """MILP-R's fast search returns the paper's loop's step and distance under the weighted cost; the
    direct robust MILP is never farther; every answer passes the exact Δ-robustness check."""
    rng = np.random.default_rng(800 + seed)
    network = random_mlp((8, 5, 1), rng)
    x = np.zeros(8)
    x[0], x[1] = rng.uniform(0, 1, 2)
    x[2 + rng.integers(3)] = 1.0
    x[5] = 1.0
    spec = FeatureTypes(8, one_hot=[[2, 3, 4]], ordinal=[[5, 6, 7]]).with_feature_cost()
    target = 1 - int(predicted_class(network, x)[0])
    delta = 0.05
    fast = robust_counterfactual(network, x, delta, features=spec, target=target)
    steps = robust_counterfactual(network, x, delta, features=spec, target=target, search="steps")
    direct = nearest_robust_counterfactual(network, x, delta, features=spec, target=target)
    assert fast.robust == steps.robust and fast.margin == steps.margin
    if fast.robust:
        assert fast.counterfactual.distance == pytest.approx(steps.counterfactual.distance, abs=1e-6)
        assert direct.robust and direct.counterfactual.distance <= fast.counterfactual.distance + 1e-6
    for answer in (fast, steps, direct):
        if answer.robust:
            assert delta_robust(network, answer.x_cf, delta, target).robust
            assert answer.counterfactual.distance == pytest.approx(spec.distance(x, answer.x_cf))
