"""`approximate_preimage`: PREMAP's anytime under-/over-approximation of a network's preimage."""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Callable
from dataclasses import replace

import numpy as np
import torch

from assay._validate import check_choice, check_float, check_int
from assay.errors import OptionError, SpecError
from assay.preimage.refinement import PreimageRefinement
from assay.preimage.region import free_coordinates
from assay.preimage.result import Piece, PreimageResult
from assay.preimage.volume import Estimate, clopper_pearson, stratified_sum
from assay.sets import HalfSpaces, OutputSpec
from assay.verify.deadline import Deadline
from assay.verify.search import SearchState, SearchStats, branch_and_bound

__all__ = ["approximate_preimage"]

_KINDS = ("under", "over")
_DEFAULT_THRESHOLD = {"under": 0.9, "over": 1.1}


def approximate_preimage(
    network,
    input_set,
    spec,
    kind: str = "under",
    threshold: float | None = None,
    samples: int = 2000,
    time_limit: float = 600.0,
    *,
    method: str = "alpha",
    alpha_iterations: int = 5,
    batch_size: int = 8,
    confidence: float = 0.95,
    stop_on: str = "bound",
    max_pieces: int | None = None,
    branching: str = "auto",
    heuristic_weights: dict | str | None = None,
    pool: int | None = None,
    min_preimage_samples: int = 300,
    resample: bool = False,
    check_samples: int = 10_000,
    rng: np.random.Generator | int | None = None,
    progress: Callable[[dict], None] | None = None,
) -> PreimageResult:
    """Approximate ``{x ∈ input_set : network(x) ∈ spec}`` by a disjoint union of polytopes (PREMAP2).

    Args:
        network: an :class:`assay.nn.Network` (ReLU network).
        input_set: a :class:`~assay.sets.Box` or ``(lower, upper)`` of the network's input shape
            (or flat). Coordinates with lower = upper are fixed (an image patch region: see
            :func:`assay.sets.patch_region`, :func:`assay.sets.sunbeam_region`) and folded into
            the first layer; the approximation splits and samples the free ones only.
        spec: the output region: an :class:`~assay.sets.OutputSpec` with one conjunction (e.g.
            :func:`assay.sets.argmax_is`), a :class:`~assay.sets.HalfSpaces`, or ``(C, d)``
            meaning ``C y + d ≥ 0`` row by row.
        kind: ``"under"`` (every point of the result maps into ``spec``) or ``"over"`` (every
            point that maps into ``spec`` is in the result).
        threshold: the target ratio of approximation to preimage volume: at least this for
            ``under`` (default 0.9), at most this for ``over`` (default 1.1).
        samples: uniform samples per piece for the volume estimates (PREMAP's N).
        time_limit: seconds; the approximation reached so far is returned when they pass.
        method: ``"alpha"`` (α-CROWN maximising the sampled volume of each piece's polytope,
            as in PREMAP; default) or ``"crown"``.
        alpha_iterations: α-CROWN steps per batch of pieces.
        batch_size: pieces split per round (their children are bounded together).
        confidence: level of every volume interval.
        stop_on: ``"bound"`` (default): stop once the ratio's confidence bound passes the
            threshold (the lower bound for ``under``, the upper for ``over``); ``"estimate"``:
            once the estimated ratio does (PREMAP's rule).
        max_pieces: stop refining at this many pieces (None: no limit).
        branching: ``"input"`` (split the free input coordinates; pieces are boxes), ``"relu"``
            (split ReLUs' activation states; see :mod:`assay.preimage.relu_refinement`) or
            ``"auto"`` (default): input splitting for at most 8 free inputs, else ReLU splitting.
        heuristic_weights: ReLU splitting's neuron scores: a dict of weights by name (``extra``,
            ``area``, ``under``, ``gap``, ``stable``, ``sensitivity``, ``balance``; names left out keep
            PREMAP2's defaults, :data:`assay.preimage.relu_refinement.DEFAULT_HEURISTIC_WEIGHTS`:
            extra 1.0, area 0.75, under 0.5, gap 0.25, stable 1.0) or a preset's name
            (``"premap2"``, the default; ``"sensitivity"``, assay's earlier BaBSR-style scores).
        pool: ReLU splitting: uniform samples of the region shared by all pieces (default
            10 × ``samples``).
        min_preimage_samples: ReLU splitting: while the pool's guide half holds fewer preimage
            points than this, the pool grows by its first size (up to 16 times it and 2²⁴ stored
            numbers), so that a tiny preimage still has enough measuring points for the ratio's
            confidence bound to pass the threshold (33 of 33 covered only proves ≥ 0.894). 0: never.
        resample: ReLU splitting: PREMAP's adaptive resampling of guide points — a child with
            fewer than ``samples``/2 guide points gets fresh uniform points of its piece (rejection
            from the box, hit-and-run below 1 % acceptance; at most 5 × ``samples`` candidates per
            piece per split). They only steer α's objective, the split scores and the queue; the
            volumes and their intervals still come from the measuring half of the pool alone.
            Off by default: on digit patches (``benchmarks/premap_patches.py``) the same number of
            pieces reached the ratio in 1.25–2 times the time.
        check_samples: fresh uniform samples of the whole region that test the final result
            (a contained point outside the preimage, or a preimage point outside an
            over-approximation, raises) and give an independent estimate of the ratio with an
            exact (Clopper–Pearson) interval: ``result.check``. 0 skips it.
        rng: a ``numpy.random.Generator`` (or a seed) for every sample.
        progress: called after each round with ``{"ratio", "pieces", "seconds"}``.

    Returns:
        :class:`~assay.preimage.PreimageResult`. Ctrl-C or the time limit end the refinement
        early and still return a valid approximation (status ``"interrupted"``/``"time_limit"``).

    Soundness: the result's polytopes are built from sound linear bounds in float64 (see
    :mod:`assay.preimage.refinement`); the volumes and the ratio are statistical estimates with
    intervals at ``confidence``. Refinement splits the input coordinates (input splitting, the
    right branching for the low-dimensional inputs of control policies and small patches).
    """
    kind = check_choice(kind, "kind", "approximate_preimage", _KINDS)
    threshold = _DEFAULT_THRESHOLD[kind] if threshold is None else check_float(threshold, "threshold", "approximate_preimage", 0.0, True)
    if kind == "under" and threshold > 1:
        raise OptionError(f"an under-approximation's ratio is at most 1; threshold={threshold} cannot be reached — use ≤ 1")
    if kind == "over" and threshold < 1:
        raise OptionError(f"an over-approximation's ratio is at least 1; threshold={threshold} cannot be reached — use ≥ 1")
    check_int(samples, "samples", "approximate_preimage", minimum=10)
    check_float(time_limit, "time_limit", "approximate_preimage", 0.0, True)
    check_choice(method, "method", "approximate_preimage", ("alpha", "crown"))
    check_int(alpha_iterations, "alpha_iterations", "approximate_preimage", minimum=0)
    check_int(batch_size, "batch_size", "approximate_preimage", minimum=1)
    check_float(confidence, "confidence", "approximate_preimage", 0.0, True)
    if not confidence < 1:
        raise OptionError(f"confidence must be below 1 (e.g. 0.95); got {confidence}")
    check_choice(stop_on, "stop_on", "approximate_preimage", ("bound", "estimate"))
    if max_pieces is not None:
        check_int(max_pieces, "max_pieces", "approximate_preimage", minimum=1)
    check_int(check_samples, "check_samples", "approximate_preimage", minimum=0)
    check_int(min_preimage_samples, "min_preimage_samples", "approximate_preimage", minimum=0)
    check_choice(branching, "branching", "approximate_preimage", ("auto", "input", "relu"))
    if heuristic_weights is not None:
        from assay.preimage.relu_refinement import heuristic_weights_for

        heuristic_weights_for(heuristic_weights)  # refuses unknown names before any work
    started = time.monotonic()
    deadline = Deadline(started + time_limit)
    lower, upper = (input_set.lower, input_set.upper) if hasattr(input_set, "lower") else input_set
    region = free_coordinates(network, torch.as_tensor(lower), torch.as_tensor(upper))
    C, d = _rows(spec, network.output_size)
    generator = np.random.default_rng(rng) if not isinstance(rng, np.random.Generator) else rng
    torch_rng = torch.Generator().manual_seed(int(generator.integers(2**62)))
    if branching == "auto":
        branching = "input" if region.dim <= 8 else "relu"
    if branching == "relu" and not region.network.relu_indices:
        branching = "input"  # an affine network: nothing to split but the inputs
    if branching == "input":
        strategy = PreimageRefinement(region.network, C, d, kind, samples=samples, method=method,
                                      alpha_iterations=alpha_iterations, rng=torch_rng,
                                      min_width=1e-7 * float((region.upper - region.lower).max()))
    else:
        from assay.preimage.relu_refinement import ReluPreimageRefinement

        strategy = ReluPreimageRefinement(region.network, C, d, kind, lower=region.lower, upper=region.upper,
                                          pool=pool or 10 * samples, method=method, alpha_iterations=alpha_iterations,
                                          rng=torch_rng, heuristic_weights=heuristic_weights,
                                          min_preimage=min_preimage_samples, samples=samples, resample=resample)
    pool_summary = None if branching == "input" else (strategy.measure_size, strategy.region_volume)
    history: list[tuple[float, float, int]] = []
    interrupted = threading.Event()
    reached = [False]

    def stop(state: SearchState) -> bool:
        pieces = _chunks(state)
        summary = _summary(kind, pieces, confidence, pool_summary)
        history.append((time.monotonic() - started, summary["ratio"], summary["pieces"]))
        if progress is not None:
            progress({"ratio": summary["ratio"], "pieces": summary["pieces"], "seconds": history[-1][0]})
        reached[0] = _reached(kind, summary, threshold, stop_on)
        over_budget = max_pieces is not None and summary["pieces"] >= max_pieces
        return reached[0] or interrupted.is_set() or over_budget

    root = strategy.root(region.lower, region.upper) if branching == "input" else strategy.root()
    state = SearchState.start(root)
    outcome_state = state
    if not stop(state):
        with _sigint_sets(interrupted):
            outcome = branch_and_bound(strategy, state, deadline, batch_size=batch_size, stats=SearchStats(),
                                       keep_closed=True, priority="priority", stop=stop)
        outcome_state = outcome.state
    pieces = _chunks(outcome_state)
    summary = _summary(kind, pieces, confidence, pool_summary)
    if reached[0] or _reached(kind, summary, threshold, stop_on):
        status = "reached"
    elif interrupted.is_set():
        status = "interrupted"
    elif deadline.passed():
        status = "time_limit"
    else:
        status = "exhausted"
    result = PreimageResult(
        kind=kind, pieces=_pieces(pieces), region=region, C=C, d=d,
        preimage_volume=summary["preimage"], approximation_volume=summary["approximation"],
        ratio=summary["ratio"], ratio_interval=summary["ratio_interval"], threshold=threshold,
        confidence=confidence, status=status, iterations=max(len(history) - 1, 0),
        seconds=time.monotonic() - started, history=tuple(history),
        stats={"pieces_bounded": strategy.counters.pieces, "bound_calls": strategy.counters.bound_calls,
               "samples": strategy.counters.samples, "method": method, "samples_per_piece": samples,
               "branching": branching, **({"pool": strategy.pool_size, "resampled": strategy.resampled} if branching == "relu" else {})},
    )
    if check_samples:
        result = replace(result, check=_independent_check(result, check_samples, torch_rng, confidence))
    return result


