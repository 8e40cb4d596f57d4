"""A network as the bound engine sees it: its layers lowered to stages, once per dtype.

The engine sees a network as a list of *stages* in topological order: affine stages (Linear,
Conv2d, AvgPool2d as a depthwise convolution, Flatten/Reshape), ReLU stages, Add stages
(residual sums), max pooling and general operators (:mod:`assay.bounds.stages`, each kind with
its own rules). Stage ``p`` produces tensor ``p + 1`` from the tensors in ``stage.sources``
(tensor 0 is the input); a ReLU stage always reads tensor ``p``, so "the input of ReLU stage
p" and "tensor p" are the same thing. Bound methods walk the stages forwards (intervals,
forward linear bounds) or backwards (backward substitution, summing the contributions that
reach a tensor from all its consumers, as auto_LiRPA does over a graph), calling each stage's
rules. :class:`Plan` prepares the stages (and an affine stage's weight maps) once per
(network, dtype) and caches them.
"""

from __future__ import annotations

import math
import weakref

import torch

from assay.bounds.rounding import gamma, unit_roundoff
from assay.bounds.rules import registered_layers, rule_for
from assay.bounds.stages import AddStage, AffineStage, MaxPoolStage, OperatorStage, ReluStage, SparseWeights, Stage
from assay.errors import UnsupportedOperatorError
from assay.nn.network import Network

__all__ = ["Plan", "plan_for", "accumulate", "gamma", "unit_roundoff", "rounding_factor", "require_bound_rules",
           "has_bound_rule", "Stage", "AffineStage", "ReluStage", "AddStage", "MaxPoolStage", "OperatorStage",
           "SparseWeights"]


class Plan:
    """The stages of a network in one dtype. Obtain with :func:`plan_for`."""

    def __init__(self, network: Network, dtype: torch.dtype):
        self.network = network
        self.dtype = dtype
        self.stages: list[Stage] = []
        # every layer becomes the stage its registered rule builds (assay.bounds.rules: the ReLU
        # network's layers lower to the engine's own stage kinds, every other operator to an
        # OperatorStage bounded by its rule); a layer without a rule ends a bound method in one
        # UnsupportedOperatorError naming it
        for index, layer in enumerate(network.layers):
            rule = rule_for(layer)
            if rule is None:
                require_bound_rules(network)
            self.stages.append(rule.stage(network, index, layer, dtype))
        self.relu_positions = [i for i, s in enumerate(self.stages) if s.splits_at_zero]
        # The tensors whose bounds a non-linear general operator reads: CROWN refines them before
        # they are relaxed, as it refines the ReLU inputs.
        self.operator_inputs = sorted({source for s in self.stages if s.general and s.nonlinear
                                       for source in s.sources})
        # Those whose bounds IntermediateBounds carries (the input's are the domain itself).
        self.operator_tensors = [t for t in self.operator_inputs if t > 0]
        # Those read only by rules that walk to their sources' linear bounds themselves
        # (assay.bounds.rules.linearized): CROWN does not refine them first (the rule's own walk
        # bounds them; IBP's interval stands for the rest).
        readers: dict[int, list] = {}
        for s in self.stages:
            if s.general and s.nonlinear:
                for source in s.sources:
                    readers.setdefault(source, []).append(s)
        self.lined_tensors = {t for t, stages in readers.items() if t > 0
                              and all(getattr(s.rule, "walks", False) for s in stages)}
        self.is_general = any(s.general for s in self.stages)
        # general operators whose relaxation has free parameters (α-CROWN tunes them)
        self.parametrised_operators = [i for i, s in enumerate(self.stages) if s.general and s.parameters]
        self.is_chain = network.is_chain
        self.has_maxpool = any(s.max_pooling for s in self.stages)
        # The rounding factor: every backward or forward product sums at most `fan` terms per
        # entry; adding the layers' fans bounds the relative error of the whole chain. In a graph
        # a coefficient reaching a tensor along several paths is summed once per extra consumer:
        # one more rounding each, covered by the 3 terms every stage adds (Stage.rounding_terms).
        self.total_fan = sum(s.rounding_terms for s in self.stages)
        # The most terms summed into a walk's offset b: one dot product over a tensor (a bias,
        # a relaxation's intercepts) plus the additions of every stage's term.
        self.sum_terms = max(math.prod(shape) for shape in network.shapes) + 2 * len(self.stages) + 3
        self.affine_positions = [i for i, s in enumerate(self.stages) if s.perturbable]
        # The first stage that relaxes each tensor: it says where the general split cuts it.
        self._relaxed_by: dict[int, Stage] = {}
        for stage in self.stages:
            for source in stage.clamped:
                self._relaxed_by.setdefault(source, stage)
        # The last stage that reads each tensor (forward walks free a tensor after it).
        self.last_use = {0: 0}
        for position, stage in enumerate(self.stages):
            for source in stage.sources:
                self.last_use[source] = position


    def split_point(self, tensor: int, lower: torch.Tensor, upper: torch.Tensor) -> torch.Tensor:
        """Where the general split cuts the intervals ``[lower, upper]`` of elements of ``tensor``
        (a ReLU's or a non-linear operator's input): the first stage relaxing it says
        (:meth:`~assay.bounds.stages.base.Stage.split_point`: 0 for a ReLU)."""
        return self._relaxed_by[tensor].split_point(lower, upper)

    @property
    def has_nonlinear_operators(self) -> bool:
        """Whether a general operator that is not affine (sigmoid, products, …) is present."""
        return any(s.general and s.nonlinear for s in self.stages)

    def require_relu_network(self, what: str, linear_operators: bool = False) -> None:
        """Raise a clear error where ``what`` handles ReLU networks only (a general operator is
        present; with ``linear_operators``, only a non-affine one)."""
        general = [s for s in self.stages if s.general and (s.nonlinear or not linear_operators)]
        if general:
            names = sorted({type(s.layer).__name__ for s in general})
            raise UnsupportedOperatorError(
                f"{what} supports networks of dense, convolution, ReLU, pooling and residual layers; "
                f"{self.network.source} also has {', '.join(names)}"
            )

    def require_no_maxpool(self, what: str) -> None:
        """Raise a clear error where ``what`` walks ReLU networks only (a MaxPool2d stage is not one)."""
        if self.has_maxpool:
            raise UnsupportedOperatorError(
                f"{what} does not support MaxPool2d layers ({self.network.source}); use the network as loaded "
                "(MaxPool lowered to ReLUs), not its `pooled` twin"
            )


