"""MILP-R's faster search (``search="skip"``) against the paper's plain loop (``search="steps"``).

The skip search proves a prefix of the margin steps fails from a lower bound on the distance of
every Δ-robust point; these tests check that it returns what the paper's loop returns, that the
steps it skips really fail the exact test, that its lower bound is a lower bound (against a grid
and every vertex model), and the protocol of the published runs on the real data.
"""

from __future__ import annotations

import numpy as np
import pytest

from assay.cfx import FeatureTypes, counterfactual, delta_robust, robust_counterfactual
from assay.cfx._model import target_rows
from assay.cfx.generate import _skip_prefix
from assay.cfx.robust_milp import robust_distance_bound
from tests.cfx.nets import all_vertices, parameter_count, random_mlp, shifted_outputs
from tests.cfx.test_generate import _vertex_worst_on_grid


def _same(a, b):
    assert a.robust == b.robust
    assert a.margin == b.margin and a.candidates == b.candidates
    assert a.counterfactual.status == b.counterfactual.status
    if a.counterfactual.found:
        assert a.counterfactual.distance == pytest.approx(b.counterfactual.distance, abs=1e-7)


@pytest.mark.parametrize("seed", [504, 506, 507, 509, 513, 516, 537, 542])  # 509, 516: no robust answer
def test_skip_returns_the_papers_step_and_skips_only_failing_steps(seed):
    rng = np.random.default_rng(seed)
    network = random_mlp((3, 5, 1), rng)
    x = rng.uniform(0, 1, size=3)
    delta, step = 0.04, 0.05
    steps = robust_counterfactual(network, x, delta, margin_step=step, max_margin=3.0, search="steps")
    skip = robust_counterfactual(network, x, delta, margin_step=step, max_margin=3.0, search="skip")
    _same(steps, skip)
    assert skip.tested <= steps.tested
    assert steps.tested == steps.candidates  # the paper's loop tests every step it decides
    if skip.robust:
        target = skip.counterfactual.target
        assert delta_robust(network, skip.x_cf, delta, target, method="milp").robust
        C = target_rows(network, target)
        signs = np.vstack([rng.uniform(-1, 1, size=(3000, parameter_count(network))),
                           rng.choice([-1.0, 1.0], size=(3000, parameter_count(network)))])
        assert (shifted_outputs(network, skip.x_cf, signs, delta) @ C.T).min() > 0


@pytest.mark.parametrize("seed", [506, 537, 542])
def test_every_skipped_step_fails_the_exact_test(seed):
    rng = np.random.default_rng(seed)
    network = random_mlp((3, 5, 1), rng)
    x = rng.uniform(0, 1, size=3)
    target = 1 - int(network.forward(x[None])[0, 0] > 0)
    delta = 0.04
    margins = [0.01 + 0.05 * k for k in range(60)]
    features = FeatureTypes.continuous(3)

    def candidate(k):
        return counterfactual(network, x, "l1", features, target, margins[k])

    fails, start = _skip_prefix(network, x, (delta, delta), features, target, "l1", None, margins, candidate)
    assert start > 0  # these seeds have a prefix to skip
    for k in range(start):
        cf = candidate(k)
        assert cf.found and not delta_robust(network, cf.x_cf, delta, target).robust
    for k in range(start, min(start + 8, len(margins))):
        cf = candidate(k)
        if cf.found and fails(cf):  # the distance rule on later steps is a proof too
            assert not delta_robust(network, cf.x_cf, delta, target).robust


def test_robust_distance_bound_is_below_every_robust_point_of_a_grid():
    checked = 0
    for seed in (300, 303, 308, 315):  # 300: no robust point at all
        rng = np.random.default_rng(seed)
        network = random_mlp((2, 3, 1), rng)
        x = rng.uniform(0, 1, size=2)
        target = 1 - int(network.forward(x[None])[0, 0] > 0)
        delta = 0.05
        bound, point = robust_distance_bound(network, x, (delta, delta), FeatureTypes.continuous(2), target)
        g = np.linspace(0, 1, 26)
        grid = np.stack(np.meshgrid(g, g), -1).reshape(-1, 2)
        C = target_rows(network, target)
        worst = _vertex_worst_on_grid(network, grid, all_vertices(parameter_count(network)), delta, C)
        robust = grid[worst > 0]
        if not len(robust):
            assert bound == np.inf and point is None
            continue
        checked += 1
        assert bound <= np.abs(robust - x).sum(1).min() + 1e-9
        assert point is not None and np.abs(point - x).sum() == pytest.approx(bound, rel=1e-5, abs=1e-7)
    assert checked == 3


