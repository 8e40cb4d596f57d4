"""The fast path of the counterfactual MILPs and of Algorithm 2 against the plain ones.

Speed-ups may change how an answer is found, never the answer: the MILP restricted to the ball a
greedy valid point proves (``tighten=True``) has the plain MILP's optimum; the bounds over that ball
contain every point of it (sampled, and against an LP); Algorithm 2's fast search returns the plain
loop's verdict, step and distance, tests each distinct point once, and what it certifies survives
every vertex model.
"""

from __future__ import annotations

import numpy as np
import pytest

from assay.cfx import FeatureTypes, counterfactual, delta_robust, nearest_robust_counterfactual, robust_counterfactual
from assay.cfx._incumbent import ball_range, greedy_point, network_margin
from assay.cfx._model import check_mlp, row_margins, target_rows
from assay.cfx.robust_milp import _solve as robust_solve
from tests.cfx.nets import all_vertices, parameter_count, random_mlp, shifted_outputs

SPECS = [
    ((4, 6, 1), FeatureTypes.continuous(4)),
    ((3, 4, 4, 1), FeatureTypes.continuous(3)),  # deeper: later layers bounded by assay.bounds over the ball's box
    ((6, 5, 1), FeatureTypes(6, one_hot=((2, 3, 4),), immutable=(5,))),
    ((7, 6, 1), FeatureTypes(7, ordinal=((3, 4, 5),), one_hot=((0, 1),))),
    ((4, 6, 3), FeatureTypes.continuous(4)),  # three classes
]


@pytest.mark.parametrize("seed", range(10))
def test_the_tightened_milp_has_the_plain_milps_optimum(seed):
    rng = np.random.default_rng(seed)
    sizes, features = SPECS[seed % len(SPECS)]
    network = random_mlp(sizes, rng)
    x = features.snap(rng.uniform(0, 1, size=sizes[0]))
    target = None if sizes[-1] == 1 else int(rng.integers(sizes[-1]))
    for distance in ("l1", "linf"):
        for margin in (0.0, 0.3, 1.0):
            fast = counterfactual(network, x, distance, features, target, margin)
            plain = counterfactual(network, x, distance, features, target, margin, tighten=False)
            assert fast.status == plain.status
            if plain.found:
                assert fast.distance == pytest.approx(plain.distance, abs=1e-6)
                assert fast.optimal and fast.lower_bound <= plain.distance + 1e-6
                assert not features.violations(fast.x_cf, x) and fast.achieved_margin > 0


@pytest.mark.parametrize("seed", range(6))
def test_the_tightened_robust_milp_has_the_plain_optimum(seed):
    rng = np.random.default_rng(40 + seed)
    sizes, features = SPECS[(2 * seed) % 4 if (2 * seed) % 4 != 1 else 0]
    network = random_mlp(sizes, rng)
    x = features.snap(rng.uniform(0, 1, size=sizes[0]))
    target = 1 - int(network.forward(x[None])[0, 0] > 0)
    for delta in (0.02, 0.1):
        fast = robust_solve(network, x, (delta, delta), features, target, "l1", 0.0, None)[0]
        plain = robust_solve(network, x, (delta, delta), features, target, "l1", 0.0, None, tighten=False)[0]
        assert fast.status == plain.status
        if plain.x is not None:
            assert fast.objective == pytest.approx(plain.objective, abs=1e-6)
            assert fast.bound <= plain.objective + 1e-6


def test_a_one_hot_bit_cut_by_the_ball_keeps_the_optimum():
    """A ball of radius < 1 around x leaves a set bit the bounds [1 − r, 1]: HiGHS's presolve returned
    a wrong optimum for such fractional bounds on a binary (this case), so bits get whole bounds."""
    rng = np.random.default_rng(15)
    network = random_mlp((6, 5, 1), rng)
    features = FeatureTypes(6, one_hot=((2, 3, 4),), immutable=(5,))
    x = np.concatenate([rng.uniform(0, 1, size=2), np.eye(3)[rng.integers(3)], rng.uniform(0, 1, size=1)])
    fast = robust_solve(network, x, (0.05, 0.05), features, 1, "l1", 0.0, None)[0]
    plain = robust_solve(network, x, (0.05, 0.05), features, 1, "l1", 0.0, None, tighten=False)[0]
    assert fast.objective == pytest.approx(plain.objective, abs=1e-9)
    fast_loop = robust_counterfactual(network, x, 0.05, features=features, margin_step=0.1, max_margin=2.0)
    plain_loop = robust_counterfactual(network, x, 0.05, features=features, margin_step=0.1, max_margin=2.0,
                                       search="steps")
    assert (fast_loop.margin, fast_loop.candidates) == (plain_loop.margin, plain_loop.candidates)
    assert fast_loop.counterfactual.distance == pytest.approx(plain_loop.counterfactual.distance, abs=1e-7)


