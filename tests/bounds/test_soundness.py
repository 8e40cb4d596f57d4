"""Conformance suite: every bound method must contain every sampled output.

Each test draws a random small network and random input domains, computes bounds, and tries to
falsify them with 10⁴ sampled inputs per domain (a quarter at box vertices). It also checks
the expected ordering of tightness: CROWN no looser than IBP, α-CROWN no looser than CROWN,
β-CROWN with splits no looser than without.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from assay.bounds import AlphaCrownOptions, BetaCrownOptions, compute_bounds
from assay.errors import UnsupportedOperatorError
from assay.nn.layers import MaxPool2d

from .strategies import (
    conv_networks,
    dense_networks,
    forward_batched,
    graph_networks,
    perturbed_network,
    random_boxes,
    random_splits,
    sample_box,
    satisfies_splits,
)

SAMPLES = 10_000
FAST = settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
networks = st.one_of(dense_networks(), conv_networks(), graph_networks())


def assert_contains(result, outputs, mask=None):
    """outputs (n, B, S); every (masked) sample lies within [lower, upper]."""
    lower, upper = result.lower.unsqueeze(0), result.upper.unsqueeze(0)
    below = outputs < lower
    above = outputs > upper
    if mask is not None:
        below &= mask.unsqueeze(-1)
        above &= mask.unsqueeze(-1)
    assert not below.any(), f"a sampled output lies below the lower bound by {(lower - outputs)[below].max().item():.3g}"
    assert not above.any(), f"a sampled output lies above the upper bound by {(outputs - upper)[above].max().item():.3g}"


@pytest.mark.parametrize("method", ["ibp", "crown", "alpha"])
@pytest.mark.parametrize("dtype", ["float64", "float32"])
@FAST
@given(network=networks, seed=st.integers(0, 2**32 - 1))
def test_bounds_contain_sampled_outputs(method, dtype, network, seed):
    rng = np.random.default_rng(seed)
    lower, upper = random_boxes(network, rng, batch=3)
    options = AlphaCrownOptions(iterations=5) if method == "alpha" else None
    result = compute_bounds(network, (lower, upper), method=method, dtype=dtype, options=options)
    outputs = forward_batched(network, sample_box(lower, upper, rng, SAMPLES))
    assert_contains(result, outputs)


@pytest.mark.parametrize("method", ["crown", "alpha"])
@FAST
@given(network=networks, seed=st.integers(0, 2**32 - 1))
def test_linear_bounds_contain_sampled_outputs(method, network, seed):
    rng = np.random.default_rng(seed)
    lower, upper = random_boxes(network, rng, batch=2)
    options = AlphaCrownOptions(iterations=5) if method == "alpha" else None
    result = compute_bounds(network, (lower, upper), method=method, options=options, return_linear=True)
    x = sample_box(lower, upper, rng, SAMPLES)
    outputs = forward_batched(network, x)  # (n, B, S)
    linear_lower, linear_upper = result.linear.evaluate(x.transpose(0, 1))  # (B, n, S)
    slack = 1e-9 * (1 + outputs.abs())
    assert (linear_lower.transpose(0, 1) <= outputs + slack).all()
    assert (linear_upper.transpose(0, 1) >= outputs - slack).all()


@pytest.mark.parametrize("method,draft", [("crown", None), ("alpha", None), ("beta", None),
                                          ("alpha", "float32"), ("beta", "float32")])
@FAST
@given(network=networks, seed=st.integers(0, 2**32 - 1))
def test_split_bounds_contain_outputs_inside_the_split_region(method, draft, network, seed):
    """(``draft``: slopes and multipliers optimised in float32, bounds in float64.)"""
    rng = np.random.default_rng(seed)
    lower, upper = random_boxes(network, rng, batch=3, max_width=2.0)
    parent = compute_bounds(network, (lower, upper), method="crown")
    splits = random_splits(network, parent.intermediate, rng)
    options = {"alpha": AlphaCrownOptions(iterations=5, draft_dtype=draft),
               "beta": BetaCrownOptions(iterations=5, draft_dtype=draft)}.get(method)
    result = compute_bounds(network, (lower, upper), method=method, splits=splits, options=options)
    x = sample_box(lower, upper, rng, SAMPLES)
    mask = satisfies_splits(network, x, splits)
    assert_contains(result, forward_batched(network, x), mask)
    # A domain with no sampled point may be empty; one with points cannot be reported empty.
    assert not (torch.isinf(result.lower).all(1) & mask.any(0)).any()


def sampled_relu_inputs(network, x):
    """Pre-activations of every ReLU layer for x (n, B, *input_shape): list of (n, B, units)."""
    n, batch = x.shape[:2]
    return [z.reshape(n, batch, -1) for z in network.pre_activations(x.reshape(n * batch, *network.input_shape))]


@pytest.mark.parametrize("intermediate_method, method", [("forward", "crown"), ("alpha", "alpha"), ("alpha", "beta")])
@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("with_splits", [False, True])
@FAST
@given(network=networks, seed=st.integers(0, 2**32 - 1))
def test_intermediate_bounds_contain_sampled_activations(intermediate_method, method, dtype, with_splits, network,
                                                         seed):
    """(With "beta", the split constraints of earlier layers enter every intermediate bound with
    multipliers of their own, at a large learning rate: the bounds must still hold on the split
    region.)"""
    rng = np.random.default_rng(seed)
    lower, upper = random_boxes(network, rng, batch=3, max_width=2.0)
    if intermediate_method == "forward" and any(isinstance(layer, MaxPool2d) for layer in network.layers):
        with pytest.raises(UnsupportedOperatorError, match="MaxPool2d"):  # forward bounds walk ReLU networks only
            compute_bounds(network, (lower, upper), intermediate_method="forward")
        return
    splits = random_splits(network, compute_bounds(network, (lower, upper)).intermediate, rng) if with_splits else None
    options = {"alpha": AlphaCrownOptions(iterations=5), "beta": BetaCrownOptions(iterations=5, lr_beta=1.0)}.get(method)
    result = compute_bounds(network, (lower, upper), method=method, dtype=dtype, intermediate_method=intermediate_method,
                            splits=splits, options=options)
    x = sample_box(lower, upper, rng, SAMPLES)
    mask = satisfies_splits(network, x, splits) if with_splits else torch.ones(x.shape[:2], dtype=torch.bool)
    assert_contains(result, forward_batched(network, x), mask)
    for k, z in enumerate(sampled_relu_inputs(network, x)):
        low = result.intermediate.lower[k].reshape(1, z.shape[1], -1)
        high = result.intermediate.upper[k].reshape(1, z.shape[1], -1)
        outside = ((z < low) | (z > high)) & mask.unsqueeze(-1)
        assert not outside.any(), f"ReLU layer {k}: a sampled pre-activation lies outside its {intermediate_method} bounds"


@FAST
@given(network=networks, seed=st.integers(0, 2**32 - 1), delta=st.sampled_from([0.0, 0.01]))
def test_alpha_intermediate_bounds_are_inside_crowns_and_stay_sound(network, seed, delta):
    """Intermediate α-CROWN starts from CROWN's bounds and keeps the best iterate: the second
    ReLU layer's intervals (the first that α tightens, on the same first-layer bounds) are inside
    CROWN's, and every sampled output stays inside (with and without perturbed weights, which
    take the tracked-magnitude path). (Later layers are not compared: CROWN's adaptive slopes
    on tighter earlier bounds can loosen a single neuron, so neither side contains the other.)"""
    rng = np.random.default_rng(seed)
    lower, upper = random_boxes(network, rng, batch=2, max_width=2.0)
    crown = compute_bounds(network, (lower, upper), method="alpha", options=AlphaCrownOptions(iterations=0),
                           weight_perturbation=delta or None)
    tight = compute_bounds(network, (lower, upper), method="alpha", options=AlphaCrownOptions(iterations=8),
                           weight_perturbation=delta or None, intermediate_method="alpha")
    for k in range(min(2, len(crown.intermediate.lower))):
        assert (tight.intermediate.lower[k] >= crown.intermediate.lower[k]).all()
        assert (tight.intermediate.upper[k] <= crown.intermediate.upper[k]).all()
    moved = perturbed_network(network, rng, delta) if delta else network
    assert_contains(tight, forward_batched(moved, sample_box(lower, upper, rng, SAMPLES)))


@FAST
@given(network=networks, seed=st.integers(0, 2**32 - 1))
def test_reused_intermediate_bounds_stay_sound_on_a_subdomain(network, seed):
    rng = np.random.default_rng(seed)
    lower, upper = random_boxes(network, rng, batch=2)
    parent = compute_bounds(network, (lower, upper), method="crown")
    cut = torch.as_tensor(rng.uniform(size=lower.shape))
    child_upper = lower + (upper - lower) * cut
    child = compute_bounds(network, (lower, child_upper), method="crown", intermediate=parent.intermediate)
    assert_contains(child, forward_batched(network, sample_box(lower, child_upper, rng, SAMPLES)))


@pytest.mark.parametrize("method", ["ibp", "crown"])
@FAST
@given(network=networks, seed=st.integers(0, 2**32 - 1), delta=st.sampled_from([0.0, 0.01, 0.1]))
def test_interval_weight_bounds_contain_perturbed_networks(method, network, seed, delta):
    rng = np.random.default_rng(seed)
    lower, upper = random_boxes(network, rng, batch=2)
    result = compute_bounds(network, (lower, upper), method=method, weight_perturbation=delta)
    for _ in range(10):
        moved = perturbed_network(network, rng, delta)
        assert_contains(result, forward_batched(moved, sample_box(lower, upper, rng, SAMPLES // 10)))


def test_interval_weights_are_sound_for_inputs_of_either_sign():
    """x ∈ [1, 2] times w ∈ [0.9, 1.1]: the product ranges over [0.9, 2.2]."""
    from assay.nn import Linear, Network

    network = Network((Linear(torch.ones(1, 1), torch.zeros(1)),), (1,))
    for method in ("ibp", "crown"):
        result = compute_bounds(network, (torch.ones(1), 2 * torch.ones(1)), method=method, weight_perturbation=0.1)
        # the bias moves by ±0.1 too: [0.9 - 0.1, 2.2 + 0.1]
        assert result.lower.item() <= 0.8 and result.upper.item() >= 2.3
    exact = compute_bounds(network, (torch.ones(1), 2 * torch.ones(1)), method="ibp", weight_perturbation=0.1)
    assert exact.lower.item() == pytest.approx(0.8) and exact.upper.item() == pytest.approx(2.3)
    negative = compute_bounds(network, (-2 * torch.ones(1), -torch.ones(1)), method="ibp", weight_perturbation=0.1)
    assert negative.lower.item() == pytest.approx(-2.2 - 0.1) and negative.upper.item() == pytest.approx(-0.9 + 0.1)


def _mean_width(result):
    return (result.upper - result.lower).mean().item()


def test_tightness_ordering_on_average():
    """Averaged over random networks: IBP ≥ CROWN ≥ α-CROWN widths; β with splits ≤ without."""
    rng = np.random.default_rng(7)
    widths = {"ibp": [], "crown": [], "alpha": []}
    split_gain = []
    for trial in range(12):
        network = _example_network(trial)
        lower, upper = random_boxes(network, rng, batch=4)
        for method in widths:
            widths[method].append(_mean_width(compute_bounds(network, (lower, upper), method=method)))
        crown = compute_bounds(network, (lower, upper), method="crown")
        splits = random_splits(network, crown.intermediate, rng)
        without = compute_bounds(network, (lower, upper), method="beta", splits=None)
        with_splits = compute_bounds(network, (lower, upper), method="beta", splits=splits)
        finite = torch.isfinite(with_splits.lower).all(1)
        split_gain.append(((without.upper - without.lower)[finite] - (with_splits.upper - with_splits.lower)[finite]).mean().item()
                          if finite.any() else 0.0)
    mean = {m: float(np.mean(w)) for m, w in widths.items()}
    assert mean["crown"] <= mean["ibp"]
    assert mean["alpha"] <= mean["crown"]
    assert float(np.mean(split_gain)) >= 0.0
    # Elementwise, CROWN results are intersected with IBP and α-CROWN starts from CROWN.
    for a, b in zip(widths["crown"], widths["ibp"]):
        assert a <= b + 1e-9
    for a, b in zip(widths["alpha"], widths["crown"]):
        assert a <= b + 1e-9


def _example_network(trial: int):
    from assay.nn import Conv2d, Flatten, Linear, Network, ReLU

    rng = np.random.default_rng(trial)
    if trial % 2:
        widths = [4, 12, 12, 12, 3]
        layers = []
        for i, (a, b) in enumerate(zip(widths[:-1], widths[1:])):
            layers.append(Linear(torch.as_tensor(rng.normal(0, 1 / np.sqrt(a) * 1.5, (b, a))), torch.as_tensor(rng.normal(0, 0.3, b))))
            if i < len(widths) - 2:
                layers.append(ReLU())
        return Network(tuple(layers), (4,))
    layers = (
        Conv2d(torch.as_tensor(rng.normal(0, 0.5, (3, 1, 3, 3))), torch.as_tensor(rng.normal(0, 0.2, 3)), 1, 1), ReLU(),
        Flatten(), Linear(torch.as_tensor(rng.normal(0, 0.2, (8, 75))), torch.as_tensor(rng.normal(0, 0.2, 8))), ReLU(),
        Linear(torch.as_tensor(rng.normal(0, 0.5, (3, 8))), torch.zeros(3)),
    )
    return Network(layers, (1, 5, 5))


@settings(max_examples=5, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(network=dense_networks(), seed=st.integers(0, 2**32 - 1))
def test_many_domains_grouped_by_unstable_count_stay_sound_and_match_one_by_one(network, seed):
    """Above 32 domains intermediate CROWN groups domains by unstable count: same bounds, still sound."""
    rng = np.random.default_rng(seed)
    lower, upper = random_boxes(network, rng, batch=80)
    together = compute_bounds(network, (lower, upper), method="crown")
    one_by_one = torch.cat([compute_bounds(network, (lower[i:i + 1], upper[i:i + 1]), method="crown").lower
                            for i in range(lower.shape[0])])
    assert torch.allclose(together.lower, one_by_one, rtol=1e-9, atol=1e-9)
    assert_contains(together, forward_batched(network, sample_box(lower, upper, rng, 1000)))


@FAST
@given(network=networks, seed=st.integers(0, 2**32 - 1))
def test_warm_started_alphas_stay_sound(network, seed):
    """Any starting slopes give sound bounds (they are clamped to [0, 1]), and so do a result's
    own slopes passed back (the warm start of branch and bound)."""
    rng = np.random.default_rng(seed)
    lower, upper = random_boxes(network, rng, batch=2, max_width=2.0)
    first = compute_bounds(network, (lower, upper), method="alpha", options=AlphaCrownOptions(iterations=5))
    rows = first.C.shape[1] * 2
    wild = [None if a is None else torch.as_tensor(rng.uniform(-0.5, 1.5, size=(2, rows, *a.shape[2:])))
            for a in first.alphas]
    result = compute_bounds(network, (lower, upper), method="alpha", alphas=wild, options=AlphaCrownOptions(iterations=2))
    x = sample_box(lower, upper, rng, SAMPLES)
    assert_contains(result, forward_batched(network, x))
    again = compute_bounds(network, (lower, upper), method="alpha", alphas=first.alphas,
                           options=AlphaCrownOptions(iterations=0))
    assert_contains(again, forward_batched(network, x))
    assert all((a is None) == (b is None) for a, b in zip(again.alphas, first.alphas))


def _stably_active_chain(rng, widths, residual: bool, biases: bool = True, mixed_signs: bool = False):
    """A dense network whose ReLUs are all active on [0, 1]^n, so CROWN is exact on it and
    rounding is the only gap: positive weights into the hidden layers with biases in [1, 2] or none,
    or (``mixed_signs``) small weights of either sign with biases near 30, far above what the
    weights can subtract. ``residual`` adds a skip connection. Weights are float32 numbers (as ONNX
    models carry them)."""
    from assay.nn import Add, Linear, Network, ReLU

    def f32(*shape, scale):
        return torch.as_tensor(rng.uniform(0.0, scale, size=shape).astype(np.float32), dtype=torch.float64)

    layers, sources = [], []
    for i, (fan_in, fan_out) in enumerate(zip(widths[:-1], widths[1:])):
        last = i == len(widths) - 2
        normal = torch.as_tensor(rng.normal(0.0, 1.0, size=(fan_out, fan_in)).astype(np.float32), dtype=torch.float64)
        if last:
            weight = normal
        else:
            weight = (normal * np.float32(0.1 / np.sqrt(fan_in))).to(torch.float32).to(torch.float64) if mixed_signs \
                else f32(fan_out, fan_in, scale=2.0 / fan_in)
        bias = f32(fan_out, scale=1.0) + (30.0 if mixed_signs else 1.0) if biases else torch.zeros(fan_out, dtype=torch.float64)
        layers.append(Linear(weight, bias))
        sources.append((len(layers) - 1,))
        if not last:
            layers.append(ReLU())
            sources.append((len(layers) - 1,))
    if residual:  # h2 + h1 before the last Linear (both of width widths[1])
        assert widths[1] == widths[2]
        layers.insert(4, Add())
        sources = [(0,), (1,), (2,), (3,), (4, 2)] + [(k,) for k in range(5, len(layers))]
    return Network(tuple(layers), (widths[0],), sources=tuple(sources))


def _exact_affine_minimum(network, C, lower, upper):
    """min over the box of C·f(x) for a network that is affine on it (every ReLU active), in
    float64 from the composed map (its rounding is ~1e-16 relative: negligible next to float32's)."""
    x0 = torch.zeros(1, network.input_size, dtype=torch.float64)
    eye = torch.eye(network.input_size, dtype=torch.float64)
    bias = network.forward(x0)  # f(0)
    jacobian = network.forward(eye) - bias  # row j: f(e_j) − f(0)
    A = C @ jacobian.T  # (S, n)
    center, radius = (lower + upper) / 2, (upper - lower) / 2
    return (A @ center) - (A.abs() @ radius) + C @ bias[0]


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("residual", [False, True])
@pytest.mark.parametrize("mixed_signs", [False, True])
def test_crown_bound_on_an_affine_network_is_below_the_exact_minimum_and_close_to_it(dtype, residual, mixed_signs):
    """Where CROWN is exact (every ReLU stable), its bound differs from the true minimum by
    rounding only: the margin must keep it below (a missing rounding term shows in float32, whose
    errors are ~1e-7 relative on wide layers), and stay small (a margin that grows with products
    of absolute weights is ~10^4 times the bound on deep networks)."""
    rng = np.random.default_rng(0)
    widths = [64, 300, 300, 300, 300, 20] if residual else [64, 300, 300, 300, 300, 300, 20]
    network = _stably_active_chain(rng, widths, residual, mixed_signs=mixed_signs)
    lower = torch.zeros(1, 64, dtype=torch.float64)
    upper = torch.ones(1, 64, dtype=torch.float64)
    C = torch.as_tensor(rng.normal(size=(40, 20)), dtype=torch.float64).to(torch.float32).to(torch.float64)
    result = compute_bounds(network, (lower, upper), method="crown", spec=C, dtype=dtype)
    assert all(bool((l >= 0).all()) for l in result.intermediate.lower), "the network must be affine on the box"
    exact = _exact_affine_minimum(network, C, lower[0], upper[0])
    scale = exact.abs().max()
    assert (result.lower[0] <= exact).all(), "a bound lies above the exact minimum: a rounding term is missing"
    assert ((exact - result.lower[0]) <= (1e-2 if dtype == "float32" else 1e-10) * scale).all()
    assert (result.upper[0] >= -_exact_affine_minimum(network, -C, lower[0], upper[0])).all()

@pytest.mark.parametrize("residual", [False, True])
def test_walk_rounding_terms_cover_the_float32_walks_deviation(residual):
    """The walk's own rounding terms (``error``, without the final evaluation's)
    cover how far the float32 linear bound can lie above the float64 one anywhere on the box,
    on a network where both walks use the same exact relaxations (every ReLU active). Without
    biases the offset owes nothing, so the coefficients' terms alone must cover the deviation."""
    from assay.bounds.crown import backsubstitute
    from assay.bounds.ibp import interval_pass
    from assay.bounds.plan import plan_for

    rng = np.random.default_rng(1)
    widths = [64, 300, 300, 300, 300, 20] if residual else [64, 300, 300, 300, 300, 300, 20]
    network = _stably_active_chain(rng, widths, residual, biases=False)
    C = torch.as_tensor(rng.normal(size=(1, 40, 20)).astype(np.float32), dtype=torch.float64)
    walks = {}
    for dtype in (torch.float32, torch.float64):
        plan = plan_for(network, dtype)
        # x ≥ 0.5: every pre-activation is clearly positive, so no rounding makes a neuron unstable
        bounds = interval_pass(plan, torch.full((1, 64), 0.5, dtype=dtype), torch.ones(1, 64, dtype=dtype))
        walks[dtype] = plan, backsubstitute(plan, len(plan.stages), C.to(dtype), torch.zeros(1, 40, dtype=dtype), bounds)
    plan32, low32 = walks[torch.float32]
    _, low64 = walks[torch.float64]
    gap = low32.A.double() - low64.A  # (1, S, 64), over x in [0.5, 1]
    deviation = torch.maximum(gap * 0.5, gap).sum(-1) + (low32.b.double() - low64.b)
    owed = low32.error.double()
    assert (deviation > 0).any(), "the walks must differ, or the test proves nothing"
    assert (deviation <= owed).all()


def test_walk_rounding_terms_cover_the_float32_walks_bias_sum():
    """The float32 walk's offset b, a bias sum over 4,000 outputs (taken in float64 and charged
    float64's γ only), lies within the walk's ``error`` of the exact sum. On the input point 0 the
    coefficients' rounding terms vanish (they scale with the input's magnitude), and rows nearly
    orthogonal to the bias make b small next to its terms, so nothing but the offset's own charge
    covers its rounding: summing the biases in float32 while charging float64's γ fails this (an
    error ~10⁻⁴ against a charge ~10⁻⁷)."""
    from assay.bounds.crown import backsubstitute
    from assay.bounds.ibp import interval_pass
    from assay.bounds.plan import plan_for
    from assay.nn import Linear, Network

    rng = np.random.default_rng(2)
    f32 = lambda t: t.to(torch.float32).to(torch.float64)  # noqa: E731
    bias = f32(torch.as_tensor(rng.normal(size=4000)) * 30)
    network = Network((Linear(f32(torch.as_tensor(rng.normal(size=(4000, 64)))), bias),), (64,), sources=((0,),))
    C = torch.as_tensor(rng.normal(size=(40, 4000)))
    C = f32(C - (C @ bias / (bias @ bias)).unsqueeze(1) * bias).unsqueeze(0)  # C·bias ≈ 0 (before rounding C)
    exact = C[0] @ bias  # float32 products, float64 sum: ~1e-16 of Σ|products| ≈ 1e5
    plan = plan_for(network, torch.float32)
    zero = torch.zeros(1, 64, dtype=torch.float32)
    back = backsubstitute(plan, 1, C.to(torch.float32), torch.zeros(1, 40, dtype=torch.float32),
                          interval_pass(plan, zero, zero))
    owed = back.error.double()
    assert (owed < 1e-6).all(), "the offset's charge must be tiny, or the test proves nothing"
    assert ((back.b.double() - exact).abs() <= owed).all()


def test_casting_bounds_to_float32_rounds_outwards():
    """Round to nearest would move an end inwards by up to half an ulp (0.1 → 0.100000001…):
    the cast bounds must contain the float64 ones, and exact values must stay put."""
    from assay.bounds.ibp import cast_outward

    lower = torch.tensor([0.1, -0.1, 0.5, 1 / 3, -2.0**30 - 1], dtype=torch.float64)
    upper = lower + torch.tensor([0.0, 1e-12, 0.25, 0.0, 0.0], dtype=torch.float64)
    low, high = cast_outward(lower, upper, torch.float32)
    assert low.dtype == high.dtype == torch.float32
    assert (low.double() <= lower).all() and (high.double() >= upper).all()
    assert low[2] == 0.5 and high[2] == 0.75  # representable: unchanged
    assert (low.double() < lower).any() and (high.double() > upper).any()  # some ends did move outwards
    same = cast_outward(lower, upper, torch.float64)
    assert torch.equal(same[0], lower) and torch.equal(same[1], upper)


def test_float32_bounds_hold_for_rows_that_float32_cannot_represent():
    """A row C·y + d whose C and d round in float32 (d = 2^24 + 1 becomes 2^24): the bounds are
    those of the exact row, checked at the box's one point in float64."""
    from assay.nn import Linear, Network

    network = Network((Linear(torch.tensor([[3.0, -1.0]], dtype=torch.float64), torch.tensor([0.5], dtype=torch.float64)),),
                      (2,))
    point = torch.tensor([[1024.0, 3.0]], dtype=torch.float64)  # y = 3069.5, exact in float32
    C = torch.tensor([[1 + 2.0**-30]], dtype=torch.float64)
    d = torch.tensor([2.0**24 + 1], dtype=torch.float64)
    exact = (C[0, 0] * 3069.5 + d[0]).item()
    for method in ("ibp", "crown", "alpha"):
        result = compute_bounds(network, (point, point), method=method, spec=(C, d), dtype="float32")
        assert result.lower.double().item() <= exact <= result.upper.double().item(), method


@pytest.mark.parametrize("seed", range(4))
def test_a_drafted_bound_is_the_float64_bound_of_its_start_or_its_best_draft(seed):
    """The float32 iterates only choose slopes: the bound returned is the float64 bound at the
    starting slopes or at the slopes returned (the best draft), whichever is tighter, to the bit.
    Returning a float32 iterate's own value (rounding uncharged) would break the equality."""
    rng = np.random.default_rng(seed)
    network = _small_relu_chain(rng)
    lower = torch.as_tensor(rng.uniform(-1, 0, (2, 6)))
    upper = lower + torch.as_tensor(rng.uniform(0.5, 1.5, (2, 6)))
    drafted = compute_bounds(network, (lower, upper), method="alpha",
                             options=AlphaCrownOptions(iterations=10, draft_dtype="float32"))
    start = compute_bounds(network, (lower, upper), method="alpha", options=AlphaCrownOptions(iterations=0))
    at_best = compute_bounds(network, (lower, upper), method="alpha", options=AlphaCrownOptions(iterations=0),
                             alphas=drafted.alphas)
    assert torch.equal(drafted.upper, torch.minimum(start.upper, at_best.upper))
    assert torch.equal(drafted.lower, torch.maximum(start.lower, at_best.lower))
    assert (drafted.upper < start.upper).any(), "the draft improved nothing: the test proves little"


def _small_relu_chain(rng):
    from assay.nn import Linear, Network, ReLU

    widths = [6, 16, 16, 4]
    layers = []
    for i, (a, b) in enumerate(zip(widths[:-1], widths[1:])):
        layers.append(Linear(torch.as_tensor(rng.normal(0, 1 / np.sqrt(a), (b, a))), torch.as_tensor(rng.normal(0, 0.1, b))))
        if i < len(widths) - 2:
            layers.append(ReLU())
    return Network(tuple(layers), (6,))


def test_draft_dtype_is_checked():
    from assay.errors import OptionError

    with pytest.raises(OptionError, match="draft_dtype"):
        BetaCrownOptions(draft_dtype="float16")
