"""Image patch regions: some pixels range over an interval, all others keep their value."""

from __future__ import annotations

from collections.abc import Iterator

import torch

from assay.errors import SpecError
from assay.sets.box import Box, as_float64

__all__ = ["patch_region", "mask_region", "all_patch_regions"]


def mask_region(image, mask, lower: float = 0.0, upper: float = 1.0, epsilon: float | None = None) -> Box:
    """The box where the pixels of ``mask`` (H, W; bool) vary in every channel and the rest are fixed.

    Args:
        image: (C, H, W) or (H, W) pixel values.
        mask: (H, W) booleans: True for the pixels that may change.
        lower, upper: the valid pixel range.
        epsilon: None: masked pixels take any value in [lower, upper]; else image ± epsilon, clipped.
    """
    image = as_float64(image, "the image")
    mask = torch.as_tensor(mask, dtype=torch.bool)
    spatial = image.shape[-2:]
    if image.dim() not in (2, 3) or tuple(mask.shape) != tuple(spatial):
        raise SpecError(f"the mask has shape {tuple(mask.shape)}; the image {tuple(image.shape)} needs an (H, W) mask of {tuple(spatial)}")
    if lower > upper:
        raise SpecError(f"the pixel range [{lower}, {upper}] is empty")
    if epsilon is None:
        low, high = torch.full_like(image, float(lower)), torch.full_like(image, float(upper))
    else:
        low, high = (image - epsilon).clamp(min=lower), (image + epsilon).clamp(max=upper)
    where = mask.expand_as(image)
    return Box(torch.where(where, low, image), torch.where(where, high, image))


def patch_region(image, top: int, left: int, height: int, width: int, lower: float = 0.0, upper: float = 1.0,
                 epsilon: float | None = None) -> Box:
    """The box where the rectangle [top, top+height) × [left, left+width) varies (see :func:`mask_region`)."""
    image = as_float64(image, "the image")
    rows, cols = image.shape[-2:]
    if height < 1 or width < 1 or top < 0 or left < 0 or top + height > rows or left + width > cols:
        raise SpecError(
            f"the patch rows {top}…{top + height - 1}, columns {left}…{left + width - 1} leave the {rows}×{cols} image; "
            f"pick top ≤ {rows - height} and left ≤ {cols - width}"
        )
    mask = torch.zeros(rows, cols, dtype=torch.bool)
    mask[top:top + height, left:left + width] = True
    return mask_region(image, mask, lower, upper, epsilon)


def all_patch_regions(image, size: int, stride: int = 1, lower: float = 0.0, upper: float = 1.0,
                      epsilon: float | None = None) -> Iterator[tuple[int, int, Box]]:
    """Every size×size patch position (top, left, region) on a grid of the given stride."""
    image = as_float64(image, "the image")
    rows, cols = image.shape[-2:]
    if size < 1 or size > min(rows, cols) or stride < 1:
        raise SpecError(f"patch size {size} and stride {stride} do not fit a {rows}×{cols} image")
    for top in range(0, rows - size + 1, stride):
        for left in range(0, cols - size + 1, stride):
            yield top, left, patch_region(image, top, left, size, size, lower, upper, epsilon)