def require_bound_rules(network: Network) -> None:
    """Raise the engine's one-line :class:`UnsupportedOperatorError` now if ``network`` has a layer
    without a bound rule (what building its :class:`Plan` would raise), for analyses that would
    otherwise run an attack or a forward pass before their first bound."""
    for index, layer in enumerate(network.layers):
        if not has_bound_rule(layer):
            where = network.origins[index] if network.origins else network.source
            raise UnsupportedOperatorError(
                f"{where}: bound propagation has no rule for operator '{type(layer).__name__}' (layer {index}); "
                f"layers with bound rules: {', '.join(c.__name__ for c in registered_layers())}"
            )


def has_bound_rule(layer) -> bool:
    """Whether the engine can bound ``layer`` (its operator has a registered rule)."""
    return rule_for(layer) is not None


def accumulate(pending: dict, tensor: int, values: tuple) -> None:
    """Add ``values`` (a tuple of tensors) to those already waiting on ``tensor`` in a backward walk.

    Backward walks over a graph keep, per tensor, the sum of what its consumers sent back; a
    chain only ever holds one entry.
    """
    if tensor in pending:
        pending[tensor] = tuple(old + new for old, new in zip(pending[tensor], values))
    else:
        pending[tensor] = values


_PLANS: "weakref.WeakKeyDictionary[Network, dict]" = weakref.WeakKeyDictionary()


def plan_for(network: Network, dtype: torch.dtype) -> Plan:
    """The cached :class:`Plan` of ``network`` in ``dtype``."""
    per_network = _PLANS.setdefault(network, {})
    if dtype not in per_network:
        per_network[dtype] = Plan(network, dtype)
    return per_network[dtype]


def rounding_factor(plan: Plan, extra_terms: int = 0) -> float:
    """A relative factor γ with |computed - exact| ≤ γ · magnitude for a chain through ``plan``.

    Standard bound for floating-point dot products (Higham, Accuracy and Stability of
    Numerical Algorithms, §3.1): a sum of n products has error at most γ_n = n·u/(1 − n·u)
    times the sum of the absolute products. A chain of such sums accumulates at most the
    sum of the γ's (first order); we double it to cover second-order terms.
    """
    return gamma(plan.total_fan + extra_terms, plan.dtype)
