"""Public surface of assay.fairness.knn: exports, errors with clear messages, result values, fan-out."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

import assay.fairness
import assay.fairness.knn as knn
from assay.errors import DataError, OptionError
from assay.fairness.knn import KnnFairnessCertifier, Status, certify, certify_many, largest_certified_flips


def small_data(rng, rows=40):
    X = rng.integers(0, 4, size=(rows, 3)).astype(float)
    y = (X[:, 1] + X[:, 2] + rng.normal(0, 0.5, rows) > 3).astype(int)
    X[:, 0] = rng.integers(0, 2, rows)
    return X, y


def test_public_names_are_pinned():
    assert knn.__all__ == ["Status", "Certificate", "Counterexample", "KnnFairnessCertifier", "certify", "certify_many",
                           "largest_certified_flips", "ground_truth", "GroundTruth", "down_sample", "knn_decision"]
    assert set(assay.fairness.__all__) <= set(knn.__all__)


@pytest.mark.parametrize("change, error, words", [
    (lambda X, y: (X[:, 0], y), DataError, "2-D"),
    (lambda X, y: (X, y[:-1]), DataError, "one label per row"),
    (lambda X, y: (np.where(np.arange(X.size).reshape(X.shape) == 7, np.nan, X), y), DataError, "row 2, column 1"),
    (lambda X, y: (X, y - 1), DataError, "labels"),
    (lambda X, y: (X, np.zeros_like(y)), DataError, "two classes"),
])
def test_bad_training_data_is_named(rng, change, error, words):
    X, y = small_data(rng)
    X, y = change(X, y)
    with pytest.raises(error, match=words):
        KnnFairnessCertifier(X, y, k_candidates=[3, 5])


@pytest.mark.parametrize("options, words", [
    (dict(k_candidates=[3, 500]), "must not exceed"),
    (dict(k_candidates=[3, 3]), "distinct"),
    (dict(k_candidates=[3], folds=1), "folds"),
    (dict(k_candidates=[3], class_weights={0: 1.5}), "ints ≥ 1"),
    (dict(k_candidates=[3], class_weights={7: 1}), "label 7"),
    (dict(k_candidates=[3], direction=(1, 1)), "two different labels"),
    (dict(k_candidates=[3], flippable=np.ones(3, dtype=bool)), "one entry per training row"),
    (dict(k_candidates=[3], flip_group={9: 1.0}), "columns 0..2"),
])
def test_bad_options_are_named(rng, options, words):
    X, y = small_data(rng)
    with pytest.raises(OptionError, match=words):
        KnnFairnessCertifier(X, y, **options)


def test_bad_requests_are_named(rng):
    X, y = small_data(rng)
    certifier = KnnFairnessCertifier(X, y, k_candidates=[3, 5])
    with pytest.raises(DataError, match="3 features"):
        certifier.certify(np.zeros(4), 1)
    with pytest.raises(DataError, match="NaN"):
        certifier.certify(np.array([0.0, np.nan, 1.0]), 1)
    with pytest.raises(OptionError, match="flips"):
        certifier.certify(X[0], -1)
    with pytest.raises(OptionError, match="epsilon"):
        certifier.certify(X[0], 1, epsilon={5: 0.1})
    with pytest.raises(OptionError, match="radii"):
        certifier.certify(X[0], 1, epsilon={1: -0.1})
    with pytest.raises(OptionError, match="protected"):
        certifier.certify(X[0], 1, protected=[3])


def test_certificate_is_a_frozen_value_with_json(rng):
    X, y = small_data(rng)
    cert = certify(X, y, X[0] + 0.3, flips=1, protected=[0], epsilon={1: 0.1}, k_candidates=[3, 5, 7], folds=5)
    assert cert.status in ("certified", "unknown", "falsified") and isinstance(cert.status, Status)
    with pytest.raises(dataclasses.FrozenInstanceError):
        cert.status = Status.CERTIFIED
    payload = json.loads(json.dumps(cert.to_json()))
    assert {"status", "prediction", "k_possible", "min_flips_to_change", "counterexample", "seconds", "method"} <= set(payload)
    assert payload["epsilon"] == {"1": 0.1} and payload["protected"] == [0]


def test_certify_many_matches_single_calls_and_reports_progress(rng):
    X, y = small_data(rng)
    tests = X[:6] + 0.25
    certifier = KnnFairnessCertifier(X, y, k_candidates=[3, 5, 7], folds=5)
    seen = []
    many = certifier.certify_many(tests, 1, protected=[0], progress=seen.append)
    assert seen == list(range(1, 7))
    single = [certifier.certify(x, 1, protected=[0]) for x in tests]
    assert [c.status for c in many] == [c.status for c in single]
    assert [c.status for c in certify_many(X, y, tests, flips=1, protected=[0], k_candidates=[3, 5, 7], folds=5)] == \
        [c.status for c in single]


def test_certify_many_fans_out_through_assay_run(rng):
    pytest.importorskip("assay.run")
    X, y = small_data(rng, rows=30)
    tests = X[:4] + 0.25
    certifier = KnnFairnessCertifier(X, y, k_candidates=[3, 5], folds=5)
    fanned = certifier.certify_many(tests, 1, workers=2)
    assert [c.status for c in fanned] == [c.status for c in certifier.certify_many(tests, 1)]


def test_restrictions_shape_the_counterexamples(rng):
    """Counterexamples respect ``flip_group`` and ``direction``; verdicts match ``ground_truth`` under the same restrictions."""
    X, y = small_data(rng)
    tests = X + 0.2
    group = X[:, 0] == 1
    restricted = {
        "group": (KnnFairnessCertifier(X, y, k_candidates=[3, 5], folds=5, flip_group={0: 1.0}), dict(flippable=group)),
        "directed": (KnnFairnessCertifier(X, y, k_candidates=[3, 5], folds=5, direction=(1, 0)), dict(direction=(1, 0))),
    }
    unrestricted = KnnFairnessCertifier(X, y, k_candidates=[3, 5], folds=5)
    found = {name: 0 for name in restricted}
    for name, (certifier, options) in restricted.items():
        truths = knn.ground_truth(X, y, tests, flips=2, k_candidates=[3, 5], folds=5, **options)
        for x, truth in zip(tests, truths):
            cert = certifier.certify(x, 2)
            assert cert.method == "exact" and cert.status == (Status.CERTIFIED if truth.fair else Status.FALSIFIED)
            if cert.counterexample is not None:
                found[name] += 1
                ce = cert.counterexample
                if name == "group":
                    assert all(group[r] for r in ce.flipped_rows)
                else:
                    assert all(y[r] == 1 and b == 0 for r, b in zip(ce.flipped_rows, ce.new_labels))
                flipped = y.copy()
                flipped[list(ce.flipped_rows)] = ce.new_labels
                assert knn.knn_decision(X, flipped, x, k_candidates=[3, 5], folds=5) == (ce.k, ce.decision)
            # fewer kinds of flips can only help certification
            assert not (unrestricted.certify(x, 2).certified and not cert.certified)
    assert found["group"] > 0 and found["directed"] > 0, found  # both restricted searches produced counterexamples


@pytest.mark.parametrize("seed, ks", [(104, [2, 6, 10]), (127, [2, 5, 7])])
def test_shared_budget_only_removes_doubt(seed, ks):
    """The bounds method's joint learning/prediction budget certifies a superset of the separate check, soundly.

    On these data the separate check certifies some inputs and the shared one certifies more, some
    of them close to unfair (a bound on the shared budget that counts one flip too few certifies an
    unfair input here); every certificate is checked against ``ground_truth``.
    """
    X, y = small_data(np.random.default_rng(seed), rows=60)
    tests = X[:15] + 0.1
    certifier = KnnFairnessCertifier(X, y, k_candidates=ks, folds=5, enumeration_limit=0)
    separate_certified = shared_only = 0
    for flips in (1, 2):
        truths = knn.ground_truth(X, y, tests, flips=flips, k_candidates=ks, folds=5)
        for x, truth in zip(tests, truths):
            separate = certifier.certify(x, flips, falsify=False, shared_budget=False)
            shared = certifier.certify(x, flips, falsify=False)
            assert separate.method == shared.method == "bounds"
            assert not separate.certified or shared.certified
            assert not shared.certified or truth.fair, f"certified but unfair: {x.tolist()} with {flips} flips"
            separate_certified += separate.certified
            shared_only += shared.certified and not separate.certified
    assert separate_certified > 0 and shared_only > 0, (separate_certified, shared_only)


def test_largest_certified_flips_function(rng):
    X, y = small_data(rng)
    n = largest_certified_flips(X, y, X[3] + 0.1, k_candidates=[3, 5], folds=5, max_flips=4)
    assert -1 <= n <= 4
