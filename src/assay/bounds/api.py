"""`compute_bounds`: the one public entry point of the bound engine."""

from __future__ import annotations

import math
import time
from collections.abc import Sequence

import torch

from assay._validate import check_choice
from assay.bounds.crown import Backward, backsubstitute, concretize
from assay.bounds.forward import (
    MAX_FORWARD_COEFFICIENTS,
    MAX_FORWARD_INPUTS,
    Constants,
    cut_tensors,
    forward_bounds,
    forward_fits,
    varying_inputs,
)
from assay.bounds.ibp import cast_outward, center_radius, interval_pass
from assay.bounds.methods import METHODS, bound_method
from assay.bounds.optimize import Objective, optimize_bounds
from assay.bounds.options import AlphaCrownOptions, BetaCrownOptions
from assay.bounds.plan import Plan, plan_for, unit_roundoff
from assay.bounds.result import BoundsResult, IntermediateBounds, LinearBounds
from assay.bounds.tensor_bounds import (
    alpha_layer_bounds,
    alpha_tensor_bounds,
    crown_layer_bounds,
    crown_tensor_bounds,
    downstream_pass,
    relaxed_before,
    rows_reach,
)
from assay.errors import DataError, OptionError, SpecError
from assay.nn.network import Network, resolve_dtype
from assay.threads import on_network_threads

# intermediate_method="hybrid": a tensor gets CROWN bounds when its walk back to a cut crosses at
# most this many elements per row (a generator's discriminator: its image and its own layers).
_CUT_WALK_ELEMENTS = 1 << 15


