"""The public boundary of compute_bounds: inputs it accepts, errors it raises, plug-in objectives."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from assay.bounds import AlphaCrownOptions, BetaCrownOptions, compute_bounds
from assay.errors import AssayError, DataError, OptionError, SpecError
from assay.nn import Linear, Network, ReLU

from .strategies import forward_batched, sample_box


@pytest.fixture
def network():
    torch.manual_seed(3)
    return Network((Linear(torch.randn(6, 3), torch.randn(6)), ReLU(), Linear(torch.randn(2, 6), torch.randn(2))), (3,))


def test_single_domain_gives_a_batch_of_one(network):
    result = compute_bounds(network, (torch.zeros(3), torch.ones(3)))
    assert result.lower.shape == (1, 2) and result.upper.shape == (1, 2)
    assert (result.lower <= result.upper).all()
    assert set(result.to_json()) >= {"method", "lower", "upper", "stats"}


def test_spec_rows_bound_the_rows(network, rng):
    lower, upper = -torch.ones(4, 3), torch.ones(4, 3)
    C, d = torch.tensor([[1.0, -1.0]]), torch.tensor([0.5])
    result = compute_bounds(network, (lower, upper), spec=(C, d), method="crown")
    assert result.lower.shape == (4, 1)
    y = forward_batched(network, sample_box(lower, upper, rng, 5000))
    rows = y[..., 0] - y[..., 1] + 0.5
    assert (rows >= result.lower[:, 0]).all() and (rows <= result.upper[:, 0]).all()


def test_one_sided_bounds(network):
    box = (-torch.ones(3), torch.ones(3))
    lower_only = compute_bounds(network, box, sides="lower")
    assert torch.isinf(lower_only.upper).all() and torch.isfinite(lower_only.lower).all()
    both = compute_bounds(network, box)
    assert torch.allclose(lower_only.lower, both.lower)


def test_custom_objective_is_used_and_bounds_stay_sound(network, rng):
    calls = []

    def first_row_only(linear, lower):
        calls.append(linear.lower_A.shape)
        return lower[:, 0]

    lower, upper = -torch.ones(2, 3), torch.ones(2, 3)
    result = compute_bounds(network, (lower, upper), method="alpha", objective=first_row_only,
                            options=AlphaCrownOptions(iterations=4), return_linear=True)
    assert calls and calls[0] == (2, 2, 3)
    y = forward_batched(network, sample_box(lower, upper, rng, 5000))
    assert (y >= result.lower).all() and (y <= result.upper).all()


@pytest.mark.parametrize(
    "kwargs, error, words",
    [
        ({"method": "deeppoly"}, OptionError, "method"),
        ({"dtype": "float16"}, DataError, "dtype"),
        ({"sides": "left"}, OptionError, "sides"),
        ({"method": "ibp", "return_linear": True}, OptionError, "return_linear"),
        ({"method": "crown", "options": AlphaCrownOptions()}, OptionError, "options"),
        ({"method": "alpha", "options": BetaCrownOptions()}, OptionError, "AlphaCrownOptions"),
        ({"weight_perturbation": -0.1}, OptionError, "≥ 0"),
        ({"weight_perturbation": [0.1]}, OptionError, "2 Linear/Conv2d"),
        ({"weight_perturbation": {1: 0.1}}, OptionError, "layer 1"),
        ({"splits": [torch.zeros(5)]}, OptionError, "shape"),
        ({"splits": [torch.full((6,), 2)]}, OptionError, "-1"),
        ({"spec": torch.ones(2, 7)}, SpecError, "spec"),
        ({"method": "crown", "objective": lambda linear, lower: lower.sum(1)}, OptionError, "objective"),
    ],
)
def test_bad_options_raise_clear_errors(network, kwargs, error, words):
    with pytest.raises(error, match=words):
        compute_bounds(network, (torch.zeros(3), torch.ones(3)), **kwargs)


@pytest.mark.parametrize(
    "box, error",
    [
        ((torch.zeros(4), torch.ones(4)), DataError),
        ((torch.zeros(3), torch.tensor([1.0, float("nan"), 1.0])), DataError),
        ((torch.ones(3), torch.zeros(3)), SpecError),
        ("not a box", SpecError),
    ],
)
def test_bad_input_sets_raise_clear_errors(network, box, error):
    with pytest.raises(error):
        compute_bounds(network, box)


def test_option_values_are_checked_when_built():
    with pytest.raises(OptionError, match="iterations"):
        AlphaCrownOptions(iterations=-1)
    with pytest.raises(OptionError, match="lr_beta"):
        BetaCrownOptions(lr_beta=0)
    assert issubclass(OptionError, AssayError)


def test_contradictory_splits_give_an_empty_domain(network):
    """A neuron that is positive on the whole box cannot be split to z ≤ 0: the domain is empty."""
    box = (torch.zeros(3), torch.ones(3))
    crown = compute_bounds(network, box)
    always_on = (crown.intermediate.lower[0][0] > 0).nonzero().flatten()
    if always_on.numel() == 0:
        pytest.skip("no neuron is stable active on this box")
    split = torch.zeros(6, dtype=torch.int64)
    split[always_on[0]] = -1
    result = compute_bounds(network, box, method="beta", splits=[split])
    assert torch.isinf(result.lower).all() and result.stats["infeasible_domains"] == 1


def test_intermediate_beta_bounds_use_earlier_splits():
    """x in [−1, 1]; layer 1: a = x, b = x; layer 2: m = relu(b) − 0.1. With a split to a ≤ 0
    (x ≤ 0), b ≤ 0 too and m = −0.1 exactly. Box-only bounds of m ignore the split (relu(b)'s
    chord gives m ≤ 0.9); β-CROWN for intermediate bounds carries it (the LP of the relaxation
    with x ≤ 0: m ≤ 0.4), and still contains m's exact range [−0.1, −0.1]."""
    network = Network((Linear(torch.tensor([[1.0], [1.0]]), torch.zeros(2)), ReLU(),
                       Linear(torch.tensor([[0.0, 1.0]]), torch.tensor([-0.1])), ReLU(),
                       Linear(torch.ones(1, 1), torch.zeros(1))), (1,))
    box = (-torch.ones(1), torch.ones(1))
    splits = [torch.tensor([-1, 0]), torch.tensor([0])]
    common = dict(splits=splits, intermediate_method="alpha", sides="upper")
    alpha = compute_bounds(network, box, method="alpha", options=AlphaCrownOptions(iterations=30), **common)
    beta = compute_bounds(network, box, method="beta", options=BetaCrownOptions(iterations=30, lr_beta=0.5), **common)
    assert alpha.intermediate.upper[1].item() == pytest.approx(0.9, abs=1e-6)
    assert -0.1 <= beta.intermediate.upper[1].item() <= 0.4 + 1e-3
    assert beta.intermediate.lower[1].item() <= -0.1


