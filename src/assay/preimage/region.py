"""The free coordinates of an input region and the network that reads them.

Preimage approximation splits, samples and measures volume in the coordinates that actually vary.
An image patch region (:func:`assay.sets.patch_region`) fixes every pixel outside the patch
(``lower == upper``): those pixels are folded into the first layer, so that the analysis works in
the k patch coordinates ``z`` only, with ``x = P z + q`` (``P`` places z's entries, ``q`` holds
the fixed pixels). A box in which every coordinate varies is its own reduction (``P = I``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from assay.errors import DataError, SpecError
from assay.nn import Linear, Network, Reshape

__all__ = ["FreeCoordinates", "free_coordinates"]


@dataclass(frozen=True, eq=False)
class FreeCoordinates:
    """An input region seen through its free coordinates.

    Attributes:
        network: the network of ``z`` (flat, k inputs): ``network(z) = original(x(z))``.
        lower, upper: (k,) float64 bounds of z.
        free: (k,) indices of the free entries in the flattened original input.
        fixed: (n,) float64 flattened original input with the fixed values (free entries 0).
        input_shape: the original network's input shape.
    """

    network: Network
    lower: torch.Tensor
    upper: torch.Tensor
    free: torch.Tensor
    fixed: torch.Tensor
    input_shape: tuple[int, ...]

    @property
    def dim(self) -> int:
        return int(self.lower.shape[0])

    @property
    def volume(self) -> float:
        return float(torch.prod(self.upper - self.lower))

    def to_input(self, z: torch.Tensor) -> torch.Tensor:
        """Points z (N, k) as original inputs (N, *input_shape)."""
        x = self.fixed.expand(z.shape[0], -1).clone()
        x[:, self.free] = z.to(torch.float64)
        return x.reshape(z.shape[0], *self.input_shape)

    def from_input(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Original inputs (N, *input_shape) as ``(z (N, k), on_region (N,) bool)``: ``on_region`` is
        False where a fixed coordinate differs from its value (such a point is outside the region)."""
        flat = x.reshape(x.shape[0], -1).to(torch.float64)
        keep = torch.ones(flat.shape[1], dtype=torch.bool)
        keep[self.free] = False
        on_region = (flat[:, keep] == self.fixed[keep]).all(1)
        return flat[:, self.free], on_region


def free_coordinates(network: Network, lower: torch.Tensor, upper: torch.Tensor, source: str = "the input box") -> FreeCoordinates:
    """Reduce the box ``[lower, upper]`` (the network's input shape, or flat) to its free coordinates.

    Raises:
        SpecError: the box's size differs from the network's input, or lower > upper somewhere.
        DataError: NaN or infinite bounds.
    """
    lower = torch.as_tensor(lower, dtype=torch.float64).reshape(-1)
    upper = torch.as_tensor(upper, dtype=torch.float64).reshape(-1)
    if lower.shape != upper.shape or lower.numel() != network.input_size:
        raise SpecError(f"{source} has {lower.numel()} lower and {upper.numel()} upper values, but the network "
                        f"{network.source} has {network.input_size} inputs (shape {network.input_shape}); give one "
                        "bound per input")
    if not (torch.isfinite(lower).all() and torch.isfinite(upper).all()):
        where = int(torch.nonzero(~(torch.isfinite(lower) & torch.isfinite(upper)))[0])
        raise DataError(f"{source}: input {where} has a NaN or infinite bound; give finite numbers")
    if (lower > upper).any():
        where = int(torch.nonzero(lower > upper)[0])
        raise SpecError(f"{source}: input {where} has lower {lower[where].item()!r} above upper "
                        f"{upper[where].item()!r}; swap them")
    free = torch.nonzero(lower < upper).flatten()
    if free.numel() == 0:
        raise SpecError(f"{source} is a single point (lower == upper everywhere): it has no volume to approximate")
    fixed = torch.where(lower < upper, torch.zeros_like(lower), lower)
    if free.numel() == lower.numel() and len(network.input_shape) == 1:
        reduced = network
    else:
        reduced = _fold(network, free, fixed)
    return FreeCoordinates(reduced, lower[free], upper[free], free, fixed, tuple(network.input_shape))


def _fold(network: Network, free: torch.Tensor, fixed: torch.Tensor) -> Network:
    """The network of z: ``x = P z + q`` composed with ``network``; folded into its first layer
    when that is a Linear layer on a flat input (``W P``, ``W q + b``), else put in front of it."""
    n, k = fixed.numel(), free.numel()
    P = torch.zeros(n, k, dtype=torch.float64)
    P[free, torch.arange(k)] = 1.0
    first = network.layers[0]
    only_first_reads_input = all(0 not in reads for reads in network.sources[1:])
    if isinstance(first, Linear) and len(network.input_shape) == 1 and only_first_reads_input:
        layers = (Linear(first.weight @ P, first.weight @ fixed + first.bias), *network.layers[1:])
        sources = network.sources
    else:
        front = (Linear(P, fixed.clone()),)
        if len(network.input_shape) != 1:
            front += (Reshape(network.input_shape),)
        layers = front + tuple(network.layers)
        # the original network now reads tensor len(front) where it read its input
        sources = tuple((i,) for i in range(len(front))) + tuple(
            tuple(s + len(front) for s in reads) for reads in network.sources)
    return Network(layers, (k,), network.input_name, network.output_name, f"{network.source} (free inputs only)",
                   sources=sources)
