"""Where splitting a non-linear operator's input would help a bound most (the general split's scores).

Branch and bound over a general network (:mod:`assay.verify.operator_split`) narrows the interval
of one element of a tensor that a non-linear operator reads — a ReLU's input at 0 (a ReLU split),
a sigmoid's at its inflection, a product's factor, a sine's argument — so that the operator's
relaxation over each half is tighter. Which element: the one whose relaxation costs the rows most,
estimated as in BaBSR (Bunel et al., JMLR 2020) and its generalisation to any operator (Shi et
al., "Neural Network Verification with Branch-and-Bound for General Nonlinearities", 2024): one
CROWN walk records the coefficients Λ of the rows on each operator's output, and an element's
score is Σ_rows |Λ_j| × the widest vertical gap between the relaxation's two lines over its
interval (lines differ by a linear function: the gap peaks at an end). An operator of several
inputs (products, softmax, MatMul) has no such lines per input: its inputs' elements score by
their width times the coefficients' mean weight per element.

These are heuristics' inputs, never bounds: no rounding is charged, and any choice of element
keeps a search sound (the children's intervals cover the parent's).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from assay.bounds.coefficient_walk import batched_rows
from assay.bounds.crown import backsubstitute
from assay.bounds.ibp import interval_pass
from assay.bounds.plan import plan_for
from assay.bounds.result import IntermediateBounds
from assay.nn.network import Network

__all__ = ["SplitCandidates", "split_candidates"]


@dataclass(frozen=True, eq=False)
class SplitCandidates:
    """The elements a general split can narrow, and their scores.

    ``tensors``: the plan's tensor indices that can be split (ReLU inputs and the tensors
    non-linear operators read, the network's input excepted); ``scores[k]`` (B, numel) float64 ≥ 0
    for ``tensors[k]``, flat; ``lower[k]``, ``upper[k]`` (B, numel): the element's current interval.
    """

    tensors: tuple[int, ...]
    scores: tuple[torch.Tensor, ...]
    lower: tuple[torch.Tensor, ...]
    upper: tuple[torch.Tensor, ...]

    def best(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Per domain: (k, flat element index, score) of the highest-scoring element (score 0
        where nothing is worth splitting)."""
        tops = [s.max(1) for s in self.scores]
        values = torch.stack([t.values for t in tops], 1)  # (B, K)
        k = values.argmax(1)
        arange = torch.arange(values.shape[0])
        element = torch.stack([t.indices for t in tops], 1)[arange, k]
        return k, element, values[arange, k]


def split_candidates(network: Network, lower: torch.Tensor, upper: torch.Tensor, intermediate: IntermediateBounds,
                     C: torch.Tensor, d: torch.Tensor | None = None) -> SplitCandidates:
    """Scores of every splittable element for the rows ``C f(x) + d`` (a heuristic, see the module docstring).

    Args:
        network: the network f.
        lower, upper: (B, *input_shape) the domains' boxes.
        intermediate: their bounds as :func:`~assay.bounds.compute_bounds` returns them (with
            the tensors general operators read; narrowed by earlier splits).
        C: (S, n_out) or (B, S, n_out) rows; d: (S,) or (B, S), default 0.
    """
    plan = plan_for(network, torch.float64)
    batch = lower.shape[0]
    lower, upper = lower.to(torch.float64), upper.to(torch.float64)
    given: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
    for k, position in enumerate(plan.relu_positions):
        given[position] = intermediate.lower[k].to(torch.float64), intermediate.upper[k].to(torch.float64)
    for k, tensor in enumerate(plan.operator_tensors if intermediate.operator_lower else ()):
        pair = intermediate.operator_lower[k].to(torch.float64), intermediate.operator_upper[k].to(torch.float64)
        if tensor in given:
            pair = torch.maximum(pair[0], given[tensor][0]), torch.minimum(pair[1], given[tensor][1])
        given[tensor] = pair

    def clamp(tensor, low, high):
        if tensor in given:
            low, high = torch.maximum(low, given[tensor][0]), torch.minimum(high, given[tensor][1])
        return low, torch.maximum(low, high)

    with torch.no_grad():
        bounds = interval_pass(plan, lower, upper, None, clamp, given=given)
        C, d = batched_rows(C, d, batch)
        rows = C.shape[1]
        tensors = sorted(set(plan.relu_positions) | set(plan.operator_tensors))
        scores = {t: torch.zeros(batch, bounds[t][0][0].numel(), dtype=torch.float64) for t in tensors}

        def observe(position, A):
            stage = plan.stages[position]
            weight = A.abs().sum(1).reshape(batch, -1)  # Σ_rows |Λ| per output element
            lines = stage.relaxation_lines(*bounds[stage.sources[0]])
            if lines is not None:  # one input, lines of its own: weight × the lines' widest gap
                source = stage.sources[0]
                if source in scores:
                    scores[source] += weight * _widest_gap(*bounds[source], *lines).reshape(batch, -1)
                return
            mass = weight.sum(1, keepdim=True)  # an operator of several inputs: width × mean weight
            for source in stage.sources:
                if source in scores:
                    low, high = bounds[source]
                    width = (high - low).reshape(batch, -1)
                    scores[source] += mass / width.shape[1] * width.nan_to_num(posinf=0.0)

        backsubstitute(plan, len(plan.stages), C.reshape(batch, rows, *network.output_shape), d, bounds,
                       rounding=False, observe_outputs=observe)
    ordered = tuple(tensors)
    return SplitCandidates(
        ordered, tuple(scores[t].nan_to_num(nan=0.0, posinf=0.0) for t in ordered),
        tuple(bounds[t][0].reshape(batch, -1) for t in ordered), tuple(bounds[t][1].reshape(batch, -1) for t in ordered),
    )


def _widest_gap(low, high, lower_slope, lower_intercept, upper_slope, upper_intercept) -> torch.Tensor:
    """max over z in [low, high] of (upper line − lower line): at one of the two ends."""
    def gap(z):
        return (upper_slope - lower_slope) * z + (upper_intercept - lower_intercept)

    widest = torch.maximum(gap(low), gap(high))
    # An unbounded side (a reciprocal or logarithm near 0) costs the rows everything: splitting it
    # comes first, where the interval has two finite ends to split between.
    finite_ends = torch.isfinite(low) & torch.isfinite(high)
    unbounded = torch.where(finite_ends, torch.full_like(widest, 1e300), torch.zeros_like(widest))
    return torch.where(torch.isfinite(widest), widest, unbounded).clamp(min=0)
