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

_banner_lock = threading.Lock()
_banner_shown = False


def linprog(*args, **kwargs):
    """:func:`scipy.optimize.linprog` (HiGHS), imported on the first call."""
    from scipy.optimize import linprog as solve

    return solve(*args, **kwargs)


def silent_highs():
    """A new ``highspy.Highs`` with ``output_flag`` off; nothing reaches stdout or stderr.

    The first construction in a process prints HiGHS's banner from C++, so it runs with file
    descriptor 1 pointed at the null device (Python's buffered output is flushed first, so none
    of it is lost or reordered).
    """
    global _banner_shown
    import highspy

    with _banner_lock:
        if _banner_shown:
            highs = highspy.Highs()
        else:
            sys.stdout.flush()
            saved = os.dup(1)
            try:
                with open(os.devnull, "w") as null:
                    os.dup2(null.fileno(), 1)
                    highs = highspy.Highs()
            finally:
                os.dup2(saved, 1)
                os.close(saved)
            _banner_shown = True
    highs.setOptionValue("output_flag", False)
    return highs
