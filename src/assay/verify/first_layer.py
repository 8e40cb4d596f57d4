"""Tighten a ReLU-splitting domain's first-layer pre-activation bounds with its own first-layer splits.

A domain of :mod:`assay.verify.relu_split` is the input box cut by its split constraints
``s_i z_i(x) ≥ 0``. The pre-activations of later layers are re-bounded under the splits before
them (β-CROWN), but a split cannot constrain the other neurons of its own layer that way: their
backward walks never pass through it. On the first ReLU layer, whose pre-activations
``z = W x + b`` are affine in the input, the bound under the same layer's splits is one small
Lagrangian problem per neuron and side:

    max_{x in box, s_i z_i(x) ≥ 0}  σ z_j(x)  ≤  min_{β ≥ 0}  max_{x in box}  σ z_j(x) + Σ_i β_i s_i z_i(x),

(weak duality: on the domain every added term is ≥ 0; the inner maximum over a box is closed
form), which equals the LP's optimum at the best β. A few projected Adam steps on β for every
domain, neuron and side at once give bounds that hold for any β reached; they are evaluated
with outward rounding, so they hold for the exact network. On a one-hidden-layer network with
100 of 128 neurons unstable (VNN-COMP safenlp), ten splits leave a domain's box-only bounds
unchanged, while over the splits many other neurons become stable: the domain's triangle
relaxations shrink, and its leaves (every sign known) come sooner.

A domain whose bounds cross (lower > upper for some neuron) has no point: it is empty.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass

import torch

from assay.bounds import IntermediateBounds
from assay.bounds.ibp import cast_outward
from assay.bounds.plan import gamma
from assay.errors import AssayError
from assay.nn.layers import Flatten, Linear, Reshape
from assay.nn.network import Network

__all__ = ["FirstLayer", "Multipliers", "first_layer", "tighten_first_layer", "tighten_first_layer_from"]

# Projected Adam steps on the multipliers, and their learning rate (the multipliers are ratios
# of weights: near 1 where a split cuts the box across a neuron's own direction).
ITERATIONS = 20
LEARNING_RATE = 0.5
# The multipliers are searched in this dtype (only the final, sound evaluation is float64).
DRAFT_DTYPE = torch.float32
# A domain whose parent's multipliers are known starts from them (restricted to its own rows, 0 for
# its new split: the parent's bound) and takes this many steps at this learning rate instead, on
# the rows whose peak violates its new split only (the others' bounds are the parent's).
WARM_ITERATIONS = 10
WARM_LEARNING_RATE = 0.12
# Adam's moment decay rates, from 0 and from a parent's multipliers: shorter memories and smaller
# steps suit a start that is already good. On VNN-COMP 2024 safenlp ruarobot rows 147, 530 and 336,
# 10 steps from the parent's multipliers took 9,823, 5,405 and 40,679 domains with rate 0.12 and
# (0.7, 0.9) (20 steps from 0: 10,645, 5,721 and 44,439), 10,079, 5,451 and 42,301 with 0.15 and
# (0.5, 0.9), and 17,807 and 9,353 (rows 147, 530) with rate 0.5 and torch's (0.9, 0.999).
MOMENTS = (0.9, 0.999)
WARM_MOMENTS = (0.7, 0.9)
# The multipliers a domain keeps for its children: at most this many split columns (those of the
# most weight), and at most WARM_ELEMENTS in all (2N rows × columns; none on wider layers).
WARM_COLUMNS = 32
WARM_ELEMENTS = 1 << 14
# Most coefficients (domains × unstable neurons × 2 sides × inputs) one tightening may hold at once;
# larger batches go in chunks.
_CHUNK_ELEMENTS = 1 << 22
# First layers larger than this (neurons × inputs) are not tightened (their rows cost more
# than the domain's own bound).
MAX_WEIGHTS = 1 << 20


@dataclass(frozen=True, eq=False)
class FirstLayer:
    """The first ReLU layer's pre-activations ``z = W x + b`` of the flat input: W (N, n), b (N,) float64."""

    W: torch.Tensor
    b: torch.Tensor


_FORMS: "weakref.WeakKeyDictionary[Network, FirstLayer | None]" = weakref.WeakKeyDictionary()


