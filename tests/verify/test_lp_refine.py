"""LP-refined pre-activation bounds of dense networks (assay.verify.lp_refine).

Falsified against the exact range of each refined neuron (one LP per activation pattern of the
layer before it, enumerated on tiny networks), a neuron whose exact maximum is placed 1e-4 above
zero, sampled activations, and an expired deadline.
"""

from __future__ import annotations

import itertools
import time

import numpy as np
import pytest
import torch
from scipy.optimize import linprog

from assay.bounds import compute_bounds
from assay.nn import Conv2d, Flatten, Linear, Network, ReLU
from assay.verify import lp_refine
from assay.verify.lp_refine import dense_layers, refine_bounds, row_upper_bounds


def dense(rng, widths=(3, 5, 4, 2), shift=None):
    layers = []
    for k, (a, b) in enumerate(zip(widths[:-1], widths[1:])):
        bias = rng.normal(size=b) * 0.5
        if shift is not None and k == 1:
            bias = bias + shift
        layers += [Linear(rng.normal(size=(b, a)), bias), ReLU()]
    return Network(tuple(layers[:-1]), (widths[0],))


def exact_second_layer_range(network, lower, upper):
    """min and max of every second-layer pre-activation over the box, by one LP per pattern of the first layer."""
    (W1, b1), (W2, b2) = dense_layers(network)[:2]
    low, high = np.full(len(b2), np.inf), np.full(len(b2), -np.inf)
    for pattern in itertools.product((0.0, 1.0), repeat=len(b1)):
        s = np.array(pattern)
        sign = np.where(s > 0, -1.0, 1.0)
        A_ub, b_ub = sign[:, None] * W1, -sign * b1
        for j in range(len(b2)):
            coef = (W2[j] * s) @ W1
            offset = (W2[j] * s) @ b1 + b2[j]
            for direction in (1.0, -1.0):
                result = linprog(-direction * coef, A_ub=A_ub, b_ub=b_ub, bounds=list(zip(lower, upper)), method="highs")
                if result.status != 0:
                    continue
                value = direction * -result.fun + offset
                low[j], high[j] = min(low[j], value), max(high[j], value)
    return low, high


def crown_intermediate(network, lower, upper):
    box = (torch.as_tensor(lower).reshape(1, -1), torch.as_tensor(upper).reshape(1, -1))
    return compute_bounds(network, box, method="crown").intermediate


@pytest.mark.parametrize("seed", range(6))
def test_refined_bounds_contain_the_exact_range_and_are_no_looser(seed):
    rng = np.random.default_rng(seed)
    network = dense(rng)
    lower, upper = rng.uniform(-1.5, -0.5, 3), rng.uniform(0.5, 1.5, 3)
    given = crown_intermediate(network, lower, upper)
    refined = refine_bounds(network, torch.as_tensor(lower), torch.as_tensor(upper), given)
    low, high = exact_second_layer_range(network, lower, upper)
    assert (refined.lower[1][0].numpy() <= low + 1e-9).all() and (refined.upper[1][0].numpy() >= high - 1e-9).all()
    for k in range(2):
        assert (refined.lower[k] >= given.lower[k]).all() and (refined.upper[k] <= given.upper[k]).all()
    x = torch.as_tensor(rng.uniform(lower, upper, size=(5000, 3)))
    for k, z in enumerate(network.pre_activations(x)):
        assert ((z >= refined.lower[k]) & (z <= refined.upper[k])).all()


def test_the_lp_tightens_crowns_bounds():
    rng = np.random.default_rng(1)
    network = dense(rng, widths=(4, 8, 6, 2))
    lower, upper = -np.ones(4), np.ones(4)
    given = crown_intermediate(network, lower, upper)
    refined = refine_bounds(network, torch.as_tensor(lower), torch.as_tensor(upper), given)
    assert float((refined.upper[1] - refined.lower[1]).sum()) < 0.9 * float((given.upper[1] - given.lower[1]).sum())


