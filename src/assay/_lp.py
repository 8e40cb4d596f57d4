"""The LP solver, loaded on first use.

Importing :mod:`scipy.optimize` takes ~0.7 s; a verification that needs no LP, and whose
timeout counts loading, should not pay it.
"""

from __future__ import annotations


def linprog(*args, **kwargs):
    """:func:`scipy.optimize.linprog` (HiGHS), imported on the first call."""
    from scipy.optimize import linprog as solve

    return solve(*args, **kwargs)
