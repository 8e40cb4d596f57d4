"""Decide a ReLU-splitting leaf exactly: one LP over its linear region, certified by duality.

A *leaf* is a domain of :mod:`assay.verify.relu_split` in which the sign of every ReLU input is
known (split, or fixed by the domain's pre-activation bounds). On such a domain the network is
affine, and "can every row of the conjunction be ≥ 0?" is the linear program

    maximise t  subject to  C_i (W x + c) + d_i ≥ t  (rows of the conjunction),
                            σ_j z_j(x) ≥ t           (every ReLU input keeps its sign),
                            x in the input box,

with z_j(x) the affine form of neuron j under the domain's activation pattern. (With t also on
the sign constraints the LP is always feasible, and t < 0 covers a region that is empty.) The
LP is only an oracle (HiGHS through :func:`scipy.optimize.linprog`), never trusted for a verdict:

- *refuted*: the LP's dual multipliers (λ on the rows, ν on the sign constraints) define the
  Lagrangian bound max_x Σ λ_i row_i(x) + Σ ν_j σ_j z_j(x), which is evaluated by the bound
  engine's own bound of one activation pattern (:func:`assay.bounds.pattern_lower_bound`, ν as
  split multipliers) with its outward rounding. A point of the leaf where every row is ≥ 0 makes that
  sum ≥ 0 for any λ, ν ≥ 0; so a negative value of the sound bound refutes the leaf, whatever the
  solver's accuracy.
- *violated*: the LP's maximiser is re-checked by a plain float64 forward pass.
- otherwise (numerically borderline, or the solver failed) the leaf stays *unknown*.
"""

from __future__ import annotations

import numpy as np
import torch

from assay._lp import linprog
from assay.bounds import affine_forms, pattern_lower_bound
from assay.nn.network import Network
from assay.verify.attack import confirm
from assay.verify.problem import UnsafeQuery
from assay.verify.result import VerificationStatus

# A leaf's verdict in the verifier's own vocabulary: HOLDS (refuted: no violation on the leaf),
# VIOLATED (with a re-checked point) or UNKNOWN.
HOLDS, VIOLATED, UNKNOWN = VerificationStatus.HOLDS, VerificationStatus.VIOLATED, VerificationStatus.UNKNOWN


def is_leaf(lower: list[torch.Tensor], upper: list[torch.Tensor]) -> torch.Tensor:
    """(B,) bool: domains whose every ReLU input has a known sign (given bounds after split clamping)."""
    undecided = [((l < 0) & (u > 0)).reshape(l.shape[0], -1).any(1) for l, u in zip(lower, upper)]
    return ~torch.stack(undecided).any(0)


def decide_leaf(
    network: Network,
    query: UnsafeQuery,
    C: torch.Tensor,
    d: torch.Tensor,
    lower: list[torch.Tensor],
    upper: list[torch.Tensor],
) -> tuple[str, tuple[torch.Tensor, torch.Tensor] | None]:
    """Decide whether the conjunction ``C y + d ≥ 0`` is reachable on one leaf domain.

    Args:
        network, query: the network and the query (its box and exact violation predicate).
        C, d: (m, n_out) and (m,): the rows of one conjunction.
        lower, upper: the leaf's pre-activation bounds per ReLU layer, each (*layer shape), with
            the split constraints already applied (as returned by ``compute_bounds``).

    Returns:
        (HOLDS, None) when the leaf is refuted, (VIOLATED, (x, y)) with x re-checked by a forward
        pass, or (UNKNOWN, None).
    """
    signs = [torch.where(l >= 0, 1.0, -1.0).to(torch.float64) for l in lower]  # +1 active, −1 inactive
    if not is_leaf([l.unsqueeze(0) for l in lower], [u.unsqueeze(0) for u in upper]):
        return UNKNOWN, None
    forms, (out_coef, out_offset) = affine_forms(network, signs)
    row_coef = (C @ out_coef).numpy()  # (m, n): rows as functions of x
    row_offset = (C @ out_offset + d).numpy()
    n = query.lower.numel()
    # Constraints A z ≤ b over z = (x, t): t − row_i(x) ≤ 0 and t − σ_j z_j(x) ≤ 0.
    blocks = [np.hstack([-row_coef, np.ones((row_coef.shape[0], 1))])]
    bounds_b = [row_offset]
    for (coef, offset), sign in zip(forms, signs):
        s = sign.reshape(-1, 1)
        blocks.append(np.hstack([(-s * coef).numpy(), np.ones((coef.shape[0], 1))]))
        bounds_b.append((s.reshape(-1) * offset).numpy())
    A_ub, b_ub = np.vstack(blocks), np.concatenate(bounds_b)
    objective = np.zeros(n + 1)
    objective[-1] = -1.0
    box = list(zip(query.lower.tolist(), query.upper.tolist())) + [(None, None)]
    solution = linprog(objective, A_ub=A_ub, b_ub=b_ub, bounds=box, method="highs")
    if solution.status != 0:
        return UNKNOWN, None
    x = torch.as_tensor(solution.x[:n], dtype=torch.float64).unsqueeze(0)
    found = confirm(network, query, x)
    if found is not None:
        return VIOLATED, found
    duals = np.clip(-solution.ineqlin.marginals, 0.0, None)  # ≥ 0 up to the solver's tolerance
    if not duals.any():
        return UNKNOWN, None
    weights = torch.as_tensor(duals[: C.shape[0]])
    multipliers = duals[C.shape[0]:]
    if _certified_negative(network, query, C, d, weights, multipliers, signs, lower, upper):
        return HOLDS, None
    return UNKNOWN, None


def _certified_negative(network, query, C, d, weights, multipliers, signs, lower, upper) -> bool:
    """Sound check of the dual bound: max over the box of Σλ_i row_i + Σ ν_j σ_j z_j < 0 (λ, ν ≥ 0),
    i.e. a positive lower bound of its negation on the leaf's pattern."""
    nus, start = [], 0
    for sign in signs:
        nus.append(torch.as_tensor(multipliers[start:start + sign.numel()], dtype=torch.float64).reshape(sign.shape))
        start += sign.numel()
    value = pattern_lower_bound(network, query.lower, query.upper, -(weights @ C), -(weights @ d), signs, nus,
                                lower, upper)
    return value > 0
