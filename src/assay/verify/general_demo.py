"""The general-networks section of ``assay demo``: bounds and verdicts on a network of sin, cos, tanh,
sigmoid and a product.

A small control policy is built on the spot (seeded weights): the state (angle, angular velocity)
enters through ``sin``/``cos`` features, then tanh and sigmoid layers whose halves multiply. Its
output is bounded over a box of states by IBP, CROWN and α-CROWN (each operator relaxed by its
own rule in :mod:`assay.bounds.rules`) beside the range seen on samples, and two properties just
above and just below the sampled maximum are verified: the first must hold, the second must be
violated with a re-checked counterexample (the demo raises otherwise: it doubles as a check).
"""

from __future__ import annotations

from collections.abc import Callable

__all__ = ["demo_section", "control_policy"]

# Properties this far above and below the sampled maximum of the output.
_MARGIN = 0.02


def control_policy():
    """The demo's network: (angle, angular velocity) → sin, cos → 8 → tanh → 8 → sigmoid → product of halves → 1."""
    import numpy as np
    import torch

    from assay.nn import Linear, Network, ops

    rng = np.random.default_rng(7)
    t = lambda *shape: torch.as_tensor(rng.normal(0, 0.8, size=shape))  # noqa: E731
    layers = (ops.Sin(), ops.Cos(), ops.Concat(0), Linear(t(8, 4), t(8)), ops.Tanh(), Linear(t(8, 8), t(8)),
              ops.Sigmoid(), ops.Slice((0,), (0,), (4,), (1,)), ops.Slice((0,), (4,), (8,), (1,)), ops.Binary("Mul"),
              Linear(t(1, 4), t(1)))
    sources = ((0,), (0,), (1, 2), (3,), (4,), (5,), (6,), (7,), (7,), (8, 9), (10,))
    return Network(layers, (2,), sources=sources, source="control policy (demo)")


def demo_section(progress: Callable[[str], None] | None = None) -> dict:
    """Bound and verify the demo's control policy; return the figures (JSON-able)."""
    import time

    import torch

    from assay.bounds import compute_bounds
    from assay.sets import Box
    from assay.sets.spec import HalfSpaces, OutputSpec
    from assay.verify import VerificationStatus, verify

    report = progress or (lambda stage: None)
    network = control_policy()
    lower = torch.tensor([-0.6, -0.4], dtype=torch.float64)
    upper = torch.tensor([0.6, 0.4], dtype=torch.float64)
    report("general networks: bounding a sin/cos/tanh/sigmoid/product policy")
    samples = lower + (upper - lower) * torch.rand(20_000, 2, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    outputs = network.forward(samples).reshape(-1)
    bounds = {}
    for method in ("ibp", "crown", "alpha"):
        started = time.perf_counter()
        result = compute_bounds(network, Box(lower, upper), method=method)
        bounds[method] = {"lower": float(result.lower[0, 0]), "upper": float(result.upper[0, 0]),
                          "seconds": time.perf_counter() - started}
        if bounds[method]["lower"] > float(outputs.min()) or bounds[method]["upper"] < float(outputs.max()):
            raise AssertionError(f"{method} bounds miss a sampled output: a soundness bug")
    peak = float(outputs.max())
    verdicts = []
    for threshold in (peak + _MARGIN, peak - _MARGIN):
        report(f"general networks: verifying y ≤ {threshold:.3f}")
        unsafe = OutputSpec((HalfSpaces(torch.tensor([[1.0]], dtype=torch.float64),
                                        torch.tensor([-threshold], dtype=torch.float64)),))
        result = verify(network, Box(lower, upper), unsafe=unsafe, timeout=30)
        example = None
        if result.status is VerificationStatus.VIOLATED:
            example = {"input": result.counterexample.input.reshape(-1).tolist(),
                       "output": float(result.counterexample.output.reshape(-1)[0])}
        verdicts.append({"threshold": threshold, "status": result.status.value, "domains": result.stats.domains,
                         "strategy": result.stats.strategy, "seconds": result.stats.seconds, "counterexample": example})
    if verdicts[0]["status"] == "violated" or verdicts[1]["status"] == "holds":
        raise AssertionError(f"verdicts contradict the sampled maximum {peak}: a soundness bug")
    operators = sorted({getattr(layer, "kind", type(layer).__name__) for layer in network.layers})
    return {"operators": operators, "box": {"lower": lower.tolist(), "upper": upper.tolist()},
            "sampled": {"min": float(outputs.min()), "max": peak, "count": outputs.numel()},
            "bounds": bounds, "verdicts": verdicts}
