"""``assay demo``: certify a digits classifier trained on the spot (see :mod:`assay.demo`).

A second section shows online verification (:mod:`assay.verify.online`) on the same network: the
L∞ ball around one test image grows a little every step, and each step is verified once reusing
the last step's leaves (every acceleration) and once from scratch.
"""

from __future__ import annotations

import json
import math

import typer

from assay.cli._common import console, show_progress
from assay.errors import OptionError

__all__ = ["demo"]

_METHOD_NAMES = {"ibp": "IBP", "crown": "CROWN", "alpha": "α-CROWN", "beta": "β-CROWN", "pgd": "PGD attack"}

# Online verification section: the ball around the 7th correctly classified test image needs a few
# to a few hundred leaves of input splitting for ε from 0.060 to 0.062 (CROWN alone proves ε ≤ 0.05),
# so reuse pays, and each run takes a second or less on one core.
_ONLINE_IMAGE = 6
_ONLINE_EPSILON = 0.06
_ONLINE_GROWTH = 0.0004
_ONLINE_TIMEOUT = 60.0


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
    online_steps: int = typer.Option(5, "--online-steps", help="Steps of the online-verification section "
                                     "(a growing L∞ ball re-verified with and without reuse); 0 skips it."),
    json_output: bool = typer.Option(False, "--json", help="Print the full result as JSON."),
) -> None:
    """Train a small ReLU MLP on scikit-learn's digits, certify its L∞ robustness, then verify a growing ball online (needs no files)."""  # noqa: E501
    from assay.demo import run_demo

    options = dict(epsilons=_floats(epsilons, "--epsilons"), images=images,
                   methods=tuple(m.strip() for m in methods.split(",") if m.strip()))
    if online_steps < 0:
        raise OptionError(f"--online-steps must be ≥ 0 (0 skips the section); got {online_steps}")
    online = None
    if show_progress(json_output):
        from rich.console import Console

        with Console(stderr=True).status("starting") as status:
            result = run_demo(**options, progress=lambda stage: status.update(stage))
            if online_steps:
                online = _online_demo(online_steps, result.hidden_layers, progress=lambda stage: status.update(stage))
    else:
        result = run_demo(**options)
        if online_steps:
            online = _online_demo(online_steps, result.hidden_layers)
    if json_output:
        payload = result.to_json()
        if online is not None:
            payload["online"] = online
        typer.echo(json.dumps(payload, indent=2))
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
    if online is not None:
        _print_online(out, online)


# ------------------------------------------------------------------------------- online verification
def _online_demo(steps: int, hidden_layers, progress=None) -> dict:
    """Grow the L∞ ball around one test image for ``steps`` steps; verify each step with every
    acceleration of :class:`~assay.verify.online.OnlineVerifier` and from scratch."""
    import torch

    from assay.demo import _train
    from assay.sets import Box, argmax_is
    from assay.verify.online import OnlineVerifier

    report = progress or (lambda stage: None)
    report("online verification: training the same network again")
    # run_demo keeps no network; the same layers and seed train the same one again (~1 s).
    network, x_test, y_test, _, _ = _train(tuple(hidden_layers), 0)
    with torch.no_grad():
        correct = torch.nonzero(network.forward(x_test).argmax(1) == y_test).flatten()
    index = int(correct[min(_ONLINE_IMAGE, len(correct) - 1)])
    image, label = x_test[index], int(y_test[index])
    spec = argmax_is(label, network.output_size)
    radii = [_ONLINE_EPSILON + step * _ONLINE_GROWTH for step in range(steps + 1)]

    def ball(epsilon):
        return Box((image - epsilon).clamp(0, 1), (image + epsilon).clamp(0, 1))

    previous_threads = torch.get_num_threads()
    torch.set_num_threads(1)  # small tensors: threads only add noise to the timings on a shared machine
    try:
        # The first α-CROWN call pays torch's one-off start-up costs: keep them out of the comparison.
        OnlineVerifier(network, ball(radii[0]), spec, accelerations="none", timeout=_ONLINE_TIMEOUT)
        runs = {}
        for name, accelerations in (("online", "all"), ("scratch", "none")):
            report(f"online verification: {steps} steps, accelerations {accelerations}")
            verifier = OnlineVerifier(network, ball(radii[0]), spec, accelerations=accelerations,
                                      timeout=_ONLINE_TIMEOUT)
            for epsilon in radii[1:]:
                verifier.update(ball(epsilon))
            runs[name] = verifier.steps
    finally:
        torch.set_num_threads(previous_threads)
    online_seconds = sum(step.seconds for step in runs["online"][1:])
    scratch_seconds = sum(step.seconds for step in runs["scratch"][1:])
    return {
        "image": index, "label": label, "epsilon": _ONLINE_EPSILON, "growth": _ONLINE_GROWTH,
        "steps": [{"step": t, "epsilon": radii[t], "online": runs["online"][t].to_json(),
                   "scratch": runs["scratch"][t].to_json()} for t in range(steps + 1)],
        "online_update_seconds": online_seconds, "scratch_update_seconds": scratch_seconds,
        "speedup": scratch_seconds / online_seconds if online_seconds > 0 else None,
    }


def _print_online(out, online: dict) -> None:
    from rich import box
    from rich.table import Table

    out.print()
    out.print(f"Online verification (Wei & Liu): the L∞ ball around test image {online['image']} (a {online['label']}) "
              f"grows from ε = {online['epsilon']:g} by {online['growth']:g} per step. Each step is verified reusing "
              "the last step's leaves (all accelerations) and from scratch:")
    table = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False)
    for column, justify in (("step", "right"), ("ε", "right"), ("status", "left"), ("coverage", "right"),
                            ("leaves", "right"), ("reused", "right"), ("seconds", "right"), ("from scratch", "right")):
        table.add_column(column, justify=justify, no_wrap=True)
    for row in online["steps"]:
        reuse, scratch = row["online"], row["scratch"]
        status = reuse["status"] + ("" if scratch["status"] == reuse["status"] else f" ({scratch['status']})")
        table.add_row(str(row["step"]), f"{row['epsilon']:.4f}", status, f"{math.floor(reuse['coverage'] * 100)}%",
                      str(reuse["leaves"]), str(reuse["reused"] + sum(reuse["skipped"].values())),
                      f"{reuse['seconds']:.3f}", f"{scratch['seconds']:.3f}")
    out.print(table)
    speedup = online["speedup"]
    out.print(f"updates 1–{len(online['steps']) - 1}: {online['online_update_seconds']:.2f} s reusing leaves vs "
              f"{online['scratch_update_seconds']:.2f} s from scratch"
              + ("." if speedup is None else f" ({speedup:.1f}× faster)." if speedup >= 1 else
                 f" ({1 / speedup:.1f}× slower: too little to reuse at these sizes).")
              + " reused: leaves (here the split histories of ReLU-splitting searches: the network has 64 inputs) "
              "whose verdict carried over because the new ball lies in a box they were verified on, instead of being "
              "bounded again. `assay verify-online` does this for any model and sequence of boxes.")