def test_a_passed_deadline_stops_crowns_intermediate_bounds_and_stays_sound():
    """Past the deadline no intermediate tensor gets CROWN bounds (a generator's layers can take
    minutes): the interval bounds stay, so the intermediate bounds are looser, never unsound.
    (The outputs' bounds need not be looser: CROWN's adaptive slopes change with the intervals.)"""
    import time

    rng = np.random.default_rng(5)
    layers = []
    for fan_in, fan_out in ((3, 16), (16, 16), (16, 2)):
        layers += [Linear(torch.as_tensor(rng.normal(0, 0.7, (fan_out, fan_in))), torch.as_tensor(rng.normal(0, 0.3, fan_out))),
                   ReLU()]
    network = Network(tuple(layers[:-1]), (3,))
    box = (-torch.ones(1, 3, dtype=torch.float64), torch.ones(1, 3, dtype=torch.float64))
    timely = compute_bounds(network, box, method="crown")
    late = compute_bounds(network, box, method="crown", deadline=time.monotonic() - 1.0)
    assert (late.intermediate.upper[1] - late.intermediate.lower[1]).sum() > \
        (timely.intermediate.upper[1] - timely.intermediate.lower[1]).sum()  # the late one did not refine
    x = box[0] + 2 * torch.as_tensor(rng.uniform(size=(4000, 3)))
    y = network.forward(x)
    assert (y >= late.lower).all() and (y <= late.upper).all()


def test_under_a_deadline_intermediate_bounds_come_in_chunks_sized_by_their_time(monkeypatch):
    """One chunk of a wide convolutional layer's neurons once took minutes and a 150 s timeout ran
    past 250 s: under a deadline the first chunk is small, the next ones are sized by the time the
    last took, and once the deadline passes no chunk starts (the rest keep their bounds)."""
    from assay.bounds import tensor_bounds as api

    clock = [0.0]
    monkeypatch.setattr(api.time, "monotonic", lambda: clock[0])
    lower, upper = -torch.ones(1, 100, dtype=torch.float64), torch.ones(1, 100, dtype=torch.float64)
    sizes = []

    def bound_rows(neurons, C, d):  # each neuron costs 0.05 s of the fake clock; bounds ±0.5
        m = neurons.shape[1]
        sizes.append(m)
        clock[0] += 0.05 * m
        return torch.full((1, 2 * m), -0.5, dtype=torch.float64)

    new_lower, new_upper = api._bound_unstable_neurons((lower, upper), 64, bound_rows, deadline=3.0, first_chunk=4)
    assert sizes[0] == 4 and sizes[1] == int(api._TIMED_CHUNK_SECONDS / 0.05)  # 20 neurons fit a second
    assert clock[0] <= 3.0 + api._TIMED_CHUNK_SECONDS + 1e-9  # overshot by one chunk at most
    reached = sum(sizes)
    assert reached < 100
    assert (new_lower[0, :reached] == -0.5).all() and (new_upper[0, :reached] == 0.5).all()
    assert (new_lower[0, reached:] == -1).all() and (new_upper[0, reached:] == 1).all()  # not reached: kept

    sizes.clear()
    api._bound_unstable_neurons((lower, upper), 64, bound_rows, first_chunk=4)
    assert sizes == [64, 36]  # without a deadline: the memory cap's chunks, as before


def test_interval_rows_of_an_unbounded_output_are_never_nan():
    """An output without bounds (1/x across 0) made the rows' centre inf − inf = NaN: every row
    read NaN, even one with a zero coefficient on that output."""
    from assay.nn import Network
    from assay.nn.ops import Reciprocal

    network = Network((Reciprocal(),), (2,))
    box = (torch.tensor([[-1.0, 1.0]], dtype=torch.float64), torch.tensor([[1.0, 2.0]], dtype=torch.float64))
    C = torch.tensor([[0.0, 1.0], [1.0, 1.0]], dtype=torch.float64)
    result = compute_bounds(network, box, method="ibp", spec=(C, torch.zeros(2, dtype=torch.float64)))
    assert not torch.isnan(result.lower).any() and not torch.isnan(result.upper).any()
    assert result.lower[0, 0] == pytest.approx(0.5) and result.upper[0, 0] == pytest.approx(1.0)
    assert result.lower[0, 1] == -torch.inf and result.upper[0, 1] == torch.inf
