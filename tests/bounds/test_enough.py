"""compute_bounds(intermediate_only=...) and compute_bounds(enough=...): work a caller does not need
is skipped, and the bounds returned stay sound and decide what the caller asks as before."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from assay.bounds import AlphaCrownOptions, BetaCrownOptions, compute_bounds
from assay.errors import OptionError

from .strategies import forward_batched, random_splits, sample_box, satisfies_splits
from .test_soundness import _small_relu_chain

ITERATIONS = 20


def _problem(seed: int, batch: int = 1):
    rng = np.random.default_rng(seed)
    network = _small_relu_chain(rng)
    lower = torch.as_tensor(rng.uniform(-1, 0, (batch, 6)))
    upper = lower + torch.as_tensor(rng.uniform(0.5, 1.5, (batch, 6)))
    return network, lower, upper, rng


def _options(method: str, draft):
    if method == "alpha":
        return AlphaCrownOptions(iterations=ITERATIONS, draft_dtype=draft)
    return BetaCrownOptions(iterations=ITERATIONS, draft_dtype=draft)


def _contains(result, network, lower, upper, rng, splits=None):
    x = sample_box(lower, upper, rng, 4000)
    rows = torch.einsum("bso,nbo->nbs", result.C, forward_batched(network, x)) + result.d
    inside = torch.ones(rows.shape[:2], dtype=torch.bool) if splits is None else satisfies_splits(network, x, splits)
    ok = (rows >= result.lower - 1e-12) & (rows <= result.upper + 1e-12)
    assert bool((ok | ~inside.unsqueeze(-1)).all()), "a sampled output lies outside the bounds"


@pytest.mark.parametrize(("method", "intermediate_method"),
                         [("crown", "crown"), ("alpha", "crown"), ("beta", "alpha"), ("crown", "forward")])
def test_intermediate_only_keeps_the_intermediate_bounds_and_skips_the_rows(method, intermediate_method):
    network, lower, upper, rng = _problem(1, batch=3)
    parent = compute_bounds(network, (lower, upper), method="crown")
    splits = random_splits(network, parent.intermediate, rng) if method == "beta" else None
    options = None if method == "crown" else _options(method, None)
    kwargs = dict(method=method, intermediate_method=intermediate_method, splits=splits, options=options)
    full = compute_bounds(network, (lower, upper), **kwargs)
    only = compute_bounds(network, (lower, upper), intermediate_only=True, **kwargs)
    for a, b in zip(full.intermediate.lower + full.intermediate.upper, only.intermediate.lower + only.intermediate.upper):
        assert torch.equal(a, b)
    ibp_rows = compute_bounds(network, (lower, upper), method="ibp")
    assert not bool(only.stats.get("iterations", 0))
    assert bool((only.upper >= full.upper).all() and (only.lower <= full.lower).all())
    # the rows' interval bounds over the (tighter) intermediate bounds: no looser than IBP's
    assert bool((only.upper <= ibp_rows.upper).all() and (only.lower >= ibp_rows.lower).all())
    assert bool((only.upper > full.upper).any()), "the rows got the method's own bounds: nothing was skipped"
    _contains(only, network, lower, upper, rng, splits)
    with pytest.raises(OptionError, match="intermediate_only"):
        compute_bounds(network, (lower, upper), intermediate_only=True, return_linear=True, **kwargs)


@pytest.mark.parametrize("method", ["alpha", "beta"])
@pytest.mark.parametrize("draft", [None, "float32"])
@pytest.mark.parametrize("sides", ["upper", "lower"])
def test_enough_stops_once_every_domain_is_past_it(method, draft, sides):
    """A threshold halfway between CROWN's bound and the optimised one: the optimisation stops
    before its last iteration, every domain's bound is past the threshold and sound."""
    network, lower, upper, rng = _problem(2, batch=3)
    spec = torch.zeros(1, 4, dtype=torch.float64)
    spec[0, 0] = 1.0
    splits = None
    if method == "beta":
        splits = random_splits(network, compute_bounds(network, (lower, upper)).intermediate, rng)
    options = _options(method, draft)
    kwargs = dict(spec=spec, method=method, sides=sides, splits=splits, options=options)
    full = compute_bounds(network, (lower, upper), **kwargs)
    start_options = AlphaCrownOptions(iterations=0) if method == "alpha" else BetaCrownOptions(iterations=0)
    start = compute_bounds(network, (lower, upper), **{**kwargs, "options": start_options})
    assert full.stats["iterations"] == ITERATIONS
    side = (lambda r: r.upper) if sides == "upper" else (lambda r: -r.lower)
    # one threshold for all domains: the least gain any domain needs, halfway to its optimum
    threshold = float((side(start) + side(full)).max() / 2)
    assert bool((side(full) < threshold).all()) and bool((side(start) > threshold).any()), "the test proves little"
    enough = threshold if sides == "upper" else -threshold
    stopped = compute_bounds(network, (lower, upper), enough=enough, **kwargs)
    assert 0 < stopped.stats["iterations"] < ITERATIONS
    assert bool((side(stopped) < threshold).all())
    _contains(stopped, network, lower, upper, rng, splits)


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("draft", [None, "float32"])
def test_a_threshold_near_the_optimum_stops_only_where_the_returned_bound_meets_it(seed, draft):
    """Thresholds within 1e-4 of the optimised bound (where float32 drafts and float64 bounds
    disagree): a run that stops early returns a bound past its threshold, and every threshold
    that the full optimisation meets, the stopped one meets too. (Stopping on a draft's word
    alone would return float64 bounds short of the threshold.)"""
    network, lower, upper, rng = _problem(seed)
    spec = torch.zeros(1, 4, dtype=torch.float64)
    spec[0, 0] = 1.0
    options = _options("alpha", draft)
    full = compute_bounds(network, (lower, upper), spec=spec, method="alpha", sides="upper", options=options)
    optimum = float(full.upper)
    stops = 0
    for step in np.linspace(-1e-4, 1e-4, 41):
        threshold = optimum + float(step) * (1 + 1e-3)  # never exactly the optimum
        result = compute_bounds(network, (lower, upper), spec=spec, method="alpha", sides="upper", options=options,
                                enough=threshold)
        past = float(result.upper) < threshold
        if result.stats["iterations"] < ITERATIONS:
            stops += 1
            assert past, f"stopped at iteration {result.stats['iterations']} short of {threshold}"
        if optimum < threshold:
            assert past, f"the full optimisation meets {threshold}, the stopped one does not"
        if result.stats["iterations"] == ITERATIONS:  # not stopped: the very same optimisation
            assert float(result.upper) == optimum
    _contains(full, network, lower, upper, rng)
    assert stops or seed == 0, "no threshold stopped the optimisation: the test proves little"


