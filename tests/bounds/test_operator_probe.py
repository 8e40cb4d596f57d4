"""The probe before CROWN bounds a large general-operator input element by element.

A tensor read by a non-linear general operator with more than ``_OPERATOR_PROBE_ABOVE`` elements
is refined only if CROWN narrows a sample of its elements: where CROWN cannot beat the interval
(a dense layer of the input box, which interval arithmetic bounds exactly) the probe skips it;
where CROWN narrows much (a difference of two copies of the same hidden tensor) it refines every
element, exactly as without the probe. Either way the bounds contain every sampled output.
"""

from __future__ import annotations

import torch

import assay.bounds.tensor_bounds as api
from assay.bounds import compute_bounds
from assay.nn import Linear, Network, ops
from assay.sets import Box

WIDTH = 300  # > _OPERATOR_PROBE_ABOVE


def _network(cancelling: bool) -> Network:
    """4 inputs → Linear(4→300) → tanh → Linear(300→300) → sigmoid → Linear(300→2).

    ``cancelling``: the second Linear's rows are differences of pairs of the first tanh's outputs
    that equal each other (the first layer repeats its rows), so each row is exactly 0 while its
    interval is as wide as two tanh outputs: only CROWN sees the cancellation."""
    generator = torch.Generator().manual_seed(3)
    half = WIDTH // 2
    first = torch.randn(half, 4, generator=generator, dtype=torch.float64)
    layers, sources = [], []
    if cancelling:
        w1 = torch.cat([first, first])
        w2 = torch.zeros(WIDTH, WIDTH, dtype=torch.float64)
        for i in range(WIDTH):
            w2[i, i % half], w2[i, half + i % half] = 1.0, -1.0
        w2 += 1e-3 * torch.randn(WIDTH, WIDTH, generator=generator, dtype=torch.float64)
    else:
        w1 = torch.randn(WIDTH, 4, generator=generator, dtype=torch.float64)
        w2 = torch.randn(WIDTH, WIDTH, generator=generator, dtype=torch.float64) / WIDTH ** 0.5
    layers = [Linear(w1, torch.zeros(WIDTH, dtype=torch.float64)), ops.Tanh(),
              Linear(w2, torch.zeros(WIDTH, dtype=torch.float64)), ops.Sigmoid(),
              Linear(torch.randn(2, WIDTH, generator=generator, dtype=torch.float64), torch.zeros(2, dtype=torch.float64))]
    sources = [(0,), (1,), (2,), (3,), (4,)]
    return Network(tuple(layers), (4,), sources=tuple(sources))


def _box():
    return Box(torch.full((4,), -0.5, dtype=torch.float64), torch.full((4,), 0.5, dtype=torch.float64))


def _crown_rows(monkeypatch):
    """Count the rows every intermediate CROWN call bounds (probe calls included)."""
    counted = []
    padded = api._crown_layer_bounds_padded

    def counting(plan, position, bounds, *args, only=None, mask=None, **kwargs):
        chosen = only if only is not None else mask
        counted.append((position, int(chosen[0].sum()) if chosen is not None else None))
        return padded(plan, position, bounds, *args, only=only, mask=mask, **kwargs)

    monkeypatch.setattr(api, "_crown_layer_bounds_padded", counting)
    return counted


def _contains(network, result, samples=2_000):
    x = _box().lower + (_box().upper - _box().lower) * torch.rand(samples, 4, dtype=torch.float64,
                                                                  generator=torch.Generator().manual_seed(5))
    y = network.forward(x)
    assert bool((y >= result.lower - 1e-12).all() and (y <= result.upper + 1e-12).all())


def test_a_tensor_crown_cannot_narrow_is_probed_and_skipped(monkeypatch):
    network = _network(cancelling=False)
    counted = _crown_rows(monkeypatch)
    result = compute_bounds(network, _box(), method="crown")
    # the first Linear's output (the tanh's input) is exact under interval arithmetic: probed
    # with _PROBE_ROWS rows, never bounded in full
    first_tanh_input = [rows for position, rows in counted if position == 1]
    assert first_tanh_input == [api._PROBE_ROWS]
    _contains(network, result)


def test_a_tensor_crown_narrows_is_refined_as_without_the_probe(monkeypatch):
    network = _network(cancelling=True)
    probed = compute_bounds(network, _box(), method="crown")
    monkeypatch.setattr(api, "_OPERATOR_PROBE_ABOVE", 10 ** 9)
    unprobed = compute_bounds(network, _box(), method="crown")
    assert torch.equal(probed.lower, unprobed.lower) and torch.equal(probed.upper, unprobed.upper)
    # and refining mattered: interval bounds of the sigmoid's input are far looser
    interval = compute_bounds(network, _box(), method="ibp")
    assert bool((probed.upper - probed.lower < 0.5 * (interval.upper - interval.lower)).all())
    _contains(network, probed)
