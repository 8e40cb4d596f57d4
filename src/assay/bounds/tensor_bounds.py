"""Bounds of one intermediate tensor, for :func:`assay.bounds.compute_bounds`' phases.

CROWN bounds of a ReLU layer's input (neuron by neuron, in chunks timed against a deadline, by
groups of rows, or padded to the widest domain) or of a tensor a general operator reads; the
probes that decide whether such a walk narrows the interval bounds at all; α-CROWN bounds of a
layer or an operator input (each row with parameters of its own, optimised by
:func:`assay.bounds.optimize.optimize_bounds`); and the interval pass that carries a refined
tensor's bounds downstream. Every function returns bounds at least as wide as the true range
(sound in floating point, as the walks it calls charge their rounding); a deadline only stops
the tightening, never the soundness.
"""

from __future__ import annotations

import math
import time

import torch

from assay.bounds.crown import Backward, backsubstitute, concretize, rounding_scales
from assay.bounds.grouped_rows import GroupedRows, row_spacing
from assay.bounds.ibp import interval_pass
from assay.bounds.optimize import optimize_bounds
from assay.bounds.options import BetaCrownOptions
from assay.bounds.plan import Plan
from assay.bounds.result import IntermediateBounds
from assay.bounds.walks import gradient_bounds
from assay.nn.network import Network

# Rows × input elements bounded in one backward pass for intermediate layers (memory cap).
_ROW_CHUNK_ELEMENTS = 1 << 24
# Rows × elements of the widest tensor a backward pass crosses (2 GiB of float64 coefficients).
_WALK_ELEMENTS = 1 << 28
# Under a deadline, CROWN's intermediate bounds are computed in chunks of neurons sized to take
# about _TIMED_CHUNK_SECONDS, so that the deadline is overshot by about one chunk's time; the
# first chunk's walk crosses at most _TIMED_FIRST_ELEMENTS (rows × widest tensor), far below
# the memory cap, and the later ones are sized by the time it took.
_TIMED_CHUNK_SECONDS = 1.0
_TIMED_FIRST_ELEMENTS = 1 << 24
# Grouped rows (assay.bounds.grouped_rows): groups × the widest tensor's elements walked at once.
_GROUPED_WALK_ELEMENTS = 1 << 25
# Slope elements (rows × earlier ReLU neurons) optimised in one intermediate α-CROWN call.
_ALPHA_CHUNK_ELEMENTS = 1 << 23
# Intermediate α-CROWN skips a layer with more unstable neurons than this in one domain: its
# cost grows with their number times the earlier layers' size (a lowered MaxPool's layers of
# thousands of unstable neurons would take minutes for little gain).
_ALPHA_MAX_UNSTABLE = 2048
# A tensor read by a non-linear general operator gets CROWN bounds element by element (one row
# each) only up to this many elements per domain; a larger one (a generator's image, a
# transformer's activations) keeps its interval bounds, which cost one pass instead of one
# backward walk per element.
_OPERATOR_REFINE_MAX = 2048
# Intermediate α-CROWN bounds a general operator's input tensor only up to this many elements
# per domain (each element's rows are optimised on their own): vit_2023 pgd_2_3_16's attention
# tensors (75 and 240 elements) gain, ibp_3_3_8's (816 and 867) took 40 s of a 100 s budget and
# gained 1e-5.
_ALPHA_OPERATOR_MAX = 256
# Intermediate CROWN groups domains by their number of unstable neurons: about this many groups,
# each of at least _MIN_GROUP domains.
_GROUPS = 16
_MIN_GROUP = 32
# A ReLU layer with more unstable neurons than this (in one domain) is probed first: CROWN
# bounds a sample of _PROBE_ROWS of them, and the layer is refined only if that tightens them.
_PROBE_ABOVE = 2048
_PROBE_ROWS = 64
_PROBE_MIN_GAIN = 0.5
# A general operator's input tensor with more elements than this (in one domain) is probed the
# same way: CROWN bounds a sample of _PROBE_ROWS of its elements, and the tensor is refined only
# if that narrows them by at least _OPERATOR_PROBE_MIN_GAIN on average. (A transformer's softmax
# outputs keep the width their inputs' bounds give them under CROWN, at a third of the cost of a
# whole ViT bound.)
_OPERATOR_PROBE_ABOVE = 256
_OPERATOR_PROBE_MIN_GAIN = 0.05


