"""A sound upper bound of a linear program's maximum from any dual multipliers (weak duality).

For ``max w·v`` subject to ``A_ub v ≤ b_ub``, ``A_eq v = b_eq`` and ``lower ≤ v ≤ upper``, every
λ ≥ 0 and μ give

    w·v  ≤  λ·b_ub + μ·b_eq + Σ_i max(g_i·lower_i, g_i·upper_i),   g = w − A_ubᵀλ − A_eqᵀμ,

for every feasible v: the solver's multipliers only make the bound tight, never valid. The
float64 evaluation is widened by the rounding of each of its sums (Higham §3.1), so the value
returned bounds the exact one (the data are taken as exact).
"""

from __future__ import annotations

import numpy as np
import torch

from assay.bounds.plan import gamma

__all__ = ["dual_upper_bound", "ideal_cut_constants", "folded_row"]


def dual_upper_bound(w, A_ub, b_ub, A_eq, b_eq, lower, upper, lam, mu) -> float:
    """The weak-duality bound above, evaluated outward; +inf where an unbounded variable keeps a
    nonzero reduced coefficient in the increasing direction.

    Args:
        w: (n,) objective to maximise; A_ub (m, n) and A_eq (k, n) scipy sparse matrices (or None);
        b_ub (m,), b_eq (k,); lower, upper (n,) variable bounds (±inf allowed);
        lam (m,) multipliers of the inequalities (negative entries are clipped to 0), mu (k,).
    """
    w = np.asarray(w, dtype=np.float64)
    g = w.copy()
    magnitude = np.abs(w)
    value_terms, value_magnitude = [], 0.0
    terms = 1
    for A, b, y in ((A_ub, b_ub, None if lam is None else np.clip(lam, 0.0, None)), (A_eq, b_eq, mu)):
        if A is None or y is None or A.shape[0] == 0:
            continue
        y = np.asarray(y, dtype=np.float64)
        g -= A.T @ y
        magnitude += abs(A).T @ np.abs(y)
        value_terms.append(float(y @ b))
        value_magnitude += float(np.abs(y) @ np.abs(b))
        terms = max(terms, A.shape[0], int(np.diff(A.tocsc().indptr).max(initial=0)) + 1)
    # |computed g − exact g| ≤ γ·(|w| + |A|ᵀ|y|) elementwise: charge it at the variables' extremes.
    g_error = gamma(terms + 2, torch.float64) * magnitude
    lower, upper = np.asarray(lower, dtype=np.float64), np.asarray(upper, dtype=np.float64)
    with np.errstate(invalid="ignore"):  # 0·inf: a zero coefficient on an unbounded variable adds 0
        at_lower = np.where(g == 0, 0.0, g * lower)
        at_upper = np.where(g == 0, 0.0, g * upper)
    box_terms = np.maximum(at_lower, at_upper)
    extent = np.maximum(np.abs(lower), np.abs(upper))
    with np.errstate(invalid="ignore"):
        widening = np.where(g_error == 0, 0.0, g_error * extent)
    if not (np.isfinite(box_terms).all() and np.isfinite(widening).all()):
        return float("inf")
    total = sum(value_terms) + float(box_terms.sum()) + float(widening.sum())
    # the final sums' own rounding
    margin = gamma(max(len(box_terms), terms) + len(value_terms) + 4, torch.float64) * (
        value_magnitude + float(np.abs(box_terms).sum()) + float(widening.sum()))
    return float(np.nextafter(total + margin, np.inf))


def ideal_cut_constants(weights, box_low, box_high, bias: float, chosen) -> tuple[float, float]:
    """K and R of Anderson et al.'s inequality ``r − Σ_{i∈I} w_i x_i − K δ ≤ R`` for the neuron
    r = relu(w·x + b) over a box, with I = ``chosen`` (a boolean mask of the inputs):

        K = Σ_{i∈I} w_i L̆_i + b + Σ_{i∉I} w_i Ŭ_i,    R = −Σ_{i∈I} w_i L̆_i,

    where L̆_i, Ŭ_i (``box_low``, ``box_high``) are the input bounds at which w_i x_i is least and
    greatest. Both are rounded up (δ ≥ 0: a larger K or R only weakens the inequality), so the
    inequality written with them holds for the exact neuron.
    """
    weights, chosen = np.asarray(weights, dtype=np.float64), np.asarray(chosen, dtype=bool)
    at_low = weights[chosen] * np.asarray(box_low, dtype=np.float64)[chosen]
    at_high = weights[~chosen] * np.asarray(box_high, dtype=np.float64)[~chosen]
    factor = gamma(len(weights) + 3, torch.float64)
    K = float(at_low.sum() + bias + at_high.sum()) + factor * float(np.abs(at_low).sum() + abs(bias)
                                                                    + np.abs(at_high).sum())
    R = float(-at_low.sum()) + factor * float(np.abs(at_low).sum())
    return K, R


def folded_row(row: np.ndarray, offset: float, M: np.ndarray, m: np.ndarray, M_error: np.ndarray | None = None,
               m_error: np.ndarray | None = None) -> tuple[np.ndarray, float, np.ndarray, float]:
    """A row ``row · (M r + m) + offset`` over an affine suffix, as ``c · r + constant`` in float64.

    Returns (c, constant, c_error, constant_error): the exact coefficients lie within
    ``c_error`` (elementwise) of ``c`` and the exact constant within ``constant_error`` of
    ``constant``, counting the float64 rounding of the products and, where given, the suffix's own
    error (``M_error``, ``m_error``: bounds of |M − exact M| and |m − exact m|). A caller that
    bounds ``c · r`` over ``0 ≤ r ≤ r_max`` adds ``c_error · r_max + constant_error``.
    """
    c = row @ M
    c_error = gamma(len(row) + 2, torch.float64) * (np.abs(row) @ np.abs(M))
    constant = float(row @ m) + offset
    constant_error = gamma(len(row) + 3, torch.float64) * (float(np.abs(row) @ np.abs(m)) + abs(offset))
    if M_error is not None:
        c_error = c_error + np.abs(row) @ M_error
    if m_error is not None:
        constant_error += float(np.abs(row) @ m_error)
    return c, constant, c_error, constant_error