@on_network_threads
def compute_bounds(
    network: Network,
    input_set,
    spec=None,
    method: str = "crown",
    *,
    dtype="float64",
    sides: str = "both",
    splits: Sequence[torch.Tensor] | None = None,
    intermediate: IntermediateBounds | None = None,
    refine_intermediate: bool = True,
    fixed_layers: int = 0,
    intermediate_method: str = "crown",
    weight_perturbation=None,
    options: AlphaCrownOptions | BetaCrownOptions | None = None,
    objective: Objective | None = None,
    return_linear: bool = False,
    deadline: float | None = None,
    alphas: Sequence[torch.Tensor | None] | None = None,
    intermediate_only: bool = False,
    enough: float | None = None,
) -> BoundsResult:
    """Sound bounds of ``C · f(x) + d`` over a batch of input domains.

    Args:
        network: the network ``f``.
        input_set: a :class:`~assay.sets.Box` (or anything with ``lower``/``upper``) whose
            tensors have the network's input shape (one domain) or ``(B, *input_shape)``
            (B domains); an :class:`~assay.sets.HPolytope` is bounded over its bounding box;
            a ``(lower, upper)`` pair is accepted too.
        spec: the rows to bound: None (every output), an :class:`~assay.sets.OutputSpec` or
            :class:`~assay.sets.HalfSpaces` (all their rows ``C y + d``, stacked), a matrix
            ``C`` of shape (S, n_out) or (B, S, n_out), or a pair ``(C, d)``.
        method: ``"ibp"``, ``"crown"``, ``"alpha"`` (α-CROWN) or ``"beta"`` (β-CROWN).
        dtype: ``"float32"`` or ``"float64"`` (default; verdicts should use it).
        sides: ``"both"``, ``"lower"`` or ``"upper"``; the other side is returned as ∓inf.
        splits: β-CROWN split history: one int tensor per ReLU layer of shape (B, *layer shape)
            (or the layer shape, shared by all domains) with +1 (neuron constrained to z ≥ 0),
            −1 (z ≤ 0) or 0 (free). Bounds then hold over the inputs satisfying the splits;
            a domain whose splits contradict its bounds is empty and gets lower = +inf,
            upper = −inf. Every method honours splits; ``"beta"`` also optimises multipliers.
        intermediate: pre-activation bounds from an earlier call on a superset of each domain
            (e.g. the parent in branch and bound), and, where given, bounds of the tensors general
            operators read (``operator_lower``/``operator_upper``: a general split's child narrows
            them). They are intersected with this call's bounds.
        refine_intermediate: with ``intermediate``: True (default) recomputes CROWN bounds for
            the neurons that are still unstable (cheap when few are); False uses them as they
            are (the fastest choice when only the split constraints changed).
        fixed_layers: with ``intermediate`` and ``refine_intermediate``: the first k ReLU layers'
            bounds are used as they are and only later layers are refined (for a network whose
            first layers did not change since ``intermediate`` was computed, e.g. after
            fine-tuning its last layers; the later layers' entries may be ±inf).
        intermediate_method: how CROWN-family methods bound the ReLU inputs: ``"crown"``
            (default; backward substitution per unstable neuron, tightest) or ``"forward"``
            (forward linear bounds, see :mod:`assay.bounds.forward`: far cheaper for
            networks with few inputs, looser; meant for input-splitting branch and bound,
            where parents' bounds are reused; convolutional networks on images carry their
            input columns in spatial groups, :mod:`assay.bounds.forward_columns`, which fits
            inputs of thousands of pixels) or ``"alpha"`` (with ``method`` "alpha"/"beta":
            CROWN, then each later ReLU layer's unstable neurons get α-CROWN bounds of their
            own, slopes optimised per neuron and side for ``options.iterations`` steps before
            the next layer is bounded; so does every element of a tensor a non-linear general
            operator reads (a transformer's attention scores and values), with the parameters
            of the operators' relaxations before it (McCormick planes, softmax expansion
            points) optimised too, and a first ReLU layer that such operators precede; the tightest and by far the costliest, meant for the
            root of a branch-and-bound search; with ``intermediate`` given, the CROWN pass is
            skipped, as α starts from it; with ``method="beta"`` and ``splits``, each neuron's
            bounds also get multipliers of their own for the earlier layers' splits) or
            ``"hybrid"`` (forward bounds with error symbols, one per unstable ReLU neuron and
            shared by every later tensor (zonotopes, see :func:`~assay.bounds.forward.forward_bounds`'s
            ``symbols``), then CROWN for the tensors whose backward walk back to
            a cut, a tensor every path from the input crosses, is short, with the cut's forward
            bounds substituted there; the others keep their forward bounds: for networks with few
            inputs and large tensors, a generator, where full CROWN costs minutes per domain;
            :func:`~assay.bounds.intermediate_method_for` says when). The output rows always use
            backward CROWN.
        weight_perturbation: δ ≥ 0: every weight and bias of every Linear/Conv2d layer may
            move by up to δ (ℓ∞); or a sequence with one δ per Linear/Conv2d layer, in order;
            or a dict ``{layer index: δ}``. Bounds then hold for every such network.
        options: :class:`AlphaCrownOptions` / :class:`BetaCrownOptions` for the optimised methods.
        objective: for ``"alpha"``/``"beta"``: a function (LinearBounds, lower (B, S)) → (B,)
            to maximise instead of the sum of lower bounds (e.g. a sample-based volume).
        return_linear: also return linear bounds w.r.t. the input (CROWN-family methods).
        deadline: a ``time.monotonic()`` instant after which no further optimisation step
            (``"alpha"``/``"beta"``) and no further CROWN bound of an intermediate tensor starts
            (those keep their interval bounds): the bounds stay sound, only less tight.
        alphas: for ``"alpha"``/``"beta"``: slopes to start the optimisation from, one tensor
            (B, S, *layer shape) or None per ReLU layer, e.g. a parent domain's
            ``BoundsResult.alphas`` in branch and bound (any values are sound; they are
            clamped to [0, 1]). The result's ``alphas`` are the slopes of its bounds.
        intermediate_only: for a caller that needs only the result's ``intermediate`` bounds
            (e.g. to pass them to a later call): the rows get interval bounds over the output's
            bounds instead of the method's own pass (CROWN's backward walk, α/β's optimisation),
            which is skipped. The intermediate bounds are the same as without it; the rows'
            bounds are sound, only looser. Not with ``return_linear``.
        enough: for ``"alpha"``/``"beta"`` with ``sides`` "lower" or "upper": the bound the caller
            needs. The optimisation stops early once every domain has a row whose bound is past
            it (``lower > enough``, resp. ``upper < enough``) or is empty: a domain refuted by
            one row of its conjunction needs no tighter bounds. With a ``draft_dtype`` the draft's
            verdict is confirmed in the call's dtype before stopping (the optimisation goes on if
            the confirmed bounds fall short). The bounds returned are sound either way; a domain
            not past ``enough`` keeps all the iterations. None (default): every iteration runs.

    Returns:
        :class:`BoundsResult` with ``lower``/``upper`` of shape (B, S).

    Soundness: for every x in domain i (satisfying its splits; for every perturbed network),
    ``lower[i] ≤ C f(x) + d ≤ upper[i]`` holds exactly (in real arithmetic) for the values
    returned: floating-point rounding is bounded and subtracted (see :mod:`assay.bounds.crown`).
    """
    started = time.perf_counter()
    spec_of_method = bound_method(method)
    _check_options(spec_of_method, method, sides, intermediate_method, return_linear, intermediate, fixed_layers,
                   objective, intermediate_only, enough)
    enough = None if enough is None else float(enough)
    torch_dtype = resolve_dtype(dtype)
    plan = plan_for(network, torch_dtype)
    if fixed_layers and (intermediate is None or not 0 <= fixed_layers <= len(plan.relu_positions)):
        raise OptionError(
            f"fixed_layers={fixed_layers} needs `intermediate` bounds and at most {len(plan.relu_positions)} "
            f"(the network's ReLU layers)"
        )
    lower, upper = _input_bounds(network, input_set, torch_dtype)
    batch = lower.shape[0]
    C, d, spec_change = _spec_rows(network, spec, batch, torch_dtype)
    deltas = _resolve_deltas(plan, weight_perturbation)
    split_signs = _resolve_splits(plan, splits, batch)
    options = spec_of_method.resolve_options(options)
    relax = spec_of_method.relax()

    with torch.no_grad():
        known = _given_bounds(plan, intermediate, fixed_layers, batch, torch_dtype)
        clamp = _Clamp(known, split_signs, batch)
        refine = spec_of_method.linear and (intermediate is None or refine_intermediate)
        bounds = _intermediate_bounds(
            network, plan, lower, upper, C, deltas, clamp, relax, options, deadline, split_signs,
            method=intermediate_method if refine else None, fixed_layers=fixed_layers,
            crown_first=intermediate is None,
            # CROWN's rows (not an optimisation, which walks every stage) stop at the constants:
            # those only they would read need not be bounded
            lazy_constants=not spec_of_method.optimised,
        )
    stats = {"domains": batch, "rows": C.shape[1], "method": method}
    if not spec_of_method.linear or intermediate_only:
        result_lower, result_upper = _interval_rows_sided(C, d, bounds[-1], sides)
        linear, optimised_alphas = None, None
    else:
        result_lower, result_upper, linear, optimised_alphas, stats["iterations"] = _linear_rows(
            plan, lower, upper, bounds, C, d, sides, deltas, relax, spec_of_method, options, split_signs, spec_change,
            clamp.infeasible, objective=objective, deadline=deadline, alphas=alphas, enough=enough, return_linear=return_linear,
            constants=clamp.constants,
        )
    result_lower, result_upper, linear = _charge_spec_rounding(spec_change, bounds[-1], result_lower, result_upper,
                                                               linear)
    infeasible = clamp.infeasible
    if infeasible.any():
        result_lower = torch.where(infeasible.unsqueeze(1), torch.inf, result_lower)
        result_upper = torch.where(infeasible.unsqueeze(1), -torch.inf, result_upper)
    stats["infeasible_domains"] = int(infeasible.sum())
    stats["seconds"] = time.perf_counter() - started
    intermediate_out = None
    if spec_of_method.linear or plan.relu_positions:
        intermediate_out = IntermediateBounds(
            tuple(bounds[p][0] for p in plan.relu_positions), tuple(bounds[p][1] for p in plan.relu_positions),
            tuple(bounds[t][0] for t in plan.operator_tensors), tuple(bounds[t][1] for t in plan.operator_tensors),
        )
    return BoundsResult(result_lower.detach(), result_upper.detach(), method, linear, intermediate_out, C, d, stats,
                        optimised_alphas)


