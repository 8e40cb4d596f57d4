"""The APΔS authors' own credit run (repository lmarza/APAS, exp_sec7): its generation test draws
10000 shifted models per candidate (``samples``), and its M2 is the base model after one pass over
all of D2 (``model_shifts(..., m2="one_pass")``)."""

from __future__ import annotations

import numpy as np
import pytest

from assay.cfx import counterfactual, robust_counterfactual
from assay.errors import OptionError
from tests.cfx.nets import logistic


def _failure_fraction(x: float, bias: float, delta: float, points: int = 400_000) -> float:
    """Exact share of the δ-box of f(x) = w·x + b (w = 1, one input) that puts x in class 0.

    The shifted model (1 + δu₁)·x + (b + δu₂) with u uniform on [−1, 1]² fails iff
    u₂ ≤ −(x + b)/δ − x·u₁; for each u₁ that has probability clip((1 − t − x·u₁)/2, 0, 1) with
    t = (x + b)/δ, a piecewise-linear function of u₁ whose mean the midpoint rule gets to ~1e-9."""
    u1 = (np.arange(points) + 0.5) / points * 2 - 1
    t = (x + bias) / delta
    return float(np.clip((1 - t - x * u1) / 2, 0, 1).mean())


def test_the_apas_test_draws_the_requested_number_of_models():
    """f(x) = x − 0.5, x = 0.2: the first candidate (margin 0.01) sits at x ≈ 0.51, where a share p ≈ 0.3
    of the δ-box (δ = 0.03) rejects it; the next one (margin 0.21) is never rejected. With n = 2
    models per test the first candidate passes with probability (1 − p)², ~0.49; with the default
    n = 1379 practically never. The pass rate over 100 seeds must sit within 4.5 standard deviations
    of (1 − p)²: a generator that ignored ``samples`` would pass it 0 times."""
    network = logistic([1.0], -0.5)
    x = np.array([0.2])
    delta = 0.03
    first = counterfactual(network, x, target=1, margin=0.01).x_cf
    p = _failure_fraction(float(first[0]), -0.5, delta)
    assert 0.2 < p < 0.4
    expected = (1 - p) ** 2
    runs = 100
    passed_first = 0
    for seed in range(runs):
        result = robust_counterfactual(network, x, delta, test="apas", target=1, samples=2,
                                       rng=np.random.default_rng(seed))
        assert result.robust
        assert "fresh sample of 2" in result.guarantee
        assert result.confidence == max(0.0, 1 - result.tested * 0.995 ** 2)  # a union bound: 0 for n = 2
        passed_first += result.margin == 0.01
    sigma = np.sqrt(runs * expected * (1 - expected))
    assert abs(passed_first - runs * expected) <= 4.5 * sigma, (passed_first, runs * expected)


def test_ten_thousand_models_per_candidate_state_their_confidence():
    network = logistic([1.0], -0.5)
    result = robust_counterfactual(network, np.array([0.2]), 0.03, test="apas", target=1, samples=10000,
                                   rng=np.random.default_rng(0))
    assert result.robust and "fresh sample of 10000" in result.guarantee
    assert result.confidence == pytest.approx(max(0.0, 1 - result.tested * 0.995 ** 10000))
    default = robust_counterfactual(network, np.array([0.2]), 0.03, test="apas", target=1,
                                    rng=np.random.default_rng(0))
    assert "fresh sample of 1379" in default.guarantee


@pytest.mark.parametrize("samples", [0, -3, 2.5, True, "10000"])
def test_a_bad_sample_size_is_refused(samples):
    with pytest.raises(OptionError, match="samples"):
        robust_counterfactual(logistic([1.0], -0.5), np.array([0.2]), 0.03, test="apas", target=1, samples=samples)


def test_an_unknown_m2_protocol_is_refused_before_any_training():
    from assay.cfx.data import model_shifts

    with pytest.raises(OptionError, match="m2"):
        model_shifts(None, None, m2="mmax")


@pytest.mark.data
def test_one_pass_m2_is_the_apas_notebooks_model(data_dir):
    """exp_sec7/credit.ipynb (lmarza/APAS) sets ``m2 = copy.deepcopy(clf); m2.partial_fit(Xn, yn)`` and
    prints the largest first-layer weight change of its float32 copy: 1.2818451. The default M2
    stays robust-ce-inn's Mmax (shift 1.5372448287620384, tests/cfx/test_credit_protocol.py)."""
    from assay.cfx.data import flat_parameters, load_dataset, model_shifts, train_model

    dataset = load_dataset("credit", data_dir, d2_rows="published")
    model = train_model(dataset)
    delta, _, m2 = model_shifts(dataset, model, m2="one_pass")
    assert delta == pytest.approx(0.054449288758308775, abs=1e-12)  # the option leaves δ alone
    first_layer = np.abs(m2.coefs_[0].astype(np.float32) - model.coefs_[0].astype(np.float32)).max()
    assert first_layer == np.float32(1.2818451)
    _, _, mmax = model_shifts(dataset, model)
    assert float(np.abs(flat_parameters(mmax) - flat_parameters(model)).max()) == pytest.approx(1.5372448287620384,
                                                                                               abs=1e-12)


# The first two MILP-R counterfactuals of the APΔS authors' credit run (lmarza/APAS,
# exp_sec7/full_results_credit.csv, column "CFX": run_ours_robust(approx=False) at their delta_min),
# with their exactly certified largest δ (column "MILP δ_max", their bisection to 1e-4).
_PUBLISHED_MILP_R = [
    ([1, 1, 0, 0, 0.64705882, 0, 0, 0, 1, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0.20254209, 1, 1, 0, 0, 0, 1, 1, 1, 1, 0,
      1, 1, 1, 1, 0, 1, 0, 0, 1, 0, 0, 1, 1, 1, 1, 1, 0, 0, 0, 0.48214286, 0, 0, 1, 1, 0, 0, 1, 0, 0, 0, 1, 1, 1, 0, 1, 1,
      1, 0, 1, 0], 0.0867),
    ([1, 1, 0, 0, 0.11764706, 0, 0, 0, 0, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0.10448993, 1, 0, 0, 0, 0, 1, 1, 1, 0, 0,
      1, 1, 1, 1, 1, 0, 0, 0, 1, 0, 0, 1, 0, 0, 0, 1, 0, 0, 0, 0.17857143, 0, 0, 1, 1, 0, 0, 1, 0, 0, 0, 1, 1, 1, 0, 1, 0,
      1, 0, 1, 0], 0.06965),
]


@pytest.mark.data
def test_milp_r_at_the_measured_delta_gives_the_apas_runs_counterfactuals(data_dir):
    """Same inputs, same generator: MILP-R at δ = 0.0544 returns the APΔS run's first two counterfactuals
    (printed to 8 digits), and the exact largest δ of each is theirs within their bisection's 1e-4."""
    from assay.cfx import max_certified_delta
    from assay.cfx.data import load_dataset, model_shifts, test_inputs, train_model
    from assay.nn import load

    dataset = load_dataset("credit", data_dir, d2_rows="published")
    model = train_model(dataset)
    network = load(model)
    delta, _, _ = model_shifts(dataset, model)
    xs = test_inputs(dataset, model, 2, sound_delta=0.05)
    for x, (published, published_delta) in zip(xs, _PUBLISHED_MILP_R):
        result = robust_counterfactual(network, x, delta, features=dataset.features, target=1)
        assert result.robust
        assert np.abs(result.x_cf - np.array(published)).max() < 1e-7
        certified = max_certified_delta(network, result.x_cf, 1, tolerance=1e-4).delta
        assert abs(certified - published_delta) <= 1e-4
