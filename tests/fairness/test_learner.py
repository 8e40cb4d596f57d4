"""The learner's definition: folds, neighbours (ties by index), votes (ties by label), exact choice of K."""

from __future__ import annotations

import numpy as np
import pytest
from sklearn.model_selection import KFold

from assay.fairness import _knn_kernels as kernels
from assay.fairness import _knn_learner as learner
from assay.fairness._knn_enumerate import _chosen_k
from assay.fairness.knn import down_sample, knn_decision


@pytest.mark.parametrize("n, folds", [(46, 10), (584, 10), (23, 4), (10, 10)])
def test_folds_match_sklearn_kfold(n, folds):
    ours = learner.fold_ranges(n, folds)
    theirs = [(int(v[0]), int(v[-1]) + 1) for _, v in KFold(folds).split(np.zeros(n))]
    assert ours == theirs


def test_serial_and_parallel_distances_are_bit_identical(rng):
    A = rng.normal(size=(300, 7))
    B = rng.normal(size=(400, 7))
    out_parallel = np.empty((300, 400))
    kernels._sqdist_parallel(A, B, out_parallel)
    out_serial = np.empty((300, 400))
    kernels._sqdist_serial(A, B, out_serial)
    assert np.array_equal(out_parallel, out_serial)
    assert np.array_equal(kernels.squared_distances(A[3], B)[0], out_serial[3])
    assert np.allclose(out_serial, ((A[:, None, :] - B[None]) ** 2).sum(-1))


def test_cv_neighbours_match_a_full_lexicographic_sort(rng):
    X = rng.integers(0, 3, size=(120, 3)).astype(float)  # many exact ties
    assert np.array_equal(learner.cv_neighbours(X, 10, 25), learner.brute_cv_neighbours(X, 10, 25))
    assert np.array_equal(learner.cv_neighbours(X, 7, 60, block=16), learner.brute_cv_neighbours(X, 7, 60))


def test_distance_ties_go_to_the_smaller_index_and_vote_ties_to_the_smaller_label():
    X = np.array([[1.0], [-1.0], [1.0], [-1.0], [3.0]])
    y = np.array([1, 0, 0, 1, 1])
    assert list(learner.nearest(X, np.array([0.0]), 4)) == [0, 1, 2, 3]
    assert learner.predict(X, y, np.array([0.0]), 2, 2) == 0  # labels {1, 0}: tie → 0
    assert learner.predict(X, y, np.array([0.0]), 3, 2) == 0  # 1, 0, 0
    assert learner.predict(X, np.array([2, 1, 0, 0, 0]), np.array([0.0]), 2, 3) == 1


def test_k_choice_is_exact_and_ties_go_to_the_first_listed():
    # fold errors 1/3 + 1/6 and 0 + 3/6 are equal as rationals; float sums may differ in the last bit
    A = np.array([[1, 1], [0, 3]])
    W = np.array([3, 6])
    assert learner.select_k(A, W) == 0
    assert learner.select_k(A[::-1], W) == 0
    assert learner.select_k(np.array([[2, 1], [1, 1]]), W) == 1


def test_down_sampling_keeps_every_wth_row_per_label_in_file_order():
    X = np.arange(10.0)[:, None]
    y = np.array([0, 0, 1, 0, 1, 0, 0, 1, 0, 0])
    _, kept_y, kept = down_sample(X, y, {0: 3, 1: 1})
    zeros = np.flatnonzero(y == 0)
    assert list(kept) == sorted(list(zeros[::3]) + list(np.flatnonzero(y == 1)))
    assert list(kept_y) == list(y[kept])


def test_plain_learner_matches_an_independent_reference(rng):
    for _ in range(5):
        X = rng.integers(0, 4, size=(40, 3)).astype(float)
        y = rng.integers(0, 3, 40)
        ks = [1, 4, 5, 9]
        weights = {0: 2, 1: 1, 2: 3}
        X_, y_, settings = learner.check_settings(X, y, ks, 5, weights, "test")
        nbr = learner.cv_neighbours(X_, 5, 9)
        state = learner.plain_cv_state(nbr, y_, settings)
        reference = _chosen_k(learner.brute_cv_neighbours(X_, 5, 9), y_, ks, 5, np.array([2, 1, 3]), 3)
        assert ks[state.k_index] == reference
        k, vote = knn_decision(X, y, X[0] + 0.5, k_candidates=ks, folds=5, class_weights=weights)
        assert k == reference


@pytest.mark.data
def test_default_ks_on_the_authors_splits(data_dir):
    from tests.fairness.problems import load_split

    X, y, _, _ = load_split(data_dir, "salary")
    assert knn_decision(X, y, X[0], k_candidates=[7, 8, 9, 10, 11])[0] == 7
    X, y, _, _ = load_split(data_dir, "german")
    Xd, yd, _ = down_sample(X, y, {0: 2, 1: 1})
    assert len(yd) == 586
    assert knn_decision(Xd, yd, Xd[0], k_candidates=[190, 200, 210, 220, 230], class_weights={0: 2, 1: 1})[0] == 190
