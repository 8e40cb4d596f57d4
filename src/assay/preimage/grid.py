"""Patch-position maps (explainability): how much of every patch's colourings keeps the decision?

For each position of a square patch on an image, :func:`patch_grid` under-approximates the set of
patch colourings (every channel of the patch's pixels in [0, 1]) under which the network still
predicts the image's class, and reports the share of colourings provably covered. Positions
where little is covered are where a sticker can change the decision: a heat map of the shares
shows what the network looks at.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from assay.preimage.api import approximate_preimage
from assay.sets import all_patch_regions, argmax_is

__all__ = ["PatchGrid", "patch_grid"]


@dataclass(frozen=True)
class PatchGrid:
    """``covered[r, c]``: the certified share (volume of the under-approximation / volume of all
    colourings) for the patch whose top-left pixel is ``(tops[r], lefts[c])``; ``ratio`` the
    approximation's ratio there; ``status`` each run's status."""

    label: int
    size: int
    tops: tuple[int, ...]
    lefts: tuple[int, ...]
    covered: np.ndarray
    ratio: np.ndarray
    status: tuple[tuple[str, ...], ...]
    seconds: float

    def to_json(self) -> dict:
        return {"label": self.label, "size": self.size, "tops": list(self.tops), "lefts": list(self.lefts),
                "covered": self.covered.tolist(), "ratio": self.ratio.tolist(),
                "status": [list(row) for row in self.status], "seconds": self.seconds}


def patch_grid(network, image, size: int, *, label: int | None = None, stride: int = 1, threshold: float = 0.9,
               time_limit: float = 10.0, samples: int = 500, method: str = "crown", branching: str = "auto", rng=0,
               progress: Callable[[int, int], None] | None = None) -> PatchGrid:
    """Under-approximate, for every ``size``×``size`` patch position, the colourings that keep ``label``.

    Args:
        network: the classifier (input shape (C, H, W) or flat H·W for single-channel images).
        image: (C, H, W) or (H, W) pixels in [0, 1].
        label: the class to keep (default: the network's prediction on ``image``).
        stride: the step between patch positions.
        threshold, time_limit, samples, method, branching, rng: per position, as in
            :func:`~assay.preimage.approximate_preimage` (kind ``"under"``).
        progress: called with (positions done, positions) after each position.
    """
    started = time.monotonic()
    image = torch.as_tensor(np.asarray(image, dtype=np.float64))
    shaped = image if image.dim() == 3 else image.unsqueeze(0)
    as_input = shaped.reshape(network.input_shape)
    if label is None:
        label = int(network.forward(as_input).reshape(-1).argmax())
    spec = argmax_is(label, network.output_size)
    generator = np.random.default_rng(rng)
    positions = list(all_patch_regions(shaped, size, stride))
    tops = sorted({top for top, _, _ in positions})
    lefts = sorted({left for _, left, _ in positions})
    covered = np.zeros((len(tops), len(lefts)))
    ratio = np.zeros_like(covered)
    status = [["" for _ in lefts] for _ in tops]
    for done, (top, left, region) in enumerate(positions, start=1):
        lower, upper = region.lower.reshape(network.input_shape), region.upper.reshape(network.input_shape)
        result = approximate_preimage(network, (lower, upper), spec, kind="under", threshold=threshold,
                                      time_limit=time_limit, samples=samples, method=method, branching=branching,
                                      rng=generator)
        r, c = tops.index(top), lefts.index(left)
        covered[r, c] = result.approximation_volume.value / result.region_volume
        ratio[r, c] = result.ratio
        status[r][c] = result.status
        if progress is not None:
            progress(done, len(positions))
    return PatchGrid(label, size, tuple(tops), tuple(lefts), covered, ratio, tuple(tuple(row) for row in status),
                     time.monotonic() - started)
