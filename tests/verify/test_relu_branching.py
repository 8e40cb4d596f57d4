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
from assay.nn import Linear, Network, ReLU
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
    scores = relu_split._intercept_scores(network, strategy.C, strategy.d, domains,
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
    scores = relu_split._intercept_scores(network, strategy.C, strategy.d, domains, row_upper)
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
    # With a shortlist of one, the choice is the best intercept score.
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
    scores = relu_split._intercept_scores(network, strategy.C, strategy.d, domains, row_upper)
    flat = torch.cat([s.reshape(len(domains), -1) for s in scores], 1)
    _, candidates = flat.topk(3, dim=1)
    together = relu_split._children_estimates(network, strategy.C, strategy.d, domains, candidates, "float64")
    monkeypatch.setattr(relu_split, "_FSB_CHUNK_ELEMENTS", 1)  # one domain per pass
    apart = relu_split._children_estimates(network, strategy.C, strategy.d, domains, candidates, "float64")
    assert len(domains) == 2 and apart.shape == (2, 3, 2)
    assert torch.allclose(together, apart, rtol=1e-12, atol=1e-12)


def _two_neuron_query(out_weights, C=((1.0,),), d=(-0.05,)):
    """y = w_A·relu(x₀ + x₁) + w_B·relu(x₀ − x₁) over [−1, 1]², unsafe C y + d ≥ 0 (default
    y ≥ 0.05), its root bounded: both hidden neurons are unstable with the same bounds (−2, 2),
    so the same relaxation area."""
    hidden = Linear(torch.tensor([[1.0, 1.0], [1.0, -1.0]], dtype=torch.float64), torch.zeros(2, dtype=torch.float64))
    out = Linear(torch.tensor([out_weights], dtype=torch.float64), torch.zeros(1, dtype=torch.float64))
    network = Network((hidden, ReLU(), out), (2,))
    (query,) = from_unsafe(network, box(2, 1.0), unsafe_region([list(row) for row in C], list(d)))
    ((strategy, state),) = conjunction_searches(network, query)
    return network, strategy, strategy.bound(state.pending[0], Deadline(), SearchStats())


def test_intercept_scores_rank_the_neuron_whose_relaxation_costs_the_bound_first():
    """Neuron A (weight +1) enters the upper bound of y through its chord, whose intercept is
    1·u(−l)/(u − l) = 1; neuron B (weight −5) through its lower relaxation, which has none. A must
    rank first, though |W| (5 against 1) favours B; FSB agrees: A's z ≤ 0 child is refuted
    (−0.05) while B's children are no tighter than their parent (1.95 and 10.95)."""
    network, strategy, bounded = _two_neuron_query([1.0, -5.0])
    assert not bool(bounded.closed.any())
    domains = bounded.branches
    row_upper = bounded.payload.result.upper
    (scores,) = relu_split._intercept_scores(network, strategy.C, strategy.d, domains, row_upper)
    assert scores[0, 0] > scores[0, 1] > 0
    # Λ_A = −chord slope 0.5: intercept (−Λ)·(−l) = 0.5·2, and the backup |Λ|·area = 0.5·1
    expected = 1.0 + relu_split._BACKUP_WEIGHT * 0.5
    assert torch.allclose(scores[0, 0], torch.tensor(expected, dtype=torch.float64), atol=1e-9)
    # FSB agrees: A's worse child is the tighter one, and A is what the search splits.
    estimates = relu_split._children_estimates(network, strategy.C, strategy.d, domains,
                                               torch.tensor([[0, 1]]), "float64")
    assert estimates[0, 0].amax() < estimates[0, 1].amax()
    assert estimates[0, 0].amin() < 0 <= estimates[0, 1].amin()
    child_splits, _, _ = relu_split._branch(network, strategy.C, strategy.d, domains, row_upper)
    assert child_splits[0][:, 0].tolist() == [1, -1] and child_splits[0][:, 1].tolist() == [0, 0]


def test_intercept_scores_read_the_row_closest_to_refuted():
    """A conjunction of y ≥ 0.05 (upper bound 1.95) and −y ≥ −100 (upper bound ~104): the scores
    are those of the first row alone. The second row's coefficients have the opposite signs (B's
    chord, A's lower relaxation), so scoring by it, or by every row, would rank B first."""
    network, strategy, bounded = _two_neuron_query([1.0, -5.0], C=((1.0,), (-1.0,)), d=(-0.05, 100.0))
    row_upper = bounded.payload.result.upper
    assert not bool(bounded.closed.any()) and row_upper[0, 0] < row_upper[0, 1]
    (scores,) = relu_split._intercept_scores(network, strategy.C, strategy.d, bounded.branches, row_upper)
    _, alone, bounded_alone = _two_neuron_query([1.0, -5.0])
    (expected,) = relu_split._intercept_scores(network, alone.C, alone.d, bounded_alone.branches,
                                               bounded_alone.payload.result.upper)
    assert scores[0, 0] > scores[0, 1]
    assert torch.allclose(scores, expected, rtol=1e-12, atol=0)


def test_a_large_networks_root_is_bounded_in_float32_and_the_search_still_decides(monkeypatch):
    """Above ROOT_FLOAT32_MIN_RELUS ReLUs the root's bounds come in float32 (the search keeps its
    dtype): they are sound for every sampled point, no looser than 1e-3 off the float64 ones,
    and the search started from them decides the query as the float64 root's search does."""
    network, query, strategy, _ = _open_root(0)
    monkeypatch.setattr(relu_split, "ROOT_FLOAT32_MIN_RELUS", network.num_relus - 1)
    ((strategy32, state32),) = conjunction_searches(network, query)
    root32, root64 = strategy32.root_bounds, strategy.root_bounds
    assert root32.upper.dtype == torch.float32 and root64.upper.dtype == torch.float64
    x = torch.as_tensor(np.random.default_rng(0).uniform(-0.5, 0.5, (20_000, 12)))
    rows = network.forward(x) @ query.C.T + query.d
    assert (rows.max(0).values <= root32.upper[0].double()).all()
    assert (root32.upper.double() - root64.upper).abs().max() <= 1e-3
    assert not strategy32.refuted_at_root  # the search below has to split
    from assay.verify import verify
    from assay.verify.result import VerificationStatus

    x = torch.as_tensor(np.random.default_rng(0).uniform(-0.5, 0.5, (20_000, 12)))  # as _open_root(0)
    threshold = (network.forward(x) @ torch.tensor([1.0, -1.0], dtype=torch.float64)).max().item() + 0.05
    statuses = []
    for least in (network.num_relus - 1, network.num_relus):  # the root in float32, then in float64
        monkeypatch.setattr(relu_split, "ROOT_FLOAT32_MIN_RELUS", least)
        for d in (-threshold, -threshold + 0.2):  # the query as _open_root(0) poses it, then a looser one
            result = verify(network, box(12, 0.5), unsafe=unsafe_region([[1.0, -1.0]], [d]), strategy="relu",
                            attack_restarts=0, timeout=60)
            statuses.append(result.status)
    assert VerificationStatus.TIMEOUT not in statuses and VerificationStatus.UNKNOWN not in statuses
    assert statuses[:2] == statuses[2:]
