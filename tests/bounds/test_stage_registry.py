"""Every layer becomes its stage through the operator registry, and the stage answers the walks.

The plan asks each layer's registered rule for its stage (:meth:`LayerRule.stage`), a ReLU's
included; the walks then call the stage's own rules. The general split cuts a tensor where the
stage relaxing it says (a ReLU at 0: ReLU splitting is the general split's case s = 0)."""

from __future__ import annotations

import torch

from assay.bounds import plan_for
from assay.bounds.plan import has_bound_rule
from assay.bounds.rules import rule_for
from assay.bounds.rules.s_shaped import SigmoidRule
from assay.bounds.stages import AffineStage, OperatorStage, ReluStage
from assay.nn import Linear, Network, ReLU
from assay.nn.ops import Sigmoid


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
