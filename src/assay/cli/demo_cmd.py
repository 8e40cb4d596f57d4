"""``assay demo``: certify a digits classifier trained on the spot (see :mod:`assay.demo`)."""

from __future__ import annotations

import json

import typer

from assay.cli._common import console, show_progress
from assay.errors import OptionError

__all__ = ["demo"]

_METHOD_NAMES = {"ibp": "IBP", "crown": "CROWN", "alpha": "α-CROWN", "beta": "β-CROWN", "pgd": "PGD attack"}


def _floats(text: str, option: str) -> tuple[float, ...]:
    try:
        values = tuple(float(part) for part in text.split(",") if part.strip())
    except ValueError:
        values = ()
    if not values:
        raise OptionError(f"{option} takes comma-separated numbers, e.g. 0.01,0.05; got {text!r}")
    return values


def demo(
    epsilons: str = typer.Option("0.01,0.03,0.05,0.1", "--epsilons", help="L∞ radii on [0, 1] pixels, comma-separated."),
    images: int = typer.Option(100, "--images", help="Correctly classified test images to certify."),
    methods: str = typer.Option("ibp,crown,alpha", "--methods", help="Bound methods: ibp, crown, alpha, beta."),
    json_output: bool = typer.Option(False, "--json", help="Print the full result as JSON."),
) -> None:
    """Train a small ReLU MLP on scikit-learn's digits and certify its L∞ robustness (needs no files)."""
    from assay.demo import run_demo

    options = dict(epsilons=_floats(epsilons, "--epsilons"), images=images,
                   methods=tuple(m.strip() for m in methods.split(",") if m.strip()))
    if show_progress(json_output):
        from rich.console import Console

        with Console(stderr=True).status("starting") as status:
            result = run_demo(**options, progress=lambda stage: status.update(stage))
    else:
        result = run_demo(**options)
    if json_output:
        typer.echo(json.dumps(result.to_json(), indent=2))
        return
    from rich.table import Table

    out = console()
    widths = "×".join(str(w) for w in result.hidden_layers)
    out.print(f"A ReLU MLP (64 → {widths} → 10, {result.parameters:,} parameters) trained on scikit-learn's 8×8 digits "
              f"in {result.train_seconds:.1f} s; test accuracy {result.test_accuracy:.1%}.")
    out.print(f"L∞ robustness of the first {result.images} correctly classified test images (pixels in [0, 1]):")
    table = Table(show_edge=False)
    for column, justify in (("ε", "right"), ("method", "left"), ("certified", "right"), ("falsified", "right"),
                            ("seconds", "right")):
        table.add_column(column, justify=justify)
    previous = None
    for row in result.rows:
        if previous is not None and row.epsilon != previous:
            table.add_section()
        previous = row.epsilon
        table.add_row(
            f"{row.epsilon:g}",
            _METHOD_NAMES.get(row.method, row.method),
            "–" if row.certified is None else f"{row.certified / row.images:.0%}",
            "–" if row.falsified is None else f"{row.falsified / row.images:.0%}",
            f"{row.seconds:.2f}",
        )
    out.print(table)
    out.print("certified: sound bounds prove no input in the ball changes the prediction. falsified: a point of the "
              "ball, re-checked by a forward pass, changes it. The rest is undecided by these methods "
              "(`assay verify` decides single cases by branch and bound).")
    out.print(f"total {result.total_seconds:.1f} s")
