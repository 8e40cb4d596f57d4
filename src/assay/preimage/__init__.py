"""Preimage approximation (PREMAP2): which inputs of a region does a network map into an output region?

>>> result = approximate_preimage(network, Box(lower, upper), argmax_is(0, 4), kind="under")  # doctest: +SKIP
>>> result.ratio, result.contains(points)                                                      # doctest: +SKIP

:func:`approximate_preimage` returns a :class:`PreimageResult`: a disjoint union of polytopes
that provably lies inside (``kind="under"``) or provably contains (``kind="over"``) the preimage,
with estimated volumes and their confidence intervals. See :mod:`assay.preimage.refinement` for
the algorithm and its soundness argument.
"""

from assay.preimage.api import approximate_preimage
from assay.preimage.result import Piece, PreimageResult
from assay.preimage.volume import Estimate

__all__ = ["approximate_preimage", "PreimageResult", "Piece", "Estimate"]
