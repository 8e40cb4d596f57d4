"""Decide a query whose box varies only in the keys of the network's :class:`IndexTable` s.

A network that places a patch where two inputs say (cctsdb_yolo: ``Cast`` to int64 → ``Slice`` →
``ScatterND``) reads those inputs only through the integers they truncate to. When every input
that the query's box lets vary is such a key, and no other layer reads the keys, the network is
constant on each cell of the keys' integer grid, and equal on every cell whose tables hold the
same values; so the query is decided by one point per distinct table value:

* a point whose float64 output violates the query is a counterexample (re-checked as every
  attack's is);
* the query holds when sound bounds of every such point exclude the unsafe set: interval bounds
  first (a point's are tight but for the rounding they charge, which grows layer by layer), the
  verifier's linear bounds for the points they leave open.

:func:`decide_by_cells` returns None where this does not apply (no tables, another input
varies, more than :data:`~assay.bounds.rules.decisions.MAX_TABLE_KEYS` cells) or where some point
is neither (the search then goes on as usual).
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import torch

from assay.bounds import compute_bounds
from assay.bounds.rules.decisions import MAX_TABLE_KEYS
from assay.nn.network import Network
from assay.nn.ops import Gather, IndexTable, Slice
from assay.verify.attack import confirm

__all__ = ["CellDecision", "decide_by_cells", "table_keys"]

_CHUNK = 32  # points bounded per call


@dataclass(frozen=True)
class CellDecision:
    """``holds`` (every point's bounds exclude the unsafe set), or ``found`` (input, output)."""

    holds: bool
    found: tuple[torch.Tensor, torch.Tensor] | None
    cells: int
    points: int


def table_keys(network: Network) -> dict[int, int] | None:
    """Flat input position → the tensor it is read into, for every IndexTable key that is one
    element of a rank-1 input (a ``Gather`` of the input) and read by IndexTables only; None
    when the network has no IndexTable or a key is anything else."""
    tables = [k for k, layer in enumerate(network.layers) if isinstance(layer, IndexTable)]
    if not tables or len(network.input_shape) != 1:
        return None
    keys = {}
    for k in tables:
        for tensor in network.sources[k]:
            if tensor == 0:
                return None
            layer = network.layers[tensor - 1]
            if not (isinstance(layer, Gather) and network.sources[tensor - 1] == (0,) and layer.axis == 0
                    and layer.indices.numel() == 1):
                return None
            readers = [j for j, sources in enumerate(network.sources) if tensor in sources]
            if any(not isinstance(network.layers[j], IndexTable) for j in readers):
                return None
            keys[int(layer.indices.reshape(-1)[0])] = tensor
    # every other layer reading the input must not read a key (Gather and Slice say what they read)
    probe = torch.arange(network.input_size, dtype=torch.float64).unsqueeze(0)
    for j, sources in enumerate(network.sources):
        if 0 not in sources or j + 1 in keys.values():
            continue
        layer = network.layers[j]
        if not isinstance(layer, (Gather, Slice)):
            return None
        if set(layer.forward(probe).reshape(-1).long().tolist()) & set(keys):
            return None
    return keys


def _representatives(network: Network, query, keys: dict[int, int]) -> tuple[torch.Tensor, int] | None:
    """One input per distinct set of table values over the box (rows of (P, n_in)), and the
    number of cells; None when an input other than a key varies or there are too many cells."""
    varying = (query.upper > query.lower).nonzero().flatten().tolist()
    if not varying or any(v not in keys for v in varying):
        return None
    ranges = [range(int(math.trunc(float(query.lower[v]))), int(math.trunc(float(query.upper[v]))) + 1)
              for v in varying]
    cells = math.prod(len(r) for r in ranges)
    if cells > MAX_TABLE_KEYS:
        return None
    tables = [(layer, network.sources[k]) for k, layer in enumerate(network.layers) if isinstance(layer, IndexTable)]
    flat_of = {tensor: position for position, tensor in keys.items()}
    seen, points = set(), []
    for combo in itertools.product(*ranges):
        x = query.lower.clone()
        for v, k in zip(varying, combo):
            # k itself where the box holds it, else the end of the box in k's cell
            x[v] = min(max(float(k), float(query.lower[v])), float(query.upper[v]))
        signature = tuple(layer.value(tuple(int(math.trunc(float(x[flat_of[t]]))) for t in sources)).tobytes()
                          for layer, sources in tables)
        if signature not in seen:
            seen.add(signature)
            points.append(x)
    return torch.stack(points), cells


def decide_by_cells(network: Network, query, *, method: str, dtype: str, stats, deadline=None) -> CellDecision | None:
    """Decide ``query`` cell by cell (see the module docstring), or None."""
    from assay.verify.input_split import bound_boxes

    keys = table_keys(network)
    if keys is None:
        return None
    found = _representatives(network, query, keys)
    if found is None:
        return None
    points, cells = found
    hit = confirm(network, query, points)
    if hit is not None:
        return CellDecision(False, hit, cells, len(points))
    for start in range(0, len(points), _CHUNK):
        if deadline is not None and deadline.passed():
            return None
        chunk = points[start:start + _CHUNK]
        # interval bounds first (a point's are tight up to rounding); the linear ones where they are not enough
        rows = compute_bounds(network, (chunk, chunk), spec=(query.C, query.d), method="ibp", dtype=dtype).upper
        groups = torch.stack([rows[:, query.groups == g].amin(1) for g in range(query.num_groups)], 1)
        chunk = chunk[~(groups < 0).all(1)]
        stats.bound_calls += 1
        if len(chunk):
            _, group_upper = bound_boxes(network, query, chunk, chunk, None, method, dtype, stats, {}, deadline)
            if not bool((group_upper < 0).all()):
                return None
    return CellDecision(True, None, cells, len(points))
