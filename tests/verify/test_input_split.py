"""Direct falsification of the input-splitting steps that can close or shrink a box."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import torch

from assay.verify.input_split import _clip_boxes, _conjunction_upper


def random_linear_bounds(rng, boxes=64, rows=4, n=5):
    lower = torch.as_tensor(rng.uniform(-1, 0.5, (boxes, n)))
    upper = lower + torch.as_tensor(rng.uniform(0.01, 1.0, (boxes, n)))
    A = torch.as_tensor(rng.normal(size=(boxes, rows, n)))
    b = torch.as_tensor(rng.normal(0, 0.5, (boxes, rows)))
    peak = torch.maximum(A * lower.unsqueeze(1), A * upper.unsqueeze(1)).sum(2) + b
    linear = SimpleNamespace(upper_A=A, upper_b=b)
    # Like compute_bounds, the rows' concrete upper bounds are rounded outwards.
    scale = (A.abs() * torch.maximum(lower.abs(), upper.abs()).unsqueeze(1)).sum(2) + b.abs()
    return lower, upper, linear, SimpleNamespace(linear=linear, upper=peak + 1e-12 * scale)


def sample(lower, upper, rng, count=20_000):
    u = torch.as_tensor(rng.uniform(size=(count, *lower.shape)))
    u[: count // 4] = torch.as_tensor(rng.integers(0, 2, size=(count // 4, *lower.shape)), dtype=u.dtype)
    return lower + (upper - lower) * u  # (count, boxes, n)


def test_clipping_never_cuts_away_a_point_that_could_violate():
    rng = np.random.default_rng(0)
    for groups in (torch.tensor([0, 0, 0, 0]), torch.tensor([0, 0, 1, 1])):
        lower, upper, linear, result = random_linear_bounds(rng)
        group_upper = _conjunction_upper(result, lower, upper, groups, {})
        clipped_lower, clipped_upper, empty = _clip_boxes(linear, lower, upper, groups, group_upper)
        x = sample(lower, upper, rng)
        values = torch.einsum("cbn,brn->cbr", x, linear.upper_A) + linear.upper_b  # (count, boxes, rows)
        per_group = torch.stack([values[..., groups == g].amin(-1) for g in range(int(groups.max()) + 1)], -1)
        possible = (per_group >= 0).any(-1)  # (count, boxes): all rows of some group may be ≥ 0 here
        # The combined bound is an upper bound of max_x min_i (a_i x + b_i) for every group...
        assert (per_group.amax(0) <= group_upper).all()
        # ... no box with such a point is declared empty, and every such point stays in the clipped box.
        assert not (possible & empty.unsqueeze(0)).any()
        inside = ((x >= clipped_lower) & (x <= clipped_upper)).all(-1)
        assert inside[possible].all()
        # The clipping does something on these random instances (the test is not vacuous).
        assert empty.any() or (clipped_upper - clipped_lower < upper - lower).any()


def test_alpha_pass_bounds_hold_at_sampled_points_and_are_never_looser_than_crown():
    """The α-CROWN pass on boxes CROWN leaves open: its row bounds, linear bounds and conjunction
    bounds hold at sampled points of every box, and never exceed CROWN's."""
    from assay.verify.input_split import bound_boxes
    from assay.verify.problem import from_unsafe
    from assay.verify.search import SearchStats
    from tests.verify.test_verify import random_network

    network = random_network(3, widths=(3, 16, 16, 16, 3))
    rng = np.random.default_rng(1)
    lower = torch.as_tensor(rng.uniform(-1, 0.6, (200, 3)))
    upper = lower + torch.as_tensor(rng.uniform(0.05, 0.4, (200, 3)))
    C = torch.tensor([[1.0, -1.0, 0.0], [1.0, 0.0, -1.0], [0.0, 1.0, -1.0]], dtype=torch.float64)
    x = sample(lower, upper, rng, 4000)  # (count, boxes, n)
    outputs = network.forward(x.reshape(-1, 3)).reshape(4000, 200, 3)
    rows = outputs @ C.T  # (count, boxes, rows)
    # Offsets that leave about half the boxes undecided by CROWN, so the α pass has work to do.
    offsets = -rows.amax((0, 1)) * 0.4
    unsafe = SimpleNamespace(conjunctions=(
        SimpleNamespace(C=C[:2], d=offsets[:2]), SimpleNamespace(C=C[2:], d=offsets[2:]),
    ))
    query = from_unsafe(network, SimpleNamespace(lower=-torch.ones(3), upper=torch.ones(3)), unsafe)[0]
    crown, crown_groups = bound_boxes(network, query, lower, upper, None, "crown", "float64", SearchStats(), {})
    alpha, alpha_groups = bound_boxes(network, query, lower, upper, None, "alpha", "float64", SearchStats(), {})
    values = rows + offsets
    linear_values = torch.einsum("cbn,brn->cbr", x, alpha.linear.upper_A.reshape(200, 3, 3)) + alpha.linear.upper_b
    per_group = torch.stack([values[..., query.groups == g].amin(-1) for g in range(2)], -1)
    assert (values.amax(0) <= alpha.upper).all()
    assert (values <= linear_values + 1e-9).all()
    assert (per_group.amax(0) <= alpha_groups).all()
    assert (alpha.upper <= crown.upper).all() and (alpha_groups <= crown_groups).all()
    # Not vacuous: the pass refutes boxes that CROWN could not.
    refuted = lambda groups: (groups < 0).all(1)  # noqa: E731
    assert (refuted(alpha_groups) & ~refuted(crown_groups)).any()


