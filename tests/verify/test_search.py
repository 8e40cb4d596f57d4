"""The branch-and-bound core: a stopped search resumes to the same answer, and its branches add up."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from assay.verify import VerificationStatus, verify
from assay.verify.deadline import Deadline
from assay.verify.input_split import InputSplitting, root_branch
from assay.verify.problem import from_unsafe
from assay.verify.relu_split import conjunction_searches
from assay.verify.search import SearchStats, branch_and_bound
from tests.verify.test_verify import box, random_network, sampled_max, unsafe_region


class Counting(Deadline):
    """No deadline; counts the calls of ``passed()``."""

    def __init__(self):
        super().__init__(math.inf)
        self.checks = 0

    def passed(self) -> bool:
        self.checks += 1
        return False


class StopAfter(Deadline):
    """A deadline that passes after ``checks`` calls of ``passed()``: stops a search mid-way,
    the same way on every machine."""

    def __init__(self, checks: int):
        super().__init__(math.inf)
        self.left = checks

    def passed(self) -> bool:
        self.left -= 1
        return self.left < 0


def input_problem():
    network = random_network(21, widths=(3, 20, 20, 2))
    C = np.array([[1.0, -1.0]])
    threshold = sampled_max(network, 3, C) + 0.01
    return network, from_unsafe(network, box(3), unsafe_region(C, [-threshold]))[0]


def relu_problem():
    """Holds after ~20 rounds of ReLU splitting, some leaves decided by LPs."""
    network = random_network(23, widths=(8, 10, 10, 2))
    C = np.array([[1.0, -1.0]])
    rng = np.random.default_rng(0)
    x = torch.as_tensor(np.concatenate([rng.uniform(-0.3, 0.3, (50_000, 8)), rng.choice([-0.3, 0.3], (50_000, 8))]))
    threshold = (network.forward(x) @ torch.as_tensor(C).T).max().item() + 0.1
    return network, from_unsafe(network, box(8, 0.3), unsafe_region(C, [-threshold]))[0]


def search_of(kind):
    """(strategy, root state, batch size) of a search that takes a few rounds and holds."""
    if kind == "input":
        network, query = input_problem()
        return InputSplitting(network, query, method="alpha"), root_branch(query), 1024
    network, query = relu_problem()
    (strategy, start), = conjunction_searches(network, query)
    return strategy, start, 64


@pytest.mark.parametrize("kind", ["input", "relu"])
def test_a_stopped_search_resumes_to_the_same_verdict_with_the_same_work(kind):
    strategy, start, batch = search_of(kind)
    fresh_stats = SearchStats()
    counting = Counting()
    fresh = branch_and_bound(strategy, start, counting, batch_size=batch, stats=fresh_stats)
    assert fresh.status is VerificationStatus.HOLDS and fresh_stats.bound_calls >= 4, fresh_stats

    strategy, start, batch = search_of(kind)
    stats = SearchStats()
    stopped = branch_and_bound(strategy, start, StopAfter(counting.checks // 2), batch_size=batch, stats=stats,
                               keep_closed=True)
    assert stopped.status is VerificationStatus.TIMEOUT
    assert stopped.state.pending_count > 0 and stopped.state.settled < 1
    resumed = branch_and_bound(strategy, stopped.state, Deadline(), batch_size=batch, stats=stats, keep_closed=True)
    assert resumed.status is VerificationStatus.HOLDS
    if kind == "input":  # exactly the same branches are bounded
        assert stats.domains == fresh_stats.domains
    else:  # the same, plus the leaves whose LP the stop postponed (bounded again when resumed)
        assert fresh_stats.domains <= stats.domains <= fresh_stats.domains + batch
    assert resumed.state.pending_count == 0
    assert resumed.state.settled == pytest.approx(fresh.state.settled, abs=1e-12)


@pytest.mark.parametrize("kind", ["input", "relu"])
def test_closed_branches_account_for_the_whole_search(kind):
    """HOLDS settles weight 1: for ReLU splitting the closed leaves' 2^-depth weights sum to 1;
    for input splitting the closed boxes and the parts clipped away fill the whole box."""
    strategy, start, batch = search_of(kind)
    outcome = branch_and_bound(strategy, start, Deadline(), batch_size=batch, stats=SearchStats(), keep_closed=True)
    assert outcome.status is VerificationStatus.HOLDS
    assert outcome.state.settled == pytest.approx(1.0, abs=1e-9)
    closed_weight = sum(float(chunk.weight.sum()) for chunk in outcome.state.closed)
    if kind == "relu":
        assert closed_weight == pytest.approx(1.0, abs=1e-12)
        splits = torch.cat([torch.cat([s.reshape(len(chunk), -1) for s in chunk.splits], 1) for chunk in outcome.state.closed])
        assert len(set(map(tuple, splits.tolist()))) == splits.shape[0]  # no leaf twice
    else:
        assert 0 < closed_weight <= 1.0 + 1e-12


def test_results_carry_their_searches():
    """A TIMEOUT keeps the open branches of the search it stopped; a HOLDS has none left."""
    from tests.verify.test_verify import hard_input_split_instance

    network, input_box, unsafe = hard_input_split_instance()
    stopped = verify(network, input_box, unsafe=unsafe, timeout=1.5, attack_restarts=0)
    assert stopped.status is VerificationStatus.TIMEOUT
    assert stopped.searches and stopped.searches[-1].pending_count > 0
    assert stopped.to_json()["searches"][-1]["pending"] == stopped.searches[-1].pending_count
    network, query = input_problem()
    done = verify(network, box(3), unsafe=unsafe_region(query.C.numpy(), query.d.numpy()), timeout=60)
    assert done.status is VerificationStatus.HOLDS
    assert done.searches[-1].pending_count == 0 and done.searches[-1].settled == pytest.approx(1.0, abs=1e-9)
    assert done.searches[-1].closed_count == 0  # closed branches are kept only when asked
    kept = verify(network, box(3), unsafe=unsafe_region(query.C.numpy(), query.d.numpy()), timeout=60, keep_closed=True)
    assert kept.searches[-1].closed_count > 0


class Halving:
    """A toy strategy on [0, 1]: every branch is open and halves; tags carry the branch's width."""

    def __init__(self):
        self.taken: list[list[float]] = []

    def bound(self, branches, deadline, stats):
        from assay.verify.search import BoundedBranches

        self.taken.append(sorted(branches.tags["width"].tolist(), reverse=True))
        return BoundedBranches(branches, torch.zeros(len(branches), dtype=torch.bool), torch.zeros(len(branches)))

    def probe(self, bounded, open_, deadline, stats):
        return None

    def decide(self, bounded, open_, deadline, stats):
        from assay.verify.search import LeafDecision

        return LeafDecision(torch.zeros_like(open_))

    def split(self, bounded, open_):
        from assay.verify.search import Branches

        parents = bounded.branches.select(open_)
        middle = (parents.lower + parents.upper) / 2
        lower = torch.cat([parents.lower, middle])
        upper = torch.cat([middle, parents.upper])
        return Branches(lower, upper, None, None, torch.cat([parents.weight, parents.weight]) / 2, None,
                        {"width": (upper - lower)[:, 0]})