def first_layer(network: Network) -> FirstLayer | None:
    """The network's first ReLU layer as an affine map of the flat input (cached); None when the
    layers before it are not one dense layer (with reshapes) or it is larger than :data:`MAX_WEIGHTS`."""
    if network not in _FORMS:
        _FORMS[network] = _build(network)
    return _FORMS[network]


def _build(network: Network) -> FirstLayer | None:
    relus = network.relu_indices
    if not network.is_chain or not relus:
        return None
    before = network.layers[:relus[0]]
    dense = [layer for layer in before if isinstance(layer, Linear)]
    if len(dense) != 1 or not all(isinstance(layer, (Linear, Flatten, Reshape)) for layer in before):
        return None
    weight, bias = dense[0].weight, dense[0].bias
    if weight.numel() > MAX_WEIGHTS or weight.shape[1] != network.input_size:
        return None
    return FirstLayer(weight.to(torch.float64), bias.to(torch.float64))


@dataclass(frozen=True, eq=False)
class Multipliers:
    """Split multipliers of a batch of domains, keyed by neuron (what a domain hands its children).

    ``beta`` (B, 2N, K) float: row j < N is for the upper bound of neuron j, row N + j for its
    lower bound; column c is the multiplier of the split on neuron ``columns[:, c]`` (−1: no
    column, its multipliers are ignored). Only a starting point: any values give sound bounds
    (negative and non-finite ones are read as 0)."""

    beta: torch.Tensor
    columns: torch.Tensor

    @staticmethod
    def none(count: int, form: FirstLayer) -> Multipliers | None:
        """``count`` domains with no multipliers (None where the layer keeps none: :func:`warm_columns`)."""
        width = warm_columns(form)
        if not width:
            return None
        neurons = form.W.shape[0]
        return Multipliers(torch.zeros(count, 2 * neurons, width, dtype=DRAFT_DTYPE),
                           torch.full((count, width), -1, dtype=torch.int64))


