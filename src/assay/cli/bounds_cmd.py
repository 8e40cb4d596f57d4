"""``assay bounds MODEL PROPERTY.vnnlib``: sound output bounds over each input region of a property.

For every query of the VNN-LIB file (an input box and an unsafe output region), prints the bounds
of every output over the box and says whether these bounds alone already exclude the unsafe region
(then the property holds for that query; otherwise the bounds are inconclusive, and
``assay verify`` decides it by branch and bound).
"""

from __future__ import annotations

import json
from pathlib import Path

import typer

from assay.bounds.methods import METHODS, method_names
from assay.cli._common import console, load_network, read_property

__all__ = ["bounds"]

_METHODS = method_names()


def bounds(
    model: Path = typer.Argument(..., help="Model file: .onnx or .nnet (optionally .gz)."),
    property_file: Path = typer.Argument(..., metavar="PROPERTY", help="VNN-LIB property (.vnnlib, optionally .gz)."),
    method: str = typer.Option("crown", "--method", "-m", help="Bound method: " + "; ".join(f"{m.name} ({m.summary})" for m in METHODS.values()) + "."),
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
    from assay.property_bounds import bound_property

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
