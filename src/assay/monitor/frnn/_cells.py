"""Compiled loops of the hash-grid and brute-force indexes: query, fused query-then-insert, rebuild, fit.

Cells. A row's cell is the tuple of ``floor((x_j − s_j) / w_j)`` over the hashed columns ``j``
(widths ``w_j > 0``, shifts ``s_j``; clipped to ±2⁴⁰ before the cast). Every function here that
maps a value to a cell index is monotone non-decreasing in the value (IEEE subtraction and
division by a positive constant, floor and clipping are all monotone), so a row ``x`` with
``lo ≤ x_j ≤ hi`` lies in a cell with index between ``cell(lo)`` and ``cell(hi)``.

Soundness of the probes. If the canonical distance (:mod:`assay.monitor._kernels`) of rows
``x`` and ``q`` is ≤ r, then for every column ``|x_j − q_j| ≤ r(1 + 4u)`` exactly (u = 2⁻⁵³; for
L∞ directly, for L1 and L2 because their partial sums never decrease). A query probes the cells
between ``cell(q_j − r')`` and ``cell(q_j + r')`` with ``r' = r(1 + 1e-12) + |q_j|·2⁻⁵¹ + 1e-300``,
which is wide enough that the two rounded bounds still enclose ``[q_j − r(1+4u), q_j + r(1+4u)]``.
So every close row is a candidate whatever the widths are; the canonical formula then decides.
Widths only change the speed. A cell is keyed by an int64 hash of its indices (wrapping
arithmetic); two cells with one key share a bucket, which only adds candidates, and a bucket is
walked at most once per query (so no row is reported twice).

Buckets are chains through ``next_in_cell`` (newest first) hanging from an open-addressing table
(linear probing, power-of-two size, at most half full). With no hashed column (``k = 0``), or when
a query would probe more cells than scanning costs, the query scans the rows instead.
"""

from __future__ import annotations

import math

import numpy as np

from assay.monitor._kernels import _distance, _grow, njit

__all__ = ["observe_rows", "by_position", "query_rows", "rebuild", "insert_rows", "choose_cells", "row_keys"]

_CLIP = 2.0**40
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)


@njit(cache=True, inline="always")
def _cell(value, shift, width):
    v = (value - shift) / width
    if v > _CLIP:
        v = _CLIP
    elif v < -_CLIP:
        v = -_CLIP
    return np.int64(math.floor(v))


@njit(cache=True, inline="always")
def _slot(key, mask):
    h = np.uint64(key) * _GOLDEN
    h = h ^ (h >> np.uint64(31))
    return np.int64(h & np.uint64(mask))


@njit(cache=True, inline="always")
def _key(row, cols, widths, shifts, mults):
    key = np.int64(0)
    for j in range(cols.shape[0]):
        key += _cell(row[cols[j]], shifts[j], widths[j]) * mults[j]
    return key


@njit(cache=True)
def row_keys(data, cols, widths, shifts, mults):
    """The cell key of every row of ``data``, int64 (n,)."""
    out = np.empty(data.shape[0], dtype=np.int64)
    for i in range(data.shape[0]):
        out[i] = _key(data[i], cols, widths, shifts, mults)
    return out


@njit(cache=True, inline="always")
def _insert(key, position, table, next_in_cell, mask):
    """Hang ``position`` at the head of its bucket; return 1 if the bucket is new, else 0.

    ``table[slot] = (key, head)``: key and head side by side, one cache line per probe.
    """
    slot = _slot(key, mask)
    while True:
        head = table[slot, 1]
        if head == -1:
            table[slot, 0] = key
            table[slot, 1] = position
            next_in_cell[position] = -1
            return 1
        if table[slot, 0] == key:
            next_in_cell[position] = head
            table[slot, 1] = position
            return 0
        slot = (slot + 1) & mask


@njit(cache=True)
def rebuild(data, alive, size, cols, widths, shifts, mults, table, next_in_cell):
    """Empty the table and hang every live row 0..size−1 in it, oldest first; return the bucket count."""
    table[:, 1] = -1
    mask = table.shape[0] - 1
    buckets = 0
    if cols.shape[0] == 0:
        return 0
    for position in range(size):
        if alive[position]:
            buckets += _insert(_key(data[position], cols, widths, shifts, mults), position, table, next_in_cell, mask)
    return buckets


