"""Backward substitution of linear bounds (CROWN, Zhang et al., NeurIPS 2018).

Given spec rows ``C`` (B, S, *target_shape) and offsets ``d`` (B, S) on tensor ``target``
(the input of a ReLU stage, or the network output), :func:`backsubstitute` walks the stages
backwards and returns ``A`` (B, S, *input_shape) and ``b`` (B, S) such that for every x in
the domain

    C · h_target(x) + d  ≥  A · x + b

using, at each ReLU, the relaxation of :mod:`assay.bounds.relaxation` (optionally with per-row
optimised lower slopes α and split multipliers β, see β-CROWN, Wang et al., NeurIPS 2021).
Upper bounds are lower bounds of the negated rows. Over a graph, the coefficients that reach a
tensor from several consumers (a residual connection) are summed before that tensor's own
stage is crossed, so every stage is crossed once.

Rounding is charged where it happens, never through products of absolute weights (those grow
geometrically with depth and, in float32, swamp the bound). Crossing an affine stage computes
P = A·W with |P − A·W| ≤ γ_fan·|A|·|W| elementwise; the stage's input z lies within the
magnitude m_z = max(|l_z|, |u_z|) of its sound bounds, so using P instead of A·W moves the
bound by at most γ_fan·|A|·(|W|·m_z). A ReLU's slope product (and a split multiplier's sum)
rounds each coefficient by at most u of itself, which moves the bound by at most 2u·|A'|·m_y.
A max-pooling stage only moves coefficients (exact, unless overlapping windows sum them: one
rounding per extra window, as for summed consumers) and adds a·max_j u_j into ``b``.
These terms, and γ_b times the magnitude of every term added into ``b`` (its own rounded sum),
add up in ``Backward.error``, charged once per stage on the final coefficients of each tensor.

The offset ``b`` is accumulated in float64 whatever the working dtype, and its two largest
kinds of terms, the ReLU intercepts Σ A⁻·intercept and the biases Σ A·bias, are dot products
taken in float64 (a product of two float32 numbers is exact there), so each such sum of at most
``sum_terms`` products errs by at most γ_b⁶⁴ = γ(sum_terms, float64) times its absolute products. In
float32 this charge is ~10⁹ times smaller than γ(sum_terms, float32), which on a 52×52
convolutional network (43,264-element tensors, γ ≈ 5·10⁻³) was most of the bound's looseness.
Other terms (max-pooling constants, general operators' offsets, weight-perturbation radii, a
cut's offset) are still computed in the working dtype and charged γ_b of that dtype. The
float64 ``b`` is returned in the working dtype, rounded to nearest: at most u·|b| (charged as
2u·|b|).
:func:`concretize` subtracts error + γ_n·(|A|·(|c| + r) + |b|), so
the bound holds for the exact network whatever the dtype.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from assay.bounds.plan import Plan, accumulate, gamma, unit_roundoff
from assay.bounds.relaxation import ReluRelaxation, relax_relu
from assay.bounds.rounding import capped_magnitude as _magnitude


@dataclass(eq=False)
class Backward:
    """The linear lower bound of C·h + d as ``A·x + b``, and the rounding it owes.

    ``error`` (B, S): the summed local rounding terms of the walk, those of ``b``'s own sum
    included (already scaled, see the module docstring).
    """

    A: torch.Tensor
    b: torch.Tensor
    error: torch.Tensor


def _dot(A: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Σ over the trailing dims of A (B or 1, S, *shape) times v (B or 1, *shape) → (B, S)."""
    flat_A = A.reshape(A.shape[0], A.shape[1], -1)
    return flat_A.matmul(v.reshape(v.shape[0], -1, 1)).squeeze(-1)