def _halving_root():
    from assay.verify.search import Branches, SearchState

    root = Branches(torch.zeros(1, 1), torch.ones(1, 1), None, None, torch.ones(1), None, {"width": torch.ones(1)})
    return SearchState.start(root)


def test_priority_takes_the_largest_tag_first_and_stop_returns_a_resumable_state():
    strategy = Halving()
    rounds = []

    def stop(state):
        rounds.append(state.pending_count)
        return len(rounds) == 4

    outcome = branch_and_bound(strategy, _halving_root(), Counting(), batch_size=3, stats=SearchStats(),
                               keep_closed=True, priority="width", stop=stop)
    assert outcome.status == VerificationStatus.UNKNOWN and rounds == [2, 4, 7, 10]
    # Best first: every round takes the widest pending branches (depth first would take the newest).
    assert strategy.taken == [[1.0], [0.5, 0.5], [0.25, 0.25, 0.25], [0.25, 0.125, 0.125]]
    widths = torch.cat([chunk.tags["width"] for chunk in outcome.state.pending])
    assert float(widths.sum()) == pytest.approx(1.0)  # the pending branches still partition [0, 1], tags kept
    resumed = branch_and_bound(strategy, outcome.state, Counting(), batch_size=3, stats=SearchStats(),
                               keep_closed=True, priority="width", stop=lambda state: True)
    assert strategy.taken[4] == [0.125, 0.125, 0.125]
    assert resumed.status == VerificationStatus.UNKNOWN


def test_a_share_of_a_deadline_ends_before_it_and_none_stays_none():
    """``Deadline.share(f)``: f of the time left from now, never past the deadline itself."""
    import time

    deadline = Deadline.after(10.0)
    before = time.monotonic()
    quarter = deadline.share(0.25)
    assert before + 2.5 - 1e-3 <= quarter.at <= time.monotonic() + 2.5 and quarter.at < deadline.at
    assert deadline.share(1.0).at <= deadline.at and deadline.share(2.0).at == deadline.at
    assert math.isinf(Deadline().share(0.5).at)