def _independent_check(result: PreimageResult, count: int, generator: torch.Generator, confidence: float) -> dict:
    """Test the result on fresh uniform samples of the region; estimate its ratio from them alone."""
    region = result.region
    z = region.lower + torch.rand(count, region.dim, generator=generator, dtype=torch.float64) * (region.upper - region.lower)
    y = region.network.forward(z)
    inside = ((y @ result.C.T + result.d) >= 0).all(1).numpy()
    contained = result.contains(region.to_input(z).numpy())
    wrong = contained & ~inside if result.kind == "under" else inside & ~contained
    if wrong.any():
        point = region.to_input(z[np.nonzero(wrong)[0][:1]]).reshape(-1).tolist()
        raise RuntimeError(f"soundness bug: the {result.kind}-approximation misclassifies the sampled input {point}; "
                           "please report it")
    k_pre, k_approx = int(inside.sum()), int(contained.sum())
    # The smaller set is a subset of the larger: its share of the larger is a binomial proportion.
    small, large = (k_approx, k_pre) if result.kind == "under" else (k_pre, k_approx)
    if large == 0:
        ratio, low, high = float("nan"), 0.0, float("inf")
    else:
        (p_low,), (p_high,) = clopper_pearson([small], [large], confidence)
        p = small / large
        ratio, low, high = (p, p_low, p_high) if result.kind == "under" else (
            1 / p if p else float("inf"), 1 / p_high if p_high else float("inf"), 1 / p_low if p_low else float("inf"))
    return {"samples": count, "in_preimage": k_pre, "in_approximation": k_approx, "ratio": ratio,
            "ratio_interval": [float(low), float(high)], "confidence": confidence}


