"""Image patch regions: some pixels range over an interval, every other pixel keeps its value.

These are the input sets of patch-attack certification (e.g. PREMAP2's patch experiments): an
attacker may repaint the pixels of one rectangle (or any mask) in every channel, and nothing else.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch

from assay.errors import DataError, SpecError
from assay.sets.box import Box, _as_index, as_float64

__all__ = ["patch_region", "mask_region", "all_patch_regions", "sunbeam_region"]


def _as_image(image) -> torch.Tensor:
    image = as_float64(image, "the image")
    if image.dim() not in (2, 3):
        raise DataError(f"an image must have shape (C, H, W) or (H, W); got {tuple(image.shape)}")
    if torch.isnan(image).any():
        raise DataError("the image contains NaN pixels; give every pixel a value")
    return image


def _check_pixel_range(lower: float, upper: float, epsilon: float | None) -> None:
    if not lower <= upper:
        raise SpecError(f"the pixel range [lower, upper] = [{lower!r}, {upper!r}] is empty; pass lower ≤ upper")
    if epsilon is not None and not epsilon >= 0:
        raise SpecError(f"epsilon must be ≥ 0 (or None for the full pixel range); got {epsilon!r}")


def mask_region(image, mask, lower: float = 0.0, upper: float = 1.0, epsilon: float | None = None) -> Box:
    """The box where the pixels of ``mask`` vary in every channel and all others are fixed.

    Args:
        image: (C, H, W) or (H, W) pixel values.
        mask: (H, W) booleans: True for the pixels that may change.
        lower, upper: the valid pixel range.
        epsilon: None: masked pixels take any value in [lower, upper]; else image ± epsilon,
            clipped to [lower, upper] (then masked pixels must lie in [lower, upper]).
    Returns:
        a Box of the image's shape; outside the mask lower = upper = the image (exactly).
    Raises:
        DataError for a malformed image; SpecError for a mask of the wrong shape or an empty range.
    """
    image = _as_image(image)
    _check_pixel_range(lower, upper, epsilon)
    spatial = tuple(image.shape[-2:])
    mask = torch.as_tensor(mask)
    if tuple(mask.shape) != spatial:
        raise SpecError(f"the mask has shape {tuple(mask.shape)}, but the image {tuple(image.shape)} needs an (H, W) = {spatial} mask")
    mask = mask.to(torch.bool).expand_as(image)
    if epsilon is None:
        low, high = torch.full_like(image, float(lower)), torch.full_like(image, float(upper))
    else:
        outside = mask & ((image < lower) | (image > upper))
        if outside.any():
            value = image[outside][0].item()
            raise DataError(f"a masked pixel has value {value!r} outside the pixel range [{lower!r}, {upper!r}]; rescale the image or widen the range")
        low, high = (image - epsilon).clamp(min=lower), (image + epsilon).clamp(max=upper)
    return Box(torch.where(mask, low, image), torch.where(mask, high, image))


def sunbeam_region(image, mask, upper: float = 1.0) -> Box:
    """The box where the pixels of ``mask`` may only brighten: from their value up to ``upper``.

    A "sunbeam" (glare on a camera) adds light and never removes it. Every channel of a masked
    pixel ranges over [image value, upper]; every other pixel is fixed.

    Raises:
        DataError for a malformed image or a masked pixel already above ``upper``; SpecError for a
        mask of the wrong shape.
    """
    image = _as_image(image)
    spatial = tuple(image.shape[-2:])
    mask = torch.as_tensor(mask)
    if tuple(mask.shape) != spatial:
        raise SpecError(f"the mask has shape {tuple(mask.shape)}, but the image {tuple(image.shape)} needs an (H, W) = {spatial} mask")
    mask = mask.to(torch.bool).expand_as(image)
    if (mask & (image > upper)).any():
        value = image[mask & (image > upper)][0].item()
        raise DataError(f"a masked pixel has value {value!r} above the brightest value {upper!r}; rescale the image or raise `upper`")
    return Box(image.clone(), torch.where(mask, torch.full_like(image, float(upper)), image))


def patch_region(image, top: int, left: int, height: int, width: int, lower: float = 0.0, upper: float = 1.0,
                 epsilon: float | None = None) -> Box:
    """The box where the rectangle rows [top, top+height) × columns [left, left+width) varies.

    Every channel of the rectangle's pixels varies (see :func:`mask_region` for ``lower``,
    ``upper`` and ``epsilon``); every other pixel is fixed to the image value.

    Raises:
        SpecError when the rectangle is empty or leaves the image, saying which positions fit.
    """
    image = _as_image(image)
    top, left = _as_index(top, "top"), _as_index(left, "left")
    height, width = _as_index(height, "height"), _as_index(width, "width")
    rows, cols = image.shape[-2:]
    if height < 1 or width < 1:
        raise SpecError(f"a patch needs height ≥ 1 and width ≥ 1; got {height}×{width}")
    if height > rows or width > cols:
        raise SpecError(f"a {height}×{width} patch does not fit in the {rows}×{cols} image; use a smaller patch")
    if top < 0 or left < 0 or top + height > rows or left + width > cols:
        raise SpecError(
            f"the patch at rows {top}…{top + height - 1}, columns {left}…{left + width - 1} leaves the {rows}×{cols} image; "
            f"pick 0 ≤ top ≤ {rows - height} and 0 ≤ left ≤ {cols - width}"
        )
    mask = torch.zeros(rows, cols, dtype=torch.bool)
    mask[top:top + height, left:left + width] = True
    return mask_region(image, mask, lower, upper, epsilon)


def all_patch_regions(image, size, stride: int = 1, lower: float = 0.0, upper: float = 1.0,
                      epsilon: float | None = None) -> Iterator[tuple[int, int, Box]]:
    """Every patch position on a grid: yields ``(top, left, region)`` row by row.

    Args:
        size: the patch's side (an int) or ``(height, width)``.
        stride: the step between positions; positions are 0, stride, 2·stride, … up to the last
            that fits (like a convolution without padding: with a stride > 1 the last rows or
            columns may be covered by fewer patches).
    """
    image = _as_image(image)
    height, width = (size, size) if not isinstance(size, (tuple, list)) else tuple(size)
    height, width = _as_index(height, "the patch height"), _as_index(width, "the patch width")
    stride = _as_index(stride, "stride")
    rows, cols = image.shape[-2:]
    if stride < 1:
        raise SpecError(f"stride must be ≥ 1; got {stride}")
    if not (1 <= height <= rows and 1 <= width <= cols):
        raise SpecError(f"a {height}×{width} patch does not fit in the {rows}×{cols} image; use 1 ≤ size ≤ {min(rows, cols)}")
    _check_pixel_range(lower, upper, epsilon)
    # Validated above, generated lazily below: bad arguments fail at the call, not at the first next().
    return _patch_grid(image, height, width, stride, lower, upper, epsilon)


def _patch_grid(image, height, width, stride, lower, upper, epsilon) -> Iterator[tuple[int, int, Box]]:
    rows, cols = image.shape[-2:]
    for top in range(0, rows - height + 1, stride):
        for left in range(0, cols - width + 1, stride):
            yield top, left, patch_region(image, top, left, height, width, lower, upper, epsilon)
