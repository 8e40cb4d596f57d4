"""The value returned by :func:`assay.preimage.approximate_preimage`: pieces, volumes, ratio, history."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from assay.preimage.refinement import satisfies
from assay.preimage.region import FreeCoordinates
from assay.preimage.volume import Estimate, clopper_pearson

__all__ = ["Piece", "PreimageResult"]

# Points × pieces tested per block in `contains` (memory cap).
_BLOCK = 1 << 22


@dataclass(frozen=True, eq=False)
class Piece:
    """One piece of the approximation: ``{z ∈ [lower, upper] : splits hold, A z + b ≥ 0}`` in free coordinates.

    ``splits`` is the piece's ReLU split history, ``(ReLU layer, flat neuron, +1 for z ≥ 0 / −1
    for z ≤ 0)`` (empty for input splitting: the piece is a polytope); ``volume`` the volume of the
    piece's domain (its box's, or estimated from the sample pool under ReLU splitting);
    ``samples`` uniform samples of it gave ``in_preimage`` points of the true preimage and
    ``in_polytope`` of the approximation; ``exact``: the approximation equals the piece's
    preimage (proved by sound bounds: the whole domain maps into the output region).
    """

    lower: torch.Tensor
    upper: torch.Tensor
    A: torch.Tensor
    b: torch.Tensor
    samples: int
    in_preimage: int
    in_polytope: int
    exact: bool
    splits: tuple[tuple[int, int, int], ...] = ()
    volume: float | None = None

    def __post_init__(self):
        if self.volume is None:  # a box piece: its volume is its box's
            object.__setattr__(self, "volume", float(torch.prod(self.upper - self.lower)))

    def fractions(self, confidence: float) -> dict:
        """The piece's preimage and polytope volumes with exact Clopper–Pearson intervals."""
        if self.exact:
            return {"preimage": Estimate(self.volume, self.volume, self.volume, 1.0),
                    "approximation": Estimate(self.volume, self.volume, self.volume, 1.0)}
        if self.samples == 0:  # no sample measured this piece: nothing is known beyond its volume
            unknown = Estimate(0.0, 0.0, self.volume, confidence)
            return {"preimage": unknown, "approximation": unknown}
        counts = np.array([self.in_preimage, self.in_polytope])
        low, high = clopper_pearson(counts, np.array([self.samples] * 2), confidence)
        v = self.volume
        return {name: Estimate(v * counts[i] / self.samples, v * low[i], v * high[i], confidence)
                for i, name in enumerate(("preimage", "approximation"))}


