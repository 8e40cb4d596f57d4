"""Every layer becomes its stage through the operator registry, and the stage answers the walks.

The plan asks each layer's registered rule for its stage (:meth:`LayerRule.stage`), a ReLU's
included; the walks then call the stage's own rules. The general split cuts a tensor where the
stage relaxing it says (a ReLU at 0: ReLU splitting is the general split's case s = 0)."""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import torch

from assay.bounds import compute_bounds, plan_for, rules
from assay.bounds.plan import has_bound_rule
from assay.bounds.rules import rule_for
from assay.bounds.rules.base import ElementwiseRule, Relaxation, widen
from assay.bounds.rules.s_shaped import SigmoidRule
from assay.bounds.stages import AffineStage, OperatorStage, ReluStage
from assay.nn import Linear, Network, ReLU
from assay.nn.ops import Sigmoid
from assay.nn.ops.base import Operator


def _network(activation) -> Network:
    torch.manual_seed(0)
    layers = (Linear(torch.randn(4, 3, dtype=torch.float64), torch.randn(4, dtype=torch.float64)), activation,
              Linear(torch.randn(2, 4, dtype=torch.float64), torch.randn(2, dtype=torch.float64)))
    return Network(layers, (3,))


def test_every_layer_gets_the_stage_its_registered_rule_builds():
    network = _network(ReLU())
    plan = plan_for(network, torch.float64)
    assert all(has_bound_rule(layer) for layer in network.layers)
    assert [type(s) for s in plan.stages] == [AffineStage, ReluStage, AffineStage]
    for index, layer in enumerate(network.layers):
        assert type(rule_for(layer).stage(network, index, layer, torch.float64)) is type(plan.stages[index])
    assert plan.relu_positions == [1] and not plan.is_general and plan.total_fan == (4 + 3) + 3 + (4 + 3)
    general = plan_for(_network(Sigmoid()), torch.float64)
    assert type(general.stages[1]) is OperatorStage and general.operator_tensors == [1] and general.is_general


def test_the_split_point_comes_from_the_stage_relaxing_the_tensor(monkeypatch):
    lower = torch.tensor([-1.0, 0.5, -3.0], dtype=torch.float64)
    upper = torch.tensor([2.0, 1.5, -1.0], dtype=torch.float64)
    middle_or_zero = torch.tensor([0.0, 1.0, -2.0], dtype=torch.float64)
    # a ReLU is split at 0 where its input straddles it (elsewhere a neuron is stable: the middle)
    assert torch.equal(plan_for(_network(ReLU()), torch.float64).split_point(1, lower, upper), middle_or_zero)
    plan = plan_for(_network(Sigmoid()), torch.float64)
    assert torch.equal(plan.split_point(1, lower, upper), middle_or_zero)
    # an operator's rule may put it elsewhere
    monkeypatch.setattr(SigmoidRule, "split_point", lambda self, layer, lo, hi: lo + (hi - lo) / 4, raising=False)
    assert torch.equal(plan.split_point(1, lower, upper), lower + (upper - lower) / 4)


@dataclass(frozen=True)
class _Cube(Operator):
    """``x³``: an operator assay does not know, for the test below."""

    def forward(self, x):
        return x ** 3

    def output_shape(self, shape):
        return tuple(shape)


class _CubeRule(ElementwiseRule):
    """x³ is increasing: the cubes of the interval's ends (widened by their rounding), and the
    constant lines at them as its relaxation."""

    def interval(self, layer, lower, upper):
        return widen(lower ** 3, upper ** 3)

    def relax(self, layer, lower, upper, alpha=None):
        low, high = self.interval(layer, lower, upper)
        zero = torch.zeros_like(low)
        return Relaxation(zero, low, zero, high)


def test_a_new_operator_is_one_rule_and_one_registration(monkeypatch):
    """An operator assay does not know, registered with a rule in this file: every bound method
    bounds networks with it soundly, with no change to the plan or the walks."""
    rules._load()
    monkeypatch.setattr(rules, "_REGISTRY", dict(rules._REGISTRY))  # forgotten after the test
    rules.register(_Cube)(_CubeRule)
    g = torch.Generator().manual_seed(1)
    w = lambda *shape: torch.randn(*shape, generator=g, dtype=torch.float64)  # noqa: E731
    direct = Network((_Cube(), Linear(w(2, 3), w(2))), (3,))  # its extremes lie at the box's corners
    inside = Network((Linear(w(4, 3), w(4)), _Cube(), Linear(w(4, 4), w(4)), ReLU(), Linear(w(2, 4), w(2))), (3,))
    assert isinstance(plan_for(inside, torch.float64).stages[1].rule, _CubeRule)
    assert plan_for(inside, torch.float64).operator_tensors == [1]
    lower = torch.rand(2, 3, generator=g, dtype=torch.float64) - 0.5
    upper = lower + 0.3
    corners = torch.tensor(list(itertools.product((0.0, 1.0), repeat=3)), dtype=torch.float64).unsqueeze(1)
    shares = torch.cat([corners.expand(-1, 2, -1), torch.rand(200, 2, 3, generator=g, dtype=torch.float64)])
    points = lower + (upper - lower) * shares
    for network in (direct, inside):
        outputs = network.forward(points.reshape(-1, 3)).reshape(len(points), 2, 2)
        for method, intermediate in (("ibp", "crown"), ("crown", "crown"), ("crown", "forward"), ("alpha", "crown")):
            result = compute_bounds(network, (lower, upper), method=method, intermediate_method=intermediate)
            assert bool((outputs >= result.lower).all() and (outputs <= result.upper).all()), method