# ---------------------------------------------------------------------------- helpers
def _rows(spec, num_outputs: int) -> tuple[torch.Tensor, torch.Tensor]:
    if isinstance(spec, OutputSpec):
        if len(spec.conjunctions) != 1:
            raise SpecError(f"preimage approximation takes an output region with one conjunction (AND of rows); this one "
                            f"is an OR of {len(spec.conjunctions)}: approximate each conjunction's preimage separately")
        spec = spec.conjunctions[0]
    if isinstance(spec, HalfSpaces):
        C, d = spec.C, spec.d
    else:
        try:
            C, d = spec
        except (TypeError, ValueError):
            raise SpecError(f"the output region must be an OutputSpec, HalfSpaces or a pair (C, d); got {type(spec).__name__}") from None
        spec = HalfSpaces(torch.as_tensor(C, dtype=torch.float64), torch.as_tensor(d, dtype=torch.float64))
        C, d = spec.C, spec.d
    if C.shape[1] != num_outputs:
        raise SpecError(f"the output region constrains {C.shape[1]} outputs, but the network has {num_outputs}; "
                        "build it for the network's outputs (e.g. argmax_is(k, network.output_size))")
    return C.to(torch.float64), d.to(torch.float64)


def _chunks(state: SearchState):
    return [chunk for chunk in (*state.closed, *state.pending, *state.unresolved) if len(chunk)]


