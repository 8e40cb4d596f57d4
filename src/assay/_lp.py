"""The LP solvers, loaded on first use, and silent.

Importing :mod:`scipy.optimize` takes ~0.7 s; a verification that needs no LP, and whose
timeout counts loading, should not pay it. HiGHS prints a banner on standard output when the
first solver of a process is built (before any option can be set): :func:`silent_highs` builds
solvers without it, so that ``--json`` output and scripts reading stdout see only assay's output.
"""

from __future__ import annotations

import os
import sys
import threading
from contextlib import contextmanager

# The threads of every HiGHS solver of the process (see silent_highs).
SOLVER_THREADS = 1

_banner_lock = threading.Lock()
_banner_shown = False


def linprog(*args, **kwargs):
    """:func:`scipy.optimize.linprog` (HiGHS), imported on the first call."""
    from scipy.optimize import linprog as solve

    return solve(*args, **kwargs)


@contextmanager
def stdout_muted():
    """File descriptor 1 pointed at the null device for the block: HiGHS prints its banner and
    some notices (e.g. ``HighsMipSolverData::transformNewIntegerFeasibleSolution``) straight to
    the C-level stdout, whatever its options, which would corrupt ``--json`` output. Python's
    buffered output is flushed first, so none of it is lost or reordered."""
    try:
        sys.stdout.flush()
        saved = os.dup(1)
    except (OSError, ValueError, AttributeError):  # no file descriptor 1 (an embedding host)
        yield
        return
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, 1)
        yield
    finally:
        os.dup2(saved, 1)
        os.close(saved)
        os.close(devnull)


def silent_highs():
    """A new ``highspy.Highs`` with ``output_flag`` off and one thread; nothing reaches stdout.

    The first construction in a process prints HiGHS's banner from C++, so it runs inside
    :func:`stdout_muted`. HiGHS sizes one scheduler per process by the first solver that runs,
    and a later solver asking for another number of threads does not run at all (status error,
    no point): every solver assay builds asks for :data:`SOLVER_THREADS` (its LPs are small, and
    batch workers run one thread each), so a verification followed by a counterfactual MILP in
    one process works.
    """
    global _banner_shown
    import highspy

    with _banner_lock:
        if _banner_shown:
            highs = highspy.Highs()
        else:
            with stdout_muted():
                highs = highspy.Highs()
            _banner_shown = True
    highs.setOptionValue("output_flag", False)
    highs.setOptionValue("threads", SOLVER_THREADS)
    return highs