# ----------------------------------------------------------------- the phases of compute_bounds
def _check_options(spec_of_method, method, sides, intermediate_method, return_linear, intermediate, fixed_layers,
                   objective, intermediate_only, enough) -> None:
    """Refuse combinations of compute_bounds' options that have no meaning, with the reason."""
    check_choice(sides, "sides", "compute_bounds", ("both", "lower", "upper"))
    check_choice(intermediate_method, "intermediate_method", "compute_bounds", ("crown", "forward", "alpha", "hybrid"))
    if return_linear and not spec_of_method.linear:
        linear = ", ".join(repr(m.name) for m in METHODS.values() if m.linear)
        raise OptionError(f"return_linear needs a method with linear bounds ({linear}); {method!r} has none")
    if intermediate_method == "alpha" and not spec_of_method.optimised:
        raise OptionError(f"intermediate_method='alpha' optimises slopes: it needs method 'alpha' or 'beta', not {method!r}")
    if objective is not None and not spec_of_method.optimised:
        raise OptionError("an `objective` is only used by the optimised methods 'alpha' and 'beta'")
    if intermediate_only and return_linear:
        raise OptionError("intermediate_only skips the rows' linear bounds: it cannot return_linear")
    if enough is not None:
        if not spec_of_method.optimised:
            raise OptionError(f"`enough` stops an optimisation early: it needs method 'alpha' or 'beta', not {method!r}")
        if sides == "both":
            raise OptionError("`enough` is a bound on one side: give sides='lower' or sides='upper'")
        if math.isnan(float(enough)):
            raise OptionError("`enough` must be a number, not NaN")


def _given_bounds(plan: Plan, intermediate: IntermediateBounds | None, fixed_layers: int, batch: int,
                  dtype: torch.dtype) -> dict[int, tuple[torch.Tensor, torch.Tensor]]:
    """``{tensor: (lower, upper)}`` of the bounds a caller gave (``intermediate``, from a superset
    of each domain), cast outwards to ``dtype``: every ReLU input, and the tensors general
    operators read before the first layer bounded again (with ``fixed_layers``, the later ones
    may belong to a network that changed since)."""
    known: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
    if intermediate is None:
        return known
    _check_intermediate(plan, intermediate, batch)
    for k, position in enumerate(plan.relu_positions):
        known[position] = cast_outward(intermediate.lower[k], intermediate.upper[k], dtype)
    trusted = plan.relu_positions[fixed_layers - 1] + 1 if fixed_layers else math.inf
    for k, tensor in enumerate(plan.operator_tensors if intermediate.operator_lower else ()):
        if tensor >= trusted:
            continue
        given = cast_outward(intermediate.operator_lower[k], intermediate.operator_upper[k], dtype)
        if tensor in known:  # a ReLU's input that an operator reads too: both hold
            given = torch.maximum(given[0], known[tensor][0]), torch.minimum(given[1], known[tensor][1])
        known[tensor] = given
    return known


class _Clamp:
    """``clamp(position, l, u, members=None)``: bounds of tensor ``position`` intersected with
    what is known of it (``known``, updated as tensors are refined) and with the ReLU split
    constraints; for the domains ``members`` (an index tensor) when given, where ``l``, ``u``
    hold those domains only. ``infeasible`` (B,) records the domains whose intervals came out
    empty (no input reaches them)."""

    def __init__(self, known, split_signs, batch: int):
        self.known, self.split_signs, self.batch = known, split_signs, batch
        self.infeasible = torch.zeros(batch, dtype=torch.bool)
        # tensors that no domain lets vary (forward bounds found them): the rows' walk stops there
        self.constants: frozenset[int] = frozenset()

    def __call__(self, position, l, u, members=None):
        pick = (lambda t: t) if members is None else (lambda t: t[members] if t.shape[0] == self.batch else t)  # noqa: E731
        if position in self.known:
            l, u = torch.maximum(l, pick(self.known[position][0])), torch.minimum(u, pick(self.known[position][1]))
        if position in self.split_signs:
            signs = pick(self.split_signs[position])
            l = torch.where(signs < 0, l.clamp(min=0), l)  # sign −1 marks z ≥ 0 (active)
            u = torch.where(signs > 0, u.clamp(max=0), u)  # sign +1 marks z ≤ 0 (inactive)
        empty = (l > u).reshape(l.shape[0], -1).any(1)
        if members is None:
            self.infeasible = self.infeasible | empty
        else:
            self.infeasible = self.infeasible.clone()
            self.infeasible[members] |= empty
        return l, torch.maximum(l, u)


