"""Soundness of the certificates against exhaustive enumeration (the ground truth written independently).

* nothing certified is shown unfair by enumerating every flip set (and protected value);
* every "falsified" carries a counterexample that the plain learner, re-run from scratch, confirms;
* without ε, ``method="exact"`` verdicts equal the ground truth;
* the number of truly fair inputs left "unknown" is reported at the end of the module.
"""

from __future__ import annotations

import numpy as np
import pytest

from assay.fairness.knn import KnnFairnessCertifier, Status, down_sample, ground_truth, knn_decision
from tests.fairness.paper_reference import paper_k_set
from tests.fairness.problems import Problem, load_split, random_problem, report_lines
from tests.fairness.reference import Reference


@pytest.fixture(scope="module")
def tally(request):
    counts: dict[str, dict[str, int]] = {}
    yield counts
    lines = ["", "knn fairness soundness: truly fair inputs left unknown (per method)"]
    for method, c in sorted(counts.items()):
        lines.append(f"  {method}: {c['fair_unknown']} of {c['fair']} fair inputs unknown; {c['certified']} certified, "
                     f"{c['falsified']} falsified of {c['inputs']} inputs; unsound: {c['unsound']}")
    report_lines(request, lines)


def confirm(problem: Problem, certificate) -> None:
    """Re-run the plain learner (from scratch) on the counterexample's labels and input."""
    ce = certificate.counterexample
    assert ce is not None and len(ce.flipped_rows) <= certificate.flips
    if problem.down_sample:
        X, y, kept = down_sample(problem.X, problem.y, problem.class_weights)
    else:
        X, y, kept = problem.X, problem.y.copy(), np.arange(len(problem.y))
    y = y.copy()
    position = {int(row): i for i, row in enumerate(kept)}
    for row, label in zip(ce.flipped_rows, ce.new_labels):
        assert label != problem.y[row]
        if problem.flippable is not None:
            assert problem.flippable[row]
        if problem.direction is not None:
            assert (problem.y[row], label) == problem.direction
        y[position[row]] = label
    k, decision = knn_decision(X, y, np.array(ce.input), k_candidates=problem.ks, folds=problem.folds,
                               class_weights=problem.class_weights)
    assert (k, decision) == (ce.k, ce.decision)
    assert decision != certificate.prediction


def check(problem: Problem, certifier, truths, tally, label, epsilon=None, exact_truth=True):
    counts = tally.setdefault(label, dict(inputs=0, fair=0, fair_unknown=0, certified=0, falsified=0, unsound=0))
    for x, truth in zip(problem.tests, truths):
        cert = certifier.certify(x, problem.flips, protected=problem.protected, epsilon=epsilon)
        counts["inputs"] += 1
        counts["fair"] += truth.fair
        counts["certified"] += cert.status == Status.CERTIFIED
        counts["falsified"] += cert.status == Status.FALSIFIED
        counts["fair_unknown"] += truth.fair and cert.status == Status.UNKNOWN
        assert cert.prediction == truth.prediction
        if cert.status == Status.CERTIFIED:
            counts["unsound"] += not truth.fair
            assert truth.fair, f"certified but unfair: {truth}"
        if cert.status == Status.FALSIFIED:
            if exact_truth:
                assert not truth.fair
            confirm(problem, cert)
            if epsilon:
                offset = np.abs(np.array(cert.counterexample.input) - np.asarray(x))
                allowed = np.zeros_like(offset)
                for c, r in epsilon.items():
                    allowed[c] = r
                movable = offset > allowed + 1e-12
                assert set(np.flatnonzero(movable)) <= set(problem.protected)
        if cert.method == "exact" and not epsilon and exact_truth:
            assert cert.status == (Status.CERTIFIED if truth.fair else Status.FALSIFIED)


def truth_for(problem: Problem, box_points=None):
    return ground_truth(problem.X, problem.y, problem.tests, flips=problem.flips, protected=problem.protected,
                        **problem.learner, **problem.restrictions, box_points=box_points)


@pytest.mark.parametrize("seed", range(6))
def test_random_problems_exact_and_bounds(seed, tally):
    rng = np.random.default_rng(1000 + seed)
    for _ in range(2):
        problem = random_problem(rng)
        truths = truth_for(problem)
        for limit, label in [(2e8, "exact (random)"), (0, "bounds (random)")]:
            certifier = KnnFairnessCertifier(problem.X, problem.y, **problem.learner, **problem.restrictions,
                                             enumeration_limit=limit)
            check(problem, certifier, truths, tally, label)


@pytest.mark.parametrize("seed", range(3))
def test_random_problems_epsilon(seed, tally):
    rng = np.random.default_rng(2000 + seed)
    problem = random_problem(rng)
    epsilon = {1: 0.2}
    boxes = []
    for x in problem.tests:
        points = []
        for combo_value in ([x[0]] if not problem.protected else sorted(set(problem.X[:, 0]) | {x[0]})):
            for step in np.linspace(-0.2, 0.2, 21):
                p = x.copy()
                p[0] = combo_value
                p[1] += step
                points.append(p)
        boxes.append(points)
    truths = truth_for(problem, box_points=boxes)  # a search of the box, not exact: unfair is proven, fair is not
    for limit, label in [(2e8, "exact + epsilon (random)"), (0, "bounds + epsilon (random)")]:
        certifier = KnnFairnessCertifier(problem.X, problem.y, **problem.learner, **problem.restrictions,
                                         enumeration_limit=limit)
        check(problem, certifier, truths, tally, label, epsilon=epsilon, exact_truth=False)


