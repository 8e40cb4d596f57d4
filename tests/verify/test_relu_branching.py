"""ReLU splitting's branching choice (filtered smart branching) on small random networks.

The choice never decides a verdict, but a wrong child (a split sign flipped, a candidate's
children mixed up) would make the search pick badly or, worse, hand children split histories
that do not cover their parent. These tests check the children's estimates against sampled
points of each child's region and that the chosen neuron is the shortlist's best.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import assay.verify.relu_split as relu_split
from assay.bounds import BetaCrownOptions, compute_bounds
from assay.verify.deadline import Deadline
from assay.verify.problem import from_unsafe
from assay.verify.relu_split import conjunction_searches
from assay.verify.search import SearchStats
from tests.verify.networks import random_relu_network
from tests.verify.test_verify import box, unsafe_region


def _open_root(seed: int):
    """A network, its query and the bounded root of its one conjunction (left open)."""
    n = 12
    network = random_relu_network(seed, widths=(n, 16, 16, 2))
    x = torch.as_tensor(np.random.default_rng(seed).uniform(-0.5, 0.5, (20_000, n)))
    C = np.array([[1.0, -1.0]])
    threshold = (network.forward(x) @ torch.as_tensor(C).T).max().item() + 0.05
    (query,) = from_unsafe(network, box(n, 0.5), unsafe_region(C, [-threshold]))
    ((strategy, state),) = conjunction_searches(network, query)
    bounded = strategy.bound(state.pending[0], Deadline(), SearchStats())
    return network, query, strategy, bounded


def _inside(network, x, splits):
    """Samples (m, n) satisfying one domain's split history (per layer, a flat ±1/0 tensor)."""
    keep = torch.ones(x.shape[0], dtype=torch.bool)
    for z, split in zip(network.pre_activations(x), splits):
        z, split = z.reshape(x.shape[0], -1), split.reshape(1, -1)
        keep &= ((split > 0) & (z < 0)).logical_not().all(1) & ((split < 0) & (z > 0)).logical_not().all(1)
    return keep


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_children_estimates_bound_every_sampled_point_of_each_child(seed):
    network, query, strategy, bounded = _open_root(seed)
    if bool(bounded.closed.all()):
        pytest.skip("the root is already refuted")
    open_ = ~bounded.closed
    domains = bounded.branches.select(open_)
    scores = relu_split._babsr_scores(network, strategy.C, list(domains.splits), domains.parents,
                                      bounded.payload.result.upper[open_])
    flat = torch.cat([s.reshape(1, -1) for s in scores], 1)
    shortlist, candidates = flat.topk(3, dim=1)
    assert (shortlist > 0).all()
    estimates = relu_split._children_estimates(network, strategy.C, strategy.d, domains, candidates, "float64")
    x = torch.as_tensor(np.random.default_rng(seed).uniform(-0.5, 0.5, (50_000, network.input_size)))
    rows = network.forward(x) @ strategy.C.T + strategy.d  # (m, S): the conjunction's rows
    least = rows.amin(1)
    sizes = [s[0].numel() for s in domains.splits]
    offsets = torch.tensor([0] + sizes[:-1]).cumsum(0)
    for j in range(candidates.shape[1]):
        for side, sign in enumerate((1, -1)):
            child = relu_split._with_split(list(domains.splits), offsets, candidates[:, j], sign)
            inside = _inside(network, x, [s[0] for s in child])
            assert inside.any()
            # Each child's least row bound is above every sampled point of that child ...
            assert (least[inside] <= estimates[0, j, side] + 1e-9).all(), (j, sign)
            # ... and is that child's own bound, as one call for that child alone gives it.
            alone = compute_bounds(network, (domains.lower, domains.upper), spec=(strategy.C, strategy.d),
                                   method="beta", sides="upper", splits=[c.to(torch.int64) for c in child],
                                   intermediate=domains.parents, refine_intermediate=False,
                                   alphas=[domains.tags.get(f"alpha_{n}") for n in range(len(child))],
                                   options=BetaCrownOptions(iterations=0))
            assert torch.allclose(alone.upper.amin(1)[0], estimates[0, j, side], rtol=1e-9, atol=1e-12), (j, sign)
        # The two children's estimates are those of different regions (not one bound twice).
    assert not torch.equal(estimates[..., 0], estimates[..., 1])


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_the_chosen_neuron_is_the_shortlisted_one_with_the_tightest_worse_child(seed, monkeypatch):
    network, query, strategy, bounded = _open_root(seed)
    if bool(bounded.closed.all()):
        pytest.skip("the root is already refuted")
    open_ = ~bounded.closed
    domains = bounded.branches.select(open_)
    row_upper = bounded.payload.result.upper[open_]
    scores = relu_split._babsr_scores(network, strategy.C, list(domains.splits), domains.parents, row_upper)
    flat = torch.cat([s.reshape(1, -1) for s in scores], 1)
    shortlist, candidates = flat.topk(min(relu_split.FSB_CANDIDATES, flat.shape[1]), dim=1)
    estimates = relu_split._children_estimates(network, strategy.C, strategy.d, domains, candidates, "float64")
    worse_child = torch.where(shortlist[0] > 0, estimates[0].amax(1), torch.inf)  # stable neurons never win
    child_splits, _, _ = relu_split._branch(network, strategy.C, strategy.d, domains, row_upper)
    changed = torch.cat([(c[0] != p[0]).reshape(-1) for c, p in zip(child_splits, domains.splits)]).nonzero()
    assert changed.numel() == 1
    assert int(changed) == int(candidates[0, worse_child.argmin()])
    # The two children split that neuron both ways.
    flat_children = torch.cat([c.reshape(2, -1) for c in child_splits], 1)
    assert flat_children[0, int(changed)] == 1 and flat_children[1, int(changed)] == -1
    # With a shortlist of one, the choice is BaBSR's best score.
    monkeypatch.setattr(relu_split, "FSB_CANDIDATES", 1)
    child_splits, _, _ = relu_split._branch(network, strategy.C, strategy.d, domains, row_upper)
    changed = torch.cat([(c[0] != p[0]).reshape(-1) for c, p in zip(child_splits, domains.splits)]).nonzero()
    assert int(changed) == int(candidates[0, 0])


def test_estimates_taken_in_chunks_of_domains_equal_one_pass(monkeypatch):
    """Several domains (the root's children, bounded) give the same estimates one chunk at a time."""
    network, query, strategy, bounded = _open_root(1)
    children = strategy.split(bounded, ~bounded.closed)
    bounded_children = strategy.bound(children, Deadline(), SearchStats())
    domains = bounded_children.branches
    row_upper = bounded_children.payload.result.upper
    scores = relu_split._babsr_scores(network, strategy.C, list(domains.splits), domains.parents, row_upper)
    flat = torch.cat([s.reshape(len(domains), -1) for s in scores], 1)
    _, candidates = flat.topk(3, dim=1)
    together = relu_split._children_estimates(network, strategy.C, strategy.d, domains, candidates, "float64")
    monkeypatch.setattr(relu_split, "_FSB_CHUNK_ELEMENTS", 1)  # one domain per pass
    apart = relu_split._children_estimates(network, strategy.C, strategy.d, domains, candidates, "float64")
    assert len(domains) == 2 and apart.shape == (2, 3, 2)
    assert torch.allclose(together, apart, rtol=1e-12, atol=1e-12)
