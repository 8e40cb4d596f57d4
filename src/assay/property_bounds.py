"""Sound output bounds over each query of a VNN-LIB property, and whether they alone prove it.

For every query of a :class:`~assay.sets.VnnlibProperty` (an input box and a FORBIDDEN output
region), :func:`bound_property` bounds every output over the box with one method of the shared
engine (:func:`assay.bounds.compute_bounds`) and bounds each half-space row ``C_i y + d_i`` of the
forbidden region from above. The region is a union of conjunctions; a conjunction is unreachable
when one of its rows is provably negative over the box, and the region when every conjunction is.
"Unreachable" is sound (the engine's bounds are outward-rounded); "not excluded" is inconclusive,
not a counterexample: branch and bound (:mod:`assay.verify`) decides those queries.
This is what ``assay bounds`` prints.
"""

from __future__ import annotations

import time

__all__ = ["bound_property"]


def bound_property(network, prop, method: str = "crown", dtype: str = "float64") -> dict:
    """Output bounds and the forbidden-region check for every query of ``prop``.

    Args:
        network: the :class:`~assay.nn.Network` the property is about.
        prop: a :class:`~assay.sets.VnnlibProperty` read for this network's input and output sizes.
        method: a bound method of :func:`assay.bounds.compute_bounds` (``"ibp"``, ``"crown"``,
            ``"alpha"``, ``"beta"``).
        dtype: ``"float64"`` (recommended for verdicts) or ``"float32"``.

    Returns:
        a JSON-ready dict: ``network``, ``property``, ``method``, ``dtype``, ``queries`` (one dict
        per query: ``query``, ``lower`` and ``upper`` (one float per output), ``unsafe_row_upper``
        (one float per row of the forbidden region), ``unsafe_unreachable`` (bool), ``seconds``),
        ``holds`` (every query unreachable: the bounds alone prove the property) and ``seconds``.
    """
    from assay.bounds import compute_bounds

    queries = []
    started = time.perf_counter()
    for index, query in enumerate(prop.queries):
        tic = time.perf_counter()
        outputs = compute_bounds(network, query.input_set, None, method, dtype=dtype)
        C, d, groups = query.unsafe_outputs.rows()
        rows = compute_bounds(network, query.input_set, (C, d), method, dtype=dtype, sides="upper")
        row_upper = rows.upper[0]
        unreachable = all(bool((row_upper[groups == g] < 0).any()) for g in range(int(groups.max()) + 1))
        queries.append({
            "query": index,
            "lower": outputs.lower[0].tolist(),
            "upper": outputs.upper[0].tolist(),
            "unsafe_row_upper": row_upper.tolist(),
            "unsafe_unreachable": unreachable,
            "seconds": time.perf_counter() - tic,
        })
    return {
        "network": str(network.source),
        "property": str(getattr(prop, "path", "")),
        "method": method,
        "dtype": dtype,
        "queries": queries,
        "holds": all(q["unsafe_unreachable"] for q in queries),
        "seconds": time.perf_counter() - started,
    }
