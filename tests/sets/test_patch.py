"""Patch and mask regions of images."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from assay.errors import DataError, SpecError
from assay.sets import all_patch_regions, mask_region, patch_region


@pytest.fixture
def image() -> torch.Tensor:
    return torch.as_tensor(np.random.default_rng(5).uniform(size=(3, 6, 7)))


def test_patch_varies_every_channel_inside_and_fixes_every_pixel_outside(image):
    region = patch_region(image, 1, 2, 2, 3)
    assert region.shape == (3, 6, 7)
    inside = torch.zeros(3, 6, 7, dtype=torch.bool)
    inside[:, 1:3, 2:5] = True
    assert (region.lower[inside] == 0).all() and (region.upper[inside] == 1).all()
    assert torch.equal(region.lower[~inside], image[~inside]) and torch.equal(region.upper[~inside], image[~inside])
    assert region.contains(image)
    samples = region.sample(50, np.random.default_rng(0))
    assert torch.equal(samples[:, ~inside], image[~inside].expand(50, -1))


def test_epsilon_patches_are_clipped_to_the_pixel_range(image):
    region = patch_region(image, 0, 0, 6, 7, epsilon=0.1)
    assert torch.allclose(region.lower, (image - 0.1).clamp(min=0.0))
    assert torch.allclose(region.upper, (image + 0.1).clamp(max=1.0))
    grey = patch_region(image[0], 2, 2, 1, 1, lower=-1.0, upper=2.0)
    assert grey.shape == (6, 7) and grey.lower[2, 2] == -1.0 and grey.upper[2, 2] == 2.0


def test_mask_region_agrees_with_patch_region(image):
    mask = np.zeros((6, 7), dtype=bool)
    mask[3:5, 4:7] = True
    by_mask, by_patch = mask_region(image, mask, epsilon=0.05), patch_region(image, 3, 4, 2, 3, epsilon=0.05)
    assert torch.equal(by_mask.lower, by_patch.lower) and torch.equal(by_mask.upper, by_patch.upper)
    diagonal = mask_region(image[0], torch.eye(6, 7, dtype=torch.bool))
    assert int((diagonal.width > 0).sum()) == 6


def test_all_patch_regions_enumerates_the_grid(image):
    positions = [(top, left) for top, left, _ in all_patch_regions(image, 2, stride=2)]
    assert positions == [(top, left) for top in (0, 2, 4) for left in (0, 2, 4)]
    assert len(list(all_patch_regions(image, 3))) == 4 * 5
    top, left, region = next(iter(all_patch_regions(image, (2, 3), stride=3)))
    assert (top, left) == (0, 0) and int((region.width > 0).sum()) == 3 * 2 * 3
    assert len(list(all_patch_regions(image, (6, 7)))) == 1


@pytest.mark.parametrize("call, error, message", [
    (lambda im: patch_region(im, 5, 5, 2, 2), SpecError, r"leaves the 6×7 image; pick 0 ≤ top ≤ 4 and 0 ≤ left ≤ 5"),
    (lambda im: patch_region(im, -1, 0, 2, 2), SpecError, "leaves the 6×7 image"),
    (lambda im: patch_region(im, 0, 0, 0, 2), SpecError, "height ≥ 1"),
    (lambda im: patch_region(im, 0, 0, 7, 2), SpecError, "does not fit in the 6×7 image"),
    (lambda im: patch_region(im, 0, 0, 2.5, 2), SpecError, "height must be an integer"),
    (lambda im: patch_region(im, 0, 0, 2, 2, lower=1.0, upper=0.0), SpecError, "pixel range"),
    (lambda im: patch_region(im, 0, 0, 2, 2, epsilon=-0.1), SpecError, "epsilon must be ≥ 0"),
    (lambda im: patch_region(im + 2, 0, 0, 2, 2, epsilon=0.1), DataError, "outside the pixel range"),
    (lambda im: patch_region(im[None], 0, 0, 2, 2), DataError, r"\(C, H, W\) or \(H, W\)"),
    (lambda im: mask_region(im, np.ones((7, 6), dtype=bool)), SpecError, r"needs an \(H, W\) = \(6, 7\) mask"),
    (lambda im: all_patch_regions(im, 8), SpecError, "does not fit"),
    (lambda im: all_patch_regions(im, 2, stride=0), SpecError, "stride must be ≥ 1"),
])
def test_bad_patches_are_explained(image, call, error, message):
    with pytest.raises(error, match=message):
        call(image)


def test_nan_images_are_rejected(image):
    image[0, 0, 0] = float("nan")
    with pytest.raises(DataError, match="NaN"):
        patch_region(image, 1, 1, 1, 1)