@pytest.mark.parametrize("gap", [1e-4, -1e-4])
def test_a_neuron_whose_exact_maximum_is_1e4_from_zero(gap):
    """Shift a second-layer neuron so that its exact maximum is +1e-4 or −1e-4: the refined upper
    bound stays at or above it (a neuron that can turn on is never declared off)."""
    network = dense(np.random.default_rng(4))
    lower, upper = -np.ones(3), np.ones(3)
    _, high = exact_second_layer_range(network, lower, upper)
    shift = np.zeros(len(high))
    shift[0] = gap - high[0]
    shifted = dense(np.random.default_rng(4), shift=shift)
    _, high = exact_second_layer_range(shifted, lower, upper)
    assert abs(high[0] - gap) < 1e-9
    refined = refine_bounds(shifted, torch.as_tensor(lower), torch.as_tensor(upper), crown_intermediate(shifted, lower, upper))
    assert float(refined.upper[1][0, 0]) >= gap


def test_an_expired_deadline_keeps_the_given_bounds_and_other_networks_are_not_refined():
    rng = np.random.default_rng(2)
    network = dense(rng)
    lower, upper = -np.ones(3), np.ones(3)
    given = crown_intermediate(network, lower, upper)
    kept = refine_bounds(network, torch.as_tensor(lower), torch.as_tensor(upper), given, deadline=time.monotonic())
    for k in range(2):
        assert torch.equal(kept.lower[k], given.lower[k]) and torch.equal(kept.upper[k], given.upper[k])
    conv = Network((Conv2d(rng.normal(size=(2, 1, 2, 2)), np.zeros(2)), ReLU(), Flatten(), Linear(rng.normal(size=(2, 8)),
                                                                                                   np.zeros(2))), (1, 3, 3))
    assert dense_layers(conv) is None
    box = (-torch.ones(1, 1, 3, 3, dtype=torch.float64), torch.ones(1, 1, 3, 3, dtype=torch.float64))
    assert refine_bounds(conv, box[0], box[1], compute_bounds(conv, box).intermediate) is None


def feasible_regions(weights, lower, upper, layer):
    """Every activation pattern of the ReLU layers before ``layer`` whose region meets the box, as
    (A_ub, b_ub, A, c): the region is A_ub x ≤ b_ub, where layer ``layer``'s input is A x + c.

    Neuron by neuron, depth first: a partial pattern whose region is already empty (a feasibility
    LP) is not extended, so only the few non-empty regions of a tiny network are enumerated
    instead of all 2^neurons patterns. Closed half-spaces (z ≥ 0 active, z ≤ 0 inactive), as the
    LP of each pattern would have them."""
    bounds = list(zip(lower, upper))

    def nonempty(rows, rhs):
        return linprog(np.zeros(len(lower)), A_ub=np.vstack(rows), b_ub=np.array(rhs), bounds=bounds,
                       method="highs").status == 0

    def layers_from(k, A, c, rows, rhs):
        if k == layer:
            yield np.vstack(rows), np.array(rhs), A, c
            return
        W, b = weights[k]
        zA, zc = W @ A, W @ c + b
        yield from neurons_from(k, zA, zc, 0, [], rows, rhs)

    def neurons_from(k, zA, zc, i, pattern, rows, rhs):
        if i == len(zc):
            s = np.array(pattern)
            yield from layers_from(k + 1, s[:, None] * zA, s * zc, rows, rhs)
            return
        for active in (1.0, 0.0):
            sign = -1.0 if active else 1.0  # active: z ≥ 0 (−z ≤ 0); inactive: z ≤ 0
            more_rows, more_rhs = rows + [sign * zA[i]], rhs + [-sign * zc[i]]
            if nonempty(more_rows, more_rhs):
                yield from neurons_from(k, zA, zc, i + 1, pattern + [active], more_rows, more_rhs)

    yield from layers_from(0, np.eye(len(lower)), np.zeros(len(lower)), [np.zeros(len(lower))], [0.0])


