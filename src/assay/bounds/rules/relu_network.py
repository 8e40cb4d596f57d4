"""The rules of the ReLU network's own layers: ReLU, Linear, Conv2d, AvgPool2d, Flatten/Reshape,
Add and MaxPool2d.

They sit in the registry like every operator's rule; what sets them apart is the stage they lower
a layer to: not an :class:`~assay.bounds.stages.OperatorStage` that calls back into the rule,
but the engine's own stage kinds (:mod:`assay.bounds.stages`), whose rules are written for speed
and for β-CROWN's ReLU splitting (per-row slopes α, split multipliers β, forked split children).
So the plan builds every stage through the registry (:meth:`LayerRule.stage`), a ReLU's included.
"""

from __future__ import annotations

import torch

from assay.bounds.rules import register
from assay.bounds.rules.base import LayerRule
from assay.bounds.stages import AddStage, AffineStage, MaxPoolStage, ReluStage, SparseWeights
from assay.nn import sparse
from assay.nn.layers import Add, AvgPool2d, Conv2d, Flatten, Linear, MaxPool2d, ReLU, Reshape

__all__ = ["ReluRule"]


# registered (and listed in the engine's error for a layer without a rule) in this order
@register(Linear)
class LinearLayerRule(LayerRule):
    """A dense layer (its weights in the plan's dtype; CSR forms when large and mostly zero)."""

    linear = True

    def vector_map(self, layer, n: int):
        if tuple(layer.weight.shape) != (n, n):
            return None
        return layer.weight.to(torch.float64), layer.bias.to(torch.float64)

    def stage(self, network, index: int, layer, dtype: torch.dtype) -> AffineStage:
        reads = network.sources[index]
        weight, bias = network.parameters_as(index, dtype)
        kept = SparseWeights.of(weight) if sparse.is_sparse_weight(weight) else None
        return AffineStage(index, "linear", network.shapes[reads[0]], network.shapes[index + 1], weight, bias,
                           weight.abs(), None, max(weight.shape), True, reads, sparse=kept)


@register(Conv2d)
class ConvLayerRule(LayerRule):
    """A 2-d convolution."""

    linear = True

    def stage(self, network, index: int, layer, dtype: torch.dtype) -> AffineStage:
        return _conv_stage(network, index, layer, dtype)


@register(ReLU)
class ReluRule(LayerRule):
    """``max(z, 0)``: a :class:`~assay.bounds.stages.ReluStage` (CROWN's relaxation, split at 0)."""

    def stage(self, network, index: int, layer, dtype: torch.dtype) -> ReluStage:
        reads = network.sources[index]
        return ReluStage(index, network.shapes[reads[0]], reads)


@register(AvgPool2d)
class AvgPoolRule(LayerRule):
    """Average pooling: the depthwise convolution it is."""

    linear = True

    def stage(self, network, index: int, layer, dtype: torch.dtype) -> AffineStage:
        in_shape = network.shapes[network.sources[index][0]]
        return _conv_stage(network, index, layer.as_conv(in_shape[0]), dtype)


@register(MaxPool2d)
class MaxPoolRule(LayerRule):
    """Max pooling without padding, relaxed window by window."""

    def stage(self, network, index: int, layer, dtype: torch.dtype) -> MaxPoolStage:
        reads = network.sources[index]
        return MaxPoolStage(index, network.shapes[reads[0]], network.shapes[index + 1], layer.kernel_size, layer.stride,
                            reads)


@register(Flatten, Reshape)
class ReshapeRule(LayerRule):
    """Flatten and Reshape: a pure reshape (the output shape says which)."""

    linear = True

    def stage(self, network, index: int, layer, dtype: torch.dtype) -> AffineStage:
        reads = network.sources[index]
        return AffineStage(index, "flatten", network.shapes[reads[0]], network.shapes[index + 1], None, None, None, None,
                           1, False, reads)


@register(Add)
class AddRule(LayerRule):
    """The sum of two tensors (a residual connection)."""

    linear = True

    def stage(self, network, index: int, layer, dtype: torch.dtype) -> AddStage:
        return AddStage(index, network.shapes[index + 1], network.sources[index])


def _conv_stage(network, index: int, conv: Conv2d, dtype: torch.dtype) -> AffineStage:
    reads = network.sources[index]
    in_shape = network.shapes[reads[0]]
    weight, bias = conv.weight.to(dtype), conv.bias.to(dtype)
    fan = max(weight.shape[1] * weight.shape[2] * weight.shape[3], weight.shape[0] * weight.shape[2] * weight.shape[3])
    return AffineStage(index, "conv", in_shape, network.shapes[index + 1], weight, bias, weight.abs(), conv, fan,
                       not conv.fixed, reads, _shared_groups(conv, weight))


def _shared_groups(conv: Conv2d, weight: torch.Tensor) -> int:
    """The number of groups of a fixed grouped convolution whose groups all use one kernel, else 0."""
    groups = conv.groups
    if not conv.fixed or groups == 1:
        return 0
    tiled = weight.reshape(groups, weight.shape[0] // groups, *weight.shape[1:])
    return groups if bool((tiled == tiled[:1]).all()) else 0
