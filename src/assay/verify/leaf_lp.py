"""Decide a ReLU-splitting leaf exactly: one LP over its linear region, certified by duality.

A *leaf* is a domain of :mod:`assay.verify.relu_split` in which the sign of every ReLU input is
known (split, or fixed by the domain's pre-activation bounds). On such a domain the network is
affine, and "can every row of the conjunction be ≥ 0?" is the linear program

    maximise t  subject to  C_i (W x + c) + d_i ≥ t  (rows of the conjunction),
                            σ_j z_j(x) ≥ t           (every ReLU input keeps its sign),
                            x in the input box,

with z_j(x) the affine form of neuron j under the domain's activation pattern. (With t also on
the sign constraints the LP is always feasible, and t < 0 covers a region that is empty.) The
LP is only an oracle (HiGHS, through highspy), never trusted for a verdict:

- *refuted*: the LP's dual multipliers (λ on the rows, ν on the sign constraints) define the
  Lagrangian bound max_x Σ λ_i row_i(x) + Σ ν_j σ_j z_j(x), which is evaluated by the bound
  engine's own bound of one activation pattern (:func:`assay.bounds.pattern_lower_bound`, ν as
  split multipliers) with its outward rounding. A point of the leaf where every row is ≥ 0 makes that
  sum ≥ 0 for any λ, ν ≥ 0; so a negative value of the sound bound refutes the leaf, whatever the
  solver's accuracy.
- *violated*: the LP's maximiser is re-checked by a plain float64 forward pass.
- otherwise (numerically borderline, or the solver failed) the leaf stays *unknown*.

Most sign constraints never bind. One whose side is ≥ 0 over the whole input box is dropped (the
LP region is the same), and the rest enter lazily: the LP starts with the conjunction's rows
alone and adds the sign constraints its maximiser violates until it violates none (the full LP's
optimum) or its optimum is already negative (then the full LP's is too). Dropped and
never-added constraints get the multiplier 0 in the certificate, which stays a valid Lagrangian
bound. On mnist 256x2 leaves 330–435 of the 512 constraints hold over the box.
"""

from __future__ import annotations

import numpy as np
import torch

from assay._lp import silent_highs
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
    # Every ReLU input with its sign: σ_j z_j(x) = sign_coef_j · x + sign_offset_j ≥ 0 on the leaf.
    sign_coef = np.vstack([(sign.reshape(-1, 1) * coef).numpy() for (coef, _), sign in zip(forms, signs)])
    sign_offset = np.concatenate([(sign.reshape(-1) * offset).numpy() for (_, offset), sign in zip(forms, signs)])
    solved = _solve_lazily(row_coef, row_offset, sign_coef, sign_offset, query.lower.numpy(), query.upper.numpy())
    if solved is None:
        return UNKNOWN, None
    x, row_duals, sign_duals = solved
    if x is not None:
        found = confirm(network, query, torch.as_tensor(x, dtype=torch.float64).unsqueeze(0))
        if found is not None:
            return VIOLATED, found
    if not (row_duals.any() or sign_duals.any()):
        return UNKNOWN, None
    if _certified_negative(network, query, C, d, torch.as_tensor(row_duals), sign_duals, signs, lower, upper):
        return HOLDS, None
    return UNKNOWN, None


# A sign constraint is added when the LP's maximiser violates it by more than this.
_VIOLATION = 1e-9


def _solve_lazily(row_coef, row_offset, sign_coef, sign_offset, lower, upper):
    """max t s.t. row_i(x) ≥ t, σ_j z_j(x) ≥ t (j lazily), x in [lower, upper], by HiGHS.

    Returns (the maximiser x of the leaf's LP, or None when a relaxation with fewer sign
    constraints already has a negative optimum (its maximiser may lie outside the leaf); the
    rows' multipliers λ ≥ 0; the sign constraints' multipliers ν ≥ 0, zero for those never
    added), or None when the solver fails. The multipliers are the solver's;
    :func:`_certified_negative` checks what they prove.
    """
    import highspy

    n, m = len(lower), len(row_offset)
    # A constraint whose side is ≥ 0 everywhere in the box never binds while t < 0, and once the
    # optimum is ≥ 0 the maximiser satisfies it anyway: it changes no verdict.
    box_min = sign_offset + np.minimum(sign_coef * lower, sign_coef * upper).sum(1)
    candidates = np.flatnonzero(box_min < 0)
    highs = silent_highs()
    highs.addVars(n + 1, np.concatenate([lower, [-highspy.kHighsInf]]), np.concatenate([upper, [highspy.kHighsInf]]))
    highs.changeColsCost(1, np.array([n], dtype=np.int32), np.array([-1.0]))  # minimise −t

    def add(coef, offset):  # t − coef · x ≤ offset
        count = coef.shape[0]
        values = np.hstack([-coef, np.ones((count, 1))]).reshape(-1)
        columns = np.tile(np.arange(n + 1, dtype=np.int32), count)
        starts = np.arange(count, dtype=np.int32) * (n + 1)
        highs.addRows(count, np.full(count, -highspy.kHighsInf), offset.astype(np.float64), len(values), starts,
                      columns, values)

    add(row_coef, row_offset)
    added = np.zeros(0, dtype=np.int64)
    while True:
        highs.run()
        if highs.getModelStatus() != highspy.HighsModelStatus.kOptimal:
            return None
        solution = highs.getSolution()
        z = np.asarray(solution.col_value)
        x, t = z[:n], z[n]
        if t < 0:  # a relaxation of the leaf's LP already refutes it
            x = None
            break
        pending = np.setdiff1d(candidates, added, assume_unique=True)
        slack = sign_coef[pending] @ x + sign_offset[pending] - t
        violated = pending[slack < -_VIOLATION]
        if violated.size == 0:
            break
        add(sign_coef[violated], sign_offset[violated])
        added = np.concatenate([added, violated])
    duals = np.clip(-np.asarray(solution.row_dual), 0.0, None)  # ≥ 0 up to the solver's tolerance
    sign_duals = np.zeros(len(sign_offset))
    sign_duals[added] = duals[m:]
    return x, duals[:m], sign_duals


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
