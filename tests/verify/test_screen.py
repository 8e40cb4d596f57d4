"""Properties that are disjunctions of many small boxes (nn4sys' lindex and mscn queries): the
verifier bounds the boxes together first (:func:`assay.verify.input_split.screen_queries`), each
with its own rows, and only the queries those bounds leave open go on.

Thresholds sit just above (1e-4) and just below (1e-5) each box's maximum, which on a box of
width 1e-3 sampling finds to ~1e-7: a screen may drop a query only when no point of its box is
unsafe, and must drop most of the clearly safe ones (or it proves nothing)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from assay.sets import read_vnnlib
from assay.verify import VerificationStatus, input_split, verify_vnnlib
from assay.verify.input_split import screen_queries
from assay.verify.problem import from_unsafe
from assay.verify.search import SearchStats
from tests.verify.networks import random_relu_network

BOXES, WIDTH, FIXED = 24, 1e-3, 0.25


def _network(seed):
    return random_relu_network(seed, widths=(2, 16, 16, 1))


def _boxes(seed):
    """Boxes over input 0 (width 1e-3), input 1 fixed (as most of mscn's inputs are)."""
    rng = np.random.default_rng(seed)
    lower = np.stack([rng.uniform(-1, 1, BOXES), np.full(BOXES, FIXED)], 1)
    upper = lower.copy()
    upper[:, 0] += WIDTH
    return torch.as_tensor(lower), torch.as_tensor(upper)


def _maxima(network, lower, upper):
    """Each box's maximum of the output, sampled on a fine grid (exact to ~1e-7 here)."""
    t = torch.linspace(0, 1, 2001, dtype=torch.float64)
    x = lower.unsqueeze(1) + t.view(1, -1, 1) * (upper - lower).unsqueeze(1)
    with torch.no_grad():
        return network(x.reshape(-1, 2)).reshape(len(lower), -1).amax(1)


class _Spec:
    def __init__(self, C, d):
        self.conjunctions = tuple(type("Conjunction", (), {"C": c, "d": dd})() for c, dd in zip(C, d))


def _queries(network, lower, upper, thresholds, two_rows=()):
    """Per box: unsafe where y ≥ threshold (one row); boxes in ``two_rows`` get a conjunction of
    two rows (y ≥ threshold and y ≥ threshold − 1), batched apart from the others."""
    queries = []
    for k in range(len(lower)):
        box = type("Box", (), {"lower": lower[k], "upper": upper[k]})()
        if k in two_rows:
            spec = _Spec([torch.tensor([[1.0], [1.0]], dtype=torch.float64)],
                         [torch.tensor([-thresholds[k], -thresholds[k] + 1.0], dtype=torch.float64)])
        else:
            spec = _Spec([torch.tensor([[1.0]], dtype=torch.float64)], [torch.tensor([-thresholds[k]], dtype=torch.float64)])
        queries += from_unsafe(network, box, spec, k)
    return queries


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("method", ["crown", "alpha"])
def test_a_screen_keeps_every_query_with_an_unsafe_point_and_drops_the_safe_ones(seed, method):
    network = _network(seed)
    lower, upper = _boxes(seed)
    peak = _maxima(network, lower, upper)
    offsets = torch.where(torch.arange(BOXES) % 3 == 0, -1e-5, 1e-4).to(torch.float64)
    queries = _queries(network, lower, upper, peak + offsets, two_rows={1, 2, 3, 4})
    kept = {q.index for q in screen_queries(network, queries, method=method, dtype="float64", stats=SearchStats())}
    unsafe = {k for k in range(BOXES) if offsets[k] < 0}
    assert unsafe <= kept, f"queries {sorted(unsafe - kept)} have unsafe points but were dropped"
    wide = _queries(network, lower, upper, peak + 0.05, two_rows={1, 2, 3, 4})
    left = screen_queries(network, wide, method=method, dtype="float64", stats=SearchStats())
    assert len(left) <= BOXES // 4, "the screen refutes almost nothing: the test proves little"


def _vnnlib(path, lower, upper, thresholds):
    lines = ["(declare-const X_0 Real)", "(declare-const X_1 Real)", "(declare-const Y_0 Real)", "(assert (or"]
    for k in range(len(lower)):
        lines.append(f"  (and (>= X_0 {float(lower[k, 0])!r}) (<= X_0 {float(upper[k, 0])!r}) "
                     f"(>= X_1 {FIXED!r}) (<= X_1 {FIXED!r}) (>= Y_0 {float(thresholds[k])!r}))")
    path.write_text("\n".join(lines + ["))"]) + "\n")
    return path


def _screen_calls(monkeypatch):
    """Record (method, boxes) of every bound call the screen makes."""
    calls = []
    original = input_split.compute_bounds

    def spy(network, bounds, **kwargs):
        calls.append((kwargs["method"], bounds[0].shape[0]))
        return original(network, bounds, **kwargs)

    monkeypatch.setattr(input_split, "compute_bounds", spy)
    return calls


@pytest.mark.parametrize("seed", range(3))
def test_interval_bounds_refute_tiny_safe_boxes_first_and_keep_every_unsafe_one(seed, monkeypatch):
    """Boxes of width 1e-7 (lindex's are ~1e-5): intervals refute the safe ones before the linear
    screen, which sees only what they leave; a box with an unsafe point is never dropped."""
    network = _network(seed)
    lower, upper = _boxes(seed)
    upper = lower + torch.tensor([1e-7, 0.0], dtype=torch.float64)
    peak = _maxima(network, lower, upper)
    offsets = torch.where(torch.arange(BOXES) % 3 == 0, -1e-9, 1e-4).to(torch.float64)
    queries = _queries(network, lower, upper, peak + offsets, two_rows={1, 2, 3, 4})
    monkeypatch.setattr(input_split, "SCREEN_BATCH", 8)
    monkeypatch.setattr(input_split, "INTERVAL_SCREEN_PROBE", 4)
    calls = _screen_calls(monkeypatch)
    kept = {q.index for q in screen_queries(network, queries, method="crown", dtype="float64", stats=SearchStats())}
    unsafe = {k for k in range(BOXES) if offsets[k] < 0}
    assert unsafe <= kept, f"queries {sorted(unsafe - kept)} have unsafe points but were dropped"
    assert kept == unsafe, "every safe box of width 1e-7 is refuted"
    interval = sum(boxes for method, boxes in calls if method == "ibp")
    linear = sum(boxes for method, boxes in calls if method != "ibp")
    assert interval == BOXES, "intervals screen every box first"
    assert linear == len(unsafe), "the linear screen sees only the boxes intervals leave"


def test_the_interval_screen_stops_when_it_refutes_little(monkeypatch):
    """Boxes of width 1e-3 against thresholds 1e-4 above their maxima: intervals refute few, so
    after one batch they are not tried again, and the linear screen still decides."""
    network = _network(0)
    lower, upper = _boxes(0)
    peak = _maxima(network, lower, upper)
    queries = _queries(network, lower, upper, peak + 1e-4)
    monkeypatch.setattr(input_split, "SCREEN_BATCH", 8)
    monkeypatch.setattr(input_split, "INTERVAL_SCREEN_PROBE", 4)
    calls = _screen_calls(monkeypatch)
    left = screen_queries(network, queries, method="crown", dtype="float64", stats=SearchStats())
    assert [(method, boxes) for method, boxes in calls if method == "ibp"] == [("ibp", 4)], "one small probe"
    assert sum(boxes for method, boxes in calls if method != "ibp") >= BOXES - 4
    assert len(left) <= BOXES // 4


@pytest.mark.parametrize("seed", range(2))
def test_many_boxes_hold_in_one_batched_call_and_one_unsafe_box_is_found(seed, tmp_path):
    network = _network(seed)
    lower, upper = _boxes(seed)
    peak = _maxima(network, lower, upper)
    safe = read_vnnlib(_vnnlib(tmp_path / "safe.vnnlib", lower, upper, peak + 0.05), 2, 1)
    result = verify_vnnlib(network, safe, timeout=60)
    assert result.status is VerificationStatus.HOLDS
    assert result.stats.queries == BOXES, "the statistics count the queries given, not those the screen left"
    thresholds = peak + 0.05
    thresholds[BOXES - 2] = peak[BOXES - 2] - 1e-5  # one box holds a point above its threshold
    unsafe = read_vnnlib(_vnnlib(tmp_path / "unsafe.vnnlib", lower, upper, thresholds), 2, 1)
    result = verify_vnnlib(network, unsafe, timeout=60)
    assert result.status is VerificationStatus.VIOLATED
    assert result.stats.queries == BOXES
    x = result.counterexample.input.reshape(-1)
    assert float(lower[BOXES - 2, 0]) <= float(x[0]) <= float(upper[BOXES - 2, 0]) and float(x[1]) == FIXED
    assert float(network(x.reshape(1, 2))) >= float(thresholds[BOXES - 2])


def test_a_screen_past_its_deadline_says_so_and_verify_times_out(tmp_path, monkeypatch):
    """A deadline that passes between the screen's batches: the screen returns None (nothing
    refuted is claimed) and verify answers TIMEOUT, not an error."""
    import time

    import assay.verify.input_split as input_split
    from assay.verify.deadline import Deadline

    network = _network(0)
    lower, upper = _boxes(0)
    peak = _maxima(network, lower, upper)
    queries = _queries(network, lower, upper, peak + 0.05)
    assert screen_queries(network, queries, method="crown", dtype="float64", stats=SearchStats(),
                          deadline=Deadline(time.monotonic() - 1)) is None
    monkeypatch.setattr(input_split, "SCREEN_BATCH", 2)
    monkeypatch.setattr(input_split, "INTERVAL_SCREEN_PROBE", 2)
    real = input_split.compute_bounds

    def slow(*args, **kwargs):  # each batch takes 0.2 s: the 0.5 s deadline passes mid-screen
        time.sleep(0.2)
        return real(*args, **kwargs)

    monkeypatch.setattr(input_split, "compute_bounds", slow)
    prop = read_vnnlib(_vnnlib(tmp_path / "safe.vnnlib", lower, upper, peak + 0.05), 2, 1)
    result = verify_vnnlib(network, prop, timeout=0.5)
    assert result.status is VerificationStatus.TIMEOUT


@pytest.mark.parametrize("seed", range(2))
def test_queries_the_screen_leaves_open_are_one_search_that_decides_each(seed, tmp_path, monkeypatch):
    """Wide boxes (0.8) and thresholds 0.002 above each box's maximum: the screen leaves some
    open, and those are searched as one family (one search; from 2 queries on here); the verdict
    holds. With one box's threshold 1e-5 below its maximum the family search finds that box's
    point."""
    import assay.verify.api as api

    monkeypatch.setattr(api, "SCREEN_MIN_QUERIES", 2)
    network = random_relu_network(seed, widths=(2, 32, 32, 32, 1))
    lower, upper = _boxes(seed)
    upper = upper.clone()
    upper[:, 0] = lower[:, 0] + 0.8
    peak = _maxima(network, lower, upper)
    queries = _queries(network, lower, upper, peak + 0.002)
    left = screen_queries(network, queries, method="crown", dtype="float64", stats=SearchStats())
    assert len(left) >= 4, "the screen settles these: the test proves little"
    safe = read_vnnlib(_vnnlib(tmp_path / "safe.vnnlib", lower, upper, peak + 0.002), 2, 1)
    result = verify_vnnlib(network, safe, timeout=120)
    assert result.status is VerificationStatus.HOLDS
    assert len(result.searches) == 1, "the open queries were not searched as one family"
    thresholds = peak + 0.002
    target = int(left[len(left) // 2].index)
    thresholds[target] = peak[target] - 1e-5
    unsafe = read_vnnlib(_vnnlib(tmp_path / "unsafe.vnnlib", lower, upper, thresholds), 2, 1)
    result = verify_vnnlib(network, unsafe, timeout=120)
    assert result.status is VerificationStatus.VIOLATED
    x = result.counterexample.input.reshape(-1)
    assert float(lower[target, 0]) <= float(x[0]) <= float(upper[target, 0])
    assert float(network(x.reshape(1, 2))) >= float(thresholds[target])


def test_a_screen_batches_boxes_that_vary_the_same_inputs_together(monkeypatch):
    """Queries that vary input 0, 1, 2 or 3 in turn, batches of 4: each batch varies one input
    (forward bounds then carry one coefficient column, not four), and every query with an unsafe
    point is still kept."""
    network = random_relu_network(5, widths=(4, 16, 16, 1))
    count = 16
    rng = np.random.default_rng(5)
    lower = torch.as_tensor(rng.uniform(-1, 1, (count, 4)))
    upper = lower.clone()
    upper[torch.arange(count), torch.arange(count) % 4] += WIDTH
    t = torch.linspace(0, 1, 2001, dtype=torch.float64)
    x = lower.unsqueeze(1) + t.view(1, -1, 1) * (upper - lower).unsqueeze(1)
    with torch.no_grad():
        peak = network(x.reshape(-1, 4)).reshape(count, -1).amax(1)
    offsets = torch.where(torch.arange(count) % 5 == 0, -1e-5, 1e-4).to(torch.float64)
    queries = []
    for k in range(count):
        box = type("Box", (), {"lower": lower[k], "upper": upper[k]})()
        spec = _Spec([torch.tensor([[1.0]], dtype=torch.float64)], [torch.tensor([-(peak[k] + offsets[k])], dtype=torch.float64)])
        queries += from_unsafe(network, box, spec, k)
    monkeypatch.setattr(input_split, "SCREEN_BATCH", 4)
    varying = []
    original = input_split.compute_bounds

    def spy(network, bounds, **kwargs):
        if kwargs["method"] != "ibp":  # the linear screen's batches
            varying.append(int((bounds[1] > bounds[0]).any(0).sum()))
        return original(network, bounds, **kwargs)

    monkeypatch.setattr(input_split, "compute_bounds", spy)
    kept = {q.index for q in screen_queries(network, queries, method="crown", dtype="float64", stats=SearchStats())}
    assert set(varying) == {1}, f"inputs varied per batch: {varying}"
    unsafe = {k for k in range(count) if offsets[k] < 0}
    assert unsafe <= kept, f"queries {sorted(unsafe - kept)} have unsafe points but were dropped"


def test_where_a_family_search_follows_only_intervals_screen(monkeypatch):
    """``linear=False`` (verify passes it where one family search follows): the screen makes
    interval bound calls only, and keeps every query intervals do not refute."""
    network = _network(0)
    lower, upper = _boxes(0)
    peak = _maxima(network, lower, upper)
    queries = _queries(network, lower, upper, peak + 1e-4)
    calls = _screen_calls(monkeypatch)
    left = screen_queries(network, queries, method="crown", dtype="float64", stats=SearchStats(), linear=False)
    assert calls and all(method == "ibp" for method, _ in calls)
    interval = input_split.compute_bounds(network, (lower, upper), spec=(torch.ones(BOXES, 1, 1, dtype=torch.float64),
                                          -(peak + 1e-4).reshape(-1, 1)), method="ibp", sides="upper")
    assert {q.index for q in left} == set((interval.upper[:, 0] >= 0).nonzero().flatten().tolist())
    assert len(left) > BOXES // 2, "intervals refute most boxes: the linear screen's absence proves little"


def test_queries_of_another_structure_leave_the_others_one_family(tmp_path, monkeypatch):
    """One box appears twice in the disjunction (two thresholds: one query of two conjunctions,
    as in mscn_dual's 2260 file): the other queries are still searched as one family, that query
    on its own; the verdict holds, and with one box's threshold below its maximum, is violated."""
    import assay.verify.api as api

    monkeypatch.setattr(api, "SCREEN_MIN_QUERIES", 2)
    network = random_relu_network(0, widths=(2, 32, 32, 32, 1))
    lower, upper = _boxes(0)
    upper = upper.clone()
    upper[:, 0] = lower[:, 0] + 0.8
    peak = _maxima(network, lower, upper)

    def write(path, thresholds):
        _vnnlib(path, lower, upper, thresholds)
        text = path.read_text().rstrip().removesuffix("))")
        k = 3  # box 3 again, with a second threshold
        text += (f"\n  (and (>= X_0 {float(lower[k, 0])!r}) (<= X_0 {float(upper[k, 0])!r}) "
                 f"(>= X_1 {FIXED!r}) (<= X_1 {FIXED!r}) (>= Y_0 {float(thresholds[k] + 0.01)!r}))\n))\n")
        path.write_text(text)
        return read_vnnlib(path, 2, 1)

    safe = write(tmp_path / "safe.vnnlib", peak + 0.002)
    result = verify_vnnlib(network, safe, timeout=120)
    assert result.status is VerificationStatus.HOLDS
    assert len(result.searches) <= 2, "the queries of one structure were not searched as one family"
    thresholds = peak + 0.002
    thresholds[BOXES - 5] = peak[BOXES - 5] - 1e-5
    result = verify_vnnlib(network, write(tmp_path / "unsafe.vnnlib", thresholds), timeout=120)
    assert result.status is VerificationStatus.VIOLATED
    x = result.counterexample.input.reshape(-1)
    assert float(network(x.reshape(1, 2))) >= float(thresholds[BOXES - 5])


def test_the_queries_of_another_structure_are_a_family_of_their_own(tmp_path, monkeypatch):
    """After the screen of a large disjunction, the few queries of another structure (box 3 with
    two thresholds) are searched as a family too (forward bounds, no attack of their own), and
    a violation in them is found: that query's box reaches its lower threshold."""
    import assay.verify.api as api

    monkeypatch.setattr(api, "SCREEN_MIN_QUERIES", 4)
    network = random_relu_network(0, widths=(2, 32, 32, 32, 1))
    lower, upper = _boxes(0)
    upper = upper.clone()
    upper[:, 0] = lower[:, 0] + 0.8
    peak = _maxima(network, lower, upper)
    families = []
    original = api.InputSplitting

    def spy(*args, **kwargs):
        families.append(kwargs.get("family"))
        return original(*args, **kwargs)

    monkeypatch.setattr(api, "InputSplitting", spy)

    def write(path, thresholds, second):
        _vnnlib(path, lower, upper, thresholds)
        text = path.read_text().rstrip().removesuffix("))")
        text += (f"\n  (and (>= X_0 {float(lower[3, 0])!r}) (<= X_0 {float(upper[3, 0])!r}) "
                 f"(>= X_1 {FIXED!r}) (<= X_1 {FIXED!r}) (>= Y_0 {second!r}))\n))\n")
        path.write_text(text)
        return read_vnnlib(path, 2, 1)

    thresholds = peak + 0.002
    result = verify_vnnlib(network, write(tmp_path / "safe.vnnlib", thresholds, float(peak[3] + 0.01)), timeout=120)
    assert result.status is VerificationStatus.HOLDS
    assert families and all(f is not None for f in families), "a query was searched on its own"
    families.clear()
    result = verify_vnnlib(network, write(tmp_path / "unsafe.vnnlib", thresholds, float(peak[3] - 1e-4)), timeout=120)
    assert result.status is VerificationStatus.VIOLATED
    assert all(f is not None for f in families)
    x = result.counterexample.input.reshape(-1)
    assert float(lower[3, 0]) <= float(x[0]) <= float(upper[3, 0])
    assert float(network(x.reshape(1, 2))) >= float(peak[3] - 1e-4)