def _summary(kind: str, chunks, confidence: float, pool: tuple[int, float] | None = None) -> dict:
    """Volumes and ratio of the pieces in ``chunks``. ``pool`` = (pool size, region volume) when
    the pieces' samples partition one uniform pool (ReLU splitting): the totals are then plain
    binomial counts with exact intervals; otherwise a stratified estimate over the pieces' boxes."""
    if pool is not None and chunks:
        return _pool_summary(kind, chunks, confidence, *pool)
    if not chunks:
        empty = stratified_sum([], [], [], [], confidence)
        return {"preimage": empty, "approximation": empty, "ratio": 1.0, "ratio_interval": (1.0, 1.0), "pieces": 0}
    tags = {name: torch.cat([c.tags[name] for c in chunks]).numpy() for name in ("n", "k_pre", "k_poly", "exact", "empty")}
    volume = torch.cat([c.tags["volume"] for c in chunks]).numpy()
    keep = ~tags["empty"]
    # Each volume's interval at (1 + confidence)/2, so that both hold together at `confidence`.
    level = (1 + confidence) / 2
    pre = stratified_sum(volume, tags["k_pre"], tags["n"], tags["exact"], level)
    approx = stratified_sum(volume, tags["k_poly"], tags["n"], tags["exact"], level)
    pre_c = stratified_sum(volume, tags["k_pre"], tags["n"], tags["exact"], confidence)
    approx_c = stratified_sum(volume, tags["k_poly"], tags["n"], tags["exact"], confidence)
    if pre.value > 0:
        ratio = approx.value / pre.value
        low = approx.low / pre.high if pre.high > 0 else 0.0
        high = approx.high / pre.low if pre.low > 0 else float("inf")
    elif bool(tags["exact"].all()):  # proved: no point of the region maps into the output region
        ratio, low, high = 1.0, 1.0, 1.0
    else:  # no preimage point seen yet: the ratio is not known
        ratio = 0.0 if kind == "under" else float("inf")
        low, high = 0.0, float("inf")
    if kind == "under":
        low, high, ratio = min(low, 1.0), min(high, 1.0), min(ratio, 1.0)
    else:
        low, high, ratio = max(low, 1.0), max(high, 1.0), max(ratio, 1.0)
    return {"preimage": pre_c, "approximation": approx_c, "ratio": ratio, "ratio_interval": (low, high),
            "pieces": int(keep.sum())}


