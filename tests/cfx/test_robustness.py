"""Exact Δ-robustness against vertex enumeration and dense sampling of shifted models.

* One hidden layer: the worst case over the weight box is attained at a vertex (each neuron's
  pre-activation is affine in its own row of weights, ReLU is monotone, the output is affine in the
  last layer's weights), so the MILP optimum must *equal* the minimum over all 2^P vertex models.
* Two hidden layers: vertices and uniform samples are only falsifiers; no sampled model may go
  below the MILP's proven lower bound, a "robust" verdict must survive all of them, and every
  "not_robust" verdict carries a shifted model within δ that invalidates x_cf by a forward pass.
* Logistic regression: the worst case has a closed form, so δ can be placed within 1e-6 of the
  threshold on both sides, and exactly on it (a tie is invalid, so never "robust").
"""

from __future__ import annotations

import numpy as np
import pytest

from assay.cfx import delta_robust, max_certified_delta
from assay.cfx._model import row_margins, target_rows
from assay.errors import OptionError
from tests.cfx.nets import all_vertices, logistic, parameter_count, parameters, random_mlp, shifted_outputs

BIG = 1e6  # a margin no model reaches: the MILP then always returns its worst model as witness


def _target_of(network, x):
    return int(network.forward(x[None])[0, 0] > 0)


def _witness_within(network, witness, deltas):
    for (W, b), (W2, b2), d in zip(parameters(network), parameters(witness), deltas):
        assert np.abs(W2 - W).max() <= d * (1 + 1e-12) + 1e-15
        assert np.abs(b2 - b).max() <= d * (1 + 1e-12) + 1e-15


@pytest.mark.parametrize("seed", range(6))
def test_one_hidden_layer_milp_equals_vertex_minimum(seed):
    rng = np.random.default_rng(seed)
    network = random_mlp((2, 3, 1), rng)
    x = rng.uniform(-1, 1, size=2)
    target = _target_of(network, x)
    C = target_rows(network, target)
    vertices = all_vertices(parameter_count(network))
    for delta in (0.02, 0.1, 0.4):
        vertex_min = float((shifted_outputs(network, x, vertices, delta) @ C.T).min())
        for method in ("milp", "auto"):  # the exact MILP and the one-hidden-layer closed form
            result = delta_robust(network, x, delta, target, margin=BIG, method=method)
            assert result.verdict == "not_robust"
            assert result.decided_by == ("milp" if method == "milp" else "closed_form")
            assert result.worst_lower == pytest.approx(vertex_min, abs=1e-6)
            assert result.worst_upper == pytest.approx(vertex_min, abs=1e-6)  # the witness's forward pass
            _witness_within(network, result.witness, result.deltas)
        verdict = delta_robust(network, x, delta, target).verdict
        assert verdict == ("robust" if vertex_min > 1e-9 else "not_robust")


@pytest.mark.parametrize("seed", range(8))
def test_two_hidden_layers_never_refuted_by_samples_or_vertices(seed):
    rng = np.random.default_rng(100 + seed)
    network = random_mlp((3, 4, 3, 1), rng)
    x = rng.uniform(0, 1, size=3)
    target = _target_of(network, x)
    C = target_rows(network, target)
    P = parameter_count(network)
    uniform = rng.uniform(-1, 1, size=(4000, P))
    corners = rng.choice([-1.0, 1.0], size=(4000, P))
    nominal = float(row_margins(network, x, C)[0])
    verdicts = set()
    for delta in (0.005, 0.02, 0.05, 0.15):
        result = delta_robust(network, x, delta, target)
        sampled = min(float((shifted_outputs(network, x, s, delta) @ C.T).min()) for s in (uniform, corners))
        verdicts.add(result.verdict)
        assert result.worst_lower <= sampled + 1e-9, "a sampled model went below the proven lower bound"
        if result.verdict == "robust":
            assert sampled > 0
        elif result.verdict == "not_robust":
            assert float(row_margins(result.witness, x, C)[0]) <= 0
            _witness_within(network, result.witness, result.deltas)
            assert result.worst_upper <= 0
        exact = delta_robust(network, x, delta, target, margin=BIG, method="milp")
        assert exact.worst_upper <= sampled + 1e-9, "the MILP's worst model is not the worst"
        assert exact.worst_lower == pytest.approx(exact.worst_upper, abs=1e-6)
    assert "unknown" not in verdicts
    assert nominal > 0