def test_root_refutation_is_never_contradicted_by_sampling_and_skips_the_search():
    """A query refuted by bounds over its whole box has no sampled violating point, and the
    verifier then answers HOLDS without searching; queries left open are still searched."""
    from assay.bounds import compute_bounds
    from assay.sets import Box
    from assay.verify import verify
    from assay.verify.deadline import Deadline
    from assay.verify.input_split import InputSplitting, bound_root, root_branch
    from assay.verify.problem import from_unsafe
    from assay.verify.search import SearchStats, branch_and_bound
    from tests.verify.test_verify import random_network, unsafe_region

    network = random_network(4, widths=(3, 12, 12, 2))
    rng = np.random.default_rng(4)
    x = torch.as_tensor(rng.uniform(-1, 1, (100_000, 3)))
    x[:20_000] = torch.as_tensor(rng.choice([-1.0, 1.0], (20_000, 3)))
    difference = (network.forward(x) @ torch.tensor([1.0, -1.0], dtype=torch.float64)).amax()
    box = Box(-torch.ones(3, dtype=torch.float64), torch.ones(3, dtype=torch.float64))
    C = torch.tensor([[1.0, -1.0]], dtype=torch.float64)
    root = compute_bounds(network, (box.lower.unsqueeze(0), box.upper.unsqueeze(0)), spec=(C, torch.zeros(1, dtype=torch.float64)))
    outcomes = []
    # From offsets with sampled violations to offsets beyond CROWN's root bound.
    for offset in -torch.linspace(float(difference) - 0.2, float(root.upper) + 0.5, 15):
        unsafe = unsafe_region(C, offset.reshape(1))
        query = from_unsafe(network, box, unsafe)[0]
        root_stats = SearchStats()
        root_bounds = bound_root(network, query, method="alpha", dtype="float64", stats=root_stats)
        refuted = root_bounds.refuted
        sampled_violation = bool(((network.forward(x) @ C.T).squeeze(1) + offset >= 0).any())
        assert not (refuted and sampled_violation)
        # Branching from the reused root bounds is the same search as branching from scratch.
        fresh_stats = SearchStats()
        fresh = branch_and_bound(InputSplitting(network, query, method="alpha"), root_branch(query),
                                 Deadline.after(30), batch_size=1024, stats=fresh_stats)
        reused = branch_and_bound(InputSplitting(network, query, method="alpha", root=root_bounds), root_branch(query),
                                  Deadline.after(30), batch_size=1024, stats=root_stats)
        assert reused.status == fresh.status and root_stats.domains == fresh_stats.domains
        result = verify(network, box, unsafe=unsafe, timeout=30)
        # no attack when the root's bounds refute the query; otherwise the verifier's own attack
        # (and the search's probes on long searches) ran
        assert (result.stats.attacks == 0) == refuted
        if refuted:
            assert result.status.value == "holds"
        outcomes.append(refuted)
    assert any(outcomes) and not all(outcomes)  # both branches are exercised


def test_a_lopsided_box_is_split_along_its_widest_input():
    """Where |A|·width chose an input more than 4× narrower (relative to its query's box) than the
    widest, the widest is split instead; otherwise the choice stands."""
    from assay.verify.input_split import _widest_if_lopsided

    relative = torch.tensor([[1.0, 0.2, 0.0], [1.0, 0.3, 0.0], [0.1, 0.1, 0.0]], dtype=torch.float64)
    chosen = torch.tensor([1, 1, 0])
    assert _widest_if_lopsided(chosen, relative).tolist() == [0, 1, 0]


def _flat_slack_network():
    """z = σ(0.1·x0 + |x1| − |x1|), each |x1| as relu(x1) + relu(−x1) on its own neurons: on
    x1 ∈ [−1, 1] CROWN bounds the first copy above by the constant 1 and the second by 0, so the
    linear bound's coefficient on x1 is 0 while its slack (1) goes only when x1 is split."""
    from assay.nn import Linear, Network, ReLU, ops

    W1 = torch.tensor([[1.0, 0], [0, 1], [0, -1], [0, 1], [0, -1]], dtype=torch.float64)
    W2 = torch.tensor([[0.1, 1, 1, -1, -1]], dtype=torch.float64)
    return Network((Linear(W1, torch.zeros(5, dtype=torch.float64)), ReLU(),
                    Linear(W2, torch.zeros(1, dtype=torch.float64)), ops.Sigmoid()), (2,))


