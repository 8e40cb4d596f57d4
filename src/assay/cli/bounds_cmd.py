"""``assay bounds MODEL PROPERTY.vnnlib``: sound output bounds over each input region of a property.

For every query of the VNN-LIB file (an input box and an unsafe output region), prints the bounds
of every output over the box and says whether these bounds alone already exclude the unsafe region
(then the property holds for that query; otherwise the bounds are inconclusive, and
``assay verify`` decides it by branch and bound).
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import typer

from assay.cli._common import console, load_network, read_property, unsafe_rows

__all__ = ["bounds", "bound_property"]

_METHODS = ("ibp", "crown", "alpha", "beta")


def bound_property(network, prop, method: str = "crown", dtype: str = "float64") -> dict:
    """Output bounds and the unsafe-region check for every query of ``prop`` (the JSON of the command)."""
    from assay.bounds import compute_bounds

    queries = []
    started = time.perf_counter()
    for index, query in enumerate(prop.queries):
        tic = time.perf_counter()
        outputs = compute_bounds(network, query.input_set, None, method, dtype=dtype)
        C, d, groups = unsafe_rows(query.unsafe_outputs)
        rows = compute_bounds(network, query.input_set, (C, d), method, dtype=dtype, sides="upper")
        row_upper = rows.upper[0]
        # The unsafe region is a union of conjunctions C_g y + d_g ≥ 0: a conjunction is unreachable
        # when one of its rows is provably negative; the region when every conjunction is.
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


def bounds(
    model: Path = typer.Argument(..., help="Model file: .onnx or .nnet (optionally .gz)."),
    property_file: Path = typer.Argument(..., metavar="PROPERTY", help="VNN-LIB property (.vnnlib, optionally .gz)."),
    method: str = typer.Option("crown", "--method", "-m", help="Bound method: ibp, crown, alpha (α-CROWN) or beta (β-CROWN)."),
    dtype: str = typer.Option("float64", "--dtype", help="float64 (recommended for verdicts) or float32 (faster, "
                              "wider margins for rounding)."),
    json_output: bool = typer.Option(False, "--json", help="Print lower/upper bounds and timings as JSON."),
) -> None:
    """Sound bounds of every output over each input region of a VNN-LIB property."""
    from assay._validate import check_choice

    check_choice(method, "--method", "assay bounds", _METHODS)
    check_choice(dtype, "--dtype", "assay bounds", ("float64", "float32"))
    network = load_network(model)
    prop = read_property(property_file, network)
    result = bound_property(network, prop, method, dtype)
    if json_output:
        typer.echo(json.dumps(result, indent=2))
        return
    from rich.table import Table

    out = console()
    out.print(f"{Path(model).name} · {Path(property_file).name} · {method} bounds in {dtype} · {result['seconds']:.3f} s")
    names = _output_names(network)
    for query in result["queries"]:
        table = Table(title=f"query {query['query']}" if len(result["queries"]) > 1 else None, show_edge=False)
        table.add_column("output")
        table.add_column("lower", justify="right")
        table.add_column("upper", justify="right")
        for name, low, high in zip(names, query["lower"], query["upper"]):
            table.add_row(name, f"{low:.6g}", f"{high:.6g}")
        out.print(table)
        if query["unsafe_unreachable"]:
            out.print("unsafe region unreachable (property holds for this query)")
        else:
            out.print(f"unsafe region not excluded by {method} bounds (inconclusive: run `assay verify`)")
    if len(result["queries"]) > 1:
        verdict = "the bounds prove the property" if result["holds"] else "the bounds do not prove the property"
        out.print(f"{verdict} ({sum(q['unsafe_unreachable'] for q in result['queries'])} of "
                  f"{len(result['queries'])} queries excluded)")


def _output_names(network) -> list[str]:
    return [f"Y_{i}" for i in range(network.output_size)]