def warm_columns(form: FirstLayer) -> int:
    """How many split columns a domain's kept multipliers have (0: none kept, the layer is too wide)."""
    rows = 2 * form.W.shape[0]
    width = min(WARM_COLUMNS, form.W.shape[0], WARM_ELEMENTS // rows)
    return max(width, 0)


def tighten_first_layer(form: FirstLayer, lower: torch.Tensor, upper: torch.Tensor, splits: torch.Tensor,
                        bounds: IntermediateBounds, iterations: int | None = None,
                        ) -> tuple[IntermediateBounds, torch.Tensor]:
    """``bounds`` with the first ReLU layer's bounds tightened under each domain's first-layer splits.

    Args:
        form: :func:`first_layer` of the network.
        lower, upper: (B, n) the domains' input boxes.
        splits: (B, *first layer shape) int8 split history of the first ReLU layer (+1: z ≥ 0, −1: z ≤ 0).
        bounds: pre-activation bounds valid on the domains (the first layer's already clamped by its splits).

    Returns:
        (the tightened bounds, never looser than ``bounds``; (B,) bool: domains shown empty).
        Domains without a first-layer split are left as they are.
    """
    tightened, empty, _ = tighten_first_layer_from(form, lower, upper, splits, bounds, None, iterations)
    return tightened, empty


def tighten_first_layer_from(form: FirstLayer, lower: torch.Tensor, upper: torch.Tensor, splits: torch.Tensor,
                             bounds: IntermediateBounds, start: Multipliers | None, iterations: int | None = None,
                             ) -> tuple[IntermediateBounds, torch.Tensor, Multipliers | None]:
    """:func:`tighten_first_layer` starting each domain's multipliers from ``start`` (e.g. its
    parent's), and returning the multipliers reached, for its children.

    A domain whose ``start`` has a column takes :data:`WARM_ITERATIONS` steps from it, the others
    ``iterations`` (:data:`ITERATIONS`) from 0. Only the rows whose peak over the box, at their
    starting multipliers, violates a split that ``start`` has no column for (the new splits) are
    searched. For the others a new split's multiplier has a non-negative gradient at 0 (the
    constraint holds at the peak), so a first step would not lower their value: they keep the
    bound they inherit (their parent's, sound on this sub-domain). That choice only costs
    tightness; the bounds are the sound values of the multipliers reached (whatever ``start``
    holds), and never looser than ``bounds``.

    Returns:
        (tightened bounds, (B,) bool: empty domains, (B,) multipliers: those reached where a domain
        was tightened, ``start``'s elsewhere; None where the layer keeps none, :func:`warm_columns`).

    Raises:
        AssayError: ``start`` is not shaped as :meth:`Multipliers.none` of the domains.
    """
    iterations = ITERATIONS if iterations is None else iterations
    count = lower.shape[0]
    width = warm_columns(form)
    if start is not None and width:
        expected = (count, 2 * form.W.shape[0], width)
        if tuple(start.beta.shape) != expected or tuple(start.columns.shape) != (count, width):
            raise AssayError(f"first-layer multipliers of shapes {tuple(start.beta.shape)} and "
                             f"{tuple(start.columns.shape)} for {count} domains of a layer of {form.W.shape[0]} "
                             f"neurons; expected {expected} and {(count, width)} (Multipliers.none)")
    if start is None and width:
        start = Multipliers.none(count, form)
    kept = None if not width else [start.beta, start.columns, False]  # (copied before the first write)
    first_lower, first_upper = bounds.lower[0], bounds.upper[0]
    shape = first_lower.shape
    s = splits.reshape(count, -1)
    new_lower = first_lower.reshape(count, -1).clone()
    new_upper = first_upper.reshape(count, -1).clone()
    # Only unstable, unsplit neurons are worth tightening (the others' relaxations are exact).
    target = (new_lower < 0) & (new_upper > 0) & (s == 0)
    todo = ((s != 0).sum(1) > 0) & target.any(1)
    warm = torch.zeros(count, dtype=torch.bool) if not width else (start.columns >= 0).any(1)
    for group, steps, rate, moments in ((todo & ~warm, iterations, LEARNING_RATE, MOMENTS),
                                        (todo & warm, WARM_ITERATIONS, WARM_LEARNING_RATE, WARM_MOMENTS)):
        group = group.nonzero().flatten()
        if not group.numel():
            continue
        rows = 2 * int(target[group].sum(1).max())
        step = max(1, _CHUNK_ELEMENTS // max(1, rows * form.W.shape[1]))
        for first in range(0, group.numel(), step):
            index = group[first:first + step]
            part = None if not width else Multipliers(start.beta[index], start.columns[index])
            up, low, neuron, reached = _tightened(form, lower[index], upper[index], s[index], target[index], steps,
                                                  part, rate, moments)
            # into the bounds' dtype (float32 where the search refines in it) rounded outwards
            low, up = cast_outward(low, up, new_upper.dtype)
            new_upper[index] = new_upper[index].scatter_reduce(1, neuron, up, "amin")
            new_lower[index] = new_lower[index].scatter_reduce(1, neuron, low, "amax")
            if reached is not None and index.numel() == count:
                kept = [reached.beta, reached.columns, True]
            elif reached is not None:
                if not kept[2]:
                    kept = [kept[0].clone(), kept[1].clone(), True]
                kept[0][index], kept[1][index] = reached.beta, reached.columns
    empty = (new_lower > new_upper).any(1)
    new_lower, new_upper = new_lower.reshape(shape), new_upper.reshape(shape)
    tightened = IntermediateBounds((new_lower, *bounds.lower[1:]), (new_upper, *bounds.upper[1:]))
    return tightened, empty, None if kept is None else Multipliers(kept[0], kept[1])


def _tightened(form: FirstLayer, lower, upper, s, target, iterations: int, start: Multipliers | None = None,
               rate: float = LEARNING_RATE, moments=MOMENTS):
    """Sound bounds of the ``target`` neurons of ``W x + b`` over each box cut by its splits ``s``,
    the multipliers searched from ``start`` (0 where it has none).

    Returns (B, R) upper bounds, (B, R) lower bounds, (B, R) the neuron each column is for
    (padding columns repeat a neuron with bounds ±inf, which change nothing) and the multipliers
    reached, keyed by neuron (None without ``start``)."""
    count, neurons = s.shape
    # The splits of each domain, padded: constraint k of domain i is  sign[i, k] · z_{which[i, k]} ≥ 0.
    width = int((s != 0).sum(1).max())
    which = (s != 0).to(torch.int8).topk(width, dim=1).indices  # split neurons first
    sign = s.gather(1, which).to(torch.float64)  # 0 on padding
    # The neurons to bound, padded the same way.
    size = int(target.sum(1).max())
    chosen, neuron = target.to(torch.int8).topk(size, dim=1)
    chosen = chosen.bool()
    W, b = form.W, form.b
    cut_A, cut_b = sign.unsqueeze(2) * W[which], sign * b[which]  # (B, K, n), (B, K)
    # Row r < R bounds σ z_j from above with σ = +1, row R + r with σ = −1 (j = neuron[:, r]).
    rows = torch.cat([neuron, neuron + neurons], 1)  # (B, 2R): each row's row of the kept multipliers
    both = torch.cat([chosen, chosen], 1)
    center, radius = (lower + upper) / 2, (upper - lower) / 2
    columns = torch.where(sign != 0, which, -1)
    cuts = cut_A, cut_b, center, radius
    if start is None:
        base = _rows(form, rows, torch.float64)
        beta = _multipliers(*(t.to(DRAFT_DTYPE) for t in (*base, *cuts)), iterations, None, rate, moments)
        bound = _sound_value(beta.to(torch.float64), *base, *cuts)
    else:
        beta, fresh = _restricted(start, rows, columns)
        draft = [t.to(DRAFT_DTYPE) for t in cuts]
        # A row whose peak over the box, at its starting multipliers, satisfies the new splits
        # gains nothing from a first step on their multipliers (the gradient there is ≥ 0): it
        # keeps its inherited bound, and only the others are searched.
        active = both & _violated(beta, fresh, *_rows(form, rows, DRAFT_DTYPE), *draft)
        bound = _searched(form, active, rows, beta, cuts, draft, iterations, rate, moments)
    bound = torch.where(both, bound, torch.inf)
    reached = None if start is None else _keyed(beta, rows, both, columns, neurons, start.beta.shape[2])
    return bound[:, :size], -bound[:, size:], neuron, reached


def _rows(form: FirstLayer, rows: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """The rows ``rows`` (B, R) of ``[W; −W]``, ``[b; −b]`` in ``dtype``: (B, R, n), (B, R)."""
    W, b = form.W.to(dtype), form.b.to(dtype)
    return torch.cat([W, -W])[rows], torch.cat([b, -b])[rows]


def _searched(form: FirstLayer, active, rows, beta, cuts, draft, iterations: int, rate: float, moments):
    """(B, R) sound upper bounds of the ``active`` rows (inf elsewhere; ``rows`` as in
    :func:`_rows`) of ``base + β·cuts`` over the boxes, their multipliers ``beta`` (B, R, K)
    searched from the values it holds (and updated); ``draft``: ``cuts`` in the draft dtype.

    Domains go in groups of similar active counts, each padded to its own largest: the counts
    range from a few rows to all (the peaks of most rows miss a split that cuts a small piece)."""
    bound = torch.full(active.shape, torch.inf, dtype=torch.float64)
    counts = active.sum(1)
    order = counts.argsort()
    order = order[counts[order] > 0]
    if not order.numel():
        return bound
    # the domains in that order once: each group is then a slice of them
    active, rows, start, counts = active[order], rows[order], beta[order], counts[order]
    cuts, draft = [t[order] for t in cuts], [t[order] for t in draft]
    domains, picks, values, found = [], [], [], []
    for first in range(0, order.numel(), _GROUP):
        group = slice(first, first + _GROUP)
        picked, pick = active[group].to(torch.int8).topk(int(counts[group].max()), dim=1)
        base = _rows(form, rows[group].gather(1, pick), torch.float64)
        initial = start[group].gather(1, pick.unsqueeze(2).expand(-1, -1, start.shape[2]))
        reached = _multipliers(*(t.to(DRAFT_DTYPE) for t in base), *(t[group] for t in draft), iterations, initial,
                               rate, moments)
        value = _sound_value(reached.to(torch.float64), *base, *(t[group] for t in cuts))
        # padding picks repeat an active row: only the picked ones are written back
        picked = picked.bool()
        domains.append(order[group].unsqueeze(1).expand_as(pick)[picked])
        picks.append(pick[picked])
        values.append(value[picked])
        found.append(reached[picked])
    domains, picks = torch.cat(domains), torch.cat(picks)
    bound[domains, picks] = torch.cat(values)
    beta[domains, picks] = torch.cat(found)
    return bound


# Domains per group of :func:`_searched`.
_GROUP = 64


def _restricted(start: Multipliers, rows: torch.Tensor, columns: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(B, 2R, K) draft multipliers for rows ``rows`` (B, 2R) and split neurons ``columns``
    (B, K; −1 padding) read from ``start`` by neuron, 0 where it has no such column; and (B, K)
    bool: the columns it has none for (the new splits)."""
    values = start.beta.to(DRAFT_DTYPE)
    picked = values.gather(1, rows.unsqueeze(2).expand(-1, -1, values.shape[2]))  # (B, 2R, K')
    # a start from elsewhere (a stale or foreign tag) may hold anything: only values ≥ 0 are multipliers
    picked = picked.nan_to_num_(nan=0.0, posinf=0.0, neginf=0.0).clamp_(min=0)
    match = (columns.unsqueeze(2) == start.columns.unsqueeze(1)) & (columns >= 0).unsqueeze(2)  # (B, K, K')
    # a column named twice in ``start`` counts once (its first entry)
    match = match & (match.cumsum(2) == 1)
    return picked.matmul(match.to(DRAFT_DTYPE).transpose(1, 2)), (columns >= 0) & ~match.any(2)


def _violated(beta, fresh, base_A, base_b, cut_A, cut_b, center, radius) -> torch.Tensor:
    """(B, R) bool: the rows of ``base + β·cuts`` whose peak over the box violates one of the
    ``fresh`` (B, K) constraints (its slope in that constraint's multiplier is negative)."""
    real, which = fresh.to(torch.int8).topk(int(fresh.sum(1).max()), dim=1)  # the fresh columns first
    cut = cut_A.gather(1, which.unsqueeze(2).expand(-1, -1, cut_A.shape[2]))  # (B, F, n)
    # padding columns get an infinite offset: never violated
    at_center = torch.where(real.bool(), cut.matmul(center.unsqueeze(2)).squeeze(2) + cut_b.gather(1, which), torch.inf)
    peak = torch.copysign(radius.unsqueeze(1).expand(-1, base_A.shape[1], -1).contiguous(),
                          torch.baddbmm(base_A, beta, cut_A))  # (B, R, n): the peak, less the center
    return (torch.baddbmm(at_center.unsqueeze(1), peak, cut.transpose(1, 2)) < 0).any(2)


def _keyed(beta: torch.Tensor, rows: torch.Tensor, real: torch.Tensor, columns: torch.Tensor, neurons: int,
           width: int) -> Multipliers:
    """Multipliers ``beta`` (B, 2R, K) of rows ``rows`` (B, 2R; only the ``real`` ones) and split
    neurons ``columns`` (B, K; −1 padding) keyed by neuron, keeping the ``width`` columns of most weight."""
    count = beta.shape[0]
    beta = beta.to(DRAFT_DTYPE)
    if beta.shape[2] > width:
        weight = torch.where(columns >= 0, beta.sum(1), -1.0)
        keep = weight.topk(width, dim=1).indices
        beta, columns = beta.gather(2, keep.unsqueeze(1).expand(-1, beta.shape[1], -1)), columns.gather(1, keep)
    else:
        pad = width - beta.shape[2]
        beta = torch.nn.functional.pad(beta, (0, pad))
        columns = torch.nn.functional.pad(columns, (0, pad), value=-1)
    # padding rows repeat a real row's neuron: they go to a spare last row, dropped
    rows = torch.where(real, rows, 2 * neurons)
    kept = torch.zeros(count, 2 * neurons + 1, width, dtype=DRAFT_DTYPE)
    kept.scatter_(1, rows.unsqueeze(2).expand(-1, -1, width), beta)
    return Multipliers(kept[:, :-1], columns)


def _multipliers(base_A, base_b, cut_A, cut_b, center, radius, iterations: int, initial=None,
                 rate: float = LEARNING_RATE, moments=MOMENTS) -> torch.Tensor:
    """(B, R, K) multipliers β ≥ 0 making ``max over the box of (base + β·cuts)(x)`` small: the
    best iterate of projected Adam from ``initial`` (≥ 0; default 0), itself among the iterates
    (only a choice: any β ≥ 0 gives a sound bound).

    The steps are Adam's (torch.optim.Adam's update, as :class:`assay.bounds.optimize.Adam`)
    written out on transposed tensors, rows last: on CPU the batched products and the
    element-wise steps run about a third faster that way than with rows first (safenlp's
    domains: 100–200 rows, 10–30 splits, 30 inputs)."""
    count, rows, width = base_A.shape[0], base_A.shape[1], cut_A.shape[1]
    beta = torch.zeros(count, width, rows, dtype=base_A.dtype) if initial is None \
        else initial.transpose(1, 2).contiguous()  # (B, K, R)
    best = torch.full((count, 1, rows), torch.inf, dtype=base_A.dtype)
    best_beta = beta.clone()
    # The constraints' and rows' values at the box's center: each step adds only what the peak's
    # offset from the center (± radius, the sign of the row's coefficient) contributes.
    at_center = cut_A.matmul(center.unsqueeze(2)) + cut_b.unsqueeze(2)  # (B, K, 1)
    base_at_center = (base_A.matmul(center.unsqueeze(2)).squeeze(2) + base_b).unsqueeze(1)  # (B, 1, R)
    base_T, cut_T = base_A.transpose(1, 2).contiguous(), cut_A.transpose(1, 2).contiguous()  # (B, n, R), (B, n, K)
    # broadcasting inside element-wise operations is slow on CPU: the radius is laid out in full
    spread = radius.unsqueeze(2).expand(-1, -1, rows).contiguous()  # (B, n, R)
    radius_row, at_center_row = radius.unsqueeze(1), at_center.transpose(1, 2)  # (B, 1, n), (B, 1, K)
    mean, square = torch.zeros_like(beta), torch.zeros_like(beta)
    decay_mean, decay_square = moments
    for step in range(iterations + 1):
        A = torch.baddbmm(base_T, cut_T, beta)  # (B, n, R): each row's coefficients
        value = base_at_center + at_center_row.bmm(beta) + radius_row.bmm(A.abs())  # (B, 1, R)
        better = value < best
        best = torch.minimum(best, value)
        best_beta.addcmul_(better.to(beta.dtype), beta - best_beta)
        if step == iterations:
            break
        # d value / d β_k: constraint k at the peak (the inner maximum's gradient, Danskin)
        grad = torch.baddbmm(at_center, cut_A, torch.copysign(spread, A))  # (B, K, R)
        mean.lerp_(grad, 1 - decay_mean)
        square.mul_(decay_square).addcmul_(grad, grad, value=1 - decay_square)
        steps = step + 1
        denominator = square.sqrt().mul_(1 / (1 - decay_square ** steps) ** 0.5).add_(1e-8)
        beta.addcdiv_(mean, denominator, value=-rate / (1 - decay_mean ** steps)).clamp_(min=0)
    return best_beta.transpose(1, 2)


def _sound_value(beta, base_A, base_b, cut_A, cut_b, center, radius) -> torch.Tensor:
    """(B, 2N) upper bounds, for the exact network, of ``max over the box of (base + β·cuts)(x)`` (β ≥ 0).

    The combined row is computed in float64; the exact one differs by at most γ times the sum of
    its terms' magnitudes, and its maximum over the box by γ times those magnitudes times
    ``|center| + radius`` (Higham's bound for sums of products, doubled by ``gamma``)."""
    with torch.no_grad():
        A = base_A + beta.matmul(cut_A)
        value = A.matmul(center.unsqueeze(2)).squeeze(2) + A.abs().matmul(radius.unsqueeze(2)).squeeze(2) \
            + base_b + beta.matmul(cut_b.unsqueeze(2)).squeeze(2)
        magnitude_A = base_A.abs() + beta.matmul(cut_A.abs())
        magnitude_b = base_b.abs() + beta.matmul(cut_b.abs().unsqueeze(2)).squeeze(2)
        terms = beta.shape[2] + center.shape[1] + 4
        margin = gamma(terms, torch.float64) * 2 * (
            magnitude_A.matmul((center.abs() + radius).unsqueeze(2)).squeeze(2) + magnitude_b)
        return torch.nextafter(value + margin, torch.tensor(torch.inf, dtype=torch.float64))
