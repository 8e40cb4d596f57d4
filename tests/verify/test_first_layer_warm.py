"""First-layer tightening started from a parent's split multipliers (ReLU splitting's children):
sound against the exact LP and sampled points, never looser than the inherited bounds, equal to
the sound value of the multipliers it keeps, and still sound from stale or corrupted multipliers."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from assay.bounds import IntermediateBounds
from assay.errors import AssayError
from assay.verify import first_layer as fl
from assay.verify.first_layer import Multipliers, first_layer, tighten_first_layer_from
from tests.verify.networks import random_relu_network
from tests.verify.test_first_layer import _box_bounds, _in_domain, _lp_extreme


def _clamped(lower, upper, splits):
    """Bounds clamped by the splits, as ReLU splitting does for a child."""
    return IntermediateBounds((torch.where(splits > 0, lower.clamp(min=0), lower),),
                              (torch.where(splits < 0, upper.clamp(max=0), upper),))


def _family(seed: int, count: int = 6, inputs: int = 4, neurons: int = 12, depth: int = 4):
    """A random first layer, ``count`` boxes each with a point, and per domain a chain of splits:
    parent (2 splits), then one more split per generation, each the sign of its neuron at the
    point (so every domain of the chain holds it). Returns the form, boxes, points and the
    chain's split histories (``depth`` of them)."""
    rng = np.random.default_rng(seed)
    network = random_relu_network(seed, (inputs, neurons, 2))
    form = first_layer(network)
    center = torch.as_tensor(rng.uniform(-0.5, 0.5, (count, inputs)))
    radius = torch.as_tensor(rng.uniform(0.3, 1.0, (count, inputs)))
    lower, upper = center - radius, center + radius
    point = lower + (upper - lower) * torch.as_tensor(rng.uniform(0, 1, (count, inputs)))
    signs = torch.where(point @ form.W.T + form.b >= 0, 1, -1).to(torch.int8)
    order = [rng.permutation(neurons) for _ in range(count)]
    chain = []
    for generation in range(depth):
        splits = torch.zeros(count, neurons, dtype=torch.int8)
        for i in range(count):
            chosen = order[i][:2 + generation]
            splits[i, chosen] = signs[i, chosen]
        chain.append(splits)
    return form, lower, upper, point, chain


def _assert_sound(form, lower, upper, splits, inherited, tightened, seed):
    """``tightened`` within ``inherited``, holding every sampled point of each domain and the LP's optima."""
    W, b = form.W, form.b
    new_lower, new_upper = tightened.lower[0], tightened.upper[0]
    assert (new_lower >= inherited.lower[0]).all() and (new_upper <= inherited.upper[0]).all()
    rng = np.random.default_rng(seed)
    for i in range(len(lower)):
        x = lower[i] + (upper[i] - lower[i]) * torch.as_tensor(rng.uniform(0, 1, (20_000, W.shape[1])))
        inside, z = _in_domain(W, b, x, splits[i])
        z = z[inside]
        assert (z <= new_upper[i] + 1e-12).all() and (z >= new_lower[i] - 1e-12).all()
        for j in range(W.shape[0]):
            if splits[i, j] != 0:
                continue
            exact_upper = _lp_extreme(W, b, lower[i], upper[i], splits[i], j, 1)
            exact_lower = -_lp_extreme(W, b, lower[i], upper[i], splits[i], j, -1)
            assert new_upper[i, j] >= exact_upper - 1e-9 and new_lower[i, j] <= exact_lower + 1e-9


def _generations(form, lower, upper, chain, start_of=lambda kept: kept):
    """Tighten each generation of the chain from the previous one's bounds and multipliers
    (``start_of`` maps the kept multipliers to the next start). Yields (splits, inherited,
    tightened, kept, start) per generation."""
    box = _box_bounds(form.W, form.b, lower, upper)
    inherited = _clamped(*box, chain[0])
    start = None
    for splits in chain:
        inherited = _clamped(inherited.lower[0], inherited.upper[0], splits)
        tightened, empty, kept = tighten_first_layer_from(form, lower, upper, splits, inherited, start)
        assert not empty.any()  # each domain holds its point
        yield splits, inherited, tightened, kept, start
        inherited, start = tightened, start_of(kept)


