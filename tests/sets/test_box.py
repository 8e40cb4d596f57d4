"""Box: construction, validation messages, geometry and sampling."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from assay.errors import DataError, SpecError
from assay.sets import Box


def test_accepts_lists_numpy_and_torch_and_stores_float64_copies():
    source = np.array([0.0, 1.0], dtype=np.float32)
    for lower in ([0.0, 1.0], source, torch.tensor([0.0, 1.0], dtype=torch.float32)):
        box = Box(lower, [2.0, 3.0])
        assert box.lower.dtype == torch.float64 and box.upper.dtype == torch.float64
    box = Box(source, np.array([2.0, 3.0]))
    source[0] = -5.0  # editing the caller's array afterwards must not change the box
    assert box.lower.tolist() == [0.0, 1.0]
    tensor = torch.zeros(2, requires_grad=True)
    assert not Box(tensor, tensor + 1).lower.requires_grad


def test_geometry_of_an_image_shaped_box():
    box = Box(torch.zeros(2, 3, 4), torch.full((2, 3, 4), 2.0))
    assert box.shape == (2, 3, 4) and box.dim == 24
    assert torch.equal(box.center, torch.ones(2, 3, 4, dtype=torch.float64))
    assert torch.equal(box.width, torch.full((2, 3, 4), 2.0, dtype=torch.float64))
    assert torch.equal(box.radius, torch.ones(2, 3, 4, dtype=torch.float64))
    assert box.to_json()["shape"] == [2, 3, 4] and len(box.to_json()["lower"]) == 2
    with pytest.raises(dataclasses.FrozenInstanceError):
        box.lower = torch.zeros(2, 3, 4)


@pytest.mark.parametrize("lower, upper, error, message", [
    ([0.0, float("nan")], [1.0, 1.0], DataError, "lower bound of element 1 is NaN"),
    ([0.0], [float("nan")], DataError, "upper bound of element 0 is NaN"),
    ([0.0], [1.0, 2.0], SpecError, r"one shape; got \(1,\) and \(2,\)"),
    ([0.0, 2.0], [1.0, 1.0], SpecError, "element 1 has lower bound 2.0 above its upper bound 1.0"),
    ([[0.0, 0.0], [3.0, 0.0]], [[1.0, 1.0], [1.0, 1.0]], SpecError, r"element 2 \(index \(1, 0\)\)"),
    (["a"], [1.0], DataError, "must be numbers"),
])
def test_invalid_bounds_say_what_to_fix(lower, upper, error, message):
    with pytest.raises(error, match=message):
        Box(lower, upper)


def test_contains_single_points_batches_and_tolerance():
    box = Box([0.0, -1.0], [1.0, 1.0])
    assert box.contains([0.5, 0.0]) is True and box.contains([1.0, -1.0]) is True  # closed
    assert box.contains([1.5, 0.0]) is False
    assert box.contains([1.0 + 1e-9, 0.0], tol=1e-8) is True
    batch = torch.tensor([[0.5, 0.0], [2.0, 0.0], [0.0, 1.0]])
    assert box.contains(batch).tolist() == [True, False, True]
    with pytest.raises(DataError, match=r"do not fit a box of shape \(2,\)"):
        box.contains([0.0, 0.0, 0.0])


def test_samples_are_inside_reproducible_and_cover_the_box():
    box = Box(torch.tensor([[0.0, -1.0], [5.0, 5.0]]), torch.tensor([[1.0, 1.0], [5.0, 6.0]]))
    points = box.sample(2000, np.random.default_rng(3))
    assert points.shape == (2000, 2, 2) and points.dtype == torch.float64
    assert box.contains(points).all()
    assert torch.equal(points, box.sample(2000, np.random.default_rng(3)))
    assert (points[:, 1, 0] == 5.0).all()  # a zero-width element stays fixed
    assert points[:, 0, 1].min() < -0.9 and points[:, 0, 1].max() > 0.9
    assert box.sample(0, np.random.default_rng(0)).shape == (0, 2, 2)
    with pytest.raises(SpecError, match="unbounded box"):
        Box([0.0], [float("inf")]).sample(3, np.random.default_rng(0))
    with pytest.raises(SpecError, match="≥ 0"):
        box.sample(-1, np.random.default_rng(0))


def test_around_builds_clipped_linf_balls():
    box = Box.around([0.5, 0.95], 0.1, lower=0.0, upper=1.0)
    assert box.lower.tolist() == pytest.approx([0.4, 0.85]) and box.upper.tolist() == pytest.approx([0.6, 1.0])
    per_element = Box.around([0.0, 0.0], [0.1, 0.2])
    assert per_element.upper.tolist() == pytest.approx([0.1, 0.2])
    assert Box.around(torch.zeros(2, 2), 0.0).width.sum() == 0
    with pytest.raises(SpecError, match="epsilon must be ≥ 0"):
        Box.around([0.0], -0.1)
    with pytest.raises(SpecError, match="outside the domain"):
        Box.around([2.0], 0.5, lower=0.0, upper=1.0)


def test_split_covers_the_box_and_checks_its_arguments():
    box = Box(torch.zeros(2, 2), torch.ones(2, 2))
    left, right = box.split(3)
    assert left.upper[1, 1] == 0.5 == right.lower[1, 1]
    assert torch.equal(left.lower, box.lower) and torch.equal(right.upper, box.upper)
    low, high = box.split(0, at=0.25)
    assert low.upper[0, 0] == 0.25 == high.lower[0, 0]
    points = box.sample(500, np.random.default_rng(0))
    assert (left.contains(points) | right.contains(points)).all()
    with pytest.raises(SpecError, match="the box has 4 elements"):
        box.split(4)
    with pytest.raises(SpecError, match="outside element 0's range"):
        box.split(0, at=2.0)


def test_intersect_and_reshape():
    a, b = Box([0.0, 0.0], [2.0, 2.0]), Box([1.0, -1.0], [3.0, 1.0])
    both = a.intersect(b)
    assert both.lower.tolist() == [1.0, 0.0] and both.upper.tolist() == [2.0, 1.0]
    with pytest.raises(SpecError, match="do not intersect: their ranges of element 1"):
        a.intersect(Box([0.0, 5.0], [1.0, 6.0]))
    with pytest.raises(SpecError, match="shapes"):
        a.intersect(Box([0.0], [1.0]))
    assert Box(torch.zeros(6), torch.ones(6)).reshape(2, 3).shape == (2, 3)
    assert Box(torch.zeros(6), torch.ones(6)).reshape((3, 2)).shape == (3, 2)
    with pytest.raises(SpecError, match="cannot reshape"):
        Box(torch.zeros(6), torch.ones(6)).reshape(4)