def _abs_dot(A: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """``|A|·v`` for a rounding term: no gradient (the optimised methods only need the bound's)."""
    return _dot(A.detach().abs(), v)


def backsubstitute(
    plan: Plan,
    target: int,
    C: torch.Tensor,
    d: torch.Tensor,
    bounds: list[tuple[torch.Tensor, torch.Tensor]],
    deltas: dict[int, float] | None = None,
    slopes: dict[int, torch.Tensor] | None = None,
    betas: dict[int, torch.Tensor] | None = None,
    relaxations: dict[int, ReluRelaxation] | None = None,
    relax=relax_relu,
    observe=None,
    scales: dict[int, torch.Tensor] | None = None,
    rounding: bool = True,
    forks: dict[int, tuple[torch.Tensor, torch.Tensor]] | None = None,
    operator_alphas: dict[int, tuple[torch.Tensor, ...]] | None = None,
    observe_outputs=None,
    cut=None,
    reduce=None,
    stops=(),
) -> Backward:
    """Lower linear bound of ``C · (input of stage target) + d`` in terms of the network input.

    Args:
        plan: stages in the working dtype.
        target: the tensor bounded: the input of ReLU stage ``target``, or ``len(plan.stages)``
            for the output.
        C: (B, S, *shape) rows; d: (B, S).
        bounds: ``bounds[t]`` = (lower, upper) of tensor t, for t < target; ReLU inputs must
            already include split clamping. Sound bounds: the rounding terms rest on them.
        deltas: weight-perturbation radius per stage position.
        slopes: per ReLU position, lower slopes (B, S, *shape) to use on unstable neurons
            (values in [0, 1]); absent: CROWN's adaptive choice.
        betas: per ReLU position, signed split multipliers (B, S, *shape): +β on neurons split
            inactive (z ≤ 0), −β on neurons split active (z ≥ 0), 0 elsewhere.
        relaxations: per ReLU position, the relaxation of ``bounds`` if already computed.
        relax: the ReLU relaxation for the others (default CROWN's, :func:`relax_relu`).
        observe: optional ``observe(position, A)``, called at each ReLU stage the rows reach with
            the coefficients on its input just after crossing it (before split multipliers):
            how much each neuron's relaxation weighs in the bound (branching heuristics read it).
        scales: :func:`rounding_scales` of these bounds, when a caller walks them many times.
        rounding: False skips the rounding terms (``error`` stays zero): for callers
            that read the coefficients only, and need only the ReLU inputs' bounds.
        forks: per ReLU position, ``(index, slope)`` (B, n) each: just before that stage is
            crossed, n copies of the walk's first S rows (the rows of ``C``) join the walk, and
            copy c crosses the neuron at flat index ``index[:, c]`` (−1: none) as a stable ReLU
            of ``slope[:, c]`` (1: z ≥ 0, 0: z ≤ 0) instead of by its relaxation. Such a row
            bounds the part of the domain where that neuron has that sign (a ReLU split's child:
            every other relaxation stays valid on it), so one walk bounds many children. Rows that
            differ only from that stage down are then walked only from there (children split
            in early layers cost a fraction of a whole walk). The result has S·(1 + Σ n) rows: the
            first S, then each fork's copies in the order of the stages crossed (the output's
            end first), copy-major. Slopes and split multipliers of a position must have as many
            rows as the walk has there. Rounding terms are not charged for forked rows (use with
            ``rounding=False``).
        operator_alphas: per general operator's stage position, the free parameters of its rule's
            relaxation (a tuple of tensors in [0, 1]; absent: the rule's default choice).
        observe_outputs: optional ``observe_outputs(position, A)``, called at each ReLU stage and
            non-linear general operator the rows reach, with the coefficients on its *output*
            just before crossing it (how much the looseness of its relaxation costs each row:
            the general split's branching scores read it).
        cut: a :class:`~assay.bounds.forward.Cut`: the walk stops at its tensor (one every path
            from the input to ``target`` crosses) and substitutes that tensor's forward linear
            bounds in the input (:meth:`Cut.substitute`), instead of crossing the stages before it.
        reduce: grouped rows (:class:`~assay.bounds.grouped_rows.GroupedRows`): ``C`` holds
            groups of rows whose receptive fields are disjoint, and every sum over a tensor's
            elements (into ``b`` and ``error``) is ``reduce(tensor, products)``, per real row:
            ``d``, ``b`` and ``error`` then have the real rows (B, R). Convolutions, ReLUs and
            additions only; with :func:`concretize`'s ``reduce``.
        stops: tensors that depend on no input the domains let vary (constants, see
            :func:`~assay.bounds.forward.forward_bounds`): coefficients reaching one whose
            ``bounds`` are finite are concretised there against its interval (``A·z ≥ A⁺·l + A⁻·u``)
            instead of being carried through the stages before it. For a constant that interval
            is as tight as any linear function could make it (up to rounding), and the walk skips
            every stage only constants reach (mscn: 5 of its 6 set blocks per box).
    """
    if forks and rounding:
        raise ValueError("backsubstitute: forks need rounding=False (their rows owe no rounding terms)")
    if reduce is not None and (forks or cut is not None or slopes or betas):
        raise ValueError("backsubstitute: grouped rows (reduce) take no forks, cut, slopes or betas")
    if rounding and scales is None:
        scales = rounding_scales(plan, target, bounds)
    if stops and (forks or reduce is not None or cut is not None):
        raise ValueError("backsubstitute: stops take no forks, grouped rows or cut")
    walk = _Walk(plan, bounds, C, d, rounding, scales, deltas or {}, slopes or {}, betas or {}, relaxations or {},
                 relax, observe, forks or {}, operator_alphas or {}, observe_outputs, reduce)
    walk.stops = frozenset(stops)
    walk.pending = {target: (C,)}
    walk.received = {target: 1}
    if target in walk.stops and walk._finite(target):  # the rows' tensor itself is a constant
        walk.pending, walk.received = {}, {}
        walk._concretize_constant(target, C)
    stop = 0 if cut is None else cut.tensor
    # whether a stage may send coefficients straight to the input (see OperatorStage): the walk
    # runs to it, with its rows as given
    walk.reaches_input = stop == 0 and not forks and reduce is None
    for position in range(target - 1, stop - 1, -1):
        if position + 1 not in walk.pending:
            continue  # the stage's output does not reach the target
        (A,) = walk.pending.pop(position + 1)
        plan.stages[position].crown_step(walk, position, A)
    if stop not in walk.pending:  # every path ended at a constant (stops): nothing on the input
        walk.pending[stop] = (C.new_zeros(C.shape[0], C.shape[1], *bounds[stop][0].shape[1:]),)
    (A,) = walk.pending.pop(stop)
    if walk.pending:  # a cut must be crossed by every path (see Cut): nothing else may be waiting
        raise ValueError(f"backsubstitute: tensor {stop} is not a cut of the walk from {target}")
    if rounding:
        walk.error = walk.settle(stop, A, None)
    if cut is not None:
        A, offset, owed = cut.substitute(A, rounding)
        walk.b = walk.b + offset
        walk.error = walk.error + owed + (walk.gamma_b * offset.detach().abs() if rounding else 0.0)
    b = walk.b.to(d.dtype)
    if rounding and b.dtype != torch.float64:  # b rounded to the working dtype: at most u·|b|
        walk.error = walk.error + 2 * walk.u * b.detach().abs()
    return Backward(A, b, walk.error)


class _Walk:
    """The state of one backward walk: the offset ``b``, the rounding owed so far, the
    coefficients waiting on each tensor, and the per-walk options of :func:`backsubstitute`.

    Rounding is charged per tensor (``charges``: the rounding owed per unit of |coefficient| on
    it) once its coefficients are final: one |A|·v per stage instead of one per rounding step.
    """

    def __init__(self, plan, bounds, C, d, rounding, scales, deltas, slopes, betas, relaxations, relax, observe,
                 forks, operator_alphas, observe_outputs=None, reduce=None):
        self.plan, self.bounds, self.rounding, self.scales = plan, bounds, rounding, scales
        self.reduce = reduce
        self.observe_outputs = observe_outputs
        self.deltas, self.slopes, self.betas, self.relaxations = deltas, slopes, betas, relaxations
        self.relax, self.observe, self.forks, self.operator_alphas = relax, observe, forks, operator_alphas
        self.fixed: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}  # per ReLU position, the rows' fixed neurons
        self.spec_rows = C.shape[1]
        self.u = unit_roundoff(plan.dtype)
        self.gamma_b = gamma(plan.sum_terms, plan.dtype)  # a term's share of the rounding of the sum b
        # the share of a term summed in float64; b itself is a float64 sum
        self.gamma_b64 = gamma(plan.sum_terms, torch.float64)
        # the share of a term of exact_dot: its product rounded once in the working dtype, then
        # summed in float64
        self.gamma_exact = self.u + self.gamma_b64 * (1 + self.u)
        self.b = d.to(torch.float64)
        self.error = self.gamma_b64 * d.abs() if rounding else torch.zeros_like(d)
        self.pending: dict = {}
        self.received: dict[int, int] = {}  # how many consumers' coefficients were summed into each tensor
        self.charges: dict[int, torch.Tensor] = {}
        self.stops: frozenset[int] = frozenset()  # constants: concretised where reached (backsubstitute's stops)
        self.finite: dict[int, bool] = {}

    def send(self, tensor: int, A: torch.Tensor) -> None:
        if tensor in self.stops and self._finite(tensor):
            self._concretize_constant(tensor, A)
            return
        accumulate(self.pending, tensor, (A,))
        self.received[tensor] = self.received.get(tensor, 0) + 1

    def _finite(self, tensor: int) -> bool:
        """Whether a stop's bounds are all finite (an infinite one is walked through instead: its
        interval would make the offset −inf or, times a zero coefficient, NaN). One sum per stop
        reached, not a test per element: any ±inf or NaN makes the sum non-finite."""
        if tensor not in self.finite:
            low, high = self.bounds[tensor]
            self.finite[tensor] = bool(torch.isfinite(low.sum() + high.sum()))
        return self.finite[tensor]

    def _concretize_constant(self, tensor: int, A: torch.Tensor) -> None:
        """Coefficients ``A`` on a stop (a constant of finite bounds [l, u]): ``A·z ≥ A⁺·l + A⁻·u``
        goes into ``b`` (a float64 sum, charged γ_b⁶⁴ of its absolute products, as the ReLU
        intercepts are), with the rounding charged on this tensor so far (this consumer's
        crossing, e.g. a ReLU's slope products)."""
        low, high = self.bounds[tensor]
        if self.rounding:
            own = self.gamma_b64 * _magnitude(low, high)
            vector = self.charges.pop(tensor, None)
            self.error = self.error + self.abs_dot(tensor, A, own if vector is None else vector + own)
        self.b = self.b + self.exact_dot(tensor, A.clamp(min=0), low) + self.exact_dot(tensor, A.clamp(max=0), high)

    def dot(self, tensor: int, A: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """Σ over ``tensor``'s elements of A (B, S, *shape) times v (B or 1, *shape), per row."""
        if self.reduce is None:
            return _dot(A, v)
        return self.reduce(tensor, A * v.unsqueeze(1))

    def exact_dot(self, tensor: int, A: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """:meth:`dot` summed in float64 (for ``b``): each product rounds once in the working
        dtype, the sum in float64, so its rounding is at most ``gamma_exact`` times Σ|products|
        (charge that). Casting the products as they are summed, rather than A beforehand, spares
        a float64 copy of A: on cctsdb's and yolo's convolutions those copies were a sixth of a
        CROWN pass."""
        products = A * v.unsqueeze(1)
        if self.reduce is None:
            return products.reshape(products.shape[0], products.shape[1], -1).sum(-1, dtype=torch.float64)
        return self.reduce(tensor, products, dtype=torch.float64)

    def abs_dot(self, tensor: int, A: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """``|A|·v`` per row for a rounding term (no gradient)."""
        return self.dot(tensor, A.detach().abs(), v)

    def charge(self, tensor: int, vector) -> None:
        self.charges[tensor] = self.charges[tensor] + vector if tensor in self.charges else vector

    def settle(self, tensor: int, A: torch.Tensor, own) -> torch.Tensor:
        """The error owed by the final coefficients A on ``tensor``: the charges deposited on it,
        the summing of k consumers' coefficients (k − 1 roundings of at most u of the sum each),
        and ``own`` (the stage about to be crossed)."""
        vector = self.charges.pop(tensor, None)
        extra = self.received.get(tensor, 1) - 1
        if extra > 0:
            summed = 2 * extra * self.u * _magnitude(*self.bounds[tensor])
            vector = summed if vector is None else vector + summed
        if own is not None:
            vector = own if vector is None else vector + own
        return self.error if vector is None else self.error + self.abs_dot(tensor, A, vector)

    def require_ungrouped(self, stage) -> None:
        """Grouped rows (``reduce``) cross convolutions, ReLUs and additions only."""
        if self.reduce is not None:
            raise ValueError(f"backsubstitute: grouped rows (reduce) do not cross a {type(stage).__name__} stage")


def rounding_scales(plan: Plan, target: int, bounds) -> dict[int, torch.Tensor]:
    """Per affine stage with weights before ``target``: its
    :meth:`~assay.bounds.stages.AffineStage.rounding_scale` (|W|·m of its input), the factor its
    rounding term multiplies |A| by. Depends on the bounds, not on the rows."""
    return {position: stage.rounding_scale(bounds) for position, stage in enumerate(plan.stages[:target])
            if stage.weighted}


def concretize(plan: Plan, back: Backward, center: torch.Tensor, radius: torch.Tensor,
               reduce=None) -> tuple[torch.Tensor, torch.Tensor]:
    """Lowest value of ``A·x + b`` over the box [center ± radius], never above the exact one.

    Returns the lower bound (B, S) and the rounding margin (B, S) already subtracted from it
    (the margin also makes ``b - margin`` a sound offset for the linear bound itself).
    ``reduce``: the walk's grouped rows (see :func:`backsubstitute`): the sums over the input
    are per real row.
    """
    if reduce is not None:
        c = center.reshape(center.shape[0], 1, *center.shape[1:])
        r = radius.reshape(radius.shape[0], 1, *radius.shape[1:])
        A = back.A
        value = reduce(0, A * c - A.abs() * r) + back.b
        with torch.no_grad():
            n = math.prod(center.shape[1:])
            evaluation = gamma(n + 2, plan.dtype) * (reduce(0, A.detach().abs() * (c.abs() + r)) + back.b.detach().abs())
            margin = evaluation + back.error
        return value - margin, margin
    flat = lambda t: t.reshape(t.shape[0], t.shape[1], -1)  # noqa: E731
    c = center.reshape(center.shape[0], 1, -1)
    r = radius.reshape(radius.shape[0], 1, -1)
    A = flat(back.A)
    value = (A * c).sum(-1) - (A.abs() * r).sum(-1) + back.b
    with torch.no_grad():
        evaluation = gamma(c.shape[-1] + 2, plan.dtype) * (
            A.detach().abs().matmul((c.abs() + r).transpose(1, 2)).squeeze(-1) + back.b.detach().abs())
        margin = evaluation + back.error
    return value - margin, margin