def test_no_robust_point_the_whole_schedule_is_decided_without_tests():
    rng = np.random.default_rng(2)
    network = random_mlp((3, 4, 1), rng)
    x = rng.uniform(0, 1, size=3)
    steps = robust_counterfactual(network, x, 5.0, max_margin=0.5, search="steps")
    skip = robust_counterfactual(network, x, 5.0, max_margin=0.5)
    _same(steps, skip)
    assert skip.candidates == 3 and skip.tested == 0 and not skip.robust  # margins 0.01, 0.21, 0.41


def test_bits_and_immutables_and_deeper_networks():
    rng = np.random.default_rng(41)
    network = random_mlp((5, 6, 1), rng)
    features = FeatureTypes(5, one_hot=((2, 3, 4),), immutable=(1,))
    found = 0
    for _ in range(6):
        x = np.concatenate([rng.uniform(0, 1, size=2), np.eye(3)[rng.integers(3)]])
        kwargs = dict(features=features, margin_step=0.05, max_margin=3.0)
        steps = robust_counterfactual(network, x, 0.03, search="steps", **kwargs)
        skip = robust_counterfactual(network, x, 0.03, **kwargs)
        _same(steps, skip)
        found += skip.robust
        if skip.robust:
            assert skip.x_cf[1] == x[1] and sorted(skip.x_cf[2:]) == [0.0, 0.0, 1.0]
    assert found >= 3
    deep = random_mlp((3, 4, 4, 1), np.random.default_rng(9))
    x = np.random.default_rng(10).uniform(0, 1, size=3)
    a = robust_counterfactual(deep, x, 0.02, margin_step=0.1, max_margin=2.0, search="steps")
    b = robust_counterfactual(deep, x, 0.02, margin_step=0.1, max_margin=2.0)
    _same(a, b)
    assert b.solves == a.solves  # the robust-distance bound needs one hidden layer: nothing is skipped


def test_unknown_search_is_an_option_error():
    from assay.errors import OptionError

    network = random_mlp((2, 3, 1), np.random.default_rng(0))
    with pytest.raises(OptionError, match="search"):
        robust_counterfactual(network, np.array([0.5, 0.5]), 0.01, search="bisect")


@pytest.mark.data
def test_published_protocol_reproduces_the_published_delta(data_dir):
    """δ of the published runs (their notebooks print 0.10583956…, 0.02092442…, 0.10821238…) comes out of
    the same base models, D1/D2 splits and retraining fractions here."""
    from assay.cfx.data import PUBLISHED, load_dataset, model_shifts, test_inputs, train_model
    from assay.nn import load

    printed = {"diabetes": 0.10583956465260402, "no2": 0.020924421229148754, "sba": 0.10821238236127151}
    for name, value in printed.items():
        dataset = load_dataset(name, data_dir)
        model = train_model(dataset)
        delta, retrained, m2 = model_shifts(dataset, model)
        assert delta == pytest.approx(value, abs=1e-12)
        assert len(retrained) == 5 and m2 is not None
        xs = test_inputs(dataset, model, 5, sound_delta=PUBLISHED[name]["delta"])
        network = load(model)
        assert len(xs) == 5 and all(delta_robust(network, x, PUBLISHED[name]["delta"], 0).robust for x in xs)


def test_a_solver_error_is_retried_without_presolve(monkeypatch):
    """HiGHS sometimes ends a small MILP with "Solve error" after its presolve (seen on sba); the
    builder solves once more without presolve instead of ending Algorithm 2's loop there."""
    import assay.cfx._model as model

    real, calls = model.run_highs, []

    def flaky(problem, options):
        calls.append(dict(options))
        if len(calls) == 1:
            return model._Outcome("error", None, None, "Solve error")
        return real(problem, options)

    monkeypatch.setattr(model, "run_highs", flaky)
    network = random_mlp((2, 3, 1), np.random.default_rng(303))
    x = np.array([0.2, 0.7])
    cf = counterfactual(network, x)
    assert len(calls) == 2 and calls[1]["presolve"] == "off" and "presolve" not in calls[0]
    assert cf.found or cf.status == "infeasible"