@pytest.mark.parametrize("seed", range(4))
def test_children_started_from_their_parents_multipliers_are_sound_and_never_looser(seed):
    form, lower, upper, _, chain = _family(seed)
    tighter = 0
    for generation, (splits, inherited, tightened, kept, _) in enumerate(_generations(form, lower, upper, chain)):
        assert (kept.columns >= 0).any(1).all()  # every domain hands its multipliers on
        _assert_sound(form, lower, upper, splits, inherited, tightened, seed)
        if generation:
            tighter += int((tightened.upper[0] < inherited.upper[0]).sum() + (tightened.lower[0] > inherited.lower[0]).sum())
    assert tighter > 0  # the warm-started generations tighten bounds beyond their parents'


def _stale(kept: Multipliers) -> Multipliers:
    """The multipliers keyed to the wrong neurons (rows rolled, columns renamed, one named twice)
    and corrupted (NaN, ±inf, negative and huge values)."""
    beta = kept.beta.roll(3, dims=1).clone()
    beta[:, 0, 0], beta[:, 1, 0], beta[:, 2, 0], beta[:, 3, :] = torch.nan, torch.inf, -torch.inf, -5.0
    beta[:, 4, :] = 1e30
    columns = torch.where(kept.columns >= 0, (kept.columns + 5) % (kept.beta.shape[1] // 2), -1)
    columns[:, -1] = columns[:, 0]
    return Multipliers(beta, columns)


@pytest.mark.parametrize("seed", range(3))
def test_stale_or_corrupted_multipliers_still_give_sound_bounds(seed):
    form, lower, upper, _, chain = _family(10 + seed)
    for splits, inherited, tightened, _, start in _generations(form, lower, upper, chain, start_of=_stale):
        if start is not None:
            assert torch.isfinite(tightened.lower[0]).all() and torch.isfinite(tightened.upper[0]).all()
        _assert_sound(form, lower, upper, splits, inherited, tightened, 10 + seed)


def _child_rows(form, splits, inherited):
    """Rows (B, 2R), chosen mask, columns (B, K) of the child's problem as :func:`fl._tightened` builds them."""
    neurons = splits.shape[1]
    target = (inherited.lower[0] < 0) & (inherited.upper[0] > 0) & (splits == 0)
    chosen, neuron = target.to(torch.int8).topk(int(target.sum(1).max()), dim=1)
    which = (splits != 0).to(torch.int8).topk(int((splits != 0).sum(1).max()), dim=1).indices
    columns = torch.where(splits.gather(1, which) != 0, which, -1)
    return torch.cat([neuron, neuron + neurons], 1), torch.cat([chosen, chosen], 1).bool(), which, columns


def _values(form, lower, upper, splits, beta, rows, which):
    """The sound values of multipliers ``beta`` (B, 2R, K) for rows ``rows`` of the domains."""
    sign = splits.gather(1, which).to(torch.float64)
    W, b = form.W, form.b
    cut_A, cut_b = sign.unsqueeze(2) * W[which], sign * b[which]
    base_A, base_b = torch.cat([W, -W])[rows], torch.cat([b, -b])[rows]
    center, radius = (lower + upper) / 2, (upper - lower) / 2
    return fl._sound_value(beta.to(torch.float64), base_A, base_b, cut_A, cut_b, center, radius)


def test_a_childs_starting_multipliers_give_its_parents_bounds_whatever_their_column_order():
    """The bookkeeping: the parent's multipliers, read by neuron for the child's rows and columns
    (its new split's column 0), are worth exactly the parent's bounds; shuffling their columns
    (with their names) changes nothing."""
    form, lower, upper, _, chain = _family(20)
    generations = _generations(form, lower, upper, chain[:2])
    _, _, parent, kept, _ = next(generations)
    splits = chain[1]
    inherited = _clamped(parent.lower[0], parent.upper[0], splits)
    rows, real, which, columns = _child_rows(form, splits, inherited)
    start, fresh = fl._restricted(kept, rows, columns)
    assert fresh.sum(1).tolist() == [1] * len(splits)  # the new split, and nothing else, is new
    value = _values(form, lower, upper, splits, start, rows, which)
    neurons = splits.shape[1]
    parent_bound = torch.cat([parent.upper[0], -parent.lower[0]], 1).gather(1, rows)
    box = _box_bounds(form.W, form.b, lower, upper)
    box_bound = torch.cat([box[1], -box[0]], 1).gather(1, rows)
    tightened = real & (parent_bound < box_bound)
    assert tightened.any()
    assert torch.allclose(value[tightened], parent_bound[tightened], rtol=0, atol=1e-12)
    permutation = torch.randperm(kept.beta.shape[2], generator=torch.Generator().manual_seed(0))
    shuffled = Multipliers(kept.beta[:, :, permutation], kept.columns[:, permutation])
    assert torch.equal(fl._restricted(shuffled, rows, columns)[0], start)
    a = tighten_first_layer_from(form, lower, upper, splits, inherited, kept)
    b = tighten_first_layer_from(form, lower, upper, splits, inherited, shuffled)
    assert torch.equal(a[0].upper[0], b[0].upper[0]) and torch.equal(a[0].lower[0], b[0].lower[0])
    assert rows.max() < 2 * neurons


def test_the_bounds_are_the_sound_values_of_the_multipliers_kept():
    """Each tightened bound is the sound value (:func:`fl._sound_value`) of the multipliers the
    domain keeps for its row, or the inherited bound where that is lower."""
    form, lower, upper, _, chain = _family(30)
    for splits, inherited, tightened, kept, _ in _generations(form, lower, upper, chain):
        rows, real, which, columns = _child_rows(form, splits, inherited)
        beta, _ = fl._restricted(kept, rows, columns)
        value = _values(form, lower, upper, splits, beta, rows, which)
        kept_bound = torch.cat([inherited.upper[0], -inherited.lower[0]], 1).gather(1, rows).minimum(value)
        bound = torch.cat([tightened.upper[0], -tightened.lower[0]], 1).gather(1, rows)
        # equal but for the rounding margin, which grows with the number of columns evaluated
        assert torch.allclose(bound[real], kept_bound[real], rtol=0, atol=1e-12)


def test_multipliers_of_another_shape_are_refused():
    form, lower, upper, _, chain = _family(40, count=2)
    inherited = _clamped(*_box_bounds(form.W, form.b, lower, upper), chain[0])
    wrong = Multipliers(torch.zeros(2, 5, 3), torch.full((2, 3), -1))
    with pytest.raises(AssayError, match="first-layer multipliers"):
        tighten_first_layer_from(form, lower, upper, chain[0], inherited, wrong)


def test_a_layer_too_wide_to_keep_multipliers_is_tightened_from_zero(monkeypatch):
    """Without kept multipliers (WARM_ELEMENTS too small for the layer) every domain is searched
    from 0 on all its rows, and its bounds stay sound; a start given is not read."""
    monkeypatch.setattr(fl, "WARM_ELEMENTS", 0)
    form, lower, upper, _, chain = _family(50)
    inherited = _clamped(*_box_bounds(form.W, form.b, lower, upper), chain[2])
    assert fl.warm_columns(form) == 0 and Multipliers.none(len(lower), form) is None
    tightened, empty, kept = tighten_first_layer_from(form, lower, upper, chain[2], inherited,
                                                      Multipliers(torch.zeros(1), torch.zeros(1)))
    assert kept is None and not empty.any()
    assert (tightened.upper[0] < inherited.upper[0]).any()
    _assert_sound(form, lower, upper, chain[2], inherited, tightened, 50)