@pytest.mark.parametrize("distance", ["l1", "linf"])
def test_ball_range_contains_the_ball_and_is_attained(distance):
    from scipy.optimize import linprog

    rng = np.random.default_rng(7)
    W, b = rng.normal(size=(5, 4)), rng.normal(size=5)
    x = rng.uniform(0, 1, size=4)
    lower, upper = np.zeros(4), np.ones(4)
    lower[2] = upper[2] = x[2]  # an immutable variable
    radius = 0.3
    lo, hi = ball_range(W, b, x, lower, upper, radius, distance)
    # Sampled points of the ball ∩ box stay inside the range.
    steps = rng.uniform(-1, 1, size=(20000, 4)) * rng.uniform(0, 1, size=(20000, 1)) ** 3
    norms = np.abs(steps).sum(1) if distance == "l1" else np.abs(steps).max(1)
    points = np.clip(x + steps * (radius / np.maximum(norms, radius))[:, None], lower, upper)
    values = points @ W.T + b
    assert (values >= lo).all() and (values <= hi).all()
    # An LP over (x′, |x′ − x|) attains both ends (the range is exact, not just sound).
    for j in range(5):
        for sign in (1.0, -1.0):
            c = np.concatenate([-sign * W[j], np.zeros(4)])
            A = [np.concatenate([np.eye(4)[i], -np.eye(4)[i]]) for i in range(4)]
            A += [np.concatenate([-np.eye(4)[i], -np.eye(4)[i]]) for i in range(4)]
            rhs = list(x) + list(-x)
            if distance == "l1":
                A.append(np.concatenate([np.zeros(4), np.ones(4)]))
                rhs.append(radius)
                t_bounds = [(0, None)] * 4
            else:
                t_bounds = [(0, radius)] * 4
            result = linprog(c, A_ub=np.array(A), b_ub=rhs, bounds=list(zip(lower, upper)) + t_bounds)
            best = sign * -result.fun + b[j]
            assert best == pytest.approx(hi[j] if sign > 0 else lo[j], abs=1e-7)


def test_greedy_point_is_valid_or_none():
    found = 0
    for seed in range(20):
        rng = np.random.default_rng(seed)
        network = random_mlp((4, 6, 1), rng)
        x = rng.uniform(0, 1, size=4)
        C = target_rows(network, 1 - int(network.forward(x[None])[0, 0] > 0))
        movable = np.array([True, True, False, True])
        point = greedy_point(network_margin(check_mlp(network, "test"), C), x, movable, np.zeros(4), np.ones(4), 0.05)
        if point is None:
            continue
        found += 1
        assert point[2] == x[2] and (point >= 0).all() and (point <= 1).all()
        assert row_margins(network, point, C)[0] >= 0.05
    assert found >= 5


def _same(a, b):
    assert a.robust == b.robust and a.margin == b.margin and a.candidates == b.candidates
    assert a.counterfactual.status == b.counterfactual.status
    if a.counterfactual.found:
        assert a.counterfactual.distance == pytest.approx(b.counterfactual.distance, abs=1e-7)


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("test", ["exact", "apas"])
def test_the_fast_search_returns_the_plain_loops_answer(seed, test):
    rng = np.random.default_rng(600 + seed)
    network = random_mlp((4, 6, 1), rng)
    x = rng.uniform(0, 1, size=4)
    kwargs = dict(test=test, margin_step=0.1, max_margin=3.0)
    fast = robust_counterfactual(network, x, 0.05, rng=np.random.default_rng(seed), **kwargs)
    plain = robust_counterfactual(network, x, 0.05, rng=np.random.default_rng(seed), search="steps", **kwargs)
    _same(fast, plain)
    assert fast.solves <= plain.solves and fast.tested <= plain.tested