@njit(cache=True)
def insert_rows(data, start, stop, cols, widths, shifts, mults, table, next_in_cell):
    """Hang the rows at positions start..stop−1 (already stored); return how many buckets were new."""
    mask = table.shape[0] - 1
    buckets = 0
    if cols.shape[0] == 0:
        return 0
    for position in range(start, stop):
        buckets += _insert(_key(data[position], cols, widths, shifts, mults), position, table, next_in_cell, mask)
    return buckets


@njit(cache=True)
def _search(query, query_norm, radius, metric, data, norms, alive, ids, tags, use_tags, tag, min_id, size,
            cols, widths, shifts, mults, table, next_in_cell, scan_cost, probe_cost, lead,
            lo, hi, cur, visited, out_position, out_distance, count):
    """Append the rows within ``radius`` of ``query`` (and passing the tag / id filters) to the outputs.

    Returns ``(out_position, out_distance, count)``; outputs grow as needed. The rows found by
    this call are in position order when it scans (no hashed column), else in bucket order.
    """
    k = cols.shape[0]
    probes = 1.0
    # |x_lead − q_lead| > r(1 + 1e-12) proves d > r for L∞, L1 and L2 (see the module docstring).
    lead_value = query[lead]
    lead_limit = radius * (1.0 + 1e-12)
    if metric == 3:
        lead_limit = math.inf
    if k > 0:
        for j in range(k):
            value = query[cols[j]]
            margin = radius * (1.0 + 1e-12) + abs(value) * 2.0**-51 + 1e-300
            lo[j] = _cell(value - margin, shifts[j], widths[j])
            hi[j] = _cell(value + margin, shifts[j], widths[j])
            probes *= hi[j] - lo[j] + 1
    if k == 0 or probes * probe_cost > size * scan_cost:
        for position in range(size):
            # Cheap filters first (written out: an inlined helper with early returns compiles to a
            # loop about 20× slower): the lead column, liveness, the label tag, the window.
            if abs(data[position, lead] - lead_value) > lead_limit:
                continue
            if not alive[position]:
                continue
            if use_tags and tags[position] == tag:
                continue
            if ids[position] < min_id:
                continue
            distance = _distance(data[position], query, metric, norms[position], query_norm, radius)
            if distance <= radius:
                if count == out_position.shape[0]:
                    out_position = _grow(out_position, count + 1)
                    out_distance = _grow(out_distance, count + 1)
                out_position[count] = position
                out_distance[count] = distance
                count += 1
        return out_position, out_distance, count
    mask = table.shape[0] - 1
    key = np.int64(0)
    for j in range(k):
        cur[j] = lo[j]
        key += lo[j] * mults[j]
    n_visited = 0
    while True:
        slot = _slot(key, mask)
        while True:
            head = table[slot, 1]
            if head == -1 or table[slot, 0] == key:
                break
            slot = (slot + 1) & mask
        if head != -1:
            seen = False
            for v in range(n_visited):
                if visited[v] == slot:
                    seen = True
                    break
            if not seen:
                if n_visited == visited.shape[0]:
                    visited = _grow(visited, n_visited + 1)
                visited[n_visited] = slot
                n_visited += 1
                position = head
                while position != -1:
                    here = position
                    position = next_in_cell[here]
                    if abs(data[here, lead] - lead_value) > lead_limit:
                        continue
                    if not alive[here]:
                        continue
                    if use_tags and tags[here] == tag:
                        continue
                    if ids[here] < min_id:
                        continue
                    distance = _distance(data[here], query, metric, norms[here], query_norm, radius)
                    if distance <= radius:
                        if count == out_position.shape[0]:
                            out_position = _grow(out_position, count + 1)
                            out_distance = _grow(out_distance, count + 1)
                        out_position[count] = here
                        out_distance[count] = distance
                        count += 1
        # next cell of the odometer
        j = 0
        while j < k:
            if cur[j] < hi[j]:
                cur[j] += 1
                key += mults[j]
                break
            key -= (cur[j] - lo[j]) * mults[j]
            cur[j] = lo[j]
            j += 1
        if j == k:
            break
    # Rows found through the cells come in bucket order; the caller sorts them by position (a
    # sort compiled here would add seconds to every first compile, for a few rows per query).
    return out_position, out_distance, count