def downstream_pass(plan: Plan, lower, upper, deltas, clamp, bounds, changed: int, until: int | None = None):
    """IBP again after tensor ``changed`` got tighter bounds: the tensors before it keep theirs
    (nothing upstream depends on it), so only the stages from ``changed`` on are recomputed, up
    to tensor ``until`` (None: the output; see :func:`interval_pass`)."""
    return interval_pass(plan, lower, upper, deltas, clamp, given={t: bounds[t] for t in range(1, changed + 1)},
                         until=until)


def crown_tensor_bounds(plan: Plan, tensor: int, bounds, deltas, center, radius, relax, deadline=None, cut=None):
    """CROWN bounds of every element of ``tensor`` (one that a non-linear general operator reads:
    its relaxation depends on the whole interval, not only on a sign), never looser than before."""
    lower, upper = bounds[tensor]
    if lower[0].numel() > _OPERATOR_REFINE_MAX:  # see _OPERATOR_REFINE_MAX: the intervals stay (sound)
        return lower, upper
    mask = upper > lower
    if int(mask[0].sum()) > _OPERATOR_PROBE_ABOVE and not _crown_narrows(plan, tensor, bounds, deltas, center, radius,
                                                                         relax, mask, cut):
        return lower, upper
    return _crown_layer_bounds_padded(plan, tensor, bounds, deltas, center, radius, relax, mask=mask,
                                      deadline=deadline, cut=cut)


def _crown_narrows(plan: Plan, tensor: int, bounds, deltas, center, radius, relax, mask, cut=None) -> bool:
    """Whether CROWN narrows the elements of ``tensor`` (a general operator's input) enough to pay
    for a backward walk per element: bounds an evenly spread sample of :data:`_PROBE_ROWS` of the
    first domain's ``mask``ed elements and compares their mean width (see
    :data:`_OPERATOR_PROBE_MIN_GAIN`). Skipping is always sound: the interval bounds stay."""
    lower, upper = (t[:1].reshape(1, -1) for t in bounds[tensor])
    candidates = mask[:1].reshape(1, -1)[0].nonzero().flatten()
    chosen = candidates[torch.linspace(0, candidates.numel() - 1, min(_PROBE_ROWS, candidates.numel())).long()]
    only = torch.zeros_like(lower, dtype=torch.bool)
    only[0, chosen] = True
    sub_bounds = [(l[:1], u[:1]) for l, u in bounds[:tensor + 1]]
    new_lower, new_upper = _crown_layer_bounds_padded(plan, tensor, sub_bounds, deltas, center[:1], radius[:1], relax,
                                                      only=only.reshape(bounds[tensor][0][:1].shape),
                                                      mask=mask[:1], cut=None if cut is None else cut.select(torch.arange(1)))
    new_lower, new_upper = new_lower.reshape(1, -1)[0, chosen], new_upper.reshape(1, -1)[0, chosen]
    old_width = (upper[0, chosen] - lower[0, chosen]).mean()
    return bool((new_upper - new_lower).mean() <= (1 - _OPERATOR_PROBE_MIN_GAIN) * old_width)


