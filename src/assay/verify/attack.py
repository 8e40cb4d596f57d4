"""Counterexample search: projected gradient ascent with restarts, and random sampling.

Searches maximise the margin ``max_g min_{i in g} (C f(x) + d)_i`` over boxes; a point with margin ≥ 0 is
a candidate, reported only after :func:`confirm` re-checks it with a float64 forward pass.
"""

from __future__ import annotations

import math
import time

import numpy as np
import torch

from assay.nn.network import Network
from assay.verify.attack_model import attack_model, drops_softmax, has_sign
from assay.verify.deadline import Deadline
from assay.verify.problem import UnsafeQuery


def margins(network: Network, x: torch.Tensor, query: UnsafeQuery) -> torch.Tensor:
    """The query's group margin of f(x) for a batch x (N, n_in flat): shape (N,), ≥ 0 when unsafe."""
    y = network.forward(x.reshape(x.shape[0], *network.input_shape)).reshape(x.shape[0], -1)
    return query.group_margin(y @ query.C.T + query.d)


def confirm(network: Network, query: UnsafeQuery, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
    """The first row of x (N, n_in) that lies in the query's box and truly violates, with its output.

    The check is a plain float64 forward pass: an input counts only if its output satisfies the
    query's violation predicate exactly as computed there.
    """
    x, y, truly = _checked(network, query, x)
    hits = truly.nonzero().flatten()
    if hits.numel() == 0:
        return None
    first = int(hits[0])
    return x[first].clone(), y[first].clone()


def _checked(network: Network, query: UnsafeQuery, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """x (N, n_in) clipped to the query's box in float64, its float64 outputs, and which rows violate."""
    x = x.detach().to(torch.float64)
    x = torch.minimum(torch.maximum(x, query.lower), query.upper)
    y = network.forward(x.reshape(x.shape[0], *network.input_shape)).reshape(x.shape[0], -1)
    return x, y, query.violates(y)


def pgd(
    network: Network,
    query: UnsafeQuery,
    lower: torch.Tensor,
    upper: torch.Tensor,
    starts: torch.Tensor,
    steps: int = 50,
    first_step: float = 0.1,
    last_step: float = 1e-4,
    deadline: Deadline | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Projected sign-gradient ascent of the margin from ``starts`` (N, n) inside boxes (N, n).

    The step, relative to each box's width, decays geometrically from ``first_step`` to
    ``last_step``: violations of verified-looking networks often hide in regions far smaller
    than a linearly decaying step resolves (ACAS Xu 1_9 property 7: PGD with steps ≥ 0.5 % of
    the width stalls at margin −6·10⁻⁴ next to a violating region).

    Differentiates :func:`~assay.verify.attack_model.attack_model` (exact forward values; on a
    binarised network, surrogate gradients through its ``Sign`` layers; the margin read may be
    that of the logits where the query only compares outputs of a final Softmax).
    Runs in float32 for speed (the caller re-checks in float64). Stops early at ``deadline``.
    On a binarised network (each step costs a pass through large convolutions, and the margin
    moves in jumps) it also stops once a point that float32 puts in the unsafe set truly
    violates with a float64 margin > 0 (the check of :func:`confirm`, ties excluded: the
    competition's checker recomputes in float32): that point is then its start's result,
    whatever its float32 margin. Elsewhere the steps go on, so that the point returned lies
    deeper in the unsafe set than the first one reached (further from rounding's reach).
    Returns the best point per start and its float32 margin.
    """
    model = _float32_model(network, query)
    lo, hi = lower.to(torch.float32), upper.to(torch.float32)
    C32, d32 = query.C.to(torch.float32), query.d.to(torch.float32)
    width = (hi - lo).clamp(min=1e-12)
    x = starts.to(torch.float32).clone().clamp(lo, hi).requires_grad_(True)
    best_x = x.detach().clone()
    best = torch.full((x.shape[0],), -torch.inf)
    stop_early = has_sign(network)
    for step in range(steps):
        if deadline is not None and deadline.passed():
            break
        y = model(x.reshape(x.shape[0], *network.input_shape)).reshape(x.shape[0], -1)
        value = query.group_margin(y @ C32.T + d32)
        with torch.no_grad():
            better = value > best
            best = torch.where(better, value, best)
            best_x[better] = x[better]
            candidates = value >= 0
            if stop_early and candidates.any():
                truly = torch.zeros_like(candidates)
                _, y64, violating = _checked(network, query, x[candidates])
                truly[candidates] = violating & (query.group_margin(y64 @ query.C.T + query.d) > 0)
                if truly.any():
                    best_x[truly], best[truly] = x[truly], value[truly]
                    break
        if not value.requires_grad:  # the output is piecewise constant in x (an index, a decision): no gradient
            break
        (grad,) = torch.autograd.grad(value.sum(), x)
        with torch.no_grad():
            size = first_step * (last_step / first_step) ** (step / max(steps - 1, 1))
            x += size * width * grad.sign()
            x.copy_(torch.minimum(torch.maximum(x, lo), hi))
    return best_x.detach(), best


def schedules(network: Network, steps: int = 50) -> list[tuple[float, float, int]]:
    """The PGD schedules an attack runs in turn, as (first step, last step, steps); steps relative
    to the box's width. A fine one (``steps`` from 0.1 to 10⁻⁴) resolves tiny violating regions
    (ACAS Xu); a coarse one (``2·steps`` from 0.5 to 0.05) reaches wide ones (MNIST ε-balls,
    where it finds within 100 steps violations that 50 fine steps miss). A binarised network
    (:func:`~assay.verify.attack_model.has_sign`) gets a third, long and mid-sized (``6·steps``
    from 0.25 to 0.01): its surrogate gradients point the right way only roughly, and a step
    flips many signs at once. It gets the coarse schedule first and the fine one last: steps of
    10⁻⁴ of the width move no sign (traffic_signs_recognition_2023, 64×64 network, ε = 1: the
    fine schedule ends at margin −30, the coarse one reaches +50)."""
    fine, coarse = (0.1, 1e-4, steps), (0.5, 0.05, 2 * steps)
    if has_sign(network):
        return [coarse, (0.25, 0.01, 6 * steps), fine]
    return [fine, coarse]


def from_center(network: Network, query: UnsafeQuery, steps: int = 50,
                deadline: Deadline | None = None) -> tuple[torch.Tensor, torch.Tensor] | None:
    """PGD from the box's centre alone, with each of :func:`schedules` in turn: a fraction of a
    second, and on image ε-balls it finds most violations that :func:`search`'s sampling needs
    tens of seconds for (the centre is the unperturbed image). Re-checked like every attack."""
    start = ((query.lower + query.upper) / 2).unsqueeze(0)
    box = query.lower.unsqueeze(0), query.upper.unsqueeze(0)
    return _descend(network, query, box, start, steps, deadline)


def _descend(network: Network, query: UnsafeQuery, box, starts: torch.Tensor, steps: int,
             deadline: Deadline | None) -> tuple[torch.Tensor, torch.Tensor] | None:
    """PGD from ``starts`` with each of :func:`schedules` in turn until :func:`confirm` accepts a point."""
    for first, last, count in schedules(network, steps):
        if deadline is not None and deadline.passed():
            return None
        x, _ = pgd(network, query, *box, starts, count, first_step=first, last_step=last, deadline=deadline)
        found = confirm(network, query, x)
        if found is not None:
            return found
    return None


def search(
    network: Network,
    query: UnsafeQuery,
    rng: np.random.Generator,
    restarts: int = 32,
    steps: int = 50,
    samples: int | None = None,
    deadline: Deadline | None = None,
    guides: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor] | None:
    """Random sampling, then PGD from the best samples and random restarts over the query box
    (with each of :func:`schedules` in turn).

    ``guides`` (k, n): further points of the box to start PGD from, besides the centre, e.g. the
    corners where sound linear upper bounds of the rows peak (:func:`assay.verify.relu_split.
    root_corners`): where the relaxation places a violation. On mnist 256x6 prop_1 (ε 0.05) PGD
    from the centre and 512 random starts stalls at margin −0.81, far from the violating corners;
    from the corners of the root's α-CROWN bounds it reaches +0.9 in a few steps. They come on
    top of the ``restarts``.

    Half of the samples are uniform, half are drawn from Beta(0.3, 0.3) per coordinate, which
    puts most of them near the faces and corners of the box, where violations of trained
    networks tend to sit (sensor ranges end there). ``samples`` defaults to a budget of about
    2·10⁹ multiply-adds (131,072 points for an ACAS Xu network, fewer for larger ones).
    Samples are ranked by a float32 forward pass; the best of each chunk (and every one that
    float32 puts within rounding of the unsafe region) are re-checked in float64, which alone
    decides. Sampling stops early once it has used a fifth of the time left at its start
    (convolutional networks cost far more per sample than their parameter count suggests), so
    that PGD and the search that follows keep their time.
    At ``deadline`` it stops (between sample chunks and PGD steps) with what it has found.
    """
    n = query.lower.numel()
    if samples is None:
        samples = int(min(1 << 17, max(1024, (1 << 31) // max(network.num_parameters, 1))))
    width = query.upper - query.lower
    keep = max(restarts // 2, 1)
    best_points, best_values = [], []
    chunk = _chunk_size(network)
    sampling_ends = math.inf
    if deadline is not None and math.isfinite(deadline.at):
        sampling_ends = time.monotonic() + _SAMPLING_SHARE * max(deadline.remaining(), 0.0)
    for start in range(0, samples, chunk):
        if deadline is not None and deadline.passed():
            return None
        if start > 0 and time.monotonic() > sampling_ends:
            break
        count = min(chunk, samples - start)
        uniform = rng.uniform(size=(count - count // 2, n))
        boundary = rng.beta(0.3, 0.3, size=(count // 2, n))
        points = query.lower + width * torch.as_tensor(np.concatenate([uniform, boundary]))
        values = _float32_margins(network, points, query)
        order = values.argsort(descending=True)
        # float32 only ranks; the float64 forward pass of confirm() decides.
        near = int((values >= -_RANKING_SLACK * (1.0 + values.abs().max())).sum())
        found = confirm(network, query, points[order[: max(_CONFIRM_PER_CHUNK, near)]])
        if found is not None:
            return found
        best_points.append(points[order[:keep]])
        best_values.append(values[order[:keep]])
    points, values = torch.cat(best_points), torch.cat(best_values)
    best = points[values.argsort(descending=True)[:keep]]
    center = ((query.lower + query.upper) / 2).unsqueeze(0)
    random_starts = query.lower + width * torch.as_tensor(rng.uniform(size=(max(restarts - keep - 1, 0), n)))
    starts = torch.cat([center, best, random_starts])[: max(restarts, 1)]
    if guides is not None and len(guides):
        starts = torch.cat([starts[:1], guides.reshape(len(guides), n).to(starts.dtype), starts[1:]])
    box = query.lower.expand_as(starts), query.upper.expand_as(starts)
    return _descend(network, query, box, starts, steps, deadline)


# Points evaluated at once while sampling, at most: fewer when their float32 tensors would take
# more than _SAMPLE_MEMORY bytes (a pooling CNN holds ~10⁵ values per point: 16,384 points ≈ 6 GB).
_SAMPLE_CHUNK = 16384
_SAMPLE_MEMORY = 256 * 2**20
# The share of the time left that sampling may use before PGD takes over.
_SAMPLING_SHARE = 0.2
# Per chunk, the float32-best points re-checked in float64, and the relative float32 margin
# below zero within which a point is re-checked too (float32 rounding of the margin).
_CONFIRM_PER_CHUNK = 256
_RANKING_SLACK = 1e-4


def _chunk_size(network: Network) -> int:
    """Sample points per chunk: every tensor of the network for the chunk fits in _SAMPLE_MEMORY (float32)."""
    values = sum(int(np.prod(shape)) for shape in network.shapes)
    return int(max(64, min(_SAMPLE_CHUNK, _SAMPLE_MEMORY // (4 * max(values, 1)))))


def _float32_margins(network: Network, x: torch.Tensor, query: UnsafeQuery) -> torch.Tensor:
    """The query's group margin of the float32 network on a batch x (N, n_in flat), as float64 (N,)."""
    model = _float32_model(network, query)
    with torch.no_grad():
        y = model(x.to(torch.float32).reshape(x.shape[0], *network.input_shape)).reshape(x.shape[0], -1)
        values = query.group_margin(y @ query.C.to(torch.float32).T + query.d.to(torch.float32))
    return values.to(torch.float64)


_MODELS: dict[tuple[int, bool], tuple[Network, torch.nn.Module]] = {}


def _float32_model(network: Network, query: UnsafeQuery) -> torch.nn.Module:
    """The float32 :func:`~assay.verify.attack_model.attack_model` for ``query`` (cached: it
    depends on the query only through whether a final Softmax is dropped)."""
    key = (id(network), drops_softmax(network, query))
    if key not in _MODELS or _MODELS[key][0] is not network:
        if any(held is not network for held, _ in _MODELS.values()):
            _MODELS.clear()  # keep one network's models: the verifier works on one network at a time
        _MODELS[key] = (network, attack_model(network, query, torch.float32))
    return _MODELS[key][1]
