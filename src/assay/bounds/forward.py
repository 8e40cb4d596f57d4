"""Forward linear bounds of intermediate layers (forward-mode LiRPA; cf. Neurify's symbolic intervals).

Each neuron carries a lower and an upper linear function of the input,

    a_lo · x + c_lo − e_lo  ≤  z(x)  ≤  a_hi · x + c_hi + e_hi      for every x in the domain,

pushed forward layer by layer: affine layers combine them by the signs of the weights, and a
ReLU applies CROWN's relaxation (:mod:`assay.bounds.relaxation`) to the neuron's concrete
bounds. The cost per layer is that of the layer times the number of input elements, so for
networks with few inputs (ACAS Xu has 5) it is far cheaper than backward substitution, which
costs the whole prefix of the network for every unstable neuron — at the price of looser
bounds. Branch and bound over the input reuses the parent's (backward) bounds, which keeps
the loss small.

Rounding: ``e_lo``/``e_hi`` ≥ 0 are error budgets in exact arithmetic: each step adds the
floating-point error bound of its sums (Higham §3.1) times the magnitudes involved, so the
stated inequality holds for the computed coefficients evaluated exactly; concretisation then
subtracts its own rounding bound. Splits and known bounds enter through ``clamp``.
"""

from __future__ import annotations

import torch

from assay.bounds.plan import AddStage, AffineStage, Plan, ReluStage, unit_roundoff
from assay.bounds.relaxation import relax_relu

# Above this many input elements the coefficient tensors (B, inputs, *shape) get too large.
MAX_FORWARD_INPUTS = 256


class _LinearFunctions:
    """Coefficients (B, n_in, *shape), constants (B, *shape) and error budgets of both sides."""

    def __init__(self, a_lo, c_lo, e_lo, a_hi, c_hi, e_hi):
        self.a_lo, self.c_lo, self.e_lo = a_lo, c_lo, e_lo
        self.a_hi, self.c_hi, self.e_hi = a_hi, c_hi, e_hi

    def magnitude(self, input_magnitude: torch.Tensor) -> torch.Tensor:
        """≥ |a·x| + |c| of both sides over the domain: (B, *shape)."""
        coeff = torch.maximum(self.a_lo.abs(), self.a_hi.abs())
        mag = input_magnitude.reshape(*input_magnitude.shape, *([1] * (coeff.dim() - 2)))
        return (coeff * mag).sum(1) + torch.maximum(self.c_lo.abs(), self.c_hi.abs())


def _apply(stage: AffineStage, tensor: torch.Tensor, weight, bias=None) -> torch.Tensor:
    """The stage's map on a tensor whose leading dims (B, k) are both batch dims."""
    lead = tensor.shape[:2]
    flat = tensor.reshape(lead[0] * lead[1], *stage.in_shape)
    return stage.forward(flat, weight, bias).reshape(*lead, *stage.out_shape)


def _affine(stage: AffineStage, f: _LinearFunctions, input_magnitude) -> _LinearFunctions:
    if stage.kind == "flatten":
        reshape = lambda t, lead: t.reshape(*t.shape[:lead], *stage.out_shape)  # noqa: E731
        return _LinearFunctions(reshape(f.a_lo, 2), reshape(f.c_lo, 1), reshape(f.e_lo, 1),
                                reshape(f.a_hi, 2), reshape(f.c_hi, 1), reshape(f.e_hi, 1))
    positive, negative = stage.weight.clamp(min=0), stage.weight.clamp(max=0)
    u = unit_roundoff(f.c_lo.dtype)
    gamma = 2.0 * (2 * stage.fan + 4) * u
    a_lo = _apply(stage, f.a_lo, positive) + _apply(stage, f.a_hi, negative)
    a_hi = _apply(stage, f.a_hi, positive) + _apply(stage, f.a_lo, negative)
    c_lo = stage.forward(f.c_lo, positive, stage.bias) + stage.forward(f.c_hi, negative)
    c_hi = stage.forward(f.c_hi, positive, stage.bias) + stage.forward(f.c_lo, negative)
    # Errors: the inherited budgets through |W|, plus this step's rounding of coefficients and
    # constants (each entry is a sum of at most 2·fan products) over the domain.
    absolute = stage.abs_weight
    rounding = gamma * (stage.forward(f.magnitude(input_magnitude), absolute, stage.bias.abs()))
    e_lo = (stage.forward(f.e_lo, positive) - stage.forward(f.e_hi, negative)) * (1 + gamma) + rounding
    e_hi = (stage.forward(f.e_hi, positive) - stage.forward(f.e_lo, negative)) * (1 + gamma) + rounding
    return _LinearFunctions(a_lo, c_lo, e_lo, a_hi, c_hi, e_hi)