def test_largest_certified_flips_is_consistent(rng):
    for _ in range(3):
        problem = random_problem(rng)
        for limit in (2e8, 0):
            certifier = KnnFairnessCertifier(problem.X, problem.y, **problem.learner, **problem.restrictions,
                                             enumeration_limit=limit)
            for x in problem.tests[:3]:
                largest = certifier.largest_certified_flips(x, protected=problem.protected, max_flips=3)
                if largest >= 0:
                    assert certifier.certify(x, largest, protected=problem.protected, falsify=False).certified
                if largest < 3:
                    assert not certifier.certify(x, largest + 1, protected=problem.protected, falsify=False).certified


def test_validation_label_flips_matter():
    """The published bounds keep validation labels fixed: here they allow only K=5, yet one flip chooses K=10."""
    X = np.array([[-3.31, 3.34], [-2.58, 1.27], [-2.71, 2.99], [-3.22, 1.0], [-3.37, 2.77], [-3.4, -0.05],
                  [-4.42, 1.39], [-3.6, -0.68], [-2.88, -0.62], [-2.59, 0.35], [-2.75, 1.34], [-3.07, 3.7],
                  [-3.46, 0.38], [-3.37, 0.42], [-4.7, 2.2], [-3.83, 1.27], [-2.52, 0.72], [-3.57, 0.37], [-2.64, 2.79]])
    y = np.array([1, 0, 1, 0, 1, 0, 0, 0, 0, 0, 0, 1, 0, 0, 1, 0, 0, 0, 1])
    x = np.array([-3.6, 2.3])
    assert paper_k_set(X, y, [5, 10], 4, 1) == [5]
    truth = ground_truth(X, y, x, flips=1, k_candidates=[5, 10], folds=4)[0]
    assert not truth.fair and truth.k == 10
    for limit in (2e8, 0):
        certifier = KnnFairnessCertifier(X, y, k_candidates=[5, 10], folds=4, enumeration_limit=limit)
        cert = certifier.certify(x, 1)
        assert 10 in cert.k_possible
        assert cert.min_flips_to_change[0] == 2  # with K = 5 alone, one flip cannot change the vote
        assert cert.status == Status.FALSIFIED and cert.counterexample.k == 10


@pytest.mark.data
def test_salary_against_enumeration(data_dir, tally):
    X, y, X_test, _ = load_split(data_dir, "salary")
    for flips in (1, 2):
        for protected in ([], [0]):
            problem = Problem(X=X, y=y, tests=X_test, ks=[7, 8, 9, 10, 11], folds=10, flips=flips, protected=protected)
            truths = truth_for(problem)
            if flips == 1:  # Table 2 of the paper (ground truth): 50.0 % and 33.3 % fair
                assert sum(t.fair for t in truths) == (3 if not protected else 2)
            for limit, label in [(2e8, "exact (salary)"), (0, "bounds (salary)")]:
                certifier = KnnFairnessCertifier(X, y, k_candidates=problem.ks, enumeration_limit=limit)
                check(problem, certifier, truths, tally, label)


@pytest.mark.data
def test_student_subset_against_enumeration(data_dir, tally):
    X, y, X_test, _ = load_split(data_dir, "student")
    problem = Problem(X=X[:150], y=y[:150], tests=X_test[:20], ks=[30, 31, 32, 33, 34], folds=10, flips=1, protected=[1])
    truths = truth_for(problem)
    for limit, label in [(2e8, "exact (student subset)"), (0, "bounds (student subset)")]:
        certifier = KnnFairnessCertifier(problem.X, problem.y, k_candidates=problem.ks, enumeration_limit=limit)
        check(problem, certifier, truths, tally, label)


@pytest.mark.data
def test_german_subset_against_enumeration(data_dir, tally):
    """Medium data (German, first 70 rows, 2 flips, with and without protected column 6), both methods
    against ``ground_truth`` (every flip set enumerated independently of the certifier), and each
    certificate's ``min_flips_to_change`` against a brute force over the neighbours' label counts."""
    X, y, X_test, _ = load_split(data_dir, "german")
    ks = [10, 15, 20, 25]
    reference = Reference(X[:70], y[:70], ks, 10, arithmetic="float")
    fair = []
    for protected in ([], [6]):
        problem = Problem(X=X[:70], y=y[:70], tests=X_test[:20], ks=ks, folds=10, flips=2, protected=protected)
        truths = truth_for(problem)
        fair += [t.fair for t in truths]
        fewest = []
        for x, truth in zip(problem.tests, truths):
            points = [reference.order(point) for point in reference.protected_points(x, protected)]
            per_k = []
            for k in ks:
                options = [m for m in (reference.min_flips(order, k, truth.prediction) for order in points) if m is not None]
                per_k.append(min(options) if options else None)
            fewest.append(per_k)
        for limit, method in [(1e12, "exact"), (0, "bounds")]:
            certifier = KnnFairnessCertifier(problem.X, problem.y, k_candidates=ks, enumeration_limit=limit)
            check(problem, certifier, truths, tally, f"{method} (german subset, 2 flips)")
            for x, per_k in zip(problem.tests, fewest):
                cert = certifier.certify(x, 2, protected=protected, falsify=False)
                assert cert.method == method
                assert list(cert.min_flips_to_change) == per_k
    assert 0 < sum(fair) < len(fair)  # both verdicts occur