def test_a_point_repeated_by_later_steps_is_tested_once(monkeypatch):
    """One-hot flips make a step's point meet the next margins too: the fast search reuses it without
    a MILP, and neither search re-tests it, even when a solve returns it with rounding noise (for
    APΔS a fresh sample would void the guarantee)."""
    from dataclasses import replace

    import assay.cfx.generate as generate

    features = FeatureTypes(6, one_hot=((2, 3, 4),), immutable=(5,))
    rng = np.random.default_rng(69)
    network = random_mlp((6, 5, 1), rng)
    x = np.concatenate([rng.uniform(0, 1, size=2), np.eye(3)[rng.integers(3)], rng.uniform(0, 1, size=1)])
    real_test, real_solve, seen = generate.apas_test, generate.counterfactual, []
    noise = np.random.default_rng(1)

    def counting(network, x_cf, *args, **kwargs):
        seen.append(np.array(x_cf))
        return real_test(network, x_cf, *args, **kwargs)

    def noisy(*args, **kwargs):  # each solve's point moved by rounding noise, as the solver's may be
        cf = real_solve(*args, **kwargs)
        return replace(cf, x_cf=cf.x_cf + noise.uniform(-1e-15, 1e-15, size=cf.x_cf.shape)) if cf.found else cf

    monkeypatch.setattr(generate, "apas_test", counting)
    monkeypatch.setattr(generate, "counterfactual", noisy)
    for search in ("skip", "steps"):
        seen.clear()
        result = robust_counterfactual(network, x, 0.2, test="apas", features=features, margin_step=0.1,
                                       max_margin=2.0, rng=np.random.default_rng(0), search=search)
        assert len(seen) == result.tested
        assert all(np.abs(a - b).max() > 1e-9 for i, a in enumerate(seen) for b in seen[:i])
        assert result.tested < result.candidates  # a point did repeat
        if search == "skip":
            assert result.solves < result.candidates  # and the fast search did not solve for it again
        assert result.robust and result.confidence == pytest.approx(1 - result.tested * 0.995 ** 1379)


@pytest.mark.parametrize("seed", [1, 2])
def test_certified_robust_counterfactuals_survive_every_vertex_model(seed):
    rng = np.random.default_rng(seed)
    network = random_mlp((2, 3, 1), rng)  # 13 parameters: all 8192 vertex models
    x = rng.uniform(0, 1, size=2)
    target = 1 - int(network.forward(x[None])[0, 0] > 0)
    C = target_rows(network, target)
    vertices = all_vertices(parameter_count(network))
    certified = 0
    for delta in (0.02, 0.05):
        for result in (robust_counterfactual(network, x, delta, margin_step=0.05, max_margin=3.0),
                       nearest_robust_counterfactual(network, x, delta)):
            if not result.robust:
                continue
            certified += 1
            assert delta_robust(network, result.x_cf, delta, target, method="milp").robust
            assert (shifted_outputs(network, result.x_cf, vertices, delta) @ C.T).min() > 0
    assert certified >= 2


def test_a_solve_stopped_without_a_point_returns_the_greedy_point_as_not_optimal(monkeypatch):
    import assay.cfx._model as model

    rng = np.random.default_rng(3)
    network = random_mlp((4, 6, 1), rng)
    x = rng.uniform(0, 1, size=4)
    exact = counterfactual(network, x)
    assert exact.found and exact.optimal
    monkeypatch.setattr(model, "run_highs",
                        lambda problem, options: model._Outcome("time_limit", None, -np.inf, "Time limit reached"))
    rushed = counterfactual(network, x, time_limit=0.01)
    assert rushed.found and not rushed.optimal  # the cap's valid point, never claimed nearest
    assert rushed.achieved_margin > 0 and rushed.distance >= exact.distance - 1e-9
    assert rushed.lower_bound <= exact.distance
    plain = counterfactual(network, x, time_limit=0.01, tighten=False)  # no greedy point: nothing to return
    assert plain.status == "timeout" and plain.x_cf is None