def _relu(f: _LinearFunctions, lower, upper, input_magnitude) -> _LinearFunctions:
    relax = relax_relu(lower, upper)
    # Lower side: slope 0 or 1 (CROWN's adaptive choice), exact in floating point.
    keep = relax.lower_slope
    # Upper side: s·(upper function) + t with s ≥ 0; rounding of the products is budgeted.
    slope, intercept = relax.upper_slope, relax.upper_intercept
    u = unit_roundoff(lower.dtype)
    expand = lambda t: t.unsqueeze(1)  # noqa: E731
    a_hi = f.a_hi * expand(slope)
    c_hi = f.c_hi * slope + intercept
    coeff_mag = (f.a_hi.abs() * input_magnitude.reshape(*input_magnitude.shape, *([1] * (f.a_hi.dim() - 2)))).sum(1)
    e_hi = f.e_hi * slope * (1 + 2 * u) + 4 * u * (slope * (coeff_mag + f.c_hi.abs()) + intercept.abs())
    return _LinearFunctions(f.a_lo * expand(keep), f.c_lo * keep, f.e_lo * keep, a_hi, c_hi, e_hi)


def _add(f: _LinearFunctions, g: _LinearFunctions, input_magnitude) -> _LinearFunctions:
    """The sum of two tensors' linear functions (a residual connection).

    The computed coefficient and constant sums are each within u·|sum| of the exact ones, so the
    budgets grow by 4u times both magnitudes (generous for the budgets' own rounding).
    """
    u = unit_roundoff(f.c_lo.dtype)
    rounding = 4 * u * (f.magnitude(input_magnitude) + g.magnitude(input_magnitude))
    return _LinearFunctions(f.a_lo + g.a_lo, f.c_lo + g.c_lo, (f.e_lo + g.e_lo) * (1 + 4 * u) + rounding,
                            f.a_hi + g.a_hi, f.c_hi + g.c_hi, (f.e_hi + g.e_hi) * (1 + 4 * u) + rounding)


def _concretize(f: _LinearFunctions, center, radius, input_magnitude):
    """Sound concrete bounds (lower, upper) of the stage input described by ``f``."""
    extra = f.a_lo.dim() - 2
    c = center.reshape(*center.shape, *([1] * extra))
    r = radius.reshape(*radius.shape, *([1] * extra))
    low = (f.a_lo * c).sum(1) - (f.a_lo.abs() * r).sum(1) + f.c_lo - f.e_lo
    high = (f.a_hi * c).sum(1) + (f.a_hi.abs() * r).sum(1) + f.c_hi + f.e_hi
    n = center.shape[1]
    u = unit_roundoff(center.dtype)
    margin = 4.0 * (n + 4) * u * (f.magnitude(input_magnitude) + f.e_lo + f.e_hi)
    return low - margin, high + margin


def forward_bounds(plan: Plan, lower: torch.Tensor, upper: torch.Tensor, clamp) -> dict[int, tuple]:
    """Concrete bounds of the input of every ReLU stage, by forward linear bounds.

    Args:
        plan: stages in the working dtype; input bounds ``lower``/``upper`` of shape (B, *input_shape).
        clamp: ``clamp(position, lower, upper) -> (lower, upper)``: intersects with bounds known
            otherwise (IBP, a parent domain, split constraints); its result is what the ReLU
            relaxation uses, so it must itself be sound.
    Returns:
        ``{relu position: (lower, upper)}`` (after ``clamp``).
    """
    plan.require_no_maxpool("forward linear bounds (intermediate_method='forward')")
    plan.require_relu_network("forward linear bounds (intermediate_method='forward')")
    batch = lower.shape[0]
    n = lower[0].numel()
    dtype = lower.dtype
    flat_lower, flat_upper = lower.reshape(batch, n), upper.reshape(batch, n)
    center = (flat_lower + flat_upper) / 2
    radius = torch.maximum(flat_upper - center, center - flat_lower) * (1 + 4 * unit_roundoff(dtype))
    input_magnitude = torch.maximum(flat_lower.abs(), flat_upper.abs())
    identity = torch.eye(n, dtype=dtype).expand(batch, n, n).reshape(batch, n, *lower.shape[1:])
    zeros = torch.zeros_like(lower)
    functions = {0: _LinearFunctions(identity, zeros, zeros, identity, zeros, zeros)}
    result = {}
    for position, stage in enumerate(plan.stages):
        if isinstance(stage, ReluStage):
            f = functions[position]
            low, high = _concretize(f, center, radius, input_magnitude)
            low, high = clamp(position, low, high)
            result[position] = (low, high)
            f = _relu(f, low, high, input_magnitude)
        elif isinstance(stage, AddStage):
            f = _add(functions[stage.sources[0]], functions[stage.sources[1]], input_magnitude)
        else:
            f = _affine(stage, functions[stage.sources[0]], input_magnitude)
        functions[position + 1] = f
        for source in stage.sources:  # free what no later stage reads (the tensors are large)
            if plan.last_use[source] == position:
                functions.pop(source, None)
    return result