def test_enough_counts_an_empty_domain_as_settled():
    """A domain whose splits contradict its bounds is empty: it does not keep the others
    iterating, though its own row (shifted by +10) never gets near the threshold."""
    network, lower, upper, rng = _problem(3, batch=1)
    lower, upper = lower.expand(2, -1).clone(), upper.expand(2, -1).clone()
    upper[0] = lower[0] + 0.01
    inter = compute_bounds(network, (lower, upper)).intermediate
    # domain 0: an inactive split of a neuron that is active on its whole (small) box: empty
    splits = [torch.zeros(2, *t.shape[1:], dtype=torch.int64) for t in inter.lower]
    active = (inter.lower[0][0] > 0).nonzero().flatten()
    assert active.numel(), "no active neuron to split"
    splits[0][0, active[0]] = -1
    C = torch.zeros(2, 1, 4, dtype=torch.float64)
    C[:, 0, 0] = 1.0
    d = torch.tensor([[10.0], [0.0]], dtype=torch.float64)
    kwargs = dict(spec=(C, d), method="beta", sides="upper", splits=splits)
    start = compute_bounds(network, (lower, upper), options=BetaCrownOptions(iterations=0), **kwargs)
    full = compute_bounds(network, (lower, upper), options=BetaCrownOptions(iterations=ITERATIONS), **kwargs)
    assert start.stats["infeasible_domains"] == 1 and bool(torch.isinf(full.upper[0]).all())
    threshold = float(start.upper[1, 0] + full.upper[1, 0]) / 2
    stopped = compute_bounds(network, (lower, upper), options=BetaCrownOptions(iterations=ITERATIONS),
                             enough=threshold, **kwargs)
    assert stopped.stats["iterations"] < ITERATIONS
    assert float(stopped.upper[1, 0]) < threshold and bool(torch.isinf(stopped.upper[0]).all())


def test_enough_is_checked():
    network, lower, upper, _ = _problem(0)
    with pytest.raises(OptionError, match="sides"):
        compute_bounds(network, (lower, upper), method="alpha", enough=0.0)
    with pytest.raises(OptionError, match="'alpha' or 'beta'"):
        compute_bounds(network, (lower, upper), method="crown", sides="upper", enough=0.0)
    with pytest.raises(OptionError, match="NaN"):
        compute_bounds(network, (lower, upper), method="alpha", sides="upper", enough=float("nan"))


def test_a_draft_stop_that_the_exact_bounds_do_not_confirm_is_not_taken(monkeypatch):
    """The float32 draft proposes a stop; the stop is taken only if the bounds in the network's
    dtype of the same iterates are past the threshold too. Here those bounds are made to fall
    short (every exact evaluation 1.0 worse): the optimisation keeps all its iterations, and
    the bound returned is the exact one, short of the threshold."""
    import assay.bounds.optimize as optimize

    network, lower, upper, _ = _problem(2, batch=1)
    spec = torch.zeros(1, 4, dtype=torch.float64)
    spec[0, 0] = 1.0
    options = _options("alpha", "float32")
    kwargs = dict(spec=spec, method="alpha", sides="upper", options=options)
    start = compute_bounds(network, (lower, upper), **{**kwargs, "options": AlphaCrownOptions(iterations=0)})
    full = compute_bounds(network, (lower, upper), **kwargs)
    threshold = float(start.upper + full.upper) / 2
    assert float(full.upper) < threshold < float(start.upper), "the test proves little"
    assert compute_bounds(network, (lower, upper), enough=threshold, **kwargs).stats["iterations"] < ITERATIONS

    exact_of_kept = optimize._exact_of_kept

    def short_of_the_draft(*args):
        lower_bound, *rest = exact_of_kept(*args)
        return (lower_bound - 1.0, *rest)

    monkeypatch.setattr(optimize, "_exact_of_kept", short_of_the_draft)
    refused = compute_bounds(network, (lower, upper), enough=threshold, **kwargs)
    assert refused.stats["iterations"] == ITERATIONS
    assert float(refused.upper) >= threshold