def _intermediate_bounds(network, plan: Plan, lower, upper, C, deltas, clamp: _Clamp, relax, options, deadline,
                         split_signs, *, method: str | None, fixed_layers: int, crown_first: bool,
                         lazy_constants: bool = False) -> list:
    """Bounds of every tensor (``bounds[t]`` = (lower, upper) of tensor t), interval bounds
    tightened by ``method`` where it refines (None: the given and interval bounds only):
    "forward"/"hybrid" by forward linear bounds (:func:`_forward_intermediate`), "crown"/"alpha"
    tensor by tensor in order (:func:`_refined_intermediate`). Each refined tensor's bounds enter
    ``clamp.known``, so every later pass intersects with them."""
    refined = _refined_tensors(plan, fixed_layers) if method in ("crown", "alpha") else []
    if method == "forward" and _parents_cover(plan, clamp.known):
        # A parent domain's bounds of every tensor the forward pass concretises (an input-splitting
        # search's children) hold the parent's intervals already: the forward pass intersects with
        # them, and the interval pass over the child's box before it is skipped (mscn_dual: a third
        # of a bound call, the children's bounds all but unchanged).
        return _forward_intermediate(network, plan, lower, upper, None, deltas, clamp, relax, deadline, method,
                                     lazy_constants)
    # Lazy IBP: each tensor CROWN refines replaces its interval bounds, and every tensor after
    # it is computed again from there; so each interval pass stops at the next refined tensor
    # (its backward walk reads only the tensors before it), and the last one runs to the output.
    bounds = interval_pass(plan, lower, upper, deltas, clamp, given=clamp.known, until=refined[0] if refined else None)
    if method in ("forward", "hybrid"):
        return _forward_intermediate(network, plan, lower, upper, bounds, deltas, clamp, relax, deadline, method,
                                     lazy_constants)
    if refined:
        return _refined_intermediate(network, plan, lower, upper, C, bounds, refined, deltas, clamp, relax, options,
                                     deadline, split_signs, method, crown_first)
    return bounds


def _forward_intermediate(network, plan: Plan, lower, upper, interval, deltas, clamp: _Clamp, relax, deadline,
                          method: str, lazy_constants: bool = False) -> list:
    """Forward linear bounds of every refined tensor ("hybrid": with error symbols, then CROWN
    where the walk back to a cut is short, the cut's forward functions substituted there),
    intersected with ``interval`` (the interval pass's bounds of every tensor; None: with the
    bounds in ``clamp`` only). ``lazy_constants``: the tensors no box lets vary are bounded only
    where read (:class:`~assay.bounds.forward.Constants`), for rows whose walks stop at them."""
    if deltas:
        raise OptionError("intermediate_method='forward' does not support weight_perturbation; use 'crown'")
    # "hybrid" stores forward functions over the varying inputs at its cuts; "forward" also
    # groups an image's columns (assay.bounds.forward_columns) and fits larger inputs
    varying = varying_inputs(lower, upper)[0].numel()
    if varying > MAX_FORWARD_INPUTS and (method == "hybrid" or not forward_fits(plan)):
        raise OptionError(
            f"intermediate_method={method!r} is meant for boxes with few varying inputs (at "
            f"most {MAX_FORWARD_INPUTS}), or ('forward') images whose layers' receptive fields keep the "
            f"grouped coefficients within {MAX_FORWARD_COEFFICIENTS} elements per tensor; the boxes given "
            f"for {network.source} vary {varying} inputs: use 'crown'"
        )

    def clamp_with_interval(position, l, u, members=None):
        if interval is None:  # the given (parents') bounds only
            return clamp(position, l, u, members)
        low, high = interval[position] if members is None else (t[members] for t in interval[position])
        return clamp(position, torch.maximum(l, low), torch.minimum(u, high), members)

    center, radius = center_radius(lower, upper)
    walks = _hybrid_walks(plan) if method == "hybrid" else {}
    cuts = {}
    # tensors that every box fixes (no coefficient): their forward bounds are interval bounds,
    # which the interval pass below takes as they are (mscn: 5 of its 6 set blocks per box)
    constants = Constants(lazy=lazy_constants and not clamp.split_signs) if method == "forward" else None
    # "hybrid": error symbols keep the correlations that many unstable neurons' relaxations lose
    clamp.known.update(forward_bounds(plan, lower, upper, clamp_with_interval, keep=set(walks.values()), cuts=cuts,
                                      symbols=method == "hybrid", constants=constants))
    given = {} if constants is None else constants.given(plan.network.shapes, lower.shape[0], lower.dtype)
    bounds = interval_pass(plan, lower, upper, deltas, clamp, given=given, complete=given)
    clamp.constants = frozenset(given)
    for position, stop in walks.items():  # "hybrid": CROWN where the walk back to a cut is short
        if deadline is not None and time.monotonic() > deadline:
            break  # the later tensors keep their forward bounds (sound)
        refine = crown_layer_bounds if position in plan.relu_positions else crown_tensor_bounds
        clamp.known[position] = refine(plan, position, bounds, deltas, center, radius, relax, deadline,
                                       cut=cuts.get(stop))
        bounds = downstream_pass(plan, lower, upper, deltas, clamp, bounds, position)
    return bounds


