"""A counterexample re-checked by onnxruntime on the ONNX file the network was loaded from.

assay confirms every counterexample with its own float64 forward pass; that shows the point
violates the property *for assay's reading of the model*. When the network came from an ONNX
file, the point is run once more through onnxruntime on the original file (not the folded graph
assay computes with), and judged the way the VNN-COMP 2023–2024 scoring judges a counterexample
(``SCORING/settings.py``): onnxruntime's output must match the reported output within a relative
L∞ error of :data:`RELATIVE_TOLERANCE` (``COUNTEREXAMPLE_RTOL``), and it must itself meet the
unsafe condition within :data:`ABSOLUTE_TOLERANCE` (``COUNTEREXAMPLE_ATOL``). Otherwise the
verdict is not VIOLATED: a loader or operator mismatch shows up as UNKNOWN with the reason,
never as a wrong answer.
"""

from __future__ import annotations

import numpy as np
import torch

from assay.errors import ModelLoadError
from assay.nn.network import Network
from assay.verify.problem import UnsafeQuery
from assay.verify.result import Counterexample

__all__ = ["confirmed_counterexample", "onnxruntime_objection", "RELATIVE_TOLERANCE", "ABSOLUTE_TOLERANCE"]

RELATIVE_TOLERANCE = 1e-3  # ‖onnxruntime − reported output‖∞ / ‖reported output‖∞ (COUNTEREXAMPLE_RTOL)
ABSOLUTE_TOLERANCE = 1e-4  # slack on each unsafe constraint C·y + d ≥ 0 (COUNTEREXAMPLE_ATOL)


def onnxruntime_objection(network: Network, query: UnsafeQuery, x: torch.Tensor, y: torch.Tensor) -> str | None:
    """Why onnxruntime on ``network.onnx_file`` rejects the counterexample ``x`` (reported output
    ``y``, from assay's forward pass) of ``query``; None when it accepts it or there is no file.

    Accepted when onnxruntime's output y' of x (fed in the graph's input dtype) meets the unsafe
    condition: for some conjunction of the query, every row has ``C·y' + d ≥ −ABSOLUTE_TOLERANCE``;
    and matches y: ``‖y' − y‖∞ ≤ RELATIVE_TOLERANCE · ‖y‖∞`` (no relative test when
    ‖y‖∞ < 1e-6, as the scoring). The objection names the first test that fails.
    A network without an ONNX file (``network.onnx_file`` None: built in memory, loaded from
    another format, or rebuilt from a loaded one) is not re-checked: None. A file onnxruntime
    cannot run is an objection (its message), not an exception.
    """
    if network.onnx_file is None:
        return None
    from assay.nn.reference import file_outputs

    point = x.detach().to("cpu", torch.float64).reshape(1, -1).numpy()
    reported = y.detach().to("cpu", torch.float64).reshape(-1).numpy()
    try:
        theirs = file_outputs(network.onnx_file, point, network.input_shape).reshape(-1).astype(np.float64)
    except ModelLoadError as exc:
        return f"onnxruntime could not re-check the counterexample: {exc}"
    if theirs.shape != reported.shape:
        return (f"onnxruntime gives {theirs.size} outputs on {network.onnx_file}, assay's forward pass "
                f"{reported.size}: the counterexample is not confirmed")
    values = query.C.to(torch.float64).numpy() @ theirs + query.d.to(torch.float64).numpy()
    groups = query.groups.numpy()
    if not any(bool((values[groups == g] >= -ABSOLUTE_TOLERANCE).all()) for g in range(query.num_groups)):
        worst = max(float(values[groups == g].min()) for g in range(query.num_groups))
        return (f"onnxruntime's output on the counterexample does not violate the property on {network.onnx_file} "
                f"(its largest unsafe margin is {worst:.3g} < −{ABSOLUTE_TOLERANCE:g}), though assay's forward pass "
                "does: the counterexample is not confirmed")
    difference = float(np.abs(theirs - reported).max(initial=0.0))
    scale = float(np.abs(reported).max(initial=0.0))
    relative = difference / scale if scale >= 1e-6 else 0.0
    if relative > RELATIVE_TOLERANCE:
        return (f"onnxruntime's output on the counterexample differs from assay's forward pass by {difference:.3g} "
                f"(relative {relative:.3g} > {RELATIVE_TOLERANCE:g}) on {network.onnx_file}: the loaded network "
                "does not compute what the file computes there, so the counterexample is not confirmed")
    return None


def confirmed_counterexample(network: Network, query: UnsafeQuery,
                             found: tuple[torch.Tensor, torch.Tensor]) -> tuple[Counterexample | None, str | None]:
    """What a verifier reports for ``found`` = (x, y), a point of ``query`` that assay's float64
    forward pass confirmed: ``(Counterexample, None)`` when :func:`onnxruntime_objection` has
    none (the verdict is VIOLATED), else ``(None, the objection)`` (the verdict must not be
    VIOLATED: UNKNOWN with that reason). Every place that reports VIOLATED goes through here."""
    x, y = found
    reason = onnxruntime_objection(network, query, x, y)
    if reason is not None:
        return None, reason
    return Counterexample(x.reshape(network.input_shape), y, query.index), None