@dataclass(frozen=True, eq=False)
class PreimageResult:
    """An under- or over-approximation of a preimage as a disjoint union of polytopes.

    Attributes:
        kind: ``"under"`` (every point of the union maps into the output region) or ``"over"``
            (every point of the region that maps into the output region lies in the union).
        pieces: the polytopes, on disjoint boxes (boxes may share faces).
        region: the input region in free coordinates (see :mod:`assay.preimage.region`).
        C, d: the output region ``C y + d ≥ 0``.
        preimage_volume, approximation_volume: stratified estimates over the region (free
            coordinates' volume) with intervals at ``confidence``.
        ratio: approximation volume / preimage volume (≤ 1 for under, ≥ 1 for over), with
            ``ratio_interval`` at ``confidence`` (a union bound over the two volumes' intervals).
        threshold: the ratio aimed at; ``status``: ``"reached"`` (by ``stop_on``),
            ``"time_limit"``, ``"interrupted"`` (Ctrl-C) or ``"exhausted"`` (nothing left to refine).
        history: ``(seconds, ratio, pieces)`` after each round.
        check: the independent test on fresh samples of the whole region (see
            ``check_samples`` of :func:`~assay.preimage.approximate_preimage`): counts, ratio and
            its exact interval; None when skipped.
    """

    kind: str
    pieces: tuple[Piece, ...]
    region: FreeCoordinates = field(repr=False)
    C: torch.Tensor = field(repr=False)
    d: torch.Tensor = field(repr=False)
    preimage_volume: Estimate
    approximation_volume: Estimate
    ratio: float
    ratio_interval: tuple[float, float]
    threshold: float
    confidence: float
    status: str
    iterations: int
    seconds: float
    history: tuple[tuple[float, float, int], ...] = ()
    stats: dict = field(default_factory=dict)
    check: dict | None = None
    _split_signs: tuple | None = field(default=None, init=False, repr=False)

    @property
    def region_volume(self) -> float:
        return self.region.volume

    def contains(self, x) -> np.ndarray:
        """Whether each point lies in the approximation: x of shape (N, *input_shape) or one input.

        Points off the region (a fixed pixel of a patch region changed) are outside.
        """
        x = torch.as_tensor(np.asarray(x, dtype=np.float64))
        single = tuple(x.shape) == self.region.input_shape or x.dim() == 1 and x.numel() == int(np.prod(self.region.input_shape))
        x = x.reshape(1 if single else x.shape[0], -1)
        z, on_region = self.region.from_input(x)
        found = torch.zeros(z.shape[0], dtype=torch.bool)
        if self.pieces:
            lower = torch.stack([p.lower for p in self.pieces])
            upper = torch.stack([p.upper for p in self.pieces])
            A = torch.stack([p.A for p in self.pieces])
            b = torch.stack([p.b for p in self.pieces])
            # ReLU splitting's pieces all share the region's box: test it once per point, not per piece.
            one_box = bool((lower == lower[0]).all() and (upper == upper[0]).all())
            step = max(1, _BLOCK // (len(self.pieces) * (1 if one_box else z.shape[1])))
            has_splits = any(p.splits for p in self.pieces)
            for start in range(0, z.shape[0], step):
                block = z[start:start + step]
                if one_box:
                    in_box = ((block >= lower[0]) & (block <= upper[0])).all(-1, keepdim=True).expand(-1, len(self.pieces))
                else:
                    in_box = ((block.unsqueeze(1) >= lower) & (block.unsqueeze(1) <= upper)).all(-1)  # (n, J)
                if has_splits:
                    in_box = in_box & self._on_splits(block)
                point, piece = torch.nonzero(in_box, as_tuple=True)
                if point.numel():
                    ok = satisfies(A[piece], b[piece], block[point].unsqueeze(1), inward=self.kind == "under")[:, 0]
                    hit = torch.zeros(block.shape[0], dtype=torch.bool)
                    hit[point[ok]] = True
                    found[start:start + step] = hit
        answer = (found & on_region).numpy()
        return answer[0] if single else answer

    def _on_splits(self, z: torch.Tensor) -> torch.Tensor:
        """(n, J) bool: whether each point satisfies each piece's ReLU splits (pieces without splits: True).

        One matrix product per block: a piece is violated where it demands z ≥ 0 of a neuron whose
        pre-activation is negative, or z ≤ 0 of one whose pre-activation is positive."""
        from assay.preimage.relu_refinement import pre_activations

        if self._split_signs is None:
            sizes = [int(np.prod(self.region.network.shapes[i])) for i in self.region.network.relu_indices]
            offsets = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(int)
            signs = torch.zeros(len(self.pieces), int(sum(sizes)))
            for j, piece in enumerate(self.pieces):
                for layer, neuron, sign in piece.splits:
                    signs[j, offsets[layer] + neuron] = sign
            # Sparse: a piece holds a few dozen splits of hundreds of neurons, and there may be
            # tens of thousands of pieces (a dense product cost a minute per 10,000 points).
            object.__setattr__(self, "_split_signs", ((signs > 0).float().to_sparse(), (signs < 0).float().to_sparse()))
        active, inactive = self._split_signs
        pre = torch.cat(pre_activations(self.region.network, z), 1)
        violated = torch.sparse.mm(active, (pre < 0).float().T) + torch.sparse.mm(inactive, (pre > 0).float().T)
        return (violated == 0).T

    def to_json(self, with_pieces: bool = True) -> dict:
        """Everything needed to check membership without assay (see the README's preimage section).

        Pieces are given in the network's (flattened) input coordinates: ``box`` lower/upper
        (fixed coordinates have lower = upper), ``A`` (rows × inputs) and ``b``: a point x is in
        the piece iff lower ≤ x ≤ upper and A x + b ≥ 0 (for under-approximations with a margin
        of about 1e-12 · (|A| |x| + |b|) to absorb rounding; see :func:`assay.preimage.refinement.satisfies`).
        """
        payload = {
            "kind": self.kind, "status": self.status, "threshold": self.threshold, "confidence": self.confidence,
            "ratio": self.ratio, "ratio_interval": list(self.ratio_interval),
            "region_volume": self.region_volume, "free_inputs": self.region.free.tolist(),
            "input_shape": list(self.region.input_shape),
            "output_region": {"C": self.C.tolist(), "d": self.d.tolist(), "meaning": "C y + d >= 0 (every row)"},
            "preimage_volume": self.preimage_volume.to_json(),
            "approximation_volume": self.approximation_volume.to_json(),
            "iterations": self.iterations, "seconds": self.seconds, "pieces_count": len(self.pieces),
            "history": [{"seconds": s, "ratio": r, "pieces": n} for s, r, n in self.history],
            "check": self.check,
            "stats": dict(self.stats),
        }
        if with_pieces:
            payload["pieces"] = [self._piece_json(piece) for piece in self.pieces]
        return payload

    def _piece_json(self, piece: Piece) -> dict:
        region = self.region
        lower = region.fixed.clone()
        upper = region.fixed.clone()
        lower[region.free], upper[region.free] = piece.lower, piece.upper
        A = torch.zeros(piece.A.shape[0], region.fixed.numel(), dtype=torch.float64)
        A[:, region.free] = piece.A
        volumes = piece.fractions(self.confidence)
        return {
            "box": {"lower": lower.tolist(), "upper": upper.tolist()},
            "splits": [list(s) for s in piece.splits],
            "A": A.tolist(), "b": piece.b.tolist(),
            "samples": piece.samples, "exact": piece.exact,
            "preimage_volume": volumes["preimage"].to_json(),
            "approximation_volume": volumes["approximation"].to_json(),
        }