def test_an_input_the_linear_bound_ignores_is_still_split():
    """Scored by |A|·width alone, the search above splits x0 forever (57,000 boxes in 10 s, then
    a timeout); with the aspect ratio bounded it holds within a few dozen boxes. Just below the
    maximum σ(0.1) the query is violated and the point is found."""
    from assay.verify import VerificationStatus, verify

    network = _flat_slack_network()
    box = SimpleNamespace(lower=torch.tensor([0.5, -1.0], dtype=torch.float64),
                          upper=torch.tensor([1.0, 1.0], dtype=torch.float64))

    def unsafe(threshold):
        return SimpleNamespace(conjunctions=(SimpleNamespace(C=torch.tensor([[1.0]], dtype=torch.float64),
                                                             d=torch.tensor([-threshold], dtype=torch.float64)),))

    peak = float(torch.sigmoid(torch.tensor(0.1, dtype=torch.float64)))
    result = verify(network, box, unsafe=unsafe(peak + 0.002), timeout=30, strategy="input")
    assert result.status is VerificationStatus.HOLDS and result.stats.domains < 500
    result = verify(network, box, unsafe=unsafe(peak - 1e-4), timeout=30, strategy="input")
    assert result.status is VerificationStatus.VIOLATED
    x = result.counterexample.input.reshape(1, 2)
    assert float(network(x)) >= peak - 1e-4


def test_input_rounds_grow_only_on_networks_of_small_tensors():
    """A round of input splitting bounds more than ``batch_size`` boxes only where the network's
    tensors are small (at most 8 times as many); ACAS Xu-sized networks keep ``batch_size``."""
    from assay.verify.input_split import INPUT_ROUND_GROWTH, input_round_size
    from tests.verify.test_verify import random_network

    tiny = random_network(0, widths=(3, 4, 4, 2))  # 3 + 4 + 4 + 4 + 4 + 2 elements a box
    assert input_round_size(tiny, 1024) == INPUT_ROUND_GROWTH * 1024
    assert input_round_size(tiny, 7) == INPUT_ROUND_GROWTH * 7
    acas_sized = random_network(0, widths=(5, 50, 50, 50, 50, 50, 50, 5))  # 615 elements a box
    assert input_round_size(acas_sized, 1024) == 1024
    assert input_round_size(acas_sized, 100) > 100  # a small batch still grows, up to the element budget


def test_a_row_repeated_across_conjunctions_is_bounded_once_with_the_same_bounds():
    """A query whose conjunctions share a row (lsnc: every group holds V(x) ≤ ρ) gets, for each
    repeat, exactly the bounds and linear bounds of bounding every row as given."""
    from assay.bounds import compute_bounds
    from assay.verify.input_split import _distinct_spec_rows, bound_boxes
    from assay.verify.problem import from_unsafe
    from assay.verify.search import SearchStats
    from tests.verify.test_verify import random_network

    network = random_network(3, widths=(3, 16, 16, 3))
    rng = np.random.default_rng(4)
    lower = torch.as_tensor(rng.uniform(-1, 0.6, (50, 3)))
    upper = lower + torch.as_tensor(rng.uniform(0.05, 0.4, (50, 3)))
    shared = torch.tensor([[0.0, 0.0, -1.0]], dtype=torch.float64)
    unsafe = SimpleNamespace(conjunctions=tuple(
        SimpleNamespace(C=torch.cat([torch.tensor([row], dtype=torch.float64), shared]), d=torch.tensor([0.1, 0.2]))
        for row in ([1.0, -1.0, 0.0], [0.0, 1.0, -1.0], [1.0, 0.0, 0.0])))
    query = from_unsafe(network, SimpleNamespace(lower=-torch.ones(3), upper=torch.ones(3)), unsafe)[0]
    C, d, inverse = _distinct_spec_rows(query.C, query.d)
    assert C.shape[0] == 4 and torch.equal(C[inverse], query.C) and torch.equal(d[inverse], query.d)
    result, _ = bound_boxes(network, query, lower, upper, None, "crown", "float64", SearchStats(), {})
    every = compute_bounds(network, (lower, upper), spec=(query.C, query.d), method="crown", dtype="float64",
                           sides="upper", return_linear=True)
    assert torch.allclose(result.upper, every.upper, rtol=0, atol=1e-12)
    assert torch.allclose(result.linear.upper_A, every.linear.upper_A, rtol=0, atol=1e-12)
    assert torch.allclose(result.linear.upper_b, every.linear.upper_b, rtol=0, atol=1e-12)