@njit(cache=True)
def query_rows(queries, query_norms, radius, metric, data, norms, alive, ids, size,
               cols, widths, shifts, mults, table, next_in_cell, scan_cost, probe_cost, lead):
    """Range queries without insertion: ``(query, position, distance)`` triples grouped by query."""
    k = cols.shape[0]
    lo = np.empty(k, dtype=np.int64)
    hi = np.empty(k, dtype=np.int64)
    cur = np.empty(k, dtype=np.int64)
    visited = np.empty(64, dtype=np.int64)
    out_position = np.empty(256, dtype=np.int64)
    out_distance = np.empty(256, dtype=np.float64)
    out_query = np.empty(256, dtype=np.int64)
    tags = np.empty(0, dtype=np.int64)
    count = 0
    for i in range(queries.shape[0]):
        before = count
        out_position, out_distance, count = _search(
            queries[i], query_norms[i], radius, metric, data, norms, alive, ids, tags, False, 0, -(2**62), size,
            cols, widths, shifts, mults, table, next_in_cell, scan_cost, probe_cost, lead,
            lo, hi, cur, visited, out_position, out_distance, count)
        if out_query.shape[0] < count:
            out_query = _grow(out_query, count)
        out_query[before:count] = i
    return out_query[:count], out_position[:count], out_distance[:count]


@njit(cache=True)
def observe_rows(rows, row_ids, row_tags, use_tags, window, count_only, radius, metric,
                 data, norms, alive, ids, tags, size, with_norms,
                 cols, widths, shifts, mults, table, next_in_cell, scan_cost, probe_cost, lead):
    """The monitor's loop: for each row in order, query the history, then store and hang the row.

    Row ``i`` is compared with every stored live row (those before the batch and rows ``0..i−1`` of
    the batch) whose tag differs from ``row_tags[i]`` (when ``use_tags``) and whose id is ≥
    ``row_ids[i] − window`` (when ``window`` ≥ 0). The caller has reserved room for the rows in
    the store and the table. Returns ``(counts, positions, distances, new_buckets)``: per row the
    number of witnesses, and (unless ``count_only``) their positions (ascending when no column is
    hashed, else in bucket order: :func:`by_position` sorts them) and distances,
    concatenated row after row.
    """
    k = cols.shape[0]
    n = rows.shape[0]
    lo = np.empty(k, dtype=np.int64)
    hi = np.empty(k, dtype=np.int64)
    cur = np.empty(k, dtype=np.int64)
    visited = np.empty(64, dtype=np.int64)
    out_position = np.empty(64, dtype=np.int64)
    out_distance = np.empty(64, dtype=np.float64)
    counts = np.empty(n, dtype=np.int64)
    mask = table.shape[0] - 1
    buckets = 0
    count = 0
    for i in range(n):
        row = rows[i]
        norm = 1.0
        if with_norms:
            total = 0.0
            for j in range(row.shape[0]):
                total += row[j] * row[j]
            norm = math.sqrt(total)
        min_id = row_ids[i] - window if window >= 0 else -(2**62)
        before = count
        out_position, out_distance, count = _search(
            row, norm, radius, metric, data, norms, alive, ids, tags, use_tags, row_tags[i], min_id, size,
            cols, widths, shifts, mults, table, next_in_cell, scan_cost, probe_cost, lead,
            lo, hi, cur, visited, out_position, out_distance, count)
        counts[i] = count - before
        if count_only:
            count = before
        position = size
        data[position] = row
        norms[position] = norm
        alive[position] = True
        ids[position] = row_ids[i]
        tags[position] = row_tags[i]
        if k > 0:
            buckets += _insert(_key(row, cols, widths, shifts, mults), position, table, next_in_cell, mask)
        size += 1
    return counts, out_position[:count], out_distance[:count], buckets


def by_position(counts: np.ndarray, positions: np.ndarray, distances: np.ndarray):
    """Sort each row's witnesses (``counts[i]`` consecutive entries per row) by position; numpy, not compiled."""
    if positions.size < 2:
        return positions, distances
    order = np.lexsort((positions, np.repeat(np.arange(counts.size), counts)))
    return positions[order], distances[order]


@njit(cache=True)
def _column_cells(sample, column, width, shift, radius, cells, lows, highs):
    for i in range(sample.shape[0]):
        value = sample[i, column]
        margin = radius * (1.0 + 1e-12) + abs(value) * 2.0**-51 + 1e-300
        cells[i] = _cell(value, shift, width)
        lows[i] = _cell(value - margin, shift, width)
        highs[i] = _cell(value + margin, shift, width)


