"""Boxes, polytopes, patch regions and output specifications."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from assay.errors import DataError, SpecError
from assay.sets import (
    Box, HPolytope, all_of, all_patch_regions, any_of, argmax_is, mask_region, negation_closure, output_at_least,
    patch_region, targeted_robustness,
)


def test_box_basics_and_errors():
    box = Box([0.0, -1.0], [1.0, 1.0])
    assert box.dim == 2 and torch.equal(box.center, torch.tensor([0.5, 0.0], dtype=torch.float64))
    assert box.contains([0.5, 0.0]) and not box.contains([1.5, 0.0])
    points = box.sample(1000, np.random.default_rng(0))
    assert box.contains(points).all()
    left, right = box.split(0)
    assert left.upper[0] == 0.5 == right.lower[0]
    assert Box.around([0.5, 0.5], 0.2, lower=0.0, upper=0.6).upper.tolist() == [0.6, 0.6]
    with pytest.raises(SpecError, match="element 1"):
        Box([0.0, 2.0], [1.0, 1.0])
    with pytest.raises(DataError, match="NaN"):
        Box([float("nan")], [1.0])
    with pytest.raises(SpecError, match="one shape"):
        Box([0.0], [1.0, 2.0])
    with pytest.raises(SpecError, match="do not intersect"):
        Box([0.0], [1.0]).intersect(Box([2.0], [3.0]))


def test_polytope_bounding_box_contains_the_polytope():
    rng = np.random.default_rng(1)
    A = rng.normal(size=(12, 3))
    b = np.abs(rng.normal(size=12)) + 0.5  # contains the origin
    polytope = HPolytope(A, b)
    box = polytope.bounding_box()
    # Random points of the polytope (rejection sampling in its box) stay inside the box.
    candidates = torch.as_tensor(rng.uniform(box.lower.numpy() - 1, box.upper.numpy() + 1, size=(20000, 3)))
    inside = candidates[polytope.contains(candidates)]
    assert inside.shape[0] > 0 and box.contains(inside).all()
    assert HPolytope.from_box(Box([0, 0], [1, 2])).bounding_box().contains(torch.tensor([[1.0, 2.0]])).all()
    with pytest.raises(SpecError, match="empty"):
        HPolytope([[1.0], [-1.0]], [0.0, -1.0]).bounding_box()
    with pytest.raises(SpecError, match="unbounded"):
        HPolytope([[1.0, 0.0]], [1.0]).bounding_box()


def test_patch_regions_fix_every_pixel_outside_the_patch():
    image = torch.rand(3, 6, 6, dtype=torch.float64)
    region = patch_region(image, 1, 2, 2, 3)
    varying = region.upper > region.lower
    assert varying[:, 1:3, 2:5].all() and varying.sum() == 3 * 2 * 3
    assert torch.equal(region.lower[~varying], image[~varying])
    assert len(list(all_patch_regions(image, 2, stride=2))) == 9
    small = mask_region(image[0], torch.eye(6, dtype=torch.bool), epsilon=0.1)
    assert (small.width <= 0.2 + 1e-12).all()
    with pytest.raises(SpecError, match="leave the 6×6 image"):
        patch_region(image, 5, 5, 2, 2)


def test_output_spec_builders():
    spec = argmax_is(1, 3)
    assert spec.contains([0.0, 2.0, 1.0]) and not spec.contains([3.0, 2.0, 1.0])
    assert targeted_robustness(0, 2, 3).contains([1.0, 5.0, 0.5])
    either = any_of(output_at_least(0, 1, 3), output_at_least(2, 1, 3))
    assert either.contains([0.0, 1.0, 2.0]) and not either.contains([0.0, 1.0, 0.5])
    C, d, index = either.rows()
    assert C.shape == (2, 3) and index.tolist() == [0, 1]
    both = all_of(either, output_at_least(0, 2, 3))
    assert len(both.conjunctions) == 2 and all(c.C.shape[0] == 2 for c in both.conjunctions)
    complement = negation_closure(argmax_is(0, 3))
    y = torch.randn(1000, 3, dtype=torch.float64)
    assert torch.equal(complement.contains(y), ~argmax_is(0, 3).contains(y) | (y[:, 0:1] == y[:, 1:]).any(1))
    with pytest.raises(SpecError, match="output index"):
        argmax_is(3, 3)
