"""The online-verification section of ``assay demo``: a growing L∞ ball, verified with and without reuse.

The ball around one test image of the demo's digits classifier grows a little every step; each
step is verified once reusing the last step's leaves (every acceleration of
:class:`~assay.verify.online.OnlineVerifier`) and once from scratch. Both runs are sound and
complete here, so their verdicts must agree; only the work differs.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

__all__ = ["demo_section"]

# The ball around the 7th correctly classified test image needs a few to a few hundred leaves of
# input splitting for ε from 0.060 to 0.062 (CROWN alone proves ε ≤ 0.05), so reuse pays, and
# each run takes a second or less on one core.
_IMAGE = 6
_EPSILON = 0.06
_GROWTH = 0.0004
_TIMEOUT = 60.0


def demo_section(steps: int = 5, hidden_layers: Sequence[int] = (32, 32),
                 progress: Callable[[str], None] | None = None) -> dict:
    """Grow the ball for ``steps`` steps; return the per-step verdicts, leaves and seconds (JSON-able)."""
    import torch

    from assay.demo import _train
    from assay.sets import Box, argmax_is
    from assay.threads import torch_threads
    from assay.verify.online import OnlineVerifier

    report = progress or (lambda stage: None)
    report("online verification: training the demo network")
    # The same layers and seed train the same network as the verify section (~1 s).
    network, x_test, y_test, _, _ = _train(tuple(hidden_layers), 0)
    with torch.no_grad():
        correct = torch.nonzero(network.forward(x_test).argmax(1) == y_test).flatten()
    index = int(correct[min(_IMAGE, len(correct) - 1)])
    image, label = x_test[index], int(y_test[index])
    spec = argmax_is(label, network.output_size)
    radii = [_EPSILON + step * _GROWTH for step in range(steps + 1)]

    def ball(epsilon):
        return Box((image - epsilon).clamp(0, 1), (image + epsilon).clamp(0, 1))

    # small tensors: threads only add noise to the timings on a shared machine
    with torch_threads(1):
        # The first α-CROWN call pays torch's one-off start-up costs: keep them out of the comparison.
        OnlineVerifier(network, ball(radii[0]), spec, accelerations="none", timeout=_TIMEOUT)
        runs = {}
        for name, accelerations in (("online", "all"), ("scratch", "none")):
            report(f"online verification: {steps} steps, accelerations {accelerations}")
            verifier = OnlineVerifier(network, ball(radii[0]), spec, accelerations=accelerations, timeout=_TIMEOUT)
            for epsilon in radii[1:]:
                verifier.update(ball(epsilon))
            runs[name] = verifier.steps
    online_seconds = sum(step.seconds for step in runs["online"][1:])
    scratch_seconds = sum(step.seconds for step in runs["scratch"][1:])
    return {
        "image": index, "label": label, "epsilon": _EPSILON, "growth": _GROWTH,
        "steps": [{"step": t, "epsilon": radii[t], "online": runs["online"][t].to_json(),
                   "scratch": runs["scratch"][t].to_json()} for t in range(steps + 1)],
        "online_update_seconds": online_seconds, "scratch_update_seconds": scratch_seconds,
        "speedup": scratch_seconds / online_seconds if online_seconds > 0 else None,
    }
