"""The bound rules of ArgMax, Equal, IndexTable (intervals and constant lines) and Cast, checked
exactly with mpmath on boxes that decide, that tie, that straddle the points where the decision
changes, tiny (width 1e-7) and wide ones, at float32 and float64."""

from __future__ import annotations

import math

import mpmath
import numpy as np
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper

from assay.bounds.rules import rule_for
from assay.bounds.rules.decisions import ArgMaxRule, EqualRule, IndexTableRule
from assay.bounds.rules.steps import CastRule
from assay.nn.ops.decision import ArgMax, Cast, Equal, IndexTable
from tests.bounds.rules.harness import check_elementwise, check_multi_input, straddling_intervals, tiny_intervals


def _box(rng, shape, center=0.0, width=1.0):
    c = rng.normal(size=shape) + center
    w = rng.uniform(0.0, width, size=shape)
    return c - w, c + w


def _point(values):
    v = np.asarray(values, dtype=np.float64)
    return v, v.copy()


def _argmax_exact(axis, keepdims, last=False):
    def f(x):
        x = np.asarray(x, dtype=object)
        moved = np.moveaxis(x, axis, -1)
        out = np.empty(moved.shape[:-1], dtype=object)
        for index in np.ndindex(out.shape):
            row = list(moved[index])
            best = max(row)
            hits = [i for i, v in enumerate(row) if v == best]
            out[index] = mpmath.mpf(hits[-1] if last else hits[0])
        return np.expand_dims(out, axis) if keepdims else out
    return f


@pytest.mark.parametrize(("axis", "keepdims", "last"), [(0, False, False), (1, True, False), (1, False, True)])
def test_argmax_sound_on_deciding_tying_tiny_and_wide_boxes(rng, axis, keepdims, last):
    layer = ArgMax(axis, keepdims, last)
    shape = (3, 4)
    winner = np.zeros(shape)
    winner[1, :] = 3.0
    winner[:, 2] += 3.0
    boxes = [[_box(rng, shape)], [_box(rng, shape, 0.0, 3.0)],
             [_box(rng, shape, 0.0, 0.01)],
             [tuple(winner + e for e in _box(rng, shape, 0.0, 0.2))],  # one entry decides
             [_point(np.ones(shape))],  # every entry ties
             [(np.ones(shape) - 5e-8, np.ones(shape) + 5e-8)],  # tiny boxes around a tie
             [(np.full(shape, -1.0), np.full(shape, 1.0))]]
    assert isinstance(rule_for(layer), ArgMaxRule)
    assert check_multi_input(rule_for(layer), layer, _argmax_exact(axis, keepdims, last), boxes) > 0


def test_argmax_is_exact_when_one_entry_dominates():
    layer = ArgMax(0, keepdims=False)
    lower = torch.tensor([[0.0, 2.0, -1.0], [0.0, 0.5, 0.9]])
    upper = torch.tensor([[1.0, 3.0, 1.9], [1.0, 0.8, 1.2]])
    lo, hi = rule_for(layer).interval(layer, [(lower, upper)])
    assert lo.tolist() == [1.0, 0.0] and hi.tolist() == [1.0, 2.0]


def _equal_exact(a, b):
    a, b = np.broadcast_arrays(np.asarray(a, dtype=object), np.asarray(b, dtype=object))
    out = np.empty(a.shape, dtype=object)
    for index in np.ndindex(a.shape):
        out[index] = mpmath.mpf(1 if a[index] == b[index] else 0)
    return out


def test_equal_sound_on_points_disjoint_overlapping_and_tiny_boxes(rng):
    layer = Equal()
    shape = (4,)
    labels = np.array([0.0, 1.0, 2.0, 2.0])
    boxes = [[_point(labels), _point([0.0, 1.0, 1.0, 2.0])],  # equal and different points
             [_box(rng, shape), _box(rng, shape)],
             [_box(rng, shape, 5.0, 0.5), _box(rng, shape, -5.0, 0.5)],  # disjoint
             [(labels - 5e-8, labels + 5e-8), _point(labels)],  # tiny, around the point
             [(labels, labels + 1e-7), (labels - 1e-7, labels)]]  # touching at one end
    assert isinstance(rule_for(layer), EqualRule)
    assert check_multi_input(rule_for(layer), layer, _equal_exact, boxes) > 0
    lo, hi = rule_for(layer).interval(layer, [tuple(torch.tensor(v).unsqueeze(0) for v in _point(labels))] * 2)
    assert lo.tolist() == [[1.0] * 4] and hi.tolist() == [[1.0] * 4]


def _table_model(table: np.ndarray) -> bytes:
    """key0, key1 (float scalars) → Cast to int64 → table[key0][key1] (a row of ``table``)."""
    nodes = [helper.make_node("Cast", ["k0"], ["i0"], to=TensorProto.INT64),
             helper.make_node("Cast", ["k1"], ["i1"], to=TensorProto.INT64),
             helper.make_node("Gather", ["table", "i0"], ["row"], axis=0),
             helper.make_node("Gather", ["row", "i1"], ["out"], axis=0)]
    graph = helper.make_graph(nodes, "table", [helper.make_tensor_value_info(k, TensorProto.FLOAT, []) for k in ("k0", "k1")],
                              [helper.make_tensor_value_info("out", TensorProto.FLOAT, None)],
                              [numpy_helper.from_array(table.astype(np.float32), "table")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]).SerializeToString()


