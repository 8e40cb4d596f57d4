"""``assay warmup``: load the monitor's and the KNN certifier's compiled kernels, compiling them once if
numba's cache lacks them.

``make demo`` and ``make test`` run it after installing, so that no later command compiles. It
prints how long it took, whether it compiled, and where numba keeps the machine code
(``NUMBA_CACHE_DIR`` moves it; the default is ``__pycache__`` beside the sources, or the user's
cache folder when those are read-only).
"""

from __future__ import annotations

import typer

__all__ = ["warmup"]


def warmup() -> None:
    """Compile the monitor's and the KNN certifier's kernels now (once; later runs load them in about a second)."""
    import time

    from assay.fairness._knn_certify import warm_up as warm_up_knn
    from assay.monitor.warmup import cache_location, kernels_cached, warm_up

    compiled = kernels_cached("grid") is False or kernels_cached("kdtree") is False
    seconds = warm_up("linf", "grid") + warm_up("cosine", "kdtree")
    where = cache_location()
    typer.echo(f"monitor kernels {'compiled' if compiled else 'loaded'} in {seconds:.1f} s"
               + (f"; cache: {where}" if where else " (numba is not installed: the kernels run as plain Python)"))
    # `assay knn-fairness` (and the demo's KNN section) run kernels of their own: 20–40 s to
    # compile on a fresh machine, which the first certification would otherwise pay
    started = time.perf_counter()
    warm_up_knn()
    typer.echo(f"KNN-fairness kernels ready in {time.perf_counter() - started:.1f} s")
