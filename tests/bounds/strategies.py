"""Hypothesis strategies and samplers for the bound-engine conformance tests."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import torch
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

from assay.nn import Add, AvgPool2d, Conv2d, Flatten, Linear, Network, ReLU, load


def _tensor(rng: np.random.Generator, *shape, scale=1.0) -> torch.Tensor:
    return torch.as_tensor(rng.normal(0.0, scale, size=shape))


@st.composite
def dense_networks(draw):
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    widths = [draw(st.integers(1, 5))] + draw(st.lists(st.integers(1, 8), min_size=1, max_size=3)) + [draw(st.integers(1, 4))]
    layers = []
    for i, (fan_in, fan_out) in enumerate(zip(widths[:-1], widths[1:])):
        layers.append(Linear(_tensor(rng, fan_out, fan_in, scale=1 / np.sqrt(fan_in) * 1.5), _tensor(rng, fan_out, scale=0.5)))
        if i < len(widths) - 2:
            layers.append(ReLU())
    return Network(tuple(layers), (widths[0],))


@st.composite
def conv_networks(draw):
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    channels = draw(st.integers(1, 2))
    size = draw(st.integers(4, 6))
    out_channels = draw(st.integers(1, 3))
    kernel = draw(st.integers(2, 3))
    stride = draw(st.integers(1, 2))
    padding = draw(st.integers(0, 1))
    layers = [Conv2d(_tensor(rng, out_channels, channels, kernel, kernel, scale=0.6), _tensor(rng, out_channels, scale=0.3),
                     stride, padding), ReLU()]
    shape = Network(tuple(layers), (channels, size, size)).output_shape
    if draw(st.booleans()) and shape[1] >= 2:
        layers.append(AvgPool2d(2, 2))
        shape = Network(tuple(layers), (channels, size, size)).output_shape
    layers.append(Flatten())
    flat = int(np.prod(shape))
    hidden = draw(st.integers(1, 6))
    layers += [Linear(_tensor(rng, hidden, flat, scale=1 / np.sqrt(flat) * 1.5), _tensor(rng, hidden, scale=0.3)), ReLU(),
               Linear(_tensor(rng, 3, hidden, scale=1.0), _tensor(rng, 3, scale=0.3))]
    return Network(tuple(layers), (channels, size, size))


@st.composite
def residual_dense_networks(draw):
    """x → Linear → ReLU → [Linear → ReLU → Linear] + skip → ReLU → Linear: a dense residual block
    (the skip reads a ReLU's output or, drawn, the first Linear's output or the input itself)."""
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    n_in, width, n_out = draw(st.integers(1, 4)), draw(st.integers(2, 6)), draw(st.integers(1, 3))
    skip_from = draw(st.sampled_from(["relu", "linear", "input"]))
    if skip_from == "input":
        width = n_in
    scale = 1.2 / np.sqrt(width)
    layers = [Linear(_tensor(rng, width, n_in, scale=1.2 / np.sqrt(n_in)), _tensor(rng, width, scale=0.4)), ReLU(),
              Linear(_tensor(rng, width, width, scale=scale), _tensor(rng, width, scale=0.4)), ReLU(),
              Linear(_tensor(rng, width, width, scale=scale), _tensor(rng, width, scale=0.4)), Add(), ReLU(),
              Linear(_tensor(rng, n_out, width, scale=scale), _tensor(rng, n_out, scale=0.3))]
    skip = {"input": 0, "linear": 1, "relu": 2}[skip_from]
    sources = ((0,), (1,), (2,), (3,), (4,), (5, skip), (6,), (7,))
    return Network(tuple(layers), (n_in,), sources=sources)


def onnx_graph_model(rng: np.random.Generator, channels: int, size: int, pool: int, stride: int, residual: bool,
                     average: bool):
    """An ONNX model Conv → Relu → MaxPool|Pad+AveragePool → [Conv 3x3 (pad 1) + skip] → Relu → Flatten → Gemm."""
    inits, nodes = [], []

    def const(name, array):
        inits.append(numpy_helper.from_array(np.asarray(array, dtype=np.float32), name))
        return name

    hidden = 2
    nodes.append(helper.make_node("Conv", ["x", const("w1", rng.normal(0, 0.7, (hidden, channels, 2, 2))),
                                          const("b1", rng.normal(0, 0.3, hidden))], ["c1"], pads=[0, 0, 0, 0]))
    nodes.append(helper.make_node("Relu", ["c1"], ["r1"]))
    if average:
        inits.append(numpy_helper.from_array(np.array([0, 0, 1, 1, 0, 0, 1, 1], dtype=np.int64), "pads"))
        nodes.append(helper.make_node("Pad", ["r1", "pads"], ["p1"], mode="constant"))
        nodes.append(helper.make_node("AveragePool", ["p1"], ["m1"], kernel_shape=[pool, pool], strides=[stride, stride]))
    else:
        nodes.append(helper.make_node("MaxPool", ["r1"], ["m1"], kernel_shape=[pool, pool], strides=[stride, stride]))
    last = "m1"
    if residual:
        nodes.append(helper.make_node("Conv", ["m1", const("w2", rng.normal(0, 0.5, (hidden, hidden, 3, 3))),
                                              const("b2", rng.normal(0, 0.3, hidden))], ["c2"], pads=[1, 1, 1, 1]))
        nodes.append(helper.make_node("Add", ["c2", "m1"], ["a2"]))
        last = "a2"
    nodes.append(helper.make_node("Relu", [last], ["r2"]))
    nodes.append(helper.make_node("Flatten", ["r2"], ["f"], axis=1))
    side = size - 1 + (2 if average else 0)
    side = (side - pool) // stride + 1
    flat = hidden * side * side
    nodes.append(helper.make_node("Gemm", ["f", const("w3", rng.normal(0, 1 / np.sqrt(flat), (3, flat))),
                                          const("b3", rng.normal(0, 0.3, 3))], ["y"], transB=1))
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, channels, size, size])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 3])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


def tied_maxpool_model(rng, pool, stride):
    """Conv (positive weights) → Relu → MaxPool → Flatten → Gemm on 1x6x6 images: on a nearly
    constant image every window holds nearly equal, active values."""
    side = (5 - pool) // stride + 1
    inits = [numpy_helper.from_array(a.astype(np.float32), n) for n, a in (
        ("w1", rng.uniform(0.2, 1.0, (2, 1, 2, 2))), ("b1", rng.uniform(0.0, 0.3, 2)),
        ("w2", rng.normal(0, 1.0, (3, 2 * side * side))), ("b2", rng.normal(0, 0.3, 3)))]
    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["c"]), helper.make_node("Relu", ["c"], ["r"]),
             helper.make_node("MaxPool", ["r"], ["m"], kernel_shape=[pool, pool], strides=[stride, stride]),
             helper.make_node("Flatten", ["m"], ["f"], axis=1), helper.make_node("Gemm", ["f", "w2", "b2"], ["y"], transB=1)]
    graph = helper.make_graph(nodes, "tied", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, 6, 6])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 3])], inits)
    network = load(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]))
    assert network.pooled is not None
    return network


@st.composite
def pooling_graph_networks(draw, pooled: bool = True):
    """Convolutional graphs with MaxPool (lowered to ReLUs, or whole) or Pad + AveragePool, with or without a
    residual Add."""
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    channels, size = draw(st.integers(1, 2)), draw(st.integers(4, 6))
    pool, stride = draw(st.sampled_from([(2, 2), (2, 1), (3, 2), (3, 3)]))
    model = onnx_graph_model(rng, channels, size, pool, stride, draw(st.booleans()), draw(st.booleans()))
    network = load(model)
    # A MaxPool model also comes as its pooled twin (MaxPool2d stages relaxed window by window).
    return network.pooled if pooled and network.pooled is not None and draw(st.booleans()) else network


def graph_networks(pooled: bool = True):
    """Residual and pooling graphs; ``pooled=False`` leaves out MaxPool2d twins (for ReLU-only walks)."""
    return st.one_of(residual_dense_networks(), pooling_graph_networks(pooled))


def random_boxes(network: Network, rng: np.random.Generator, batch: int, max_width: float = 1.0):
    """A batch of random input boxes (lower, upper), each of shape (batch, *input_shape)."""
    shape = (batch, *network.input_shape)
    center = torch.as_tensor(rng.uniform(-1.0, 1.0, size=shape))
    radius = torch.as_tensor(rng.uniform(0.0, max_width / 2, size=shape))
    return center - radius, center + radius


def sample_box(lower: torch.Tensor, upper: torch.Tensor, rng: np.random.Generator, n: int) -> torch.Tensor:
    """n points per domain (n, B, *shape): a quarter at random vertices, the rest uniform."""
    u = torch.as_tensor(rng.uniform(size=(n, *lower.shape)))
    vertices = n // 4
    u[:vertices] = torch.as_tensor(rng.integers(0, 2, size=(vertices, *lower.shape)), dtype=u.dtype)
    return lower + (upper - lower) * u


def forward_batched(network: Network, x: torch.Tensor) -> torch.Tensor:
    """Forward pass of x (n, B, *input_shape) → (n, B, n_out) in float64."""
    n, batch = x.shape[:2]
    return network.forward(x.reshape(n * batch, *network.input_shape)).reshape(n, batch, -1)


def random_splits(network: Network, intermediate, rng: np.random.Generator, per_layer: int = 2):
    """Split histories fixing up to ``per_layer`` unstable ReLUs per layer to a random sign."""
    splits = []
    for lower, upper in zip(intermediate.lower, intermediate.upper):
        split = torch.zeros(lower.shape, dtype=torch.int64)
        flat_split = split.reshape(lower.shape[0], -1)
        unstable = ((lower < 0) & (upper > 0)).reshape(lower.shape[0], -1)
        for b in range(lower.shape[0]):
            candidates = unstable[b].nonzero().flatten().numpy()
            if candidates.size:
                chosen = rng.choice(candidates, size=min(per_layer, candidates.size), replace=False)
                flat_split[b, torch.as_tensor(chosen)] = torch.as_tensor(rng.choice([-1, 1], size=chosen.size))
        splits.append(split)
    return splits


def satisfies_splits(network: Network, x: torch.Tensor, splits) -> torch.Tensor:
    """Mask (n, B): which points satisfy every split constraint of their domain."""
    n, batch = x.shape[:2]
    ok = torch.ones(n * batch, dtype=torch.bool)
    for k, pre in enumerate(network.pre_activations(x.reshape(n * batch, *network.input_shape))):
        split = splits[k].unsqueeze(0).expand(n, *splits[k].shape).reshape(n * batch, -1)
        z = pre.reshape(n * batch, -1)
        ok &= (((split == 1) & (z < 0)) | ((split == -1) & (z > 0))).logical_not().all(1)
    return ok.reshape(n, batch)


def perturbed_network(network: Network, rng: np.random.Generator, delta: float) -> Network:
    """The same network with every Linear/Conv2d weight and bias moved by ≤ δ (often at ±δ)."""
    def move(t):
        corner = rng.choice([-1.0, 1.0], size=t.shape)
        step = np.where(rng.uniform(size=t.shape) < 0.5, corner, rng.uniform(-1.0, 1.0, size=t.shape))
        return t + delta * torch.as_tensor(step)

    layers = []
    for layer in network.layers:
        if isinstance(layer, Linear):
            layer = Linear(move(layer.weight), move(layer.bias))
        elif isinstance(layer, Conv2d) and not layer.fixed:
            layer = Conv2d(move(layer.weight), move(layer.bias), layer.stride, layer.padding, layer.dilation, layer.groups)
        layers.append(layer)
    return replace(network, layers=tuple(layers))