def test_index_table_hull_over_the_integer_keys_it_reaches(rng):
    table = rng.normal(size=(5, 4, 3)).astype(np.float32)
    layer = IndexTable(_table_model(table), ("k0", "k1"), "out", (3,))

    def exact(k0, k1):
        i0, i1 = (int(mpmath.floor(k[0])) for k in (k0, k1))  # keys ≥ 0: truncation is floor
        return np.array([mpmath.mpf(float(v)) for v in table[i0, i1]], dtype=object)

    boxes = [[_point([2.0]), _point([3.0])], [([0.0], [4.0]), ([0.0], [3.0])],  # one key, every key
             [([1.0 - 1e-7], [1.0]), ([2.0], [2.0 + 1e-7])],  # tiny, at an integer (a jump)
             [([0.9], [1.1]), ([2.5], [2.7])], [([3.2], [3.9]), ([0.1], [0.9])]]
    assert isinstance(rule_for(layer), IndexTableRule)
    assert check_multi_input(rule_for(layer), layer, exact, boxes) > 0
    assert layer.forward(torch.tensor([[2.7]]), torch.tensor([[1.2]])).tolist() == [table[2, 1].tolist()]
    lo, hi = rule_for(layer).interval(layer, [(torch.tensor([[2.2]]), torch.tensor([[2.9]]))] * 2)
    assert lo.tolist() == hi.tolist() == [table[2, 2].tolist()]  # one key tuple: exact


def test_index_table_unbounded_beyond_its_limit():
    layer = IndexTable(_table_model(np.zeros((5, 4, 3))), ("k0", "k1"), "out", (3,))
    lo, hi = rule_for(layer).interval(layer, [(torch.tensor([[-1e9]]), torch.tensor([[1e9]]))] * 2)
    assert lo.tolist() == [[-math.inf] * 3] and hi.tolist() == [[math.inf] * 3]


def _cast_exact(to):
    def f(z):
        if to == TensorProto.FLOAT:
            return mpmath.mpf(float(np.float32(float(z)))) if abs(z) < 3.5e38 else None
        if to == TensorProto.FLOAT16:
            return mpmath.mpf(float(np.float16(float(z)))) if abs(z) < 65000 else None
        if to == TensorProto.BOOL:
            return mpmath.mpf(0 if z == 0 else 1)
        return mpmath.floor(z) if z >= 0 else mpmath.ceil(z)  # integers truncate towards zero
    return f


@pytest.mark.parametrize("to", [TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.DOUBLE, TensorProto.INT64,
                                TensorProto.BOOL])
def test_cast_sound_everywhere(to):
    layer = Cast(to)
    points = [0.0, 1.0, -1.0, 2.5, 1.0 / 3.0, 2.0 ** 24 + 1]
    intervals = [(-3.0, 2.0), (0.1, 0.9), (0.0, 0.0), (1.0 / 3.0, 1.0 / 3.0), (-1e-30, 1e-31), (1e4, 1e4 + 0.1),
                 (-1e-6, 1e-6), (2.0 ** 24 - 4, 2.0 ** 24 + 4)]
    intervals += tiny_intervals(points) + straddling_intervals(points, widths=(1e-6, 0.3, 2.0))
    if to == TensorProto.FLOAT16:
        intervals += [(6e4, 7e4)]  # beyond float16's largest: rounds to inf
    exact = _cast_exact(to)
    if to == TensorProto.DOUBLE:
        exact = lambda z: z  # noqa: E731 (a no-op on float32 and float64 inputs)
    assert isinstance(rule_for(layer), CastRule)
    assert check_elementwise(rule_for(layer), layer, exact, intervals, count=8) > 0


def test_cast_lines():
    rule = rule_for(Cast(TensorProto.DOUBLE))
    lower, upper = torch.tensor([[0.5, -3.0]]), torch.tensor([[0.7, 4.0]])
    identity = rule.relax(Cast(TensorProto.DOUBLE), lower, upper)
    assert identity.lower_slope.tolist() == [[1.0, 1.0]] and identity.upper_intercept.tolist() == [[0.0, 0.0]]
    integer = rule.relax(Cast(TensorProto.INT64), lower, upper)
    assert integer.lower_slope.tolist() == [[0.0, 0.0]]
    assert integer.lower_intercept.tolist() == [[0.0, -3.0]] and integer.upper_intercept.tolist() == [[0.0, 4.0]]


def test_index_table_outside_the_models_range_is_a_clear_error():
    from assay.errors import UnsupportedError

    layer = IndexTable(_table_model(np.zeros((5, 4, 3))), ("k0", "k1"), "out", (3,))
    with pytest.raises(UnsupportedError, match=r"indexed by \['k0', 'k1'\] cannot be computed at \[9, 0\]"):
        layer.forward(torch.tensor([[9.5]]), torch.tensor([[0.0]]))