def exact_range(network, lower, upper, layer, directions=(1.0, -1.0)):
    """min and max of every pre-activation of ReLU layer ``layer`` over the box: one LP per
    non-empty activation region of all the layers before it (tiny networks only). With
    ``directions=(1.0,)`` only the maxima are solved for (the minima stay +inf)."""
    weights = dense_layers(network)
    bounds = list(zip(lower, upper))
    W, b = weights[layer]
    low, high = np.full(len(b), np.inf), np.full(len(b), -np.inf)
    for A_ub, b_ub, A, c in feasible_regions(weights, lower, upper, layer):
        zA, zc = W @ A, W @ c + b
        for j in range(len(b)):
            for direction in directions:
                result = linprog(-direction * zA[j], A_ub=A_ub, b_ub=b_ub, bounds=bounds, method="highs")
                if result.status != 0:
                    continue
                value = direction * -result.fun + zc[j]
                low[j], high[j] = min(low[j], value), max(high[j], value)
    return low, high


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_deeper_layers_contain_their_exact_range(seed, dtype):
    """Three ReLU layers: the third layer's bounds come from the LP over two refined layers and
    from CROWN over them (the propagation after each layer); both contain the exact range, also
    when the given bounds are float32 (the float64 LP bounds are rounded outwards into them)."""
    rng = np.random.default_rng(10 + seed)
    network = dense(rng, widths=(3, 4, 3, 3, 2))
    lower, upper = rng.uniform(-1.5, -0.5, 3), rng.uniform(0.5, 1.5, 3)
    box = (torch.as_tensor(lower).reshape(1, -1), torch.as_tensor(upper).reshape(1, -1))
    given = compute_bounds(network, box, method="crown", dtype=dtype).intermediate
    refined = refine_bounds(network, torch.as_tensor(lower), torch.as_tensor(upper), given)
    for k in (1, 2):
        low, high = exact_range(network, lower, upper, k)
        assert (refined.lower[k][0].double().numpy() <= low).all() and (refined.upper[k][0].double().numpy() >= high).all()
        assert (refined.lower[k] >= given.lower[k]).all() and (refined.upper[k] <= given.upper[k]).all()
        assert refined.lower[k].dtype == given.lower[k].dtype


@pytest.mark.parametrize("gap", [1e-4, -1e-4])
def test_a_third_layer_neuron_whose_exact_maximum_is_1e4_from_zero(gap):
    """The propagation after the second layer must not declare a third-layer neuron off that
    can still turn on (exact maximum +1e-4), and may declare it off at −1e-4."""
    rng = np.random.default_rng(21)
    network = dense(rng, widths=(3, 4, 3, 3, 2))
    lower, upper = -np.ones(3), np.ones(3)
    _, high = exact_range(network, lower, upper, 2)
    layers = list(network.layers)
    third = layers[4]
    bias = third.bias.numpy().copy()
    bias[0] += gap - high[0]
    layers[4] = Linear(third.weight.numpy(), bias)
    shifted = Network(tuple(layers), network.input_shape)
    _, high = exact_range(shifted, lower, upper, 2)
    assert abs(high[0] - gap) < 1e-9
    refined = refine_bounds(shifted, torch.as_tensor(lower), torch.as_tensor(upper), crown_intermediate(shifted, lower, upper))
    assert float(refined.upper[2][0, 0]) >= gap


@pytest.mark.parametrize("seed", range(2))
def test_dropping_slack_cuts_keeps_the_lp_and_its_certificate_in_step(seed, monkeypatch):
    """With a cut pool of 0, every cut slack at an objective's optimum is deleted from HiGHS
    after that objective: the rows kept for the certificate must follow (same count, same
    order), and the bounds must still contain the exact range of every refined layer."""
    monkeypatch.setattr(lp_refine, "CUT_POOL", 0)
    dropped = []
    original = lp_refine._Relaxation.drop_slack_cuts

    def watched(self):
        before = len(self.rows)
        original(self)
        assert self.highs.getNumRow() == len(self.rows) == len(self.is_cut)
        dropped.append(before - len(self.rows))

    monkeypatch.setattr(lp_refine._Relaxation, "drop_slack_cuts", watched)
    rng = np.random.default_rng(30 + seed)
    network = dense(rng, widths=(3, 5, 4, 3, 2))
    lower, upper = rng.uniform(-1.5, -0.5, 3), rng.uniform(0.5, 1.5, 3)
    given = crown_intermediate(network, lower, upper)
    refined = refine_bounds(network, torch.as_tensor(lower), torch.as_tensor(upper), given)
    assert sum(dropped) > 0
    for k in (1, 2):
        low, high = exact_range(network, lower, upper, k)
        assert (refined.lower[k][0].numpy() <= low).all() and (refined.upper[k][0].numpy() >= high).all()