def _parents_cover(plan: Plan, known: dict) -> bool:
    """Whether ``known`` (bounds given by the caller) holds every ReLU input and every tensor a
    non-linear general operator reads: all that forward bounds concretise."""
    return bool(known) and all(t in known for t in (*plan.relu_positions, *plan.operator_tensors))


def _refined_intermediate(network, plan: Plan, lower, upper, C, bounds, refined, deltas, clamp: _Clamp, relax,
                          options, deadline, split_signs, method: str, crown_first: bool) -> list:
    """CROWN (and with ``method`` "alpha", α-CROWN) bounds of the ``refined`` tensors in order,
    each pass of interval bounds continuing from the last refined tensor. ``crown_first``: False
    when bounds were given, where α's first iterate is CROWN on them (a separate CROWN pass
    first would only repeat it). Past the deadline the later tensors keep interval bounds."""
    center, radius = center_radius(lower, upper)
    known = clamp.known
    reach = None
    # Not under ReLU splits: a split domain's search branches on, and decides leaves by,
    # every unstable neuron's bounds (ReLU splitting asked to branch a domain whose
    # unreached neurons kept interval bounds found none it could split).
    if method == "crown" and not split_signs and not (plan.has_maxpool or plan.is_general):
        # the lazy pass stops at the first refined tensor; reach reads every layer's
        # interval bounds (looser than the refined ones: a superset of the reached neurons)
        reach = rows_reach(network, plan, C, interval_pass(plan, lower, upper, deltas, clamp, given=known))
    for index, position in enumerate(refined):
        if deadline is not None and time.monotonic() > deadline:
            break  # past the deadline: the later tensors keep their interval bounds (sound)
        until = refined[index + 1] if index + 1 < len(refined) else None
        if len(bounds) <= position:  # the tensor before was not refined (α skips the first
            # ReLU layer where CROWN did not run): the lazy pass continues from where it stopped
            bounds = downstream_pass(plan, lower, upper, deltas, clamp, bounds, len(bounds) - 1, position)
        if position not in plan.relu_positions:  # a general operator's input: every element
            optimised = method == "alpha" and relaxed_before(plan, position)
            if method == "crown" or crown_first or not optimised:  # (α's first iterate is CROWN)
                known[position] = crown_tensor_bounds(plan, position, bounds, deltas, center, radius, relax, deadline)
                bounds = downstream_pass(plan, lower, upper, deltas, clamp, bounds, position, until)
            if optimised:
                known[position] = alpha_tensor_bounds(plan, position, bounds, deltas, center, radius, relax,
                                                       options, deadline, split_signs)
                bounds = downstream_pass(plan, lower, upper, deltas, clamp, bounds, position, until)
            continue
        if method == "crown" or crown_first:
            known[position] = crown_layer_bounds(plan, position, bounds, deltas, center, radius, relax, deadline,
                                                  only=None if reach is None else reach[position])
            bounds = downstream_pass(plan, lower, upper, deltas, clamp, bounds, position, until)
        if method == "alpha" and relaxed_before(plan, position):
            known[position] = alpha_layer_bounds(plan, position, bounds, deltas, center, radius, relax,
                                                  options, deadline, split_signs)
            bounds = downstream_pass(plan, lower, upper, deltas, clamp, bounds, position, until)
    if len(bounds) < len(plan.stages) + 1:  # stopped by the deadline: the rest by IBP
        bounds = downstream_pass(plan, lower, upper, deltas, clamp, bounds, len(bounds) - 1)
    return bounds


def _interval_rows_sided(C, d, output_bounds, sides: str):
    """The rows' bounds from the output's interval bounds, the side not asked for at ∓inf."""
    lo, hi = _interval_rows(C, d, *output_bounds)
    return (lo if sides != "upper" else torch.full_like(lo, -torch.inf),
            hi if sides != "lower" else torch.full_like(hi, torch.inf))


