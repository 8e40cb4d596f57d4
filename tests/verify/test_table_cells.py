"""A box that varies only in the keys of a network's IndexTables (a patch's row) is decided cell
by cell: the answer agrees with enumerating every row; a counterexample violates; a box where
another input varies, or a key that another layer reads, is left to the search."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from assay.nn import load
from assay.sets import Box
from assay.verify import VerificationStatus, verify
from assay.verify.problem import from_unsafe
from assay.verify.search import SearchStats
from assay.verify.table_cells import decide_by_cells, table_keys
from tests.nn.test_general_networks import _patch_and_decide
from tests.nn.test_onnx import GraphMaker

WRONG = SimpleNamespace(conjunctions=(SimpleNamespace(C=torch.tensor([[-1.0]], dtype=torch.float64),
                                                      d=torch.tensor([0.5], dtype=torch.float64)),))  # y ≤ 0.5


def _network(seed):
    rng = np.random.default_rng(seed)
    g = GraphMaker(rng)
    return load(g.model([18], _patch_and_decide(g), output_rank=1)), rng


@pytest.mark.parametrize("seed", [0, 5, 7])
def test_agrees_with_enumerating_every_row(seed):
    network, rng = _network(seed)
    image = rng.uniform(-1.0, 1.0, size=16)
    statuses = set()
    for label in range(4):
        rows = torch.tensor([[*image, row, label] for row in range(4)], dtype=torch.float64)
        truth = network.forward(rows).reshape(-1)
        lower = torch.tensor([*image, 0.0, label], dtype=torch.float64)
        upper = torch.tensor([*image, 3.999, label], dtype=torch.float64)
        result = verify(network, Box(lower, upper), unsafe=WRONG, timeout=60)
        expected = VerificationStatus.VIOLATED if (truth <= 0.5).any() else VerificationStatus.HOLDS
        assert result.status == expected, (label, truth)
        statuses.add(result.status)
        if expected == VerificationStatus.VIOLATED:
            x = result.counterexample.input.reshape(1, -1)
            assert network.forward(x).item() <= 0.5 and (lower <= x).all() and (x <= upper).all()
        assert result.stats.leaf_lps == 0 and result.stats.domains <= 4  # no branching: a point per row at most
    assert (VerificationStatus.HOLDS in statuses) == (seed != 0)  # seeds 5 and 7: a label every row agrees on


def test_left_to_the_search_where_another_input_varies_or_a_key_is_read_elsewhere():
    network, rng = _network(0)
    assert table_keys(network) == {16: table_keys(network)[16]}
    lower = torch.tensor([*rng.uniform(-1.0, 1.0, size=16), 0.0, 1.0], dtype=torch.float64)
    upper = lower.clone()
    upper[16], upper[3] = 3.0, lower[3] + 0.1  # a pixel varies too
    (query,) = from_unsafe(network, Box(lower, upper), WRONG)
    assert decide_by_cells(network, query, method="crown", dtype="float64", stats=SearchStats()) is None
    # a layer that reads the key's input position as well: not a table-only key
    g = GraphMaker(np.random.default_rng(0))
    out = g.node("Add", [_patch_and_decide(g), g.node("Gather", ["x", g.const(16, np.int64)], axis=0)])
    assert table_keys(load(g.model([18], out, output_rank=1))) is None


def test_holds_rests_on_the_bounds_of_every_point(monkeypatch):
    """With bounds that exclude nothing, a query every row satisfies is not decided here."""
    import assay.verify.input_split as input_split
    import assay.verify.table_cells as table_cells

    network, rng = _network(7)
    image = rng.uniform(-1.0, 1.0, size=16)
    lower = torch.tensor([*image, 0.0, 0.0], dtype=torch.float64)
    upper = torch.tensor([*image, 3.999, 0.0], dtype=torch.float64)
    (query,) = from_unsafe(network, Box(lower, upper), WRONG)
    decision = decide_by_cells(network, query, method="crown", dtype="float64", stats=SearchStats())
    assert decision is not None and decision.holds and decision.points <= 4

    def unbounded(network, box, **kwargs):
        return SimpleNamespace(upper=torch.full((box[0].shape[0], 1), torch.inf, dtype=torch.float64))

    monkeypatch.setattr(table_cells, "compute_bounds", unbounded)
    monkeypatch.setattr(input_split, "bound_boxes", lambda network, query, lower, *rest, **kw: (
        None, torch.ones(lower.shape[0], 1, dtype=torch.float64)))
    assert decide_by_cells(network, query, method="crown", dtype="float64", stats=SearchStats()) is None