def exact_row_maxima(network, lower, upper, C, d):
    """max of every row of C f(x) + d over the box, by enumeration (the rows folded into the last layer)."""
    layers = list(network.layers)
    last = layers[-1]
    layers[-1] = Linear(C @ last.weight.numpy(), C @ last.bias.numpy() + d)
    folded = Network(tuple(layers), network.input_shape)
    return exact_range(folded, lower, upper, len(dense_layers(folded)) - 1, directions=(1.0,))[1]


@pytest.mark.parametrize("seed", range(2))
def test_row_bounds_contain_the_exact_maxima_and_beat_alpha_crown_or_tie(seed):
    """The LP's row bounds over refined pre-activation bounds (three ReLU layers) are at or
    above the exact maxima of the rows (enumerated), and never far above α-CROWN's."""
    rng = np.random.default_rng(40 + seed)
    network = dense(rng, widths=(3, 4, 3, 3, 2))
    lower, upper = rng.uniform(-1.5, -0.5, 3), rng.uniform(0.5, 1.5, 3)
    C, d = rng.normal(size=(3, 2)), rng.normal(size=3)
    given = crown_intermediate(network, lower, upper)
    refined = refine_bounds(network, torch.as_tensor(lower), torch.as_tensor(upper), given)
    bounds = row_upper_bounds(network, torch.as_tensor(lower), torch.as_tensor(upper), refined,
                              torch.as_tensor(C), torch.as_tensor(d))
    exact = exact_row_maxima(network, lower, upper, C, d)
    assert (bounds.numpy() >= exact).all()
    box = (torch.as_tensor(lower).reshape(1, -1), torch.as_tensor(upper).reshape(1, -1))
    alpha = compute_bounds(network, box, spec=(torch.as_tensor(C).unsqueeze(0), torch.as_tensor(d).unsqueeze(0)),
                           method="alpha", intermediate=refined, refine_intermediate=False, sides="upper").upper[0]
    assert (bounds <= alpha + 1e-6).all()


@pytest.mark.parametrize("gap", [1e-4, -1e-4])
def test_a_row_whose_exact_maximum_is_1e4_from_zero(gap):
    """A small box on which every neuron is stable (so the LP is exact) and a row shifted so that
    its exact maximum is ±1e-4: the LP bound is at or above it and within 1e-7 of it (the
    bound decides the row's sign correctly both ways)."""
    rng = np.random.default_rng(41)
    network = dense(rng, widths=(3, 4, 3, 3, 2))
    center = rng.uniform(-1, 1, 3)
    lower, upper = center - 0.01, center + 0.01
    C = np.array([[1.0, -1.0]])
    d = np.array([gap]) - exact_row_maxima(network, lower, upper, C, np.zeros(1))
    assert abs(exact_row_maxima(network, lower, upper, C, d)[0] - gap) < 1e-9
    refined = refine_bounds(network, torch.as_tensor(lower), torch.as_tensor(upper), crown_intermediate(network, lower, upper))
    assert all(((low >= 0) | (high <= 0)).all() for low, high in zip(refined.lower, refined.upper))
    bound = row_upper_bounds(network, torch.as_tensor(lower), torch.as_tensor(upper), refined, torch.as_tensor(C),
                             torch.as_tensor(d))
    assert gap <= float(bound[0]) <= gap + 1e-7


def test_a_solve_stops_at_the_deadline():
    """HiGHS gets the time left as its limit (its clock counts all runs of an LP object): an LP
    that takes seconds to solve, asked for a bound 0.3 s ahead, gives up (+inf, a sound
    "unknown") instead of running past the deadline to a finite bound."""
    rng = np.random.default_rng(0)
    widths = (100, 300, 300, 300, 2)
    layers = []
    for a, b in zip(widths[:-1], widths[1:]):
        layers += [Linear(rng.normal(size=(b, a)) / np.sqrt(a), rng.normal(size=b) * 0.1), ReLU()]
    network = Network(tuple(layers[:-1]), (100,))
    lower, upper = -torch.ones(100, dtype=torch.float64), torch.ones(100, dtype=torch.float64)
    given = compute_bounds(network, (lower.reshape(1, -1), upper.reshape(1, -1))).intermediate
    C, d = torch.tensor([[1.0, -1.0]], dtype=torch.float64), torch.zeros(1, dtype=torch.float64)
    bounds = row_upper_bounds(network, lower, upper, given, C, d, deadline=time.monotonic() + 0.3)
    assert torch.isinf(bounds).all()
