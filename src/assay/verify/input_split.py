"""Branch and bound over the input box (for networks with few inputs, e.g. ACAS Xu).

Each round bounds a batch of pending boxes with :func:`assay.bounds.compute_bounds`; a box is
done when some unsafe row has a negative upper bound on it (no point of the box can satisfy
the whole conjunction). Otherwise the box is probed for a counterexample (its center, the
corner that maximises the linear upper bound of its most promising row) and split in two
along the dimension with the largest ``|A_j| · width_j`` of that row's linear bound.

Soundness: HOLDS is returned only when every box of a partition of the input box was shown
infeasible by sound bounds; VIOLATED only with a point confirmed by a float64 forward pass.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from assay.bounds import compute_bounds
from assay.nn.network import Network
from assay.verify.attack import confirm, pgd
from assay.verify.problem import UnsafeQuery
from assay.verify.result import VerificationStatus

# Below this relative width a box is not split further: bounds cannot be trusted to tighten.
_MIN_RELATIVE_WIDTH = 1e-10


@dataclass
class SearchStats:
    domains: int = 0
    bound_calls: int = 0
    max_pending: int = 0
    attacks: int = 0


def input_split(
    network: Network,
    query: UnsafeQuery,
    deadline: float,
    *,
    method: str = "crown",
    dtype: str = "float64",
    batch_size: int = 1024,
    stats: SearchStats,
    progress: Callable[[float, int], None] | None = None,
) -> tuple[VerificationStatus, tuple[torch.Tensor, torch.Tensor] | None]:
    """Decide one unsafe query by input splitting. Returns (status, (x, y) for VIOLATED)."""
    shape = network.input_shape
    full_width = (query.upper - query.lower).clamp(min=1e-30)
    pending_lower = [query.lower.unsqueeze(0)]
    pending_upper = [query.upper.unsqueeze(0)]
    pending = 1
    done_volume = 0.0
    while pending:
        if time.monotonic() > deadline:
            return VerificationStatus.TIMEOUT, None
        lower, upper, pending_lower, pending_upper = _take(pending_lower, pending_upper, batch_size)
        pending -= lower.shape[0]
        result = compute_bounds(
            network, (lower.reshape(-1, *shape), upper.reshape(-1, *shape)), spec=(query.C, query.d),
            method=method, dtype=dtype, sides="upper", return_linear=True,
        )
        stats.bound_calls += 1
        stats.domains += lower.shape[0]
        row_upper = result.upper  # (B, m): upper bounds of each unsafe row
        best_row = row_upper.argmin(1)
        safe = row_upper.gather(1, best_row.unsqueeze(1)).squeeze(1) < 0
        done_volume += float(((upper[safe] - lower[safe]) / full_width).prod(1).sum())
        open_ = ~safe
        if open_.any():
            lower, upper = lower[open_], upper[open_]
            rows = best_row[open_]
            # Linear upper bound of each open box's most promising row: y_r ≤ A·x + b.
            A = result.linear.upper_A[open_].reshape(lower.shape[0], -1, lower.shape[1])
            A = A[torch.arange(lower.shape[0]), rows]
            corner = torch.where(A > 0, upper, lower)
            center = (lower + upper) / 2
            found = confirm(network, query, torch.cat([corner, center]))
            if found is None and stats.bound_calls % 8 == 1:
                found = _attack_worst(network, query, lower, upper, row_upper[open_], stats)
            if found is not None:
                return VerificationStatus.VIOLATED, found
            width = upper - lower
            if (width <= _MIN_RELATIVE_WIDTH * full_width).all(1).any():
                return VerificationStatus.UNKNOWN, None
            score = A.abs() * width
            dim = score.argmax(1)
            arange = torch.arange(lower.shape[0])
            middle = (lower[arange, dim] + upper[arange, dim]) / 2
            left_upper = upper.clone()
            left_upper[arange, dim] = middle
            right_lower = lower.clone()
            right_lower[arange, dim] = middle
            pending_lower += [lower, right_lower]
            pending_upper += [left_upper, upper]
            pending += 2 * lower.shape[0]
        stats.max_pending = max(stats.max_pending, pending)
        if progress is not None:
            progress(done_volume, pending)
    return VerificationStatus.HOLDS, None


def _take(lowers: list[torch.Tensor], uppers: list[torch.Tensor], count: int):
    """Pop up to ``count`` boxes from the end of the pending stacks (depth first)."""
    taken_l, taken_u, have = [], [], 0
    while lowers and have < count:
        l, u = lowers.pop(), uppers.pop()
        need = count - have
        if l.shape[0] > need:
            lowers.append(l[:-need])
            uppers.append(u[:-need])
            l, u = l[-need:], u[-need:]
        taken_l.append(l)
        taken_u.append(u)
        have += l.shape[0]
    return torch.cat(taken_l), torch.cat(taken_u), lowers, uppers


def _attack_worst(network, query, lower, upper, row_upper, stats, count: int = 16):
    """PGD inside the open boxes whose bounds are least negative (most likely to hide a violation)."""
    stats.attacks += 1
    order = row_upper.amin(1).argsort(descending=True)[:count]
    lo, hi = lower[order], upper[order]
    x, _ = pgd(network, query.C, query.d, lo, hi, (lo + hi) / 2, steps=20)
    return confirm(network, query, x)
