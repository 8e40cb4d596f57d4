"""MILP counterfactuals: valid by a forward pass, respect every feature type, and are nearest.

Optimality is checked two ways: on a mixed spec (one free continuous variable, a one-hot group, a
thermometer group, an immutable variable) every encoding is enumerated and the continuous variable
swept on a dense grid, so the best grid point must be no cheaper than the MILP's answer (and the
MILP no worse than the grid); on continuous-only networks a local search (moves toward x, random
moves in a shrinking ℓ1 ball) must find no valid point cheaper than the MILP's. "Valid" here means every target row ≥ MIN_MARGIN
(1e-4), the margin the MILP always asks for so that solver tolerances cannot return a boundary point.
"""

from __future__ import annotations

import numpy as np
import pytest

from assay.cfx import FeatureTypes, counterfactual
from assay.cfx._model import predicted_class, row_margins, target_rows
from assay.cfx.milp import MIN_MARGIN
from assay.errors import DataError, OptionError, SpecError
from tests.cfx.nets import cheapest_on_grid, logistic, random_mlp

MIXED = FeatureTypes(8, one_hot=[[2, 3, 4]], ordinal=[[5, 6, 7]], immutable=[0], names=[f"v{i}" for i in range(8)])


def _mixed_input(rng):
    x = np.zeros(8)
    x[0], x[1] = rng.uniform(0, 1, 2)
    x[2 + rng.integers(3)] = 1.0
    x[5:5 + 1 + rng.integers(3)] = 1.0
    return x


@pytest.mark.parametrize("seed", range(8))
def test_mixed_features_valid_respected_and_no_cheaper_grid_point(seed):
    rng = np.random.default_rng(seed)
    network = random_mlp((8, 6, 1), rng)
    x = _mixed_input(rng)
    target = 1 - int(predicted_class(network, x)[0])
    result = counterfactual(network, x, features=MIXED)
    best, step = cheapest_on_grid(network, x, target)
    if not np.isfinite(best):
        assert result.status == "infeasible" and "v0" in result.message
        return
    assert result.found and result.optimal
    assert MIXED.violations(result.x_cf, x) == []
    assert predicted_class(network, result.x_cf)[0] == target
    assert result.achieved_margin > 0
    assert result.distance <= best + 1e-9, "the grid found a cheaper counterfactual than the MILP"
    assert result.distance >= best - 2 * step - 1e-9 or result.distance < best
    assert result.lower_bound <= result.distance + 1e-9


@pytest.mark.parametrize("seed", range(6))
def test_local_search_finds_nothing_cheaper(seed):
    rng = np.random.default_rng(50 + seed)
    network = random_mlp((5, 8, 1), rng)
    x = rng.uniform(0, 1, size=5)
    result = counterfactual(network, x)
    assert result.found and result.optimal
    C = target_rows(network, result.target)
    cf, d = result.x_cf, result.distance
    candidates = [cf + t * (x - cf) for t in (1e-3, 1e-2, 0.05, 0.2)]
    for i in range(5):
        for t in (1e-3, 1e-2, 0.1, 0.5, 1.0):
            moved = cf.copy()
            moved[i] += t * (x[i] - cf[i])
            candidates.append(moved)
    for radius in (d, 0.99 * d, 0.9 * d):
        steps = rng.laplace(size=(3000, 5))
        steps *= (radius * rng.uniform(0, 1, size=(3000, 1)) ** (1 / 5)) / np.abs(steps).sum(1, keepdims=True)
        candidates.extend(np.clip(x + steps, 0, 1))
    candidates = np.array(candidates)
    cheaper = np.abs(candidates - x).sum(1) < d - 1e-7
    assert not (row_margins(network, candidates[cheaper], C) >= MIN_MARGIN).any()


def test_margin_is_met_and_linf_is_nearest_on_a_grid():
    rng = np.random.default_rng(9)
    network = random_mlp((2, 5, 1), rng)
    x = np.array([0.2, 0.7])
    target = 1 - int(predicted_class(network, x)[0])
    C = target_rows(network, target)
    g = np.linspace(0, 1, 801)
    points = np.stack(np.meshgrid(g, g), -1).reshape(-1, 2)
    margins = row_margins(network, points, C)
    for margin in (0.0, 0.3):
        result = counterfactual(network, x, "linf", target=target, margin=margin)
        if not result.found:
            assert (margins < margin).all()
            continue
        assert result.achieved_margin >= margin - 1e-6
        ok = margins >= max(margin, 1e-4)
        best = float(np.abs(points[ok] - x).max(1).min())
        assert result.distance <= best + 1e-9
        assert result.distance >= best - 2 * (g[1] - g[0])