def _pool_summary(kind: str, chunks, confidence: float, size: int, region_volume: float) -> dict:
    tags = {name: torch.cat([c.tags[name] for c in chunks]) for name in ("k_pre", "k_poly", "exact", "empty")}
    k_pre, k_poly = int(tags["k_pre"].sum()), int(tags["k_poly"].sum())
    (pre_low, poly_low), (pre_high, poly_high) = clopper_pearson([k_pre, k_poly], [size, size], confidence)
    pre = Estimate(region_volume * k_pre / size, region_volume * pre_low, region_volume * pre_high, confidence)
    approx = Estimate(region_volume * k_poly / size, region_volume * poly_low, region_volume * poly_high, confidence)
    small, large = (k_poly, k_pre) if kind == "under" else (k_pre, k_poly)
    if large > 0:
        (low,), (high,) = clopper_pearson([small], [large], confidence)
        ratio = small / large
        if kind == "over":  # the preimage's share of the approximation, inverted
            ratio, low, high = (1 / ratio if ratio else float("inf")), (1 / high if high else float("inf")), \
                (1 / low if low else float("inf"))
    elif bool(tags["exact"].all()):
        ratio, low, high = 1.0, 1.0, 1.0
    else:
        ratio = 0.0 if kind == "under" else float("inf")
        low, high = 0.0, float("inf")
    return {"preimage": pre, "approximation": approx, "ratio": float(ratio), "ratio_interval": (float(low), float(high)),
            "pieces": int((~tags["empty"]).sum())}


def _reached(kind: str, summary: dict, threshold: float, stop_on: str) -> bool:
    low, high = summary["ratio_interval"]
    if kind == "under":
        return (low if stop_on == "bound" else summary["ratio"]) >= threshold
    return (high if stop_on == "bound" else summary["ratio"]) <= threshold


def _pieces(chunks) -> tuple[Piece, ...]:
    pieces = []
    for chunk in chunks:
        t = chunk.tags
        for i in torch.nonzero(~t["empty"]).flatten().tolist():
            splits = () if chunk.splits is None else tuple(
                (layer, int(neuron), int(s.reshape(s.shape[0], -1)[i, neuron]))
                for layer, s in enumerate(chunk.splits) for neuron in torch.nonzero(s.reshape(s.shape[0], -1)[i]).flatten())
            pieces.append(Piece(chunk.lower[i], chunk.upper[i], t["A"][i], t["b"][i], int(t["n"][i]),
                                int(t["k_pre"][i]), int(t["k_poly"][i]), bool(t["exact"][i]), splits,
                                float(t["volume"][i])))
    return tuple(pieces)


class _sigint_sets:
    """Within the block, Ctrl-C sets ``event`` (the refinement stops after its round) instead of
    raising; a second Ctrl-C raises as usual. Only in the main thread (signals live there)."""

    def __init__(self, event: threading.Event):
        self.event = event
        self.previous = None

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            def handler(signum, frame):
                if self.event.is_set():
                    raise KeyboardInterrupt
                self.event.set()

            self.previous = signal.signal(signal.SIGINT, handler)
        return self

    def __exit__(self, *exc):
        if self.previous is not None:
            signal.signal(signal.SIGINT, self.previous)
        return False
