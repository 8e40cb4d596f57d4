"""HPolytope: membership and sound bounding boxes."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from assay.errors import DataError, SpecError
from assay.sets import Box, HPolytope


def triangle() -> HPolytope:
    """x ≥ 0, y ≥ 0, x + y ≤ 1."""
    return HPolytope([[-1.0, 0.0], [0.0, -1.0], [1.0, 1.0]], [0.0, 0.0, 1.0])


def test_contains_points_and_batches():
    polytope = triangle()
    assert polytope.contains([0.2, 0.2]) is True and polytope.contains([0.8, 0.8]) is False
    assert polytope.contains(torch.tensor([[0.0, 1.0], [1.0, 0.1]])).tolist() == [True, False]
    assert polytope.contains([0.5, 0.5 + 1e-9], tol=1e-8) is True
    with pytest.raises(DataError, match="over 2 inputs"):
        polytope.contains([0.0, 0.0, 0.0])


def test_bounding_box_is_sound_and_tight_up_to_the_margin():
    box = triangle().bounding_box()
    assert (box.lower <= 0).all() and (box.upper >= 1).all()
    assert (box.lower > -1e-6).all() and (box.upper < 1 + 1e-6).all()


def test_bounding_box_contains_sampled_points_of_a_random_polytope():
    rng = np.random.default_rng(1)
    A = rng.normal(size=(12, 3))
    b = np.abs(rng.normal(size=12)) + 0.5  # the origin is inside
    polytope = HPolytope(A, b)
    box = polytope.bounding_box()
    candidates = torch.as_tensor(rng.uniform(box.lower.numpy() - 1, box.upper.numpy() + 1, size=(20000, 3)))
    inside = candidates[polytope.contains(candidates)]
    assert inside.shape[0] > 100 and box.contains(inside).all()
    # Tight: along every axis some sampled point comes close to each face of the box.
    assert ((inside.amin(0) - box.lower) < 0.2 * box.width).all()


def test_from_box_round_trips_through_the_bounding_box():
    box = Box([0.0, -2.0], [1.0, 2.0])
    polytope = HPolytope.from_box(box)
    assert polytope.A.shape == (4, 2) and polytope.num_constraints == 4 and polytope.dim == 2
    again = polytope.bounding_box()
    assert (again.lower <= box.lower).all() and (again.upper >= box.upper).all()
    assert torch.allclose(again.lower, box.lower, atol=1e-6) and torch.allclose(again.upper, box.upper, atol=1e-6)
    with pytest.raises(SpecError, match="finite bounds"):
        HPolytope.from_box(Box([0.0], [float("inf")]))


def test_empty_unbounded_and_malformed_polytopes_are_explained():
    with pytest.raises(SpecError, match="empty"):
        HPolytope([[1.0], [-1.0]], [0.0, -1.0]).bounding_box()
    with pytest.raises(SpecError, match="input 0 is not bounded below"):
        HPolytope([[1.0, 0.0], [0.0, 1.0], [0.0, -1.0]], [1.0, 1.0, 1.0]).bounding_box()
    with pytest.raises(SpecError, match=r"A of shape \(m, n ≥ 1\)"):
        HPolytope([[1.0, 0.0]], [1.0, 2.0])
    with pytest.raises(DataError, match="finite"):
        HPolytope([[float("nan")]], [1.0])
