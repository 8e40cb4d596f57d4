"""``assay info MODEL``: what assay sees in a model file (layers, shapes, parameters, names)."""

from __future__ import annotations

import json
from pathlib import Path

import typer

from assay.cli._common import console, load_network, parse_shape

__all__ = ["info", "describe"]


def describe(network, model_path=None) -> dict:
    """The JSON form of ``assay info``: names, shapes, one row per layer, totals; for an ONNX
    file also its operators (``{op_type: count}``) and the network's layer kinds that the bound
    engine has no rule for yet."""
    from assay.bounds.plan import has_bound_rule

    operators = None
    if model_path is not None and ".onnx" in Path(model_path).name.lower():
        from assay.nn._onnx import operator_counts

        operators = operator_counts(model_path)
    return {
        "onnx_operators": operators,
        "layers_without_bound_rules": sorted({type(layer).__name__ for layer in network.layers
                                              if not has_bound_rule(layer)}),
        "source": str(network.source),
        "input": {"name": network.input_name, "shape": list(network.input_shape)},
        "output": {"name": network.output_name, "shape": list(network.output_shape)},
        "layers": network.summary(),
        "parameters": network.num_parameters,
        "relu_neurons": network.num_relus,
        # MaxPool kept whole, for bound propagation (the layers above lower it to ReLUs)
        "pooled_layers": None if network.pooled is None else network.pooled.summary(),
    }


def _shape(shape) -> str:
    return "(" + ", ".join(str(d) for d in shape) + ("," if len(shape) == 1 else "") + ")"


def info(
    model: Path = typer.Argument(..., help="Model file: .onnx or .nnet (optionally .gz)."),
    input_shape: str = typer.Option(None, "--input-shape", help="Shape of one input without the batch "
                                    "dimension, e.g. 1,28,28 (fills in dimensions the file leaves open)."),
    json_output: bool = typer.Option(False, "--json", help="Print everything as JSON."),
) -> None:
    """Show the layers, shapes, parameter count and input/output names of a model."""
    network = load_network(model, parse_shape(input_shape))
    facts = describe(network, model)
    if json_output:
        typer.echo(json.dumps(facts, indent=2))
        return
    from rich.table import Table

    out = console()
    out.print(f"model   {facts['source']}")
    out.print(f"input   {facts['input']['name']}  shape {_shape(network.input_shape)}")
    out.print(f"output  {facts['output']['name']}  shape {_shape(network.output_shape)}")
    table = Table(show_edge=False)
    table.add_column("#", justify="right")
    table.add_column("layer")
    if not network.is_chain:  # a graph: say which tensors (0 = input, i + 1 = layer i's output) each layer reads
        table.add_column("reads")
    table.add_column("input shape")
    table.add_column("output shape")
    table.add_column("parameters", justify="right")
    for row in facts["layers"]:
        reads = [] if network.is_chain else [", ".join(map(str, row["reads"]))]
        table.add_row(str(row["index"]), row["layer"], *reads, _shape(row["input_shape"]), _shape(row["output_shape"]),
                      f"{row['parameters']:,}")
    out.print(table)
    out.print(f"{len(facts['layers'])} layers, {facts['parameters']:,} parameters, {facts['relu_neurons']:,} ReLU neurons")
    if facts["onnx_operators"]:
        out.print("ONNX operators  " + ", ".join(f"{op} ×{count}" for op, count in facts["onnx_operators"].items()))
    missing = facts["layers_without_bound_rules"]
    out.print("bound rules     " + (f"none yet for {', '.join(missing)} (assay bounds/verify refuse this network)"
                                    if missing else "every layer has one"))
    if network.pooled is not None:
        kept = " → ".join(row["layer"] for row in facts["pooled_layers"])
        out.print(f"MaxPool is lowered to ReLUs above (exact); bounds also use it whole: {kept} "
                  f"({network.pooled.num_relus:,} ReLU neurons)")