def crown_layer_bounds(plan: Plan, position: int, bounds, deltas, center, radius, relax, deadline=None, cut=None,
                        only=None):
    """CROWN bounds of the input of ReLU stage ``position``, only for neurons not yet stable.

    Stable neurons are relaxed exactly whatever their bounds, so only the unstable ones of each
    domain get a row: domain i bounds its own ``k_i`` unstable neurons, padded to the largest
    ``k`` of its group. Domains are grouped by ``k_i`` (sorted) so that little is padded.
    ``cut``: the walks stop there (see :func:`backsubstitute`). ``only`` (bool, the bounds'
    shape): the neurons to bound (the others keep theirs).
    """
    lower, upper = bounds[position]
    batch = lower.shape[0]
    unstable = (lower < 0) & (upper > 0)
    if only is not None:
        unstable = unstable & only
        if not bool(unstable.any()):
            return lower, upper
    if int(unstable.reshape(batch, -1).sum(1).max()) > _PROBE_ABOVE and not _crown_tightens(plan, position, bounds, deltas, center, radius,
                                                                  relax, cut, only):
        return lower, upper
    if cut is None:
        grouped = _crown_layer_bounds_grouped(plan, position, bounds, deltas, center, radius, relax, deadline, only)
        if grouped is not None:
            return grouped
    if batch <= _MIN_GROUP:
        return _crown_layer_bounds_padded(plan, position, bounds, deltas, center, radius, relax, deadline=deadline,
                                          cut=cut, only=only)
    counts = unstable.reshape(batch, -1).sum(1)
    order = counts.argsort()
    new_lower, new_upper = lower.clone(), upper.clone()
    group = max(_MIN_GROUP, batch // _GROUPS)
    for start in range(0, batch, group):
        members = order[start:start + group]
        if int(counts[members].max()) == 0:
            continue
        sub_bounds = [(l[members], u[members]) for l, u in bounds[:position + 1]]
        low, high = _crown_layer_bounds_padded(plan, position, sub_bounds, deltas, center[members], radius[members],
                                               relax, cut=None if cut is None else cut.select(members),
                                               only=None if only is None else only[members])
        new_lower[members], new_upper[members] = low, high
    return new_lower, new_upper


def _crown_layer_bounds_grouped(plan: Plan, position: int, bounds, deltas, center, radius, relax, deadline=None,
                                only=None):
    """:func:`crown_layer_bounds` by grouped rows (:mod:`assay.bounds.grouped_rows`): the
    unstable neurons of one channel whose receptive fields are disjoint share one backward walk
    (per side). None where the layer's rows cannot be grouped, or grouping saves less than half
    the walks. Chunks of groups are sized by :data:`_GROUPED_WALK_ELEMENTS`; under a deadline
    the groups not reached keep their bounds (sound)."""
    found = row_spacing(plan, position)
    if found is None:
        return None
    (sh, sw), fields = found
    lower, upper = bounds[position]
    batch, channels, height, width = lower.shape
    unstable = (lower < 0) & (upper > 0)
    if only is not None:
        unstable = unstable & only
    # the groups (channel, row offset, column offset) with an unstable neuron in some domain
    padded = torch.zeros(channels, -(-height // sh) * sh, -(-width // sw) * sw, dtype=torch.bool)
    padded[:, :height, :width] = unstable.any(0)
    occupied = padded.reshape(channels, -1, sh, padded.shape[2] // sw, sw).any(3).any(1)  # (C, sh, sw)
    present = occupied.nonzero()
    if present.shape[0] == 0:
        return lower, upper
    if 2 * present.shape[0] > int(unstable.reshape(batch, -1).sum(1).max()):
        return None  # fewer than half the walks saved: one row per neuron
    present = torch.cat([present, present + torch.tensor([channels, 0, 0])])  # lower rows, then upper rows
    widest = max(math.prod(plan.network.shapes[t]) for t in list(fields) + [position])
    chunk = max(1, _GROUPED_WALK_ELEMENTS // (batch * widest))
    scales = rounding_scales(plan, position, bounds)
    hit_rows = torch.arange(height).unsqueeze(0) % sh == torch.arange(sh).unsqueeze(1)  # (sh, H)
    hit_cols = torch.arange(width).unsqueeze(0) % sw == torch.arange(sw).unsqueeze(1)  # (sw, W)
    new_lower, new_upper = lower.clone(), upper.clone()
    flat_unstable = unstable.reshape(batch, -1)
    for start in range(0, present.shape[0], chunk):
        if deadline is not None and time.monotonic() > deadline:
            break
        groups = present[start:start + chunk]
        rows = GroupedRows(plan, position, 2 * channels, (sh, sw), fields, groups)
        kind, oh, ow = groups.unbind(1)
        channel = kind % channels
        sign = torch.where(kind < channels, 1.0, -1.0).to(lower.dtype)
        pattern = hit_rows[oh].unsqueeze(2) & hit_cols[ow].unsqueeze(1)  # (G, H, W)
        member = unstable[:, channel] & pattern  # (B, G, H, W)
        C = torch.zeros(batch, groups.shape[0], channels, height, width, dtype=lower.dtype)
        C[:, torch.arange(groups.shape[0]), channel] = member.to(lower.dtype) * sign.view(1, -1, 1, 1)
        d = torch.zeros(batch, rows.rows, dtype=lower.dtype)
        back = backsubstitute(plan, position, C, d, bounds, deltas, relax=relax, scales=scales, reduce=rows.reduce)
        value = concretize(plan, back, center, radius, reduce=rows.reduce)[0].reshape(batch, 2, -1)
        reached = rows.row_groups().reshape(2, -1)
        take_lower = reached[0].unsqueeze(0) & flat_unstable
        take_upper = reached[1].unsqueeze(0) & flat_unstable
        flat_lower, flat_upper = new_lower.reshape(batch, -1), new_upper.reshape(batch, -1)
        flat_lower.copy_(torch.where(take_lower, torch.maximum(flat_lower, value[:, 0]), flat_lower))
        flat_upper.copy_(torch.where(take_upper, torch.minimum(flat_upper, -value[:, 1]), flat_upper))
    return new_lower, new_upper


def rows_reach(network: Network, plan: Plan, C: torch.Tensor, bounds) -> dict[int, torch.Tensor] | None:
    """Per ReLU position, the neurons (B, *shape) with a path to some row of ``C`` (B, S, *out)
    through nonzero weights and ReLUs not off on the domain (:func:`gradient_bounds` of |C|,
    which is positive exactly there, but where a product underflows: such a neuron is only left
    unrefined, which is sound). The rows' bounds, and the bounds of every neuron on such a
    path, never read the relaxation of a neuron outside it, so CROWN need not bound those (a
    fully convolutional network's rows read a window of it). None for a network with max pooling
    or general operators, and where every neuron is reached."""
    if plan.has_maxpool or plan.is_general or not plan.relu_positions:
        return None
    intermediate = IntermediateBounds(tuple(bounds[p][0].to(torch.float64) for p in plan.relu_positions),
                                      tuple(bounds[p][1].to(torch.float64) for p in plan.relu_positions))
    rows = C.detach().abs().to(torch.float64).reshape(C.shape[0], C.shape[1], -1).sum(1)
    reached = gradient_bounds(network, rows, intermediate).relu_outputs
    if all(bool((r > 0).all()) for r in reached):
        return None
    return {p: r > 0 for p, r in zip(plan.relu_positions, reached)}


def _crown_tightens(plan: Plan, position: int, bounds, deltas, center, radius, relax, cut=None, only=None) -> bool:
    """Whether CROWN tightens ReLU layer ``position`` enough to pay for bounding all its unstable neurons.

    Bounds an evenly spread sample of the first domain's unstable neurons: worth it when one of
    them becomes stable or their mean width halves (:data:`_PROBE_MIN_GAIN`). (Where the
    neurons' pre-activations are nearly tied differences, e.g. inside a lowered MaxPool, CROWN
    shrinks them by a third and settles none, at the cost of minutes.) Skipping is always
    sound: the interval bounds stay.
    """
    lower, upper = (t[:1].reshape(1, -1) for t in bounds[position])
    candidates = (lower < 0) & (upper > 0)
    if only is not None:
        candidates = candidates & only[:1].reshape(1, -1)
    candidates = candidates[0].nonzero().flatten()
    if candidates.numel() == 0:
        return False
    chosen = candidates[torch.linspace(0, candidates.numel() - 1, min(_PROBE_ROWS, candidates.numel())).long()]
    only = torch.zeros_like(lower, dtype=torch.bool)
    only[0, chosen] = True
    sub_bounds = [(l[:1], u[:1]) for l, u in bounds[:position + 1]]
    new_lower, new_upper = _crown_layer_bounds_padded(plan, position, sub_bounds, deltas, center[:1], radius[:1],
                                                      relax, only=only.reshape(bounds[position][0][:1].shape),
                                                      cut=None if cut is None else cut.select(torch.arange(1)))
    new_lower, new_upper = new_lower.reshape(1, -1)[0, chosen], new_upper.reshape(1, -1)[0, chosen]
    if bool(((new_lower >= 0) | (new_upper <= 0)).any()):
        return True
    old_width = (upper[0, chosen] - lower[0, chosen]).mean()
    return bool((new_upper - new_lower).mean() <= (1 - _PROBE_MIN_GAIN) * old_width)


def _crown_layer_bounds_padded(plan: Plan, position: int, bounds, deltas, center, radius, relax, only=None,
                               mask=None, deadline=None, cut=None):
    """:func:`crown_layer_bounds` for one group of domains (every row padded to the group's max);
    ``only`` (a bool mask of the layer's shape per domain) restricts which unstable neurons are
    bounded, and ``mask`` replaces "unstable" by any choice (see :func:`_bound_unstable_neurons`)."""
    lower = bounds[position][0]
    input_elements = max(1, center[0].numel())
    # The walk's coefficients are rows × each tensor they cross: a generator's images outgrow
    # its few inputs (cgan: 28,800 against 5), and rows sized by the input alone took 18 GB.
    widest = max(t[0][0].numel() for t in bounds[0 if cut is None else cut.tensor:position + 1])
    chunk = max(1, min(_ROW_CHUNK_ELEMENTS // (2 * lower.shape[0] * input_elements),
                       _WALK_ELEMENTS // (2 * lower.shape[0] * widest)))
    scales = rounding_scales(plan, position, bounds)

    def bound_rows(neurons, C, d):
        back = backsubstitute(plan, position, C, d, bounds, deltas, relax=relax, scales=scales, cut=cut)
        return concretize(plan, back, center, radius)[0]

    first_chunk = max(1, _TIMED_FIRST_ELEMENTS // (2 * lower.shape[0] * widest))
    return _bound_unstable_neurons(bounds[position], chunk, bound_rows, only, mask, deadline, first_chunk)


def alpha_layer_bounds(plan: Plan, position: int, bounds, deltas, center, radius, relax, options, deadline,
                        split_signs=None):
    """α-CROWN bounds of the input of ReLU stage ``position``, only for neurons not yet stable.

    Every unstable neuron's lower and upper bound is a row of its own, with its own slopes at
    every earlier ReLU layer, optimised by :func:`optimize_bounds` (any slopes are sound, so a
    deadline only stops the tightening). With :class:`BetaCrownOptions`, the split constraints
    of earlier layers (``split_signs``) enter each row with multipliers of its own (β-CROWN
    for intermediate bounds: a domain whose first layers are split gets later bounds over the
    inputs that satisfy the splits, not over its whole box; any β ≥ 0 is sound). Rows are
    bounded in chunks so that the slopes of one chunk stay within :data:`_ALPHA_CHUNK_ELEMENTS`. A layer with more than
    :data:`_ALPHA_MAX_UNSTABLE` unstable neurons in some domain keeps its CROWN bounds.
    """
    lower, upper = bounds[position]
    if int(((lower < 0) & (upper > 0)).reshape(lower.shape[0], -1).sum(1).max()) > _ALPHA_MAX_UNSTABLE:
        return lower, upper  # CROWN's bounds stay (sound); see _ALPHA_MAX_UNSTABLE
    slope_elements = sum(math.prod(plan.stages[p].shape) for p in plan.relu_positions if p < position)
    chunk = max(1, _ALPHA_CHUNK_ELEMENTS // (2 * lower.shape[0] * max(1, slope_elements)))
    bound_rows = _optimised_rows(plan, position, bounds, deltas, center, radius, relax, options, deadline, split_signs)
    return _bound_unstable_neurons(bounds[position], chunk, bound_rows)


def _optimised_rows(plan: Plan, target: int, bounds, deltas, center, radius, relax, options, deadline, split_signs):
    """``bound_rows(neurons, C, d)`` for :func:`_bound_unstable_neurons`: the rows' lower bounds
    optimised by :func:`optimize_bounds` over the walk back from tensor ``target`` (with
    :class:`BetaCrownOptions`, the split constraints of earlier layers enter with multipliers)."""
    beta = isinstance(options, BetaCrownOptions)
    lr = options.lr_alpha if beta else options.lr
    signs = {p: s for p, s in (split_signs or {}).items() if p < target} if beta else None

    def bound_rows(neurons, C, d):
        with torch.enable_grad():  # compute_bounds walks the layers under no_grad
            best, *_ = optimize_bounds(
                plan, C, d, bounds, center, radius, deltas=deltas, split_signs=signs, iterations=options.iterations,
                lr_alpha=lr, lr_beta=options.lr_beta if beta else 0.0, lr_decay=options.lr_decay, objective=None,
                to_linear=_no_linear, deadline=deadline, relax=relax, target=target,
            )
        return best.detach()

    return bound_rows


def relaxed_before(plan: Plan, tensor: int) -> bool:
    """Whether a walk back from ``tensor`` crosses a relaxation with free parameters (a ReLU or a
    parametrised general operator): only then can α-CROWN tighten CROWN's bounds of it."""
    return any(p < tensor for p in list(plan.relu_positions) + list(plan.parametrised_operators))


def alpha_tensor_bounds(plan: Plan, tensor: int, bounds, deltas, center, radius, relax, options, deadline,
                         split_signs=None):
    """α-CROWN bounds of every element of ``tensor`` (one a non-linear general operator reads, e.g.
    a transformer's attention scores): each element's lower and upper bound is a row of its own,
    with its own slopes at every earlier ReLU layer and its own parameters of every earlier
    general operator's relaxation, optimised by :func:`optimize_bounds` from CROWN's choice (any
    parameters are sound; a deadline only stops the tightening). Never looser than before."""
    lower, upper = bounds[tensor]
    if lower[0].numel() > _ALPHA_OPERATOR_MAX:
        return lower, upper  # CROWN's bounds stay (sound); see _ALPHA_OPERATOR_MAX
    mask = upper > lower
    slope_elements = sum(math.prod(plan.stages[p].shape) for p in plan.relu_positions if p < tensor) \
        + sum(math.prod(plan.stages[p].out_shape) * plan.stages[p].rule.alpha_tensors()
              for p in plan.parametrised_operators if p < tensor)
    chunk = max(1, _ALPHA_CHUNK_ELEMENTS // (2 * lower.shape[0] * max(1, slope_elements)))
    bound_rows = _optimised_rows(plan, tensor, bounds, deltas, center, radius, relax, options, deadline, split_signs)
    return _bound_unstable_neurons(bounds[tensor], chunk, bound_rows, mask=mask, deadline=deadline)


def _no_linear(back: Backward, margin: torch.Tensor) -> None:
    """The default objective (the sum of the lower bounds) reads no linear bounds."""
    return None


def _bound_unstable_neurons(layer_bounds, chunk: int, bound_rows, only=None, mask=None, deadline=None,
                            first_chunk: int | None = None):
    """Tighten one layer's unstable neurons: ``bound_rows(neurons, C, d)`` returns sound lower
    bounds (B, 2m) of the rows ``C`` = (+unit on each neuron, then −unit), (B, 2m, *shape).

    Each domain bounds its own unstable neurons (restricted to ``only``, a bool mask of the
    layer's shape per domain, if given), padded to the largest count among the domains; at most
    ``chunk`` neurons per call. ``mask`` (a bool tensor of the bounds' shape) replaces "unstable"
    by any choice of elements. Under a ``deadline`` the first call bounds at most ``first_chunk``
    neurons and later calls as many as take about :data:`_TIMED_CHUNK_SECONDS` by the time
    measured. Returns the new (lower, upper), never looser than the old.
    """
    lower, upper = layer_bounds
    batch = lower.shape[0]
    flat_lower, flat_upper = lower.reshape(batch, -1).clone(), upper.reshape(batch, -1).clone()
    unstable = (flat_lower < 0) & (flat_upper > 0) if mask is None else mask.reshape(batch, -1).clone()
    if only is not None:
        unstable &= only.reshape(batch, -1)
    width = int(unstable.sum(1).max()) if batch else 0
    if width == 0:
        return lower, upper
    # The unstable neurons of each domain first (stable sort keeps index order), then padding.
    order = torch.sort(unstable.to(torch.int8), dim=1, descending=True, stable=True).indices
    size = flat_lower.shape[1]
    # Under a deadline the chunks start small and grow to what fits _TIMED_CHUNK_SECONDS: one
    # chunk of a wide convolutional layer can take minutes, and the deadline is only read
    # between chunks (a 150 s timeout once ran past 250 s inside one).
    step = chunk if deadline is None else min(chunk, first_chunk or chunk)
    start = 0
    while start < width:
        if deadline is not None and time.monotonic() > deadline:
            break  # the neurons not reached keep their bounds (sound)
        began = time.monotonic()
        neurons = order[:, start:min(start + step, width)]  # (B, m): only as many as the most unstable domain has
        start += neurons.shape[1]
        valid = torch.gather(unstable, 1, neurons)
        m = neurons.shape[1]
        rows = torch.zeros(batch, 2 * m, size, dtype=lower.dtype)
        rows.scatter_(2, neurons.unsqueeze(-1), 1.0)
        rows[:, m:].scatter_(2, neurons.unsqueeze(-1), -1.0)
        C = rows.reshape(batch, 2 * m, *lower.shape[1:])
        d = torch.zeros(batch, 2 * m, dtype=lower.dtype)
        value = bound_rows(neurons, C, d)
        new_lower = torch.maximum(torch.gather(flat_lower, 1, neurons), value[:, :m])
        new_upper = torch.minimum(torch.gather(flat_upper, 1, neurons), -value[:, m:])
        flat_lower.scatter_(1, neurons, torch.where(valid, new_lower, torch.gather(flat_lower, 1, neurons)))
        flat_upper.scatter_(1, neurons, torch.where(valid, new_upper, torch.gather(flat_upper, 1, neurons)))
        if deadline is not None:
            per_neuron = max(time.monotonic() - began, 1e-6) / m
            step = max(1, min(chunk, int(_TIMED_CHUNK_SECONDS / per_neuron)))
    return flat_lower.reshape(lower.shape), flat_upper.reshape(upper.shape)