@njit(cache=True)
def _greedy(sample, candidates, bases, alphas, only_alpha, radius, n_rows, probe_cost, candidate_cost, scan_cost,
            max_columns, force_columns):
    """One greedy path (widths from all ``alphas``, or only ``alphas[only_alpha]``); its cheapest prefix and cost."""
    m = sample.shape[0]
    n_pairs = m * (m - 1)
    pair_q = np.empty(n_pairs, dtype=np.int64)
    pair_x = np.empty(n_pairs, dtype=np.int64)
    p = 0
    for a in range(m):
        for b in range(m):
            if a != b:
                pair_q[p] = a
                pair_x[p] = b
                p += 1
    alive_pairs = n_pairs
    probes = np.ones(m)
    used = np.zeros(candidates.shape[0], dtype=np.bool_)
    out_columns = np.empty(max_columns, dtype=np.int64)
    out_widths = np.empty(max_columns)
    out_shifts = np.empty(max_columns)
    chosen = 0
    best_cost = scan_cost * n_rows
    cells = np.empty(m, dtype=np.int64)
    lows = np.empty(m, dtype=np.int64)
    highs = np.empty(m, dtype=np.int64)
    # Half a pair of smoothing: a sample cannot show fractions below ~1/m², and an estimate of
    # zero candidates would add columns for nothing.
    total_pairs = max(n_pairs, 1) + 1.0
    best_prefix = 0
    first_alpha = 0 if only_alpha < 0 else only_alpha
    last_alpha = alphas.shape[0] if only_alpha < 0 else only_alpha + 1
    while chosen < max_columns:
        step_cost = math.inf
        step_c = -1
        step_a = -1
        for c in range(candidates.shape[0]):
            if used[c]:
                continue
            for a in range(first_alpha, last_alpha):
                width = bases[c] * alphas[a]
                shift = -0.5 * width
                _column_cells(sample, candidates[c], width, shift, radius, cells, lows, highs)
                mean_probes = 0.0
                for i in range(m):
                    mean_probes += probes[i] * (highs[i] - lows[i] + 1)
                mean_probes /= max(m, 1)
                survivors = 0
                for t in range(alive_pairs):
                    cx = cells[pair_x[t]]
                    q = pair_q[t]
                    if lows[q] <= cx and cx <= highs[q]:
                        survivors += 1
                cost = probe_cost * mean_probes + candidate_cost * n_rows * ((survivors + 0.5) / total_pairs)
                if cost < step_cost:
                    step_cost = cost
                    step_c = c
                    step_a = a
        if step_c == -1:
            break
        width = bases[step_c] * alphas[step_a]
        shift = -0.5 * width
        _column_cells(sample, candidates[step_c], width, shift, radius, cells, lows, highs)
        for i in range(m):
            probes[i] *= highs[i] - lows[i] + 1
        kept = 0
        for t in range(alive_pairs):
            cx = cells[pair_x[t]]
            q = pair_q[t]
            if lows[q] <= cx and cx <= highs[q]:
                pair_q[kept] = q
                pair_x[kept] = pair_x[t]
                kept += 1
        alive_pairs = kept
        used[step_c] = True
        out_columns[chosen] = candidates[step_c]
        out_widths[chosen] = width
        out_shifts[chosen] = shift
        chosen += 1
        if step_cost < best_cost or chosen <= force_columns:
            best_cost = step_cost
            best_prefix = chosen
    return best_cost, out_columns[:best_prefix], out_widths[:best_prefix], out_shifts[:best_prefix]


@njit(cache=True)
def choose_cells(sample, candidates, bases, alphas, radius, n_rows, probe_cost, candidate_cost, scan_cost, max_columns, force_columns):
    """Choice of hashed columns and widths that minimises the estimated cost of one query.

    The cost of a query is estimated on the sample as ``probe_cost × (cells probed) +
    candidate_cost × n_rows × (fraction of sample pairs that share a probed cell)``, against
    ``scan_cost × n_rows`` for scanning. Candidate ``c`` with width multiplier ``alphas[a]`` hashes
    column ``candidates[c]`` with width ``bases[c] × alphas[a]``. Columns are added greedily up
    to ``max_columns`` and the cheapest prefix is kept (at least ``force_columns``; none when
    scanning is cheapest). A greedy path is myopic (narrow cells win the first steps even when
    many wider cells are cheaper in the end), so it is run once with all widths and once per
    width, and the cheapest result is kept. Returns ``(columns, widths, shifts)``.
    """
    best_cost, columns, widths, shifts = _greedy(sample, candidates, bases, alphas, -1, radius, n_rows, probe_cost,
                                                 candidate_cost, scan_cost, max_columns, force_columns)
    for a in range(alphas.shape[0]):
        cost, c, w, s = _greedy(sample, candidates, bases, alphas, a, radius, n_rows, probe_cost,
                                candidate_cost, scan_cost, max_columns, force_columns)
        if cost < best_cost:
            best_cost, columns, widths, shifts = cost, c, w, s
    return columns, widths, shifts