def test_bounds_check_is_sound_and_milp_decides_what_it_cannot():
    rng = np.random.default_rng(7)
    decided_by = set()
    for _ in range(12):
        network = random_mlp((4, 5, 3, 1), rng)
        x = rng.uniform(0, 1, size=4)
        target = _target_of(network, x)
        for delta in (0.001, 0.01, 0.05):
            fast = delta_robust(network, x, delta, target, method="bounds")
            exact = delta_robust(network, x, delta, target, method="milp")
            auto = delta_robust(network, x, delta, target)
            assert exact.verdict in ("robust", "not_robust")
            if fast.verdict == "robust":
                assert exact.verdict == "robust"
            else:
                assert fast.verdict == "unknown"
            assert auto.verdict == exact.verdict
            assert fast.worst_lower <= exact.worst_lower + 1e-9
            decided_by.add(auto.decided_by)
    assert decided_by == {"bounds", "milp"}


def test_logistic_regression_threshold_within_1e6():
    w, b = np.array([1.5, -2.0, 0.5]), 0.3
    x = np.array([0.4, 0.1, 0.9])
    network = logistic(w, b)
    m = float(w @ x + b)
    threshold = m / (np.abs(x).sum() + 1.0)  # worst row = m − δ(‖x‖₁ + 1)
    assert delta_robust(network, x, threshold * (1 - 1e-6), 1).verdict == "robust"
    below = delta_robust(network, x, threshold * (1 + 1e-6), 1)
    assert below.verdict == "not_robust" and below.worst_upper <= 0
    assert delta_robust(network, x, threshold, 1).verdict != "robust"  # a tie is invalid


def test_two_layer_threshold_found_by_bisection_is_tight():
    rng = np.random.default_rng(11)
    network = random_mlp((2, 3, 1), rng)  # one hidden layer, 13 parameters: the vertices are exact
    x = rng.uniform(0, 1, size=2)
    target = _target_of(network, x)
    found = max_certified_delta(network, x, target, tolerance=1e-5)
    assert found.undecided == 0
    assert delta_robust(network, x, found.delta, target).verdict == "robust"
    beyond = delta_robust(network, x, found.upper, target)
    assert beyond.verdict == "not_robust"
    assert found.upper - found.delta <= 1e-5
    C = target_rows(network, target)
    vertices = all_vertices(parameter_count(network))
    assert float((shifted_outputs(network, x, vertices, found.delta) @ C.T).min()) > 0
    assert float((shifted_outputs(network, x, vertices, found.upper) @ C.T).min()) <= 0


def test_per_layer_delta_and_multiclass():
    rng = np.random.default_rng(3)
    network = random_mlp((3, 4, 3), rng)
    x = rng.uniform(0, 1, size=3)
    target = int(network.forward(x[None])[0].argmax())
    C = target_rows(network, target)
    assert C.shape == (2, 3)
    P = parameter_count(network)
    vertices = all_vertices(P) if P <= 14 else rng.choice([-1.0, 1.0], size=(20000, P))
    for deltas in ((0.05, 0.0), (0.0, 0.2), (0.1, 0.1)):
        result = delta_robust(network, x, {0: deltas[0], 2: deltas[1]}, target, margin=BIG, method="milp")
        assert result.deltas == deltas
        _witness_within(network, result.witness, deltas)
        sampled = float((shifted_outputs(network, x, vertices, deltas) @ C.T).min())
        assert result.worst_lower <= sampled + 1e-9
        assert result.worst_upper == pytest.approx(result.worst_lower, abs=1e-6)
    with pytest.raises(OptionError, match="not Linear layers"):
        delta_robust(network, x, {1: 0.1}, target)
    with pytest.raises(OptionError, match="≥ 0"):
        delta_robust(network, x, -0.1, target)


def test_max_certified_delta_stopped_by_ctrl_c_keeps_a_certified_delta(monkeypatch):
    import assay.cfx.robustness as module

    rng = np.random.default_rng(11)
    network = random_mlp((2, 3, 1), rng)
    x = rng.uniform(0, 1, size=2)
    target = _target_of(network, x)
    real, calls = module.delta_robust, []

    def stopping(*args, **kwargs):
        calls.append(1)
        if len(calls) > 6:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(module, "delta_robust", stopping)
    stopped = module.max_certified_delta(network, x, target, tolerance=1e-6)
    monkeypatch.undo()
    assert stopped.interrupted and stopped.checks == 7
    assert stopped.delta < stopped.upper
    assert stopped.delta == 0 or delta_robust(network, x, stopped.delta, target).robust
