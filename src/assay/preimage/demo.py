"""The preimage section of ``assay demo``: which stickers on a digit leave its class unchanged?

A 3×3 patch on one test image of the demo's digits classifier may take any colouring
(9 free pixels in [0, 1]); :func:`~assay.preimage.approximate_preimage` under-approximates the
colourings under which the prediction stays the same, and the section reports the share of all
colourings that is provably safe, with the approximation's ratio and a check of its soundness
on fresh samples.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

__all__ = ["demo_section"]

# Test image 4 (a 9) with a 3×3 patch at rows 2–4, columns 3–5: about 42 % of the colourings keep the 9.
_IMAGE, _TOP, _LEFT, _SIZE = 4, 2, 3, 3
_CHECK = 20_000
_THRESHOLD = 0.75


def demo_section(hidden_layers: Sequence[int] = (32, 32), progress: Callable[[str], None] | None = None) -> dict:
    """Approximate one patch region's preimage; return ratio, covered share, timing and the sample check."""
    import torch

    from assay.demo import _train
    from assay.preimage import approximate_preimage
    from assay.sets import argmax_is, patch_region

    report = progress or (lambda stage: None)
    report("preimage: training the demo network")
    network, x_test, y_test, _, _ = _train(tuple(hidden_layers), 0)
    index = _IMAGE
    label = int(network.forward(x_test[index]).argmax())  # the class the network gives the unpatched image
    image = x_test[index].reshape(1, 8, 8)
    region = patch_region(image, _TOP, _LEFT, _SIZE, _SIZE)
    report(f"preimage: {_SIZE}×{_SIZE} patch on test image {index}")
    result = approximate_preimage(network, (region.lower.reshape(-1), region.upper.reshape(-1)),
                                  argmax_is(label, network.output_size), kind="under", threshold=_THRESHOLD, samples=1000,
                                  time_limit=20, method="crown", rng=0)
    # Attack the certificate: fresh colourings the approximation contains must keep the label.
    rng = np.random.default_rng(1)
    points = np.repeat(image.reshape(1, -1).numpy(), _CHECK, 0)
    free = result.region.free.numpy()
    points[:, free] = rng.random((_CHECK, free.size))
    contained = result.contains(points)
    kept = (network.forward(torch.as_tensor(points)).argmax(1) == label).numpy()
    return {"image": index, "label": label, "patch": {"top": _TOP, "left": _LEFT, "size": _SIZE},
            "status": result.status, "threshold": _THRESHOLD, "ratio": result.ratio, "ratio_interval": list(result.ratio_interval),
            "covered_share": result.approximation_volume.value / result.region_volume,
            "preimage_share": result.preimage_volume.value / result.region_volume,
            "pieces": len(result.pieces), "seconds": result.seconds, "checked": _CHECK,
            "checked_contained": int(contained.sum()), "checked_violations": int((contained & ~kept).sum())}
