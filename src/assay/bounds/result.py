"""Values returned by bound propagation."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

__all__ = ["LinearBounds", "IntermediateBounds", "BoundsResult"]


@dataclass(frozen=True, eq=False)
class LinearBounds:
    """Linear bounds of each spec row with respect to the input, valid over the input domain.

    For every domain ``i``, row ``s`` and every input ``x`` in domain ``i`` (and, with splits,
    satisfying the domain's split constraints; with weight perturbation, for every perturbed
    network)::

        lower_A[i, s] · x + lower_b[i, s]  ≤  (C f(x) + d)[i, s]  ≤  upper_A[i, s] · x + upper_b[i, s]

    ``·`` sums over the input shape. Rounding margins are already folded into the offsets.
    Shapes: ``*_A`` is (B, S, *input_shape), ``*_b`` is (B, S). A side that was not computed is None.
    """

    lower_A: torch.Tensor | None
    lower_b: torch.Tensor | None
    upper_A: torch.Tensor | None
    upper_b: torch.Tensor | None

    def evaluate(self, x: torch.Tensor) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """Evaluate both sides at points ``x`` of shape (B, N, *input_shape); returns (B, N, S) each.

        The value at a point is a bound only up to the rounding of this evaluation itself.
        """
        def side(A, b):
            if A is None:
                return None
            flat_A = A.reshape(A.shape[0], A.shape[1], -1)
            flat_x = x.reshape(x.shape[0], x.shape[1], -1).to(flat_A.dtype)
            return flat_x.matmul(flat_A.transpose(1, 2)) + b.unsqueeze(1)

        return side(self.lower_A, self.lower_b), side(self.upper_A, self.upper_b)


@dataclass(frozen=True, eq=False)
class IntermediateBounds:
    """Bounds of the tensors the bound methods relax, reusable in a later call on a sub-domain.

    ``lower[k]`` and ``upper[k]`` have shape (B, *shape of the input of the k-th ReLU layer).
    ``operator_lower[k]`` / ``operator_upper[k]``: the same for the k-th tensor of the plan's
    ``operator_tensors`` (the tensors, other than the network's input, that a non-linear general
    operator reads: sigmoid, product, softmax, …); empty where none are known (every bound method
    then computes its own). They are valid for the domains they were computed on, and therefore for
    any sub-domain of them (e.g. a child produced by splitting an input, a ReLU, or an operator's
    input: such a child narrows its own entries).
    """

    lower: tuple[torch.Tensor, ...]
    upper: tuple[torch.Tensor, ...]
    operator_lower: tuple[torch.Tensor, ...] = ()
    operator_upper: tuple[torch.Tensor, ...] = ()

    @property
    def batch_size(self) -> int:
        first = self.lower or self.operator_lower
        return first[0].shape[0] if first else 0

    def select(self, index) -> "IntermediateBounds":
        """Bounds of the domains picked by ``index`` (an index tensor, slice or bool mask)."""
        return IntermediateBounds(tuple(t[index] for t in self.lower), tuple(t[index] for t in self.upper),
                                  tuple(t[index] for t in self.operator_lower),
                                  tuple(t[index] for t in self.operator_upper))


@dataclass(frozen=True, eq=False)
class BoundsResult:
    """Bounds of ``C f(x) + d`` over each input domain.

    Attributes:
        lower, upper: (B, S) tensors; ``lower[i, s] ≤ (C f(x) + d)[s] ≤ upper[i, s]`` for every x
            in domain i. A side that was not asked for is -inf / +inf.
        method: the bound method used.
        linear: the linear bounds w.r.t. the input (when asked for), else None.
        intermediate: the pre-activation bounds used (to pass to a later call), or None for IBP.
        C, d: the spec rows that were bounded ((B, S, n_out) and (B, S)).
        stats: timings and iteration counts.
        alphas: for the optimised methods, the lower slopes of the returned bounds: per ReLU
            layer (B, S, *layer shape), or None where the layer had no unstable neuron (rows
            ordered as the lower-bound rows, then the upper-bound rows); pass them back as
            ``compute_bounds(alphas=...)`` to warm-start a sub-domain.
    """

    lower: torch.Tensor
    upper: torch.Tensor
    method: str
    linear: LinearBounds | None
    intermediate: IntermediateBounds | None
    C: torch.Tensor
    d: torch.Tensor
    stats: dict = field(default_factory=dict)
    alphas: tuple | None = None

    def to_json(self) -> dict:
        return {
            "method": self.method,
            "lower": self.lower.tolist(),
            "upper": self.upper.tolist(),
            "stats": dict(self.stats),
        }
