"""α-CROWN and β-CROWN: optimise relaxation slopes and split multipliers by projected Adam.

Every iterate gives a sound bound (any α ∈ [0, 1] is a valid lower relaxation and any β ≥ 0
a valid Lagrangian multiplier), so the best value seen for each row is kept: the result is
anytime and never looser than the CROWN bound it starts from.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch

from assay.bounds.crown import Backward, backsubstitute, concretize, rounding_scales
from assay.bounds.plan import Plan, plan_for
from assay.bounds.relaxation import relax_relu
from assay.bounds.result import LinearBounds

Objective = Callable[[LinearBounds, torch.Tensor], torch.Tensor]


def default_objective(linear: LinearBounds, lower: torch.Tensor) -> torch.Tensor:
    """Sum over rows of the concrete lower bounds: (B, S) → (B,). Larger is better."""
    return lower.sum(dim=1)


def optimize_bounds(
    plan: Plan,
    C: torch.Tensor,
    d: torch.Tensor,
    bounds,
    center: torch.Tensor,
    radius: torch.Tensor,
    *,
    deltas: dict[int, float],
    split_signs: dict[int, torch.Tensor] | None,
    iterations: int,
    lr_alpha: float,
    lr_beta: float,
    lr_decay: float,
    objective: Objective | None,
    to_linear: Callable[[Backward, torch.Tensor], LinearBounds],
    deadline: float | None = None,
    relax=relax_relu,
    initial_alphas: dict[int, torch.Tensor] | None = None,
    target: int | None = None,
    draft_dtype: torch.dtype | None = None,
    enough: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> tuple[torch.Tensor, Backward, torch.Tensor, int, dict[int, torch.Tensor]]:
    """Maximise the lower bound of each row of ``C · f(x) + d`` over α (and β where split).

    Args:
        split_signs: per ReLU position, (B, *shape) tensors with +1 for neurons split inactive,
            −1 for neurons split active, 0 elsewhere; None or empty: no β variables (α-CROWN).
        objective: maps (linear bounds, concrete lower (B, S)) to a per-domain score (B,) to
            maximise; default the sum of the lower bounds.
        to_linear: turns a Backward and its margin into LinearBounds for the objective.
        deadline: a ``time.monotonic()`` instant after which no further iteration starts
            (the best bound so far is returned: every iterate is sound).
        relax: the ReLU relaxation (default CROWN's); α replaces its lower slopes.
        initial_alphas: per ReLU position, slopes (B, S, *shape) to start from (e.g. a parent
            domain's optimised ones); values are clamped to [0, 1] (any is sound).
        target: the tensor whose rows are bounded (see :func:`backsubstitute`): the input of
            ReLU stage ``target``, or None for the network output. Only ReLU layers before it
            get slopes.
        draft_dtype: a cheaper dtype (float32) to iterate in, when ``plan`` is in a wider one: the
            Adam steps walk the network in it without rounding terms, and only the starting
            point and the best iterate of each domain are bounded in ``plan``'s dtype, which
            alone give the returned bounds. On CPU a float32 step costs about half a float64
            one; float32 bounds with their rounding terms are looser by ~10⁻² on CIFAR
            networks (oval21 cifar_base: 0.112 against 0.096), the drafted ones are not.
        enough: ``(target (B, S), settled (B,) bool)``: the iterations stop once every domain is
            settled or has a row whose sound lower bound exceeds its target (see
            :func:`_past`), the starting point included. In a draft, the draft's bounds of each
            domain's best iterate only propose the stop: it is taken when the bounds of those
            iterates in ``plan``'s dtype (the ones returned) confirm it, and the iterations go
            on otherwise (the next proposal is considered after as many iterations again as
            were done, so that failed confirmations cost a bounded share). None: all iterations.
    Returns:
        (best lower (B, S) elementwise over iterations, Backward at the best objective per
        domain, its margin, iterations run, the α of that Backward per ReLU position — and,
        under ``("operator", position, k)`` keys, the parameters of general operators'
        relaxations, which start where CROWN has them: ``rule.alpha_start(k)``).
    """
    objective = objective or default_objective
    target = len(plan.stages) if target is None else target
    batch, rows = C.shape[:2]
    alphas: dict[int, torch.Tensor] = {}
    relaxations = {p: relax(*bounds[p]) for p in plan.relu_positions if p < target}
    scales = rounding_scales(plan, target, bounds)  # the same for every iterate
    initial_alphas = initial_alphas or {}
    for position, relaxation in relaxations.items():
        if relaxation.unstable.any():
            init = relaxation.lower_slope.unsqueeze(1).expand(batch, rows, *relaxation.lower_slope.shape[1:])
            if position in initial_alphas:
                given = initial_alphas[position].to(init.dtype).clamp(0.0, 1.0)
                init = torch.where(relaxation.unstable.unsqueeze(1), given.expand_as(init), init)
            alphas[position] = init.clone().requires_grad_(True)
    # the free parameters of general operators' relaxations: ("operator", position, k) keys
    for position in plan.parametrised_operators:
        if position < target:
            stage = plan.stages[position]
            for k in range(stage.rule.alpha_tensors()):
                alphas[("operator", position, k)] = torch.full((batch, rows, *stage.out_shape), stage.rule.alpha_start(k),
                                                               dtype=C.dtype, requires_grad=True)
    betas: dict[int, torch.Tensor] = {}
    split_signs = split_signs or {}
    for position, signs in split_signs.items():
        if position < target and (signs != 0).any():
            betas[position] = torch.zeros(batch, rows, *signs.shape[1:], dtype=C.dtype, requires_grad=True)

    exact = _evaluator(plan, target, C, d, bounds, deltas, relaxations, scales, center, radius, split_signs)
    with torch.no_grad():
        best_back, best_lower, best_margin = exact(alphas, betas)
        best_score = objective(to_linear(best_back, best_margin), best_lower)
        best_alphas = {p: a.detach().clone() for p, a in alphas.items()}
    if not (alphas or betas) or iterations == 0 or _past(best_lower, enough):
        return best_lower, best_back, best_margin, 0, best_alphas
    if draft_dtype is not None and draft_dtype != plan.dtype:
        return _drafted(plan, target, C, d, bounds, deltas, split_signs, center, radius, relax, alphas, betas,
                        iterations, lr_alpha, lr_beta, lr_decay, objective, to_linear, deadline, draft_dtype,
                        exact, (best_back, best_lower, best_margin, best_score), enough)

    done = 0
    for back, lower, margin, score in _adam_steps(alphas, betas, exact, objective, to_linear, iterations,
                                                  lr_alpha, lr_beta, lr_decay, deadline):
        done += 1
        with torch.no_grad():
            best_lower = torch.maximum(best_lower, lower.detach())
            improved = score > best_score
            if improved.any():
                best_score = torch.where(improved, score, best_score)
                best_back = _select(improved, back, best_back)
                best_margin = torch.where(improved.unsqueeze(1), margin.detach(), best_margin)
                _keep_improved(best_alphas, alphas, improved)
        if done < iterations and _past(best_lower, enough):
            # every iterate is bounded in plan's dtype: these bounds are the ones returned (after
            # the last iteration the final iterate is bounded as without `enough`)
            return best_lower, best_back, best_margin, done, best_alphas
    with torch.no_grad():
        back, lower, margin = exact(alphas, betas)
        best_lower = torch.maximum(best_lower, lower)
        score = objective(to_linear(back, margin), lower)
        improved = score > best_score
        best_back = _select(improved, back, best_back)
        best_margin = torch.where(improved.unsqueeze(1), margin, best_margin)
        _keep_improved(best_alphas, alphas, improved)
    return best_lower, best_back, best_margin, done, best_alphas


def _past(lower: torch.Tensor, enough: tuple[torch.Tensor, torch.Tensor] | None) -> bool:
    """Whether every domain is settled or has a row whose lower bound (B, S) exceeds its target
    (``enough`` as for :func:`optimize_bounds`; None: never)."""
    if enough is None:
        return False
    target, settled = enough
    return bool(((lower.detach().to(target.dtype) > target).any(1) | settled).all())


def _evaluator(plan, target, C, d, bounds, deltas, relaxations, scales, center, radius, split_signs,
               rounding: bool = True):
    """The bound of the rows for given slopes and split multipliers: (α, β) → (Backward, lower, margin)."""

    def evaluate(alphas, betas):
        signed = {p: betas[p].clamp(min=0) * split_signs[p].unsqueeze(1) for p in betas}
        slopes = {p: a.clamp(0.0, 1.0) for p, a in alphas.items() if isinstance(p, int)}
        operator_alphas: dict[int, list] = {}
        for key, a in alphas.items():  # ("operator", position, k), in k order
            if not isinstance(key, int):
                operator_alphas.setdefault(key[1], []).append(a.clamp(0.0, 1.0))
        back = backsubstitute(plan, target, C, d, bounds, deltas, slopes, signed, relaxations, scales=scales,
                              rounding=rounding, operator_alphas={p: tuple(v) for p, v in operator_alphas.items()})
        lower, margin = concretize(plan, back, center, radius)
        return back, lower, margin

    return evaluate


def _drafted(plan, target, C, d, bounds, deltas, split_signs, center, radius, relax, alphas, betas, iterations,
             lr_alpha, lr_beta, lr_decay, objective, to_linear, deadline, draft_dtype, exact, start, enough=None):
    """:func:`optimize_bounds` iterating in ``draft_dtype``: Adam on copies of α and β in it, the
    draft walks skip rounding terms (they only rank iterates); each domain's best draft iterate
    is then bounded by ``exact`` (``plan``'s dtype, rounding charged) and kept where it beats
    the start ``(back, lower, margin, score)``. Only ``exact``'s values are returned. The slopes
    returned are each domain's best draft iterate, also where the start's Backward is kept: they
    only warm-start later calls (any slope in [0, 1] is sound), and the best draft is the better
    start on the rows the draft improved. With ``enough``, the draft bounds of the kept iterates
    propose a stop and ``exact``'s bounds of them confirm it (see :func:`optimize_bounds`)."""
    cast = lambda t: t.to(draft_dtype)  # noqa: E731
    draft_plan = plan_for(plan.network, draft_dtype)
    draft_bounds = [(cast(lower), cast(upper)) for lower, upper in bounds]
    draft_relaxations = {p: relax(*draft_bounds[p]) for p in plan.relu_positions if p < target}
    draft = _evaluator(draft_plan, target, cast(C), cast(d), draft_bounds, deltas, draft_relaxations, None,
                       cast(center), cast(radius), {p: cast(s) for p, s in split_signs.items()}, rounding=False)
    alphas = {p: cast(a.detach()).requires_grad_(True) for p, a in alphas.items()}
    betas = {p: cast(b.detach()).requires_grad_(True) for p, b in betas.items()}
    kept_alphas = {p: a.detach().clone() for p, a in alphas.items()}
    kept_betas = {p: b.detach().clone() for p, b in betas.items()}
    kept_score = kept_lower = None
    done, next_proposal = 0, 1
    for _, draft_lower, _, score in _adam_steps(alphas, betas, draft, objective, to_linear, iterations,
                                                lr_alpha, lr_beta, lr_decay, deadline):
        done += 1
        with torch.no_grad():
            improved = score > kept_score if kept_score is not None else torch.ones_like(score, dtype=torch.bool)
            kept_score = score if kept_score is None else torch.where(improved, score, kept_score)
            draft_lower = draft_lower.detach()
            kept_lower = draft_lower if kept_lower is None else torch.where(improved.unsqueeze(1), draft_lower,
                                                                            kept_lower)
            _keep_improved(kept_alphas, alphas, improved)
            _keep_improved(kept_betas, betas, improved, low=0.0, high=None)
        if done >= next_proposal and done < iterations and _past(kept_lower, enough):
            # The draft proposes to stop: its kept iterates are bounded in plan's dtype (the
            # bounds that would be returned anyway) and the stop is taken only if those confirm it.
            confirmed = _exact_of_kept(plan, exact, objective, to_linear, start, kept_alphas, kept_betas)
            if _past(confirmed[0], enough):
                return (*confirmed[:3], done, confirmed[3])
            next_proposal = 2 * done
    final = _exact_of_kept(plan, exact, objective, to_linear, start, kept_alphas, kept_betas)
    return (*final[:3], done, final[3])


def _exact_of_kept(plan, exact, objective, to_linear, start, kept_alphas, kept_betas):
    """The draft's kept iterates bounded by ``exact``, each domain's better of them and the start
    ``(back, lower, margin, score)``: (back, lower, margin, slopes), as :func:`_drafted` returns
    them (less the iteration count)."""
    best_back, best_lower, best_margin, best_score = start
    with torch.no_grad():
        back, lower, margin = exact({p: a.to(plan.dtype) for p, a in kept_alphas.items()},
                                    {p: b.to(plan.dtype) for p, b in kept_betas.items()})
        score = objective(to_linear(back, margin), lower)
        improved = score > best_score
        best_lower = torch.maximum(best_lower, lower)  # both bounds are sound
        best_back = _select(improved, back, best_back)
        best_margin = torch.where(improved.unsqueeze(1), margin, best_margin)
        best_alphas = {p: a.to(plan.dtype) for p, a in kept_alphas.items()}
    return best_lower, best_back, best_margin, best_alphas


def _adam_steps(alphas, betas, evaluate, objective, to_linear, iterations, lr_alpha, lr_beta, lr_decay, deadline):
    """Adam on ``alphas`` (kept in [0, 1]) and ``betas`` (kept ≥ 0), in place: yields each
    iterate's (Backward, lower, margin, score) before stepping from it; stops after
    ``iterations`` steps or at ``deadline``."""
    groups = [group for group in ({"params": list(alphas.values()), "lr": lr_alpha},
                                  {"params": list(betas.values()), "lr": lr_beta}) if group["params"]]
    optimizer = Adam(groups, lr_decay)
    for _ in range(iterations):
        if deadline is not None and time.monotonic() > deadline:
            return
        optimizer.zero_grad()
        back, lower, margin = evaluate(alphas, betas)
        score = objective(to_linear(back, margin), lower)
        if not score.requires_grad:
            # no parameter reaches the rows (every neuron and operator they cross is fixed on
            # these bounds, e.g. a root whose earlier layers are all stable): one iterate is all
            yield back, lower, margin, score.detach()
            return
        (-score.sum()).backward()
        yield back, lower, margin, score.detach()
        optimizer.step()
        with torch.no_grad():
            for a in alphas.values():
                a.clamp_(0.0, 1.0)
            for beta in betas.values():
                beta.clamp_(min=0.0)


def _keep_improved(best: dict, current: dict, improved: torch.Tensor, low: float | None = 0.0,
                   high: float | None = 1.0) -> None:
    """Copy the current α (or β: ``high=None``) of the domains whose objective improved into
    ``best`` (in place), clamped to their feasible range."""
    for position, value in current.items():
        mask = improved.view(-1, *([1] * (value.dim() - 1)))
        best[position] = torch.where(mask, value.detach().clamp(low, high), best[position])


class Adam:
    """Adam (Kingma & Ba; torch.optim.Adam's defaults and update) with an exponential decay of
    each group's learning rate after every step.

    Written out because creating the first ``torch.optim`` optimizer of a process imports
    ``torch._dynamo`` (~2 s): every verification's first α-CROWN pass would pay it, against a
    timeout the user set. The iterates only choose relaxations, so any update rule is sound.
    """

    def __init__(self, groups: list[dict], decay: float, betas=(0.9, 0.999), eps: float = 1e-8):
        self.groups = [{"params": list(g["params"]), "lr": float(g["lr"])} for g in groups]
        self.decay, self.betas, self.eps, self.steps = decay, betas, eps, 0
        self.moments = {id(p): (torch.zeros_like(p), torch.zeros_like(p)) for g in self.groups for p in g["params"]}

    def zero_grad(self) -> None:
        for group in self.groups:
            for p in group["params"]:
                p.grad = None

    @torch.no_grad()
    def step(self) -> None:
        self.steps += 1
        beta1, beta2 = self.betas
        correction1 = 1 - beta1 ** self.steps
        correction2 = (1 - beta2 ** self.steps) ** 0.5
        for group in self.groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                mean, square = self.moments[id(p)]
                mean.lerp_(p.grad, 1 - beta1)
                square.mul_(beta2).addcmul_(p.grad, p.grad, value=1 - beta2)
                p.addcdiv_(mean, (square.sqrt() / correction2).add_(self.eps), value=-group["lr"] / correction1)
            group["lr"] *= self.decay


def _select(mask: torch.Tensor, new: Backward, old: Backward) -> Backward:
    def pick(a, b):
        m = mask.view(-1, *([1] * (a.dim() - 1)))
        return torch.where(m, a.detach(), b)

    return Backward(pick(new.A, old.A), pick(new.b, old.b), pick(new.error, old.error))
