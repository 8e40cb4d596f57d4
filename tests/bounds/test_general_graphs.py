"""Conformance of the bound engine on general graphs: every method must contain every sampled output.

Three graph templates exercise every affine general operator (Transpose, Slice, Pad, Gather,
Reduce, Affine, Neg, ConstMatMul, Conv, Concat with constants, Add/Sub of two tensors) around a
non-linear operator drawn from every one that has a bound rule (ReLU, and the registered
element-wise and multi-input rules). Weights and boxes are random (seeded by hypothesis); each
box is sampled 1,000 times (a quarter at vertices) and the forward pass in float64 must stay
within the bounds of IBP, CROWN and α-CROWN, in float32 and float64, and under the linear
bounds CROWN returns.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from assay.bounds import AlphaCrownOptions, compute_bounds
from assay.bounds.rules import rule_for
from assay.nn import Flatten, Linear, Network, ReLU, Reshape, ops

from .strategies import forward_batched, sample_box

SAMPLES = 1_000
FAST = settings(max_examples=3, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# Non-linear steps to put in the graphs: (name, layers of a chain from a tensor to one of the same shape).
# Operators with a restricted domain get it from a sigmoid shifted to (0.1, 1.1).
_POSITIVE = [ops.Sigmoid(), ops.Affine(torch.tensor(1.0), torch.tensor(0.1))]
NONLINEAR = {
    "relu": [ReLU()],
    "sigmoid": [ops.Sigmoid()],
    "tanh": [ops.Tanh()],
    "exp": [ops.Exp()],
    "log": _POSITIVE + [ops.Log()],
    "reciprocal": _POSITIVE + [ops.Reciprocal()],
    "sqrt": _POSITIVE + [ops.Sqrt()],
    "pow2": [ops.Pow(2.0)],
    "pow3": [ops.Pow(3.0)],
    "sin": [ops.Sin()],
    "cos": [ops.Cos()],
    "abs": [ops.Abs()],
    "sign": [ops.Sign()],
    "floor": [ops.Affine(torch.tensor(3.0), torch.tensor(0.0)), ops.Floor()],
    "leaky_relu": [ops.LeakyRelu(0.1)],
    "clip": [ops.Clip(-0.3, 0.4)],
    "softmax": [ops.Softmax(0)],
    "max_constant": [ops.MinMax("Max", torch.tensor(0.2))],
}
AVAILABLE = [name for name, chain in NONLINEAR.items()
             if all(isinstance(layer, ReLU) or rule_for(layer) is not None for layer in chain)]


def _t(rng, *shape, scale=1.0):
    return torch.as_tensor(rng.normal(0.0, scale, size=shape))


def _chain(layers, sources, start, chain):
    """Append ``chain`` reading tensor ``start``; returns the index of its last tensor."""
    for layer in chain:
        layers.append(layer)
        sources.append((start,) if not isinstance(layer, ReLU) else (len(layers) - 1,))
        start = len(layers)
    return start


def shapes_graph(rng, chain) -> Network:
    """(2, 3, 4) → Transpose → Slice → Pad → non-linear → Gather → Reduce → Neg → Flatten → Linear."""
    layers, sources = [], []
    t = _chain(layers, sources, 0, [ops.Transpose((1, 0, 2)), ops.Slice((2,), (1,), (4,), (1,)),
                                    ops.Pad((0, 1, 0), (0, 0, 1), 0.5)])
    t = _chain(layers, sources, t, [ops.Affine(_t(rng, 3, 1, 1), _t(rng, 4, scale=0.3))])
    t = _chain(layers, sources, t, chain)
    t = _chain(layers, sources, t, [ops.Gather(0, torch.tensor([2, 0, 0])), ops.Reduce("mean", (2,)), ops.Neg(),
                                    Flatten()])
    _chain(layers, sources, t, [Linear(_t(rng, 3, 9, scale=0.5), _t(rng, 3, scale=0.2))])
    return Network(tuple(layers), (2, 3, 4), sources=tuple(sources))


def branches_graph(rng, chain) -> Network:
    """(6,) → Linear → non-linear → two Slices → Sub, Add → Concat with a constant → ConstMatMul."""
    layers, sources = [], []
    t = _chain(layers, sources, 0, [Linear(_t(rng, 8, 6, scale=0.6), _t(rng, 8, scale=0.3))])
    t = _chain(layers, sources, t, chain)
    a = _chain(layers, sources, t, [ops.Slice((0,), (0,), (4,), (1,))])
    b = _chain(layers, sources, t, [ops.Slice((0,), (4,), (8,), (1,))])
    layers.append(ops.Binary("Sub"))
    sources.append((a, b))
    diff = len(layers)
    layers.append(ops.Binary("Add"))
    sources.append((diff, a))
    total = len(layers)
    layers.append(ops.Concat(0, (None, torch.tensor([0.25, -1.0]), None)))
    sources.append((diff, total))
    _chain(layers, sources, len(layers), [ops.ConstMatMul(_t(rng, 10, 3, scale=0.4))])
    return Network(tuple(layers), (6,), sources=tuple(sources))


def conv_graph(rng, chain) -> Network:
    """(2, 5, 5) → Conv (asymmetric pads) → non-linear → Reduce sum → Flatten → Linear."""
    layers, sources = [], []
    conv = ops.Conv(_t(rng, 3, 2, 3, 3, scale=0.4), _t(rng, 3, scale=0.2), (2, 1), (1, 0), (0, 1), (1, 1))
    t = _chain(layers, sources, 0, [conv])
    t = _chain(layers, sources, t, chain)
    t = _chain(layers, sources, t, [ops.Reduce("sum", (1,)), Flatten()])
    shape = Network(tuple(layers), (2, 5, 5), sources=tuple(sources)).output_shape
    _chain(layers, sources, t, [Linear(_t(rng, 2, shape[0], scale=0.4), _t(rng, 2, scale=0.2))])
    return Network(tuple(layers), (2, 5, 5), sources=tuple(sources))


TEMPLATES = {"shapes": shapes_graph, "branches": branches_graph, "conv": conv_graph}

# Operators of two tensors: (name, layers applied to b first, the operator, reshape both to this first).
PAIRS = {
    "mul": ([], ops.Binary("Mul"), None),
    "div": (_POSITIVE, ops.Binary("Div"), None),
    "max": ([], ops.MinMax("Max"), None),
    "min": ([], ops.MinMax("Min"), None),
    "matmul": ([], ops.MatMul(), (2, 2)),
}
PAIRS_AVAILABLE = [name for name, (prepare, layer, _) in PAIRS.items()
                   if rule_for(layer) is not None and all(rule_for(p) is not None for p in prepare)]


def pairs_graph(rng, name) -> Network:
    """(6,) → Linear → two Slices a, b (b prepared, e.g. made positive) → a ∘ b → Flatten → Linear."""
    prepare, operator, shape = PAIRS[name]
    layers, sources = [], []
    t = _chain(layers, sources, 0, [Linear(_t(rng, 8, 6, scale=0.8), _t(rng, 8, scale=0.5))])
    a = _chain(layers, sources, t, [ops.Slice((0,), (0,), (4,), (1,))] + ([Reshape(shape)] if shape else []))
    b = _chain(layers, sources, t, [ops.Slice((0,), (4,), (8,), (1,))] + prepare + ([Reshape(shape)] if shape else []))
    layers.append(operator)
    sources.append((a, b))
    t = _chain(layers, sources, len(layers), [Flatten()])
    _chain(layers, sources, t, [Linear(_t(rng, 3, 4, scale=0.6), _t(rng, 3, scale=0.2))])
    return Network(tuple(layers), (6,), sources=tuple(sources))


@pytest.mark.parametrize("nonlinear", AVAILABLE + [f"pair:{name}" for name in PAIRS_AVAILABLE])
@given(template=st.sampled_from(sorted(TEMPLATES)), seed=st.integers(0, 2**32 - 1),
       width=st.sampled_from([1e-3, 0.3, 2.0]))
@FAST
def test_every_method_contains_every_sample(template, nonlinear, seed, width):
    rng = np.random.default_rng(seed)
    if nonlinear.startswith("pair:"):
        network = pairs_graph(rng, nonlinear[5:])
    else:
        network = TEMPLATES[template](rng, NONLINEAR[nonlinear])
    shape = (2, *network.input_shape)
    center = torch.as_tensor(rng.uniform(-1, 1, size=shape))
    radius = torch.as_tensor(rng.uniform(0, width / 2, size=shape))
    lower, upper = center - radius, center + radius
    x = sample_box(lower, upper, rng, SAMPLES)
    y = forward_batched(network, x)
    assert torch.isfinite(y).all()
    for dtype in ("float64", "float32"):
        for method in ("ibp", "crown", "alpha"):
            options = AlphaCrownOptions(iterations=3) if method == "alpha" else None
            result = compute_bounds(network, (lower, upper), method=method, dtype=dtype, options=options,
                                    return_linear=method == "crown")
            low, high = result.lower.to(torch.float64), result.upper.to(torch.float64)
            assert (y >= low.unsqueeze(0)).all(), f"{method} {dtype}: a sample below the lower bound by " \
                f"{float((low.unsqueeze(0) - y).max()):.3g}"
            assert (y <= high.unsqueeze(0)).all(), f"{method} {dtype}: a sample above the upper bound by " \
                f"{float((y - high.unsqueeze(0)).max()):.3g}"
            if result.linear is not None:
                flat = x.reshape(SAMPLES, 2, -1)
                lin = result.linear
                below = torch.einsum("bsi,nbi->nbs", lin.lower_A.reshape(2, y.shape[-1], -1).double(), flat) \
                    + lin.lower_b.double()
                above = torch.einsum("bsi,nbi->nbs", lin.upper_A.reshape(2, y.shape[-1], -1).double(), flat) \
                    + lin.upper_b.double()
                # evaluating the linear bound in float64 rounds: allow its own tiny error
                slack = 1e-9 * (1 + y.abs())
                assert (below <= y + slack).all() and (y <= above + slack).all(), f"{method} {dtype}: linear bounds"


def test_an_operator_without_a_rule_is_refused_in_one_line():
    class Unruled(ops.Operator):
        def forward(self, x):
            return x

    network = Network((Linear(torch.eye(2), torch.zeros(2)), Unruled()), (2,))
    with pytest.raises(Exception, match="no rule for operator 'Unruled'"):
        compute_bounds(network, (torch.zeros(2), torch.ones(2)))