def _linear_rows(plan: Plan, lower, upper, bounds, C, d, sides, deltas, relax, spec_of_method, options, split_signs,
                 spec_change, infeasible, *, objective, deadline, alphas, enough, return_linear, constants=frozenset()):
    """The rows' bounds by the method's backward pass (CROWN, or α/β-CROWN's optimisation) over
    the intermediate ``bounds``, each row kept at the tighter of it and the interval bound.
    ``constants``: tensors no domain lets vary, where CROWN's walk stops (those of finite bounds).
    Returns ``(lower, upper, linear or None, optimised slopes or None, iterations)``."""
    center, radius = center_radius(lower, upper)
    batch = C.shape[0]
    rows_lower, rows_upper = _sided_rows(C, d, sides)
    stacked_C = torch.cat([r[0] for r in (rows_lower, rows_upper) if r is not None], dim=1)
    stacked_d = torch.cat([r[1] for r in (rows_lower, rows_upper) if r is not None], dim=1)
    n_lower = rows_lower[0].shape[1] if rows_lower is not None else 0

    def to_linear(back: Backward, margin: torch.Tensor) -> LinearBounds:
        offset = back.b - margin
        return LinearBounds(
            back.A[:, :n_lower] if rows_lower is not None else None,
            offset[:, :n_lower] if rows_lower is not None else None,
            -back.A[:, n_lower:] if rows_upper is not None else None,
            -offset[:, n_lower:] if rows_upper is not None else None,
        )

    optimised_alphas = None
    if not spec_of_method.optimised:
        with torch.no_grad():
            back = backsubstitute(plan, len(plan.stages), stacked_C, stacked_d, bounds, deltas, relax=relax,
                                  stops=constants)
            best, margin = concretize(plan, back, center, radius)
        iterations = 0
    else:
        if isinstance(options, BetaCrownOptions):
            lr_alpha, lr_beta = options.lr_alpha, options.lr_beta
            signs_for_beta = split_signs
        else:
            lr_alpha, lr_beta, signs_for_beta = options.lr, 0.0, None
        initial = None
        if alphas is not None:
            if len(alphas) != len(plan.relu_positions):
                raise OptionError(f"alphas has {len(alphas)} entries; the network has "
                                  f"{len(plan.relu_positions)} ReLU layers")
            initial = {p: a for p, a in zip(plan.relu_positions, alphas) if a is not None}
        target = None
        if enough is not None:
            # The optimised rows are the lower rows, or the upper rows negated; the rows'
            # rounding (_charge_spec_rounding) moves the bounds by `slack` afterwards, so the
            # target includes it.
            slack = _spec_rounding(spec_change, *bounds[-1])
            target = enough if sides == "lower" else -enough
            target = torch.full((batch, stacked_C.shape[1]), target, dtype=torch.float64)
            if slack is not None:
                target = target + slack
            target = (target, infeasible)
        best, back, margin, iterations, slopes = optimize_bounds(
            plan, stacked_C, stacked_d, bounds, center, radius,
            deltas=deltas, split_signs=signs_for_beta, iterations=options.iterations,
            lr_alpha=lr_alpha, lr_beta=lr_beta, lr_decay=options.lr_decay,
            objective=objective, to_linear=to_linear, deadline=deadline, relax=relax,
            initial_alphas=initial,
            draft_dtype=None if options.draft_dtype is None else resolve_dtype(options.draft_dtype),
            enough=target,
        )
        optimised_alphas = tuple(slopes.get(p) for p in plan.relu_positions)
    with torch.no_grad():
        # CROWN and IBP are both sound: keep the tighter of the two for each row.
        ibp_lo, ibp_hi = _interval_rows(C, d, *bounds[-1])
        result_lower = torch.full_like(ibp_lo, -torch.inf)
        result_upper = torch.full_like(ibp_hi, torch.inf)
        if rows_lower is not None:
            result_lower = torch.maximum(best[:, :n_lower].detach(), ibp_lo)
        if rows_upper is not None:
            result_upper = torch.minimum(-best[:, n_lower:].detach(), ibp_hi)
    linear = None
    if return_linear:
        linear = to_linear(Backward(back.A.detach(), back.b.detach(), back.error), margin.detach())
    return result_lower, result_upper, linear, optimised_alphas, iterations


def _charge_spec_rounding(spec_change, output_bounds, result_lower, result_upper, linear):
    """Where the rows were rounded to the working dtype, widen their bounds (and linear bounds'
    offsets) by how far the exact rows' bounds can lie (:func:`_spec_rounding`)."""
    slack = _spec_rounding(spec_change, *output_bounds)
    if slack is None:
        return result_lower, result_upper, linear
    down = torch.nextafter(result_lower - slack.to(result_lower.dtype), torch.full_like(result_lower, -torch.inf))
    up = torch.nextafter(result_upper + slack.to(result_upper.dtype), torch.full_like(result_upper, torch.inf))
    if linear is not None:
        linear = LinearBounds(
            linear.lower_A, None if linear.lower_b is None else torch.nextafter(
                linear.lower_b - slack.to(linear.lower_b.dtype), torch.full_like(linear.lower_b, -torch.inf)),
            linear.upper_A, None if linear.upper_b is None else torch.nextafter(
                linear.upper_b + slack.to(linear.upper_b.dtype), torch.full_like(linear.upper_b, torch.inf)))
    return down, up, linear


# ---------------------------------------------------------------------------- helpers
def _refined_tensors(plan: Plan, fixed_layers: int) -> list[int]:
    """The tensors CROWN bounds before the output, in order: the inputs of the ReLU layers after
    the first ``fixed_layers``, and every tensor a non-linear general operator reads (the
    network's input excepted: its bounds are the domain; so are the tensors only rules that walk
    to their linear bounds themselves read, :attr:`Plan.lined_tensors`)."""
    first = plan.relu_positions[fixed_layers - 1] + 1 if fixed_layers else 1
    return sorted({p for p in plan.relu_positions[fixed_layers:]}
                  | {t for t in plan.operator_inputs if t >= first and t not in plan.lined_tensors})


def _hybrid_walks(plan: Plan) -> dict[int, int]:
    """For ``intermediate_method="hybrid"``: {refined tensor: the cut its CROWN walk stops at (0:
    the input)}, for the tensors whose walk back to some cut crosses at most
    :data:`_CUT_WALK_ELEMENTS` elements per row; the farthest such cut (the tightest bounds).
    The others keep their forward bounds, and so do the tensors whose walk would cross affine
    stages only: substituting the cut's forward bounds through affine maps gives exactly the
    forward bounds again (positive coefficients take the lower function, negative ones the
    upper, as the forward pass combines them), so such a walk costs a backward pass per element
    and gains nothing. (On a 64×64 cgan, the discriminator's first two ReLU layers, 16,384 and
    8,192 neurons behind one convolution each, took most of every box's time that way.)"""
    sizes = [math.prod(shape) for shape in plan.network.shapes]
    cuts = [0] + cut_tensors(plan)
    relaxed = [stage.relaxes for stage in plan.stages]
    walks = {}
    for tensor in sorted(set(plan.relu_positions) | set(plan.operator_inputs) - {0}):
        for stop in cuts:  # ascending: the farthest first
            if stop < tensor and sum(sizes[stop:tensor + 1]) <= _CUT_WALK_ELEMENTS:
                if any(relaxed[stop:tensor]):  # some relaxation for the walk to choose per row
                    walks[tensor] = stop
                break
    return walks


