"""Input splitting keeps α-CROWN only while it refutes boxes that CROWN leaves open."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import torch

from assay.verify.input_split import AlphaLedger, bound_boxes
from assay.verify.problem import from_unsafe
from assay.verify.search import SearchStats
from tests.verify.test_input_split import sample
from tests.verify.test_verify import random_network


def test_the_ledger_turns_alpha_off_when_it_refutes_too_little_and_retries_on_a_sample():
    ledger = AlphaLedger()
    open_ = torch.tensor([True, False] * 50)  # 50 open boxes of 100
    assert ledger.active and torch.equal(ledger.choose(open_), open_)  # no evidence yet: all of them
    ledger.record(50, 6)  # 12 % < 1/8
    assert not ledger.active
    chosen = [ledger.choose(open_) for _ in range(ledger.retry_every * 2)]
    sampled = [c for c in chosen if c.any()]
    assert len(sampled) == 2  # one retry every `retry_every` rounds ...
    for c in sampled:  # ... of `sample` open boxes, spread over them (the first and the last included)
        assert int(c.sum()) == ledger.sample and not (c & ~open_).any()
        assert bool(c[0]) and bool(c[98])
    ledger.record(32, 16)  # the retry refutes half: α is back on for every open box
    assert ledger.active and torch.equal(ledger.choose(open_), open_)
    few = torch.zeros(100, dtype=torch.bool)
    few[[3, 40]] = True
    ledger.record(400, 0)
    while not ledger.choose(few).any():
        pass
    assert torch.equal(ledger.choose(few) | few, few)  # a retry never picks a closed box
    # old evidence fades: a long run of refutations outweighs an early failure
    ledger = AlphaLedger()
    ledger.record(1000, 0)
    for _ in range(6):
        ledger.record(20, 4)
    assert ledger.active


def _problem():
    """A random network, 200 boxes and a query that CROWN leaves about half of them open on."""
    network = random_network(3, widths=(3, 16, 16, 16, 3))
    rng = np.random.default_rng(1)
    lower = torch.as_tensor(rng.uniform(-1, 0.6, (200, 3)))
    upper = lower + torch.as_tensor(rng.uniform(0.05, 0.4, (200, 3)))
    C = torch.tensor([[1.0, -1.0, 0.0], [1.0, 0.0, -1.0], [0.0, 1.0, -1.0]], dtype=torch.float64)
    x = sample(lower, upper, rng, 4000)
    rows = network.forward(x.reshape(-1, 3)).reshape(4000, 200, 3) @ C.T
    offsets = -rows.amax((0, 1)) * 0.4
    unsafe = SimpleNamespace(conjunctions=(SimpleNamespace(C=C[:2], d=offsets[:2]), SimpleNamespace(C=C[2:], d=offsets[2:])))
    query = from_unsafe(network, SimpleNamespace(lower=-torch.ones(3), upper=torch.ones(3)), unsafe)[0]
    return network, query, lower, upper, (rows + offsets)


def test_bound_boxes_gives_alpha_only_the_boxes_the_ledger_chooses_and_records_what_it_refuted():
    network, query, lower, upper, values = _problem()
    args = (network, query, lower, upper, None)
    crown, crown_groups = bound_boxes(*args, "crown", "float64", SearchStats(), {})
    alpha, alpha_groups = bound_boxes(*args, "alpha", "float64", SearchStats(), {})
    ledger = AlphaLedger()
    kept, kept_groups = bound_boxes(*args, "alpha", "float64", SearchStats(), {}, ledger=ledger)
    refuted = lambda groups: (groups < 0).all(1)  # noqa: E731
    gained = int((refuted(alpha_groups) & ~refuted(crown_groups)).sum())
    assert gained > 0
    assert ledger.tried == int((~refuted(crown_groups)).sum()) and ledger.refuted == gained
    torch.testing.assert_close(kept_groups, alpha_groups)
    # An inactive ledger: CROWN's bounds on every box but the retry sample, α's on the sample.
    ledger = AlphaLedger(tried=1e6, rounds=0, retry_every=1, sample=16)
    stats = SearchStats()
    mixed, mixed_groups = bound_boxes(*args, "alpha", "float64", stats, {}, ledger=ledger)
    sampled = ~torch.isclose(mixed_groups, crown_groups).all(1)
    assert 0 < int(sampled.sum()) <= 16 and stats.bound_calls == 2
    assert ledger.tried == 1e6 / 2 + 16
    ledger = AlphaLedger(tried=1e6, rounds=0, retry_every=1000)
    stats = SearchStats()
    plain, plain_groups = bound_boxes(*args, "alpha", "float64", stats, {}, ledger=ledger)
    torch.testing.assert_close(plain_groups, crown_groups)
    torch.testing.assert_close(plain.upper, crown.upper)
    assert stats.bound_calls == 1  # no α pass at all
    # Every variant stays sound at the sampled points.
    per_group = torch.stack([values[..., query.groups == g].amin(-1) for g in range(2)], -1).amax(0)
    for groups in (kept_groups, mixed_groups, plain_groups):
        assert (per_group <= groups).all()