def test_immutable_features_that_forbid_a_counterfactual_get_a_clear_answer():
    network = logistic([10.0, 0.1], -5.0)  # class 1 needs x0 ≳ 0.5
    features = FeatureTypes.continuous(2, immutable=[0])
    result = counterfactual(network, np.array([0.0, 0.5]), features=features)
    assert result.status == "infeasible" and result.x_cf is None
    assert "immutable" in result.message and "x[0]" in result.message
    free = counterfactual(network, np.array([0.0, 0.5]))
    assert free.found and free.x_cf[0] == pytest.approx(0.495, abs=1e-4)
    assert result.to_json()["distance"] is None


def test_bad_requests_raise_assay_errors():
    network = random_mlp((3, 4, 1), np.random.default_rng(0))
    with pytest.raises(DataError, match="3"):
        counterfactual(network, np.zeros(4))
    with pytest.raises(DataError, match="outside"):
        counterfactual(network, np.array([0.5, 2.0, 0.5]))
    with pytest.raises(OptionError, match="target"):
        counterfactual(network, np.zeros(3), target=2)
    with pytest.raises(OptionError):
        counterfactual(network, np.zeros(3), distance="l2")
    with pytest.raises(SpecError, match="two groups"):
        FeatureTypes(4, one_hot=[[0, 1]], ordinal=[[1, 2]])
    with pytest.raises(DataError, match="thermometer"):
        counterfactual(random_mlp((8, 3, 1), np.random.default_rng(1)),
                       np.array([0.5, 0.5, 1, 0, 0, 1, 0, 1.0]), features=MIXED)


def test_multiclass_target_and_gradient_method():
    rng = np.random.default_rng(4)
    network = random_mlp((4, 8, 3), rng)
    x = rng.uniform(0, 1, size=4)
    with pytest.raises(OptionError, match="which class"):
        counterfactual(network, x)
    source = int(predicted_class(network, x)[0])
    for target in sorted({0, 1, 2} - {source})[:1]:
        exact = counterfactual(network, x, target=target)
        if not exact.found:
            continue
        assert predicted_class(network, exact.x_cf)[0] == target
        fast = counterfactual(network, x, target=target, method="gradient", rng=np.random.default_rng(0))
        if fast.found:
            assert predicted_class(network, fast.x_cf)[0] == target
            assert fast.distance >= exact.distance - 1e-6 and not fast.optimal


def test_feature_spec_json_roundtrip(tmp_path):
    path = tmp_path / "spec.json"
    import json

    path.write_text(json.dumps(MIXED.to_json()))
    again = FeatureTypes.from_json(path)
    assert again.one_hot == MIXED.one_hot and again.ordinal == MIXED.ordinal and again.immutable == (0,)
    path.write_text('{"size": 3, "colour": 1}')
    with pytest.raises(SpecError, match="unknown keys"):
        FeatureTypes.from_json(path)
    assert MIXED.snap(np.array([0.3, 0.4, 0.2, 0.7, 0.1, 0.9, 0.6, 0.8]))[2:].tolist() == [0, 1, 0, 1, 1, 1]


def test_time_limits_that_expire_never_overclaim():
    from assay.cfx import delta_robust

    rng = np.random.default_rng(77)
    network = random_mlp((6, 12, 12, 1), rng, bias_scale=0.1)
    x = rng.uniform(0, 1, size=6)
    unlimited = counterfactual(network, x)
    rushed = counterfactual(network, x, time_limit=1e-3)
    assert rushed.status in ("found", "timeout")
    if rushed.found:
        assert predicted_class(network, rushed.x_cf)[0] == rushed.target
        assert rushed.lower_bound <= unlimited.distance + 1e-6  # a bound, never above the optimum
        if rushed.optimal:
            assert rushed.distance == pytest.approx(unlimited.distance, abs=1e-6)
        else:
            assert rushed.distance >= unlimited.distance - 1e-6
    if unlimited.found:
        target = unlimited.target
        exact = delta_robust(network, unlimited.x_cf, 0.01, target, method="milp")
        quick = delta_robust(network, unlimited.x_cf, 0.01, target, method="milp", time_limit=1e-3)
        assert quick.verdict in (exact.verdict, "unknown")


def test_solver_notices_on_the_c_level_stdout_are_muted(capfd):
    import os

    from assay._lp import stdout_muted

    print("before", flush=True)
    with stdout_muted():
        os.write(1, b"HighsMipSolverData::transformNewIntegerFeasibleSolution tmpSolver.run();\n")
    print("after", flush=True)
    out = capfd.readouterr().out
    assert "before" in out and "after" in out and "Highs" not in out