def _interval_rows(C, d, out_lower, out_upper):
    """Interval bounds of C y + d for y in [out_lower, out_upper], rounded outwards."""
    if not (torch.isfinite(out_lower).all() and torch.isfinite(out_upper).all()):
        return _unbounded_interval_rows(C, d, out_lower, out_upper)
    center, radius = center_radius(out_lower, out_upper)
    flat = lambda t: t.reshape(t.shape[0], 1, -1)  # noqa: E731
    C_flat = C.reshape(C.shape[0], C.shape[1], -1)
    mid = (C_flat * flat(center)).sum(-1) + d
    rad = (C_flat.abs() * flat(radius)).sum(-1)
    u = unit_roundoff(C.dtype)
    margin = 2 * (C_flat.shape[-1] + 3) * u * ((C_flat.abs() * (flat(center).abs() + flat(radius))).sum(-1) + d.abs())
    return mid - rad - margin, mid + rad + margin


def _unbounded_interval_rows(C, d, out_lower, out_upper):
    """:func:`_interval_rows` where some output bound is infinite (its centre would be NaN): each
    row sums ``c·y``'s end terms, a zero coefficient ignoring its output's bounds."""
    from assay.bounds.rules.multi import interval_sum

    C_flat = C.reshape(C.shape[0], C.shape[1], -1)
    lo, hi = out_lower.reshape(out_lower.shape[0], 1, -1), out_upper.reshape(out_upper.shape[0], 1, -1)
    zero = torch.zeros_like(C_flat)
    low = torch.where(C_flat > 0, C_flat * lo, torch.where(C_flat < 0, C_flat * hi, zero))
    high = torch.where(C_flat > 0, C_flat * hi, torch.where(C_flat < 0, C_flat * lo, zero))
    offset = d.expand(C_flat.shape[0], C_flat.shape[1]).unsqueeze(-1)
    return interval_sum(torch.cat([low, offset], -1), torch.cat([high, offset], -1), -1)


def _sided_rows(C, d, sides):
    lower_rows = (C, d) if sides in ("both", "lower") else None
    upper_rows = (-C, -d) if sides in ("both", "upper") else None
    return lower_rows, upper_rows


def _input_bounds(network: Network, input_set, dtype):
    if hasattr(input_set, "bounding_box") and not hasattr(input_set, "lower"):
        input_set = input_set.bounding_box()
    if isinstance(input_set, str):
        raise SpecError(f"compute_bounds needs a Box, an HPolytope or a (lower, upper) pair; got the string {input_set!r}")
    if hasattr(input_set, "lower") and hasattr(input_set, "upper"):
        lower, upper = input_set.lower, input_set.upper
    elif isinstance(input_set, (tuple, list)) and len(input_set) == 2:
        lower, upper = input_set
    else:
        raise SpecError(f"compute_bounds needs a Box, an HPolytope or a (lower, upper) pair; got {type(input_set).__name__}")
    try:
        lower, upper = cast_outward(lower, upper, dtype)
    except (TypeError, RuntimeError, ValueError) as exc:
        raise SpecError(f"the input set's bounds are not numeric arrays ({type(input_set).__name__}): {exc}") from exc
    shape = network.input_shape
    if tuple(lower.shape) == shape:
        lower, upper = lower.unsqueeze(0), upper.unsqueeze(0)
    elif lower.dim() == 1 and lower.numel() == network.input_size and lower.shape == upper.shape:
        # A flat box (e.g. read from VNN-LIB, which numbers inputs X_0 … X_{n-1}) in row-major order.
        lower, upper = lower.reshape(1, *shape), upper.reshape(1, *shape)
    if tuple(lower.shape[1:]) != shape or lower.shape != upper.shape:
        raise DataError(
            f"the input set has shape {tuple(lower.shape)}, but {network.source} takes inputs of shape {shape} "
            f"(or a batch of domains of shape (B, {', '.join(map(str, shape))}))"
        )
    if not (torch.isfinite(lower).all() and torch.isfinite(upper).all()):
        raise DataError("the input set has NaN or infinite bounds; every input must be bounded")
    if (lower > upper).any():
        raise SpecError("the input set has a lower bound above its upper bound")
    return lower, upper


