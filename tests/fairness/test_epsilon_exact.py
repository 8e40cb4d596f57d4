"""ε-fairness against the exact decision regions of the ε-box (1-D segments and 2-D boxes).

The certifier promises that ``certified`` holds for *every* point of the box ``|x'_c − x_c| ≤ ε_c``
(and every protected value, every flip set of the budget, K re-chosen by cross-validation). A
sampled box can only show unfairness, so here the box is enumerated exactly:
:func:`tests.fairness.reference.box_faces` visits one point on every face of the arrangement of
the bisectors ``d_i = d_j`` inside the box (breakpoints on a segment; vertices, edges and cells of
a 2-D box), ties at breakpoints included (ties go to the smaller row index). The K that
cross-validation chooses does not depend on the input, so for each flip set the decision over the
box is the vote of each distinct neighbour set, for that flip set's K.

Data are on a dyadic grid (multiples of 1/4, inputs and radii multiples of 1/8), so the learner's
float64 distances are exact and every breakpoint the enumeration visits is a float input the
learner can be run on; the truth is computed in exact rational arithmetic all the same.

Each case must contain inputs that are fair at ``x`` (and its protected values) but unfair inside
the box — a certifier that ignores ε certifies them — and inputs fair over the whole box, of which
the number left ``unknown`` is reported.
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction

import numpy as np
import pytest

from assay.fairness._knn_predict import identical_row_ranks, membership_keys
from assay.fairness.knn import KnnFairnessCertifier, Status, ground_truth, knn_decision
from tests.fairness.problems import report_lines
from tests.fairness.reference import Reference, box_orders, fraction


@dataclass(frozen=True)
class Case:
    name: str
    seed: int
    rows: int
    columns: int
    protected: tuple[int, ...]
    free: tuple[int, ...]  # the ε columns
    radii: tuple[float, ...]
    n_classes: int
    ks: tuple[int, ...]
    folds: int
    budgets: tuple[int, ...]
    inputs: int


CASES = [
    Case("1-D line", 11, 16, 1, (), (0,), (0.25, 0.375, 0.5, 0.75), 2, (3, 5), 4, (0, 1, 2), 18),
    Case("1-D line, 3 labels", 12, 15, 1, (), (0,), (0.25, 0.5, 0.625), 3, (2, 4, 5), 3, (0, 1), 14),
    Case("segment, protected column", 22, 16, 2, (0,), (1,), (0.25, 0.375, 0.5), 2, (3, 5), 4, (0, 1), 14),
    Case("2-D box", 14, 14, 2, (), (0, 1), (0.25, 0.375, 0.5), 2, (3, 5), 4, (0, 1), 12),
    Case("2-D box, protected column", 15, 14, 3, (0,), (1, 2), (0.25, 0.375), 2, (3, 5), 4, (0, 1), 8),
]


def make_data(case: Case):
    rng = np.random.default_rng(case.seed)
    X = rng.integers(0, 24, size=(case.rows, case.columns)) / 4.0
    tests = rng.integers(0, 48, size=(case.inputs, case.columns)) / 8.0
    for c in case.protected:
        X[:, c] = rng.integers(0, 2, case.rows)
        tests[:, c] = rng.integers(0, 2, case.inputs)
    free = list(case.free)
    score = np.sin(1.3 * X[:, free]).sum(axis=1) + rng.normal(0, 0.5, case.rows)
    if case.protected:
        score += 0.8 * X[:, case.protected[0]]
    y = np.digitize(score, np.quantile(score, np.linspace(0, 1, case.n_classes + 1)[1:-1]))
    radii = rng.choice(case.radii, size=case.inputs)
    return X, y.astype(int), tests, radii


@pytest.fixture(scope="module")
def epsilon_tally(request):
    counts: dict[str, dict[str, int]] = {}
    yield counts
    lines = ["", "knn ε-fairness against exact decision regions: fair over the box but left unknown (per method)"]
    for key, c in sorted(counts.items()):
        lines.append(f"  {key}: {c['box_fair_unknown']} of {c['box_fair']} box-fair inputs unknown "
                     f"({c['box_fair_certified']} certified); {c['only_x_fair']} fair at x only, "
                     f"{c['falsified']} falsified of {c['inputs']}")
    report_lines(request, lines)


_FACES: dict[tuple, list] = {}


def point_faces(case: Case, reference: Reference, t: int, x, r) -> list[tuple[list[Fraction], dict[tuple, list[Fraction]]]]:
    """Per protected point of input ``t``: the point and every neighbour signature in its box (cached per module)."""
    key = (case.name, t, float(r))
    if key not in _FACES:
        radius = {c: Fraction(float(r)) for c in case.free} if r else {}
        _FACES[key] = [(point, box_orders(reference, point, radius)) for point in reference.protected_points(x, case.protected)]
    return _FACES[key]


def merged(per_point) -> dict[tuple, list[Fraction]]:
    out: dict[tuple, list[Fraction]] = {}
    for _, signatures in per_point:
        for signature, p in signatures.items():
            out.setdefault(signature, p)
    return out


def unfair_witness(reference: Reference, signatures, budget: int, p: int):
    """A (flip set, K, point) changing the decision somewhere on the given signatures, or None."""
    for rows, new, labels, k in reference.scenarios(budget):
        a = reference.ks.index(k)
        for signature, point in signatures.items():
            if reference.decide(signature[a], labels, k) != p:
                return rows, new, k, point
    return None


def check_counterexample(case: Case, X, y, x, radius, cert, reference: Reference) -> None:
    """Inside the box (and the allowed protected values), within budget, confirmed by the plain learner."""
    ce = cert.counterexample
    assert ce is not None and len(ce.flipped_rows) <= cert.flips
    point = np.array(ce.input)
    for c in range(X.shape[1]):
        if c in case.protected:
            assert point[c] in set(X[:, c]) | {x[c]}
        elif c in radius:
            assert abs(point[c] - x[c]) <= radius[c], f"counterexample outside the box in column {c}"
        else:
            assert point[c] == x[c]
    labels = y.copy()
    for row, label in zip(ce.flipped_rows, ce.new_labels):
        assert label != y[row]
        labels[row] = label
    k, decision = knn_decision(X, labels, point, k_candidates=list(case.ks), folds=case.folds)
    assert (k, decision) == (ce.k, ce.decision) and decision != cert.prediction
    # the same scenario in exact arithmetic: the box truly holds an unfair point
    assert reference.chosen_k(labels) == k
    assert reference.decide(reference.order([fraction(v) for v in point]), labels, k) == decision


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_epsilon_certificates_against_exact_box_regions(case: Case, epsilon_tally):
    X, y, tests, radii = make_data(case)
    ks = list(case.ks)
    reference = Reference(X, y, ks, case.folds)
    k0 = reference.k_default()
    assert knn_decision(X, y, X[0], k_candidates=ks, folds=case.folds)[0] == k0  # the reference is the learner
    certifiers = {method: KnnFairnessCertifier(X, y, k_candidates=ks, folds=case.folds, enumeration_limit=limit)
                  for method, limit in (("exact", 2e8), ("bounds", 0))}
    seen = dict(only_x_fair=0, box_fair=0)
    for budget in case.budgets:
        # the reference at ε = 0 against the independent enumeration of assay
        truths = ground_truth(X, y, tests, flips=budget, protected=list(case.protected), k_candidates=ks, folds=case.folds)
        k_possible = reference.k_possible(budget)
        for t, (x, r, truth) in enumerate(zip(tests, radii, truths)):
            epsilon = {c: float(r) for c in case.free}
            p = reference.decide(reference.order(x), reference.y, k0)
            assert p == truth.prediction
            at_x = merged(point_faces(case, reference, t, x, 0))
            in_box = merged(point_faces(case, reference, t, x, r))
            x_fair = unfair_witness(reference, at_x, budget, p) is None
            assert x_fair == truth.fair
            box_fair = unfair_witness(reference, in_box, budget, p) is None
            assert not box_fair or x_fair
            seen["only_x_fair"] += x_fair and not box_fair
            seen["box_fair"] += box_fair
            # the fewest prediction flips per K over the whole box (None: no flips change the vote)
            fewest = []
            for a, k in enumerate(ks):
                options = [reference.min_flips(signature[a], k, p) for signature in in_box]
                options = [m for m in options if m is not None]
                fewest.append(min(options) if options else None)
            for method, certifier in certifiers.items():
                cert = certifier.certify(x, budget, protected=list(case.protected), epsilon=epsilon)
                counts = epsilon_tally.setdefault(f"{case.name}, {method}", dict(
                    inputs=0, box_fair=0, box_fair_unknown=0, box_fair_certified=0, only_x_fair=0, falsified=0))
                counts["inputs"] += 1
                counts["box_fair"] += box_fair
                counts["box_fair_unknown"] += box_fair and cert.status == Status.UNKNOWN
                counts["box_fair_certified"] += box_fair and cert.certified
                counts["only_x_fair"] += x_fair and not box_fair
                counts["falsified"] += cert.status == Status.FALSIFIED
                where = f"{case.name}: x={x.tolist()} ε={r} flips={budget} method={method}"
                assert cert.prediction == p, where
                assert cert.method == method or budget == 0, where
                if cert.certified:
                    assert box_fair, f"certified but unfair inside the box: {where}, " \
                                     f"witness {unfair_witness(reference, in_box, budget, p)}"
                if cert.status == Status.FALSIFIED:
                    assert not box_fair, where
                    check_counterexample(case, X, y, x, epsilon, cert, reference)
                # K is chosen without looking at x: the ε-box does not change which K are possible
                if method == "exact":
                    assert set(cert.k_possible) == k_possible, where
                else:
                    assert set(cert.k_possible) >= k_possible, where
                # lower bounds on the prediction flips, over the whole box
                for a, k in enumerate(ks):
                    if fewest[a] is not None:
                        assert cert.min_flips_to_change[a] is not None and cert.min_flips_to_change[a] <= fewest[a], \
                            f"{where} K={k}: {cert.min_flips_to_change[a]} > {fewest[a]} flips found in the box"
    # the case must be able to tell a certifier that ignores ε, and one that never certifies with ε
    assert seen["only_x_fair"] > 0 and seen["box_fair"] > 0, seen
    assert epsilon_tally[f"{case.name}, exact"]["box_fair_certified"] > 0


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_box_membership_against_exact_box_regions(case: Case):
    """The prediction step's classification of rows against a box, face by face.

    For every K, the rows it calls *certain* must be among the K nearest at every point of the box,
    and every row among the K nearest at some point must be *possible* (exact at ε = 0).
    """
    X, y, tests, radii = make_data(case)
    reference = Reference(X, y, list(case.ks), case.folds)
    before, after = identical_row_ranks(X)
    kmax = max(case.ks)
    for t, (x, r) in enumerate(zip(tests, radii)):
        for radius_value in (0, r):
            radius = np.zeros(X.shape[1])
            radius[list(case.free)] = radius_value
            for point, signatures in point_faces(case, reference, t, x, radius_value):
                key_certain, key_possible = membership_keys(np.array([float(v) for v in point]), radius, X, kmax, before, after)
                for a, k in enumerate(case.ks):
                    certain = set(np.flatnonzero(key_certain <= k).tolist())
                    possible = set(np.flatnonzero(key_possible <= k - 1).tolist())
                    where = f"{case.name}: point {[float(v) for v in point]} ε={radius_value} K={k}"
                    realised = set()
                    for signature in signatures:
                        assert certain <= set(signature[a]), f"{where}: certain rows missing from {signature[a]}"
                        realised |= set(signature[a])
                    assert realised <= possible, f"{where}: rows {sorted(realised - possible)} nearest somewhere, not possible"
                    if radius_value == 0:
                        assert certain == possible == realised, where
