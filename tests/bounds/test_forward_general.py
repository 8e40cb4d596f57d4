"""Forward linear bounds (intermediate_method="forward") on general graphs: every sampled tensor
must lie within the bounds of every tensor they return, and the output within compute_bounds'.

The graphs are test_general_graphs' templates (every affine general operator around every
non-linear one that has a rule, and the operators of two tensors), plus a generator-like chain
(transposed convolutions, batch-norm scalings, ReLUs, a convolution) as in VNN-COMP's cgan.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from assay.bounds import compute_bounds, intermediate_method_for, plan_for
from assay.bounds.forward import forward_bounds
from assay.nn import Flatten, Linear, Network, ReLU, Reshape, ops

from .strategies import forward_batched, sample_box
from .test_general_graphs import AVAILABLE, NONLINEAR, PAIRS_AVAILABLE, TEMPLATES, pairs_graph

SAMPLES = 1_000
FAST = settings(max_examples=3, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _t(rng, *shape, scale=1.0):
    return torch.as_tensor(rng.normal(0.0, scale, size=shape))


def generator_graph(rng, channels: int = 3, image: int = 2) -> Network:
    """(4,) → Linear → Reshape (c, 2, 2) → ConvTranspose → Affine → ReLU → ConvTranspose
    → Affine → ReLU → Conv → Flatten → Linear: a cgan generator and its discriminator in small."""
    c = channels
    layers = [
        Linear(_t(rng, c * image * image, 4, scale=0.7), _t(rng, c * image * image, scale=0.2)),
        Reshape((c, image, image)),
        ops.Conv(_t(rng, c, c, 3, 3, scale=0.4), _t(rng, c, scale=0.2), (1, 1), (0, 0), (0, 0), (1, 1),
                 transposed=True),
        ops.Affine(_t(rng, c, 1, 1, scale=0.8).abs() + 0.2, _t(rng, c, 1, 1, scale=0.3)),
        ReLU(),
        ops.Conv(_t(rng, c, 2, 4, 4, scale=0.4), _t(rng, 2, scale=0.2), (2, 2), (1, 1), (1, 1), (1, 1),
                 transposed=True),
        ops.Affine(_t(rng, 2, 1, 1, scale=0.8), _t(rng, 2, 1, 1, scale=0.3)),
        ReLU(),
        ops.Conv(_t(rng, 3, 2, 3, 3, scale=0.4), _t(rng, 3, scale=0.2), (2, 2), (1, 1), (1, 1), (1, 1)),
        Flatten(),
    ]
    shape = Network(tuple(layers), (4,)).output_shape
    layers.append(Linear(_t(rng, 2, shape[0], scale=0.3), _t(rng, 2, scale=0.2)))
    return Network(tuple(layers), (4,))


def _network(kind: str, template: str, rng) -> Network:
    if kind == "generator":
        return generator_graph(rng)
    if kind.startswith("pair:"):
        return pairs_graph(rng, kind[5:])
    return TEMPLATES[template](rng, NONLINEAR[kind])


@pytest.mark.parametrize("kind", ["generator"] + AVAILABLE + [f"pair:{name}" for name in PAIRS_AVAILABLE])
@given(template=st.sampled_from(sorted(TEMPLATES)), seed=st.integers(0, 2**32 - 1),
       width=st.sampled_from([1e-3, 0.3, 2.0]))
@FAST
def test_forward_bounds_contain_every_sampled_tensor(kind, template, seed, width):
    """Per-side forward bounds and, with ``symbols``, forward bounds whose ReLUs add error symbols
    (the hybrid bounds' forward pass, each of the 3 domains with its own symbols)."""
    rng = np.random.default_rng(seed)
    network = _network(kind, template, rng)
    batch = 3
    shape = (batch, *network.input_shape)
    center = torch.as_tensor(rng.uniform(-1, 1, size=shape))
    radius = torch.as_tensor(rng.uniform(0, width / 2, size=shape))
    lower, upper = center - radius, center + radius
    x = sample_box(lower, upper, rng, SAMPLES)
    with torch.no_grad():
        values = network.tensors(x.reshape(SAMPLES * batch, *network.input_shape))
    for dtype in (torch.float64, torch.float32):
        plan = plan_for(network, dtype)
        for symbols in (False, True):
            bounds = forward_bounds(plan, lower.to(dtype), upper.to(dtype),
                                    lambda position, low, high, members=None: (low, high), symbols=symbols)
            assert set(plan.relu_positions) | set(plan.operator_inputs) - {0} <= set(bounds)
            for tensor, (low, high) in bounds.items():
                value = values[tensor].reshape(SAMPLES, batch, -1)
                low, high = low.reshape(1, batch, -1).double(), high.reshape(1, batch, -1).double()
                what = f"{dtype}{' symbols' if symbols else ''} tensor {tensor}"
                assert (value >= low).all(), f"{what}: below by {float((low - value).max()):.3g}"
                assert (value <= high).all(), f"{what}: above by {float((value - high).max()):.3g}"
    y = forward_batched(network, x)
    for dtype in ("float64", "float32"):
        for intermediate in ("forward", "hybrid"):
            result = compute_bounds(network, (lower, upper), dtype=dtype, intermediate_method=intermediate)
            low, high = result.lower.double().unsqueeze(0), result.upper.double().unsqueeze(0)
            assert (y >= low).all() and (y <= high).all(), f"CROWN {dtype} with {intermediate} intermediate bounds"
            relu_values = [values[t].reshape(SAMPLES, batch, -1) for t in plan.relu_positions]
            for k, value in enumerate(relu_values):
                low = result.intermediate.lower[k].reshape(1, batch, -1).double()
                high = result.intermediate.upper[k].reshape(1, batch, -1).double()
                assert (value >= low).all() and (value <= high).all(), f"{intermediate} {dtype}: ReLU layer {k}"


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@given(seed=st.integers(0, 2**32 - 1), width=st.sampled_from([1e-3, 0.3, 2.0]))
@FAST
def test_walks_stopped_at_a_cut_bound_every_sample(dtype, seed, width):
    """CROWN rows of the output walked back only to each cut tensor, then through its forward
    bounds, must hold on every sample (and the cuts of a chain are all its tensors); with error
    symbols, the cut's coefficients on them are concretised there, or folded into its budgets."""
    from assay.bounds.crown import backsubstitute, concretize
    from assay.bounds.forward import cut_tensors
    from assay.bounds.ibp import center_radius, interval_pass

    rng = np.random.default_rng(seed)
    network = generator_graph(rng)
    plan = plan_for(network, dtype)
    assert cut_tensors(plan) == list(range(1, len(plan.stages) + 1))
    lower = torch.as_tensor(rng.uniform(-1, 1, size=(3, 4)))
    upper = lower + torch.as_tensor(rng.uniform(0, width, size=(3, 4)))
    lower, upper = lower.to(dtype), upper.to(dtype)
    bounds = interval_pass(plan, lower, upper)
    center, radius = center_radius(lower, upper)
    C = torch.eye(2, dtype=dtype).expand(3, 2, 2)
    C = torch.cat([C, -C], 1)
    x = sample_box(lower.double(), upper.double(), rng, SAMPLES)
    y = forward_batched(network, x)
    values = torch.cat([y, -y], 2)
    for symbols in (False, True):
        cuts = {}
        forward_bounds(plan, lower, upper, lambda position, low, high, members=None: (low, high),
                       keep=set(range(1, 11)), cuts=cuts, symbols=symbols)
        if symbols:  # the symbols reached the cuts (unless no neuron is unstable on narrow boxes)
            assert any(cut.functions.a_lo.shape[1] > 4 for cut in cuts.values()) or width < 0.01
        for stop, whole in cuts.items():
            for cut in (whole, whole.folded()) if symbols else (whole,):
                back = backsubstitute(plan, len(plan.stages), C, torch.zeros(3, 4, dtype=dtype), bounds, cut=cut)
                low = concretize(plan, back, center, radius)[0].double()
                what = f"cut at {stop}{' with symbols' if symbols else ''}"
                assert (values >= low.unsqueeze(0)).all(), f"{what}: below by {float((low - values).max()):.3g}"


def test_a_tensor_that_is_not_a_cut_is_refused():
    """A residual connection around tensor 2 (stage 3 reads tensor 1): 2 is no cut."""
    from assay.bounds.crown import backsubstitute
    from assay.bounds.forward import cut_tensors
    from assay.bounds.ibp import interval_pass

    rng = np.random.default_rng(0)
    layers = (Linear(_t(rng, 3, 2), _t(rng, 3)), ReLU(), Linear(_t(rng, 3, 3), _t(rng, 3)), ops.Binary("Add"),
              Linear(_t(rng, 1, 3), _t(rng, 1)))
    network = Network(layers, (2,), sources=((0,), (1,), (2,), (3, 1), (4,)))
    plan = plan_for(network, torch.float64)
    assert 2 not in cut_tensors(plan) and 4 in cut_tensors(plan)
    lower, upper = -torch.ones(1, 2, dtype=torch.float64), torch.ones(1, 2, dtype=torch.float64)
    cuts = {}
    forward_bounds(plan, lower, upper, lambda position, low, high: (low, high), keep={2}, cuts=cuts)
    with pytest.raises(ValueError, match="not a cut"):
        backsubstitute(plan, len(plan.stages), torch.ones(1, 1, 1, dtype=torch.float64),
                       torch.zeros(1, 1, dtype=torch.float64), interval_pass(plan, lower, upper), cut=cuts[2])


def test_forward_bounds_of_a_generator_are_tighter_than_intervals():
    """The point of forward bounds on a generator: far tighter than IBP on its last tensors."""
    rng = np.random.default_rng(3)
    network = generator_graph(rng, channels=4)
    lower, upper = -0.1 * torch.ones(1, 4), 0.1 * torch.ones(1, 4)
    forward = compute_bounds(network, (lower, upper), intermediate_method="forward")
    ibp = compute_bounds(network, (lower, upper), method="ibp")
    assert ((forward.upper - forward.lower) < (ibp.upper - ibp.lower)).all()


def test_forward_is_chosen_only_where_backward_bounds_are_costly():
    rng = np.random.default_rng(0)
    small = Network((Linear(_t(rng, 50, 5), _t(rng, 50)), ReLU(), Linear(_t(rng, 50, 50), _t(rng, 50)), ReLU(),
                     Linear(_t(rng, 5, 50), _t(rng, 5))), (5,))
    assert intermediate_method_for(plan_for(small, torch.float64)) == "crown"
    # 5 inputs, then 64 × 32 × 32 activations: backward CROWN walks ~10⁵ elements per neuron
    big = Network((Linear(_t(rng, 64 * 4, 5), _t(rng, 64 * 4)), Reshape((64, 2, 2)),
                   ops.Resize((1, 16, 16)), ReLU(), Flatten(), Linear(_t(rng, 1, 64 * 32 * 32), _t(rng, 1))), (5,))
    assert intermediate_method_for(plan_for(big, torch.float64)) == "hybrid"
    wide = Network((Linear(_t(rng, 10, 300), _t(rng, 10)), ReLU(), Linear(_t(rng, 1, 10), _t(rng, 1))), (300,))
    assert intermediate_method_for(plan_for(wide, torch.float64)) == "crown"  # too many inputs for forward bounds


def test_hybrid_walks_skip_tensors_that_only_affine_stages_separate_from_their_cut():
    """A CROWN walk crossing affine stages only, then substituting the cut's forward bounds, gives
    the forward bounds again: such tensors get no walk (a 64×64 cgan's discriminator spent most of
    each box on them); a tensor whose walk crosses a ReLU keeps its walk."""
    from assay.bounds.api import _hybrid_walks

    rng = np.random.default_rng(1)
    network = Network((Linear(_t(rng, 16, 4), _t(rng, 16)), ReLU(), Linear(_t(rng, 16, 16), _t(rng, 16)), ReLU(),
                       Linear(_t(rng, 2, 16), _t(rng, 2))), (4,))
    walks = _hybrid_walks(plan_for(network, torch.float64))
    assert 1 not in walks  # behind one Linear: the forward bounds are what a walk would give
    assert walks[3] == 0  # crosses the first ReLU: its relaxation is chosen per row
    # and the bounds with or without the skipped walk agree (to rounding)
    lower, upper = -0.3 * torch.ones(1, 4, dtype=torch.float64), 0.3 * torch.ones(1, 4, dtype=torch.float64)
    hybrid = compute_bounds(network, (lower, upper), intermediate_method="hybrid")
    crown = compute_bounds(network, (lower, upper), intermediate_method="crown")
    torch.testing.assert_close(hybrid.intermediate.lower[0], crown.intermediate.lower[0], rtol=1e-9, atol=1e-9)
    torch.testing.assert_close(hybrid.intermediate.upper[0], crown.intermediate.upper[0], rtol=1e-9, atol=1e-9)