def _spec_rows(network: Network, spec, batch: int, dtype):
    n_out = network.output_size
    if spec is None:
        C, d = torch.eye(n_out, dtype=dtype), torch.zeros(n_out, dtype=dtype)
    elif hasattr(spec, "rows"):
        C, d, _ = spec.rows()
    elif hasattr(spec, "C") and hasattr(spec, "d"):
        C, d = spec.C, spec.d
    elif isinstance(spec, (tuple, list)) and len(spec) == 2:
        C, d = spec
    else:
        C, d = spec, None
    C = torch.as_tensor(C)
    d = torch.zeros(C.shape[:-1], dtype=dtype) if d is None else torch.as_tensor(d)
    # What casting the rows to a narrower working dtype changed (rows are rarely exact in
    # float32, e.g. a threshold 3.99): the bounds are widened by its effect (see _spec_rounding).
    # Into float64, or from the working dtype itself, the cast is exact and nothing is kept.
    narrowing = dtype != torch.float64 and (C.dtype != dtype or d.dtype != dtype)
    exact = (C.to(torch.float64), d.to(torch.float64)) if narrowing else None
    C, d = C.to(dtype), d.to(dtype)
    if C.dim() == 2:
        C, d = C.unsqueeze(0).expand(batch, *C.shape), d.unsqueeze(0).expand(batch, *d.shape)
        exact = None if exact is None else tuple(t.unsqueeze(0).expand(batch, *t.shape) for t in exact)
    if C.dim() != 3 or C.shape[0] != batch or C.shape[2] != n_out or d.shape != C.shape[:2]:
        raise SpecError(
            f"the spec rows have shape C {tuple(C.shape)}, d {tuple(d.shape)}; expected C (S, {n_out}) or "
            f"(B={batch}, S, {n_out}) and d (S,) or (B, S) for {network.source}"
        )
    change = None if exact is None else (
        (exact[0].reshape(batch, C.shape[1], -1) - C.reshape(batch, C.shape[1], -1).to(torch.float64)).abs(),
        (exact[1] - d.to(torch.float64)).abs())
    return C.reshape(batch, C.shape[1], *network.output_shape).contiguous(), d.contiguous(), change


def _spec_rounding(change, out_lower, out_upper) -> torch.Tensor:
    """(B, S) float64: how far C·y + d can move when the rows (C, d) are rounded to the working
    dtype, over the outputs' bounds: |ΔC|·max|y| + |Δd|, doubled for this sum's own rounding;
    None when the cast was exact."""
    if change is None:
        return None
    delta_C, delta_d = change
    if not (delta_C.any() or delta_d.any()):
        return None
    magnitude = torch.maximum(out_lower.abs(), out_upper.abs()).reshape(out_lower.shape[0], -1, 1).to(torch.float64)
    return 2 * (delta_C.matmul(magnitude).squeeze(-1) + delta_d)


def _resolve_deltas(plan: Plan, weight_perturbation) -> dict[int, float]:
    if weight_perturbation is None:
        return {}
    positions = plan.affine_positions  # stage positions of Linear/Conv2d layers
    layer_to_position = {plan.stages[p].index: p for p in positions}
    if isinstance(weight_perturbation, dict):
        items = []
        for layer_index, delta in weight_perturbation.items():
            if layer_index not in layer_to_position:
                raise OptionError(
                    f"weight_perturbation names layer {layer_index}, which is not a Linear/Conv2d layer; "
                    f"those are layers {sorted(layer_to_position)}"
                )
            items.append((layer_to_position[layer_index], delta))
    elif isinstance(weight_perturbation, (int, float)):
        items = [(p, weight_perturbation) for p in positions]
    else:
        values = list(weight_perturbation)
        if len(values) != len(positions):
            raise OptionError(
                f"weight_perturbation has {len(values)} values, but the network has {len(positions)} Linear/Conv2d layers"
            )
        items = list(zip(positions, values))
    deltas = {}
    for position, delta in items:
        delta = float(delta)
        if not delta >= 0 or delta == torch.inf:
            raise OptionError(f"weight_perturbation values must be finite and ≥ 0; got {delta}")
        if delta > 0:
            deltas[position] = delta
    return deltas


def _resolve_splits(plan: Plan, splits, batch: int) -> dict[int, torch.Tensor]:
    if splits is None:
        return {}
    splits = list(splits)
    if len(splits) != len(plan.relu_positions):
        raise OptionError(f"splits has {len(splits)} entries; the network has {len(plan.relu_positions)} ReLU layers")
    signs = {}
    for position, split in zip(plan.relu_positions, splits):
        shape = plan.stages[position].shape
        split = torch.as_tensor(split)
        if tuple(split.shape) == shape:
            split = split.unsqueeze(0).expand(batch, *shape)
        if tuple(split.shape) != (batch, *shape):
            raise OptionError(f"a split tensor has shape {tuple(split.shape)}; expected {(batch, *shape)} or {shape}")
        if not torch.isin(split, torch.tensor([-1, 0, 1], dtype=split.dtype)).all():
            raise OptionError("split tensors may only contain -1 (z ≤ 0), 0 (free) and +1 (z ≥ 0)")
        # Internally the sign of the Lagrangian term: +1 for z ≤ 0 splits, −1 for z ≥ 0 splits.
        signs[position] = (-split).to(plan.dtype)
    return signs


def _check_intermediate(plan: Plan, intermediate: IntermediateBounds, batch: int):
    # without any tensor to hold there is no batch to count the domains by
    counted = intermediate.lower or intermediate.operator_lower
    if len(intermediate.lower) != len(plan.relu_positions) or (counted and intermediate.batch_size != batch):
        raise OptionError(
            f"intermediate bounds cover {len(intermediate.lower)} ReLU layers and {intermediate.batch_size} domains; "
            f"expected {len(plan.relu_positions)} layers and {batch} domains"
        )
    if intermediate.operator_lower and len(intermediate.operator_lower) != len(plan.operator_tensors):
        raise OptionError(
            f"intermediate bounds cover {len(intermediate.operator_lower)} tensors read by general operators; "
            f"the network has {len(plan.operator_tensors)} (or pass none)"
        )
