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

General operators (:mod:`assay.bounds.rules`) take part too: an affine one (a transposed
convolution, a batch norm, a slice, a concatenation, …) maps both functions through its rule's
map ``L`` and ``|L|`` (the lower function becomes ``L m − |L| w`` for the functions' midpoint
``m`` and half-difference ``w``, i.e. ``L⁺ lower + L⁻ upper``); an element-wise one applies its
rule's relaxation to the concrete bounds of its input, as a ReLU does; any other (products,
softmax, …) starts afresh from its output's interval (constant functions). So a generator with
five inputs and images of 28,800 elements costs a dozen passes of the network, where backward
substitution costs one walk of the whole prefix per element.

With ``symbols`` (:func:`forward_bounds`), a ReLU instead adds one error symbol per unstable
neuron, a new input column in [−1, 1] shared by every later tensor (the zonotope step, DeepZ):
the per-side relaxation forgets that the same neuron's error reaches many later neurons, the
symbols keep it, and errors cancel downstream. Two sides that share one coefficient tensor
(``a_lo is a_hi``, as a pure chain of affine maps and symbol steps keeps them) are mapped once.

Rounding: ``e_lo``/``e_hi`` ≥ 0 are error budgets in exact arithmetic: each step adds the
floating-point error bound of its sums (Higham §3.1) times the magnitudes involved, so the
stated inequality holds for the computed coefficients evaluated exactly; concretisation then
subtracts its own rounding bound. Splits and known bounds enter through ``clamp``.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import torch

from assay.bounds.forward_columns import ColumnMap, Grouping, regroup, spacing_for, tensor_windows
from assay.bounds.linear_functions import LinearFunctions as _LinearFunctions
from assay.bounds.linear_functions import constant_functions
from assay.bounds.linear_functions import contract as _contract
from assay.bounds.plan import Plan, gamma, unit_roundoff

# Above this many input elements the coefficient tensors (B, inputs, *shape) get too large.
MAX_FORWARD_INPUTS = 256
# An image network with more inputs gets forward bounds when its grouped columns
# (:mod:`assay.bounds.forward_columns`) keep every coefficient tensor (columns × tensor elements,
# per side and domain) within this many elements: about 1 GiB in float64; a pass holds about
# eight such tensors at once.
MAX_FORWARD_COEFFICIENTS = 1 << 27


def _concretize(f: _LinearFunctions, center, radius, input_magnitude):
    """Sound concrete bounds (lower, upper) of the stage input described by ``f``."""
    columns = f.columns
    absolute = None
    if f.shared:  # the same products as below, computed once
        absolute = f.a_lo.abs()
        mid, spread = _contract(f.a_lo, center, columns), _contract(absolute, radius, columns)
        low, high = mid - spread + f.c_lo - f.e_lo, mid + spread + f.c_hi + f.e_hi
    else:
        low = _contract(f.a_lo, center, columns) - _contract(f.a_lo.abs(), radius, columns) + f.c_lo - f.e_lo
        high = _contract(f.a_hi, center, columns) + _contract(f.a_hi.abs(), radius, columns) + f.c_hi + f.e_hi
    n = center.shape[1]
    u = unit_roundoff(center.dtype)
    margin = 4.0 * (n + 4) * u * (f.magnitude(input_magnitude, absolute) + f.e_lo + f.e_hi)
    # an unbounded operator upstream (a reciprocal across 0) leaves inf − inf: no bound there
    return (low - margin).nan_to_num(nan=-torch.inf), (high + margin).nan_to_num(nan=torch.inf)


@dataclass(frozen=True, eq=False)
class Cut:
    """The forward linear bounds of one tensor over B domains, where a backward walk may stop
    (:func:`assay.bounds.crown.backsubstitute`'s ``cut``): every path from the input to the
    tensors bounded after it must cross it, so coefficients reaching it are all it needs."""

    tensor: int
    functions: _LinearFunctions  # (B, k + s, *shape) coefficients on the k varying inputs and s error
    # symbols (forward_bounds' `symbols`), (B, *shape) constants, budgets
    input_magnitude: torch.Tensor  # (B, k + s): max |x| of the varying inputs over each domain (1: a symbol)
    input_shape: tuple[int, ...]
    columns: torch.Tensor  # (B, k): each domain's flat indices of its k inputs with a coefficient (box_columns)

    def select(self, members: torch.Tensor) -> Cut:
        """The cut for the domains ``members`` (an index tensor)."""
        f = self.functions
        a_lo = f.a_lo[members]
        picked = _LinearFunctions(a_lo, f.c_lo[members], f.e_lo[members], a_lo if f.shared else f.a_hi[members],
                                  f.c_hi[members], f.e_hi[members])
        return Cut(self.tensor, picked, self.input_magnitude[members], self.input_shape, self.columns[members])

    def folded(self) -> Cut:
        """The cut without its error-symbol columns: each side's least value over the symbols
        (its coefficients' magnitudes, with their sum's rounding) moves into its budget. Sound
        and smaller, looser by the correlation the symbols kept."""
        f, inputs = self.functions, self.columns.shape[1]
        if f.a_lo.shape[1] == inputs:
            return self
        terms = gamma(f.a_lo.shape[1] - inputs + 2, f.c_lo.dtype)
        spread = lambda a: a[:, inputs:].abs().sum(1) * (1 + 2 * terms)  # noqa: E731
        a_lo = f.a_lo[:, :inputs]
        picked = _LinearFunctions(a_lo, f.c_lo, f.e_lo + spread(f.a_lo), a_lo if f.shared else f.a_hi[:, :inputs],
                                  f.c_hi, f.e_hi + spread(f.a_hi))
        return Cut(self.tensor, picked, self.input_magnitude[:, :inputs], self.input_shape, self.columns)

    @staticmethod
    def concatenate(cuts: list[Cut]) -> Cut:
        """One cut over the domains of ``cuts`` (of one tensor), in order; columns past a cut's own
        (error symbols another cut has more of) get zero coefficients and magnitude 0."""
        n = max(c.functions.a_lo.shape[1] for c in cuts)
        parts = [c.functions.padded(n) for c in cuts]
        shared = all(f.shared for f in parts)
        cat = lambda name: torch.cat([getattr(f, name) for f in parts])  # noqa: E731
        a_lo = cat("a_lo")
        functions = _LinearFunctions(a_lo, cat("c_lo"), cat("e_lo"), a_lo if shared else cat("a_hi"), cat("c_hi"),
                                     cat("e_hi"))
        magnitude = torch.cat([torch.nn.functional.pad(c.input_magnitude, (0, n - c.input_magnitude.shape[1]))
                               for c in cuts])
        first = cuts[0]
        return Cut(first.tensor, functions, magnitude, first.input_shape, torch.cat([c.columns for c in cuts]))

    def substitute(self, A: torch.Tensor, rounding: bool = True):
        """For coefficients ``A`` (B, S, *shape) on the tensor z: ``(A_x, offset, owed)`` with
        ``A·z ≥ A_x·x + offset − owed`` for every x of each domain, exactly: positive coefficients
        take z's lower function, negative ones its upper function (both with their budgets);
        ``owed`` bounds the rounding of these sums of Q products (γ_{Q+n+8} of their magnitudes)."""
        f = self.functions
        batch, rows = A.shape[:2]
        flat = A.reshape(batch, rows, -1)
        positive, negative = flat.clamp(min=0), flat.clamp(max=0)
        coefficients = lambda t: t.reshape(batch, t.shape[1], -1).transpose(1, 2)  # noqa: E731
        vector = lambda t: t.reshape(batch, -1, 1)  # noqa: E731
        A_x = positive.matmul(coefficients(f.a_lo)) + negative.matmul(coefficients(f.a_hi))
        offset = (positive.matmul(vector(f.c_lo - f.e_lo)) + negative.matmul(vector(f.c_hi + f.e_hi))).squeeze(-1)
        inputs = self.columns.shape[1]
        symbols = A_x[:, :, inputs:]  # error symbols, each in [−1, 1]: their least value
        A_x = A_x[:, :, :inputs]
        if symbols.shape[2]:
            spread = symbols.abs().sum(-1)
            offset = offset - spread
        # coefficients on the fixed inputs are 0: their values are part of the constants
        full = A_x.new_zeros(batch, rows, math.prod(self.input_shape))
        full.scatter_(2, self.columns.unsqueeze(1).expand(batch, rows, -1), A_x)  # distinct per domain
        A_x = full.reshape(batch, rows, *self.input_shape)
        if not rounding:
            return A_x, offset, torch.zeros_like(offset)
        with torch.no_grad():
            terms = flat.shape[-1] + self.input_magnitude.shape[1] + 8
            scale = f.magnitude(self.input_magnitude) + f.e_lo + f.e_hi
            owed = gamma(terms, A.dtype) * flat.detach().abs().matmul(vector(scale)).squeeze(-1)
            if symbols.shape[2]:  # the sum of the symbols' magnitudes, and its subtraction
                owed = owed + gamma(symbols.shape[2] + 2, A.dtype) * spread.detach()
        return A_x, offset, owed


def forward_bounds(plan: Plan, lower: torch.Tensor, upper: torch.Tensor, clamp, keep=(),
                   cuts: dict[int, Cut] | None = None, grouped: bool = True, symbols: bool = False,
                   constants: dict[int, tuple] | None = None) -> dict[int, tuple]:
    """Concrete bounds of the input of every ReLU stage and of every tensor a non-linear general
    operator reads, by forward linear bounds.

    Args:
        plan: stages in the working dtype; input bounds ``lower``/``upper`` of shape (B, *input_shape).
        clamp: ``clamp(position, lower, upper) -> (lower, upper)``: intersects with bounds known
            otherwise (IBP, a parent domain, split constraints); its result is what the ReLU
            relaxation uses, so it must itself be sound. With ``symbols`` it is called as
            ``clamp(position, lower, upper, members)`` for the domains ``members`` (an index
            tensor into the B domains) of each pass.
        grouped: for an image input, carry the input columns in spatial groups while the tensors'
            receptive fields are narrow (:mod:`assay.bounds.forward_columns`: the same bounds,
            at a fraction of the memory and time); False: one column per input element.
        symbols: ReLUs add one error symbol per unstable neuron (:meth:`~assay.bounds.stages.ReluStage.forward_step`, the
            zonotope step) instead of relaxing each side on its own, while the coefficient
            tensors stay within :data:`MAX_FORWARD_COEFFICIENTS` elements (a later ReLU layer that
            would outgrow them is relaxed as without symbols). Tighter where many unstable
            neurons feed later ones (a generator into a discriminator: cgan's 64×64 output
            bounds narrow from ±150 to ±0.3); the domains are bounded one at a time, since each
            has its own symbols. Not with grouped columns (``grouped`` is ignored).
        constants: a :class:`Constants` to fill with the *constant* tensors: those whose
            functions have no coefficient in any domain (every input they read is fixed by every
            box: nn4sys' mscn reads 22 set elements of which a box lets 1 or 2 vary). A constant
            tensor's linear functions are exactly its interval, so the stages that read only
            constant tensors are crossed by their interval rule
            (:meth:`~assay.bounds.stages.base.Stage.interval`, a fraction of mapping functions)
            and the caller may take these bounds instead of recomputing them; with
            ``constants.lazy``, only when read (see :class:`Constants`). Ignored with
            ``symbols``, grouped columns or ``keep``.
    Returns:
        ``{tensor: (lower, upper)}`` (after ``clamp``) for those tensors. With ``keep`` (tensor
        indices) and a dict ``cuts``, each kept tensor's functions are stored in ``cuts`` as a
        :class:`Cut` (meaningful where the tensor is a cut, see :func:`cut_tensors`; with
        ``symbols``, a cut's coefficients on the symbols are concretised when substituted).
        No stage after the last of those tensors is computed.
    """
    if not symbols:
        return _forward_pass(plan, lower, upper, clamp, keep, cuts, grouped, False, constants=constants)
    result, parts = {}, {}
    # as many input columns for every domain (their cuts join, the symbols' columns after them)
    columns, fixed = box_columns(lower, upper)
    for b in range(lower.shape[0]):
        members = torch.tensor([b])
        own = {} if cuts is not None else None
        found = _forward_pass(plan, lower[b:b + 1], upper[b:b + 1],
                              lambda t, lo, hi, members=members: clamp(t, lo, hi, members), keep, own, False, True,
                              (columns[b:b + 1], fixed[b:b + 1]))
        for t, value in found.items():
            result.setdefault(t, []).append(value)
        for t, cut in (own or {}).items():
            # B domains' cuts with this many columns would outgrow the coefficient budget: folded
            if lower.shape[0] * cut.functions.a_lo[0].numel() > MAX_FORWARD_COEFFICIENTS:
                cut = cut.folded()
            parts.setdefault(t, []).append(cut)
    if cuts is not None:
        cuts.update({t: Cut.concatenate(c) for t, c in parts.items()})
    return {t: (torch.cat([v[0] for v in values]), torch.cat([v[1] for v in values])) for t, values in result.items()}


def _forward_pass(plan: Plan, lower: torch.Tensor, upper: torch.Tensor, clamp, keep, cuts, grouped: bool,
                  symbols: bool, varying=None, constants: dict[int, tuple] | None = None) -> dict[int, tuple]:
    """:func:`forward_bounds` over all of ``lower``'s domains at once (``clamp`` takes 3 arguments);
    ``varying``: :func:`box_columns` of these domains if already known; ``constants``: see
    :func:`forward_bounds`."""

    plan.require_no_maxpool("forward linear bounds (intermediate_method='forward')")
    batch = lower.shape[0]
    dtype = lower.dtype
    needed = set(plan.relu_positions) | set(plan.operator_inputs) | set(keep if cuts is not None else ())
    last = max(needed, default=-1)
    windows = _input_windows(plan) if grouped and not keep else [None] * (len(plan.stages) + 1)
    grouping = None
    if windows[0] is not None:
        grouping = Grouping(tuple(lower.shape[1:]), spacing_for(windows[1], plan.network.shapes[1], lower.shape[1:]))
    if grouping is not None and not grouping.dense:
        # an image: grouped columns over every input element (fixed ones have radius 0)
        columns, fixed = torch.arange(lower[0].numel()).expand(batch, -1), torch.zeros_like(lower)
    else:
        grouping = None
        # one coefficient per input the domain lets vary; the inputs it fixes are constants
        columns, fixed = box_columns(lower, upper) if varying is None else varying
    n = columns.shape[1]
    flat_lower, flat_upper = lower.reshape(batch, -1).gather(1, columns), upper.reshape(batch, -1).gather(1, columns)
    center = (flat_lower + flat_upper) / 2
    radius = torch.maximum(flat_upper - center, center - flat_lower) * (1 + 4 * unit_roundoff(dtype))
    input_magnitude = torch.maximum(flat_lower.abs(), flat_upper.abs())
    if grouping is not None:
        start = grouping.initial(batch, dtype)
    else:
        tracked = constants is not None and not symbols
        # A box that fixes one of its columns (it lets fewer inputs vary than the batch's most)
        # gives that column no coefficient where constants are tracked, its value going into the
        # constants as any fixed input's: the same functions, and a tensor that reads only such
        # inputs stays recognisably constant.
        live = (flat_upper > flat_lower).to(dtype) if tracked else torch.ones_like(flat_lower)
        if tracked:
            fixed = fixed.reshape(batch, -1).scatter_add(1, columns, flat_lower * (1 - live)).reshape(lower.shape)
        start = torch.zeros(batch, n, lower[0].numel(), dtype=dtype)
        start.scatter_(2, columns.unsqueeze(2), live.unsqueeze(2))
        start = start.reshape(batch, n, *lower.shape[1:])
    zeros = torch.zeros_like(lower)
    functions = {0: _LinearFunctions(start, fixed, zeros, start, fixed, zeros, _columns(grouping, windows, plan, 0))}
    state = ForwardState(plan, functions, center, radius, input_magnitude, clamp, symbols, last)
    if constants is not None and grouping is None and not symbols and not keep:
        state.constants = constants
        state.functions = _Functions(state)
        state.functions.update(functions)
    tracked = state.constants is not None
    for position, stage in enumerate(plan.stages):
        if position > last:
            break
        if grouping is not None:  # widen the groups before the tensor outgrows them
            grouping = _widened(plan, windows, grouping, state.functions, position + 1)
        if tracked and stage.sources and all(s in constants.tensors for s in stage.sources):
            constants.tensors.add(position + 1)  # its functions are made if a stage reads them
            if not constants.lazy:
                state.constant(position + 1)
        else:
            f = stage.forward_step(state, position)
            if tracked and _no_coefficients(f):
                constants.tensors.add(position + 1)
                constants.bounds[position + 1] = _concretize(f, center, radius, input_magnitude)
            f.columns = _columns(grouping, windows, plan, position + 1)
            state.functions[position + 1] = f
            if position + 1 in keep and cuts is not None:
                cuts[position + 1] = Cut(position + 1, f, state.input_magnitude, tuple(lower.shape[1:]), columns)
        for source in stage.sources:  # free what no later stage reads (the tensors are large)
            if plan.last_use[source] == position:
                state.functions.pop(source, None)
    if tracked:
        _resolve_what_is_read(state, last)
    return state.result


def _resolve_what_is_read(state: ForwardState, last: int) -> None:
    """After the pass: the bounds of the constant tensors that the caller reads whatever the
    walks do (every ReLU input and non-linear operator input: a result's intermediate bounds,
    and a child's starting point), those the stages after ``last`` read from a stage that is not
    constant (the pass stopped before them), and the output's if it is constant."""
    plan, constants = state.plan, state.constants
    for position in range(last + 1, len(plan.stages)):
        stage = plan.stages[position]
        if stage.sources and all(s in constants.tensors for s in stage.sources):
            constants.tensors.add(position + 1)
        else:
            for source in stage.sources:
                if source in constants.tensors:
                    state.constant(source)
    for tensor in (*plan.relu_positions, *plan.operator_inputs, len(plan.stages)):
        if tensor in constants.tensors:
            state.constant(tensor)


def _no_coefficients(f: _LinearFunctions) -> bool:
    """Whether both sides of ``f`` have only zero coefficients (a constant in every domain)."""
    return not bool(f.a_lo.any()) and (f.shared or not bool(f.a_hi.any()))


class Constants:
    """The constant tensors of a forward pass (:func:`forward_bounds`' ``constants``): ``tensors``
    (every one) and ``bounds`` (``{tensor: (lower, upper)}`` of those computed).

    ``lazy``: a constant is bounded only when something reads it: a stage that is not constant
    (its functions), a bound of a ReLU or operator input, or the caller afterwards; one the
    caller's bounds already hold (a parent domain's, given as known bounds through ``clamp``)
    is taken from there, so an input-splitting child pays nothing for the constants its parent
    bounded. The others (a fixed set block's inner tensors) are never computed, and
    :meth:`given` hands them to the interval pass as unbounded: meant for a caller whose walks
    stop at the constants (:func:`~assay.bounds.crown.backsubstitute`'s ``stops``), where only
    the constants a stage that is not constant reads are ever concretised.
    """

    def __init__(self, lazy: bool = False):
        self.lazy = lazy
        self.tensors: set[int] = set()
        self.bounds: dict[int, tuple] = {}

    def given(self, shapes, batch: int, dtype) -> dict[int, tuple]:
        """``{tensor: (lower, upper)}`` of every constant for an interval pass: those computed,
        and (−inf, +inf) for the others (sound; see the class docstring for who reads them)."""
        given = dict(self.bounds)
        for tensor in self.tensors - set(self.bounds):
            shape = (batch, *shapes[tensor])
            given[tensor] = (torch.full((), -torch.inf, dtype=dtype).expand(shape),
                             torch.full((), torch.inf, dtype=dtype).expand(shape))
        return given


class _Functions(dict):
    """A forward pass's live functions, where a constant tensor's (its interval's constant
    functions) are made when a stage first reads them."""

    def __init__(self, state: ForwardState):
        super().__init__()
        self.state = state

    def __missing__(self, tensor: int) -> _LinearFunctions:
        state = self.state
        if tensor not in state.constants.tensors:
            raise KeyError(tensor)
        f = constant_functions(*state.constant(tensor), state.n)
        self[tensor] = f
        return f


class ForwardState:
    """One forward pass as a stage's ``forward_step`` sees it (:mod:`assay.bounds.stages`): the
    live tensors' linear functions (``functions``), the input columns' centre, radius and
    magnitude (B, n), and the tensors' concrete bounds (:meth:`concrete`, after ``clamp``, kept
    in ``result`` for the caller). With ``symbols``, a ReLU may append error symbols as new
    columns (:meth:`symbol_room`, :meth:`add_symbols`)."""

    def __init__(self, plan: Plan, functions: dict, center, radius, input_magnitude, clamp, symbols: bool,
                 last: int):
        self.plan, self.functions, self.clamp, self.symbols, self.last = plan, functions, clamp, symbols, last
        self.center, self.radius, self.input_magnitude = center, radius, input_magnitude
        self.result: dict[int, tuple] = {}
        self.sizes = [math.prod(shape) for shape in plan.network.shapes]
        self.constants: Constants | None = None  # the constant tensors, when the pass tracks them

    @property
    def n(self) -> int:
        """The number of columns (varying inputs, then error symbols)."""
        return self.center.shape[1]

    def concrete(self, tensor: int):
        """The tensor's bounds (after clamp), kept for the caller."""
        if tensor not in self.result:
            if self.constants is not None and tensor in self.constants.tensors:  # its functions are its interval
                self.result[tensor] = self.clamp(tensor, *self.constant(tensor))
            else:
                self.result[tensor] = self.clamp(tensor, *_concretize(self.functions[tensor], self.center,
                                                                      self.radius, self.input_magnitude))
        return self.result[tensor]

    def constant(self, tensor: int) -> tuple[torch.Tensor, torch.Tensor]:
        """A constant tensor's bounds (before ``clamp``), computed on first use: the bounds
        ``clamp`` knows of it where those are finite (a ReLU or operator input a parent domain
        bounded, or the interval pass before this one), else its stage's interval rule on its
        sources' bounds (each a constant: those the stage relaxes after ``clamp``)."""
        constants = self.constants
        if tensor not in constants.bounds:
            value = None
            if tensor in self.plan.relu_positions or tensor in self.plan.operator_inputs:
                shape = (self.center.shape[0], *self.plan.network.shapes[tensor])
                unbounded = torch.full(shape, torch.inf, dtype=self.center.dtype)
                low, high = self.clamp(tensor, -unbounded, unbounded)
                if bool(torch.isfinite(low.sum() + high.sum())):
                    value = (low, high)
            if value is None:
                stage = self.plan.stages[tensor - 1]
                value = stage.interval({s: self.concrete(s) if s in stage.clamped else self.constant(s)
                                        for s in stage.sources})
            constants.bounds[tensor] = value
        return constants.bounds[tensor]

    def symbol_room(self, position: int, lower: torch.Tensor, upper: torch.Tensor) -> int:
        """How many error symbols the ReLU at ``position`` adds for its input bounds: the most
        unstable neurons of a domain, or 0 (no symbols, none unstable, or coefficient tensors
        that would outgrow :data:`MAX_FORWARD_COEFFICIENTS`)."""
        batch = lower.shape[0]
        added = int(((lower < 0) & (upper > 0)).reshape(batch, -1).sum(1).max()) if self.symbols else 0
        total = self.center.shape[1] + added
        later = max(self.sizes[position + 1:self.last + 1], default=0)  # the largest tensor the symbols reach
        return added if added and later and batch * total * later <= MAX_FORWARD_COEFFICIENTS else 0

    def add_symbols(self, position: int, added: int) -> None:
        """Append ``added`` error-symbol columns (centre 0, radius 1, magnitude 1); the functions
        still read after ``position`` get zero coefficients on them."""
        batch = self.center.shape[0]
        total = self.center.shape[1] + added
        self.center, self.radius, self.input_magnitude = (
            torch.cat([t, t.new_full((batch, added), value)], 1)
            for t, value in ((self.center, 0.0), (self.radius, 1.0), (self.input_magnitude, 1.0)))
        self.functions = {t: g.padded(total) if self.plan.last_use[t] > position else g
                          for t, g in self.functions.items()}


def varying_inputs(lower: torch.Tensor, upper: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The inputs that forward linear bounds give a coefficient: ``(columns, fixed)`` for boxes
    ``lower``/``upper`` (B, *input_shape). ``columns`` (k,): the flat indices of the inputs whose
    interval has positive width in some box (at least one index, so that every tensor keeps its
    shape); ``fixed`` (B, *input_shape): every other input's value (its lower bound, which equals
    its upper bound in every box), 0 at the columns. A VNN-LIB property that fixes most inputs
    (nn4sys' cardinality queries let 1 or 2 of 154 vary) then costs its varying inputs only."""
    batch = lower.shape[0]
    flat_lower, flat_upper = lower.reshape(batch, -1), upper.reshape(batch, -1)
    varies = (flat_upper != flat_lower).any(0)
    if not bool(varies.any()):
        varies[0] = True
    columns = varies.nonzero().flatten()
    fixed = torch.where(varies, torch.zeros_like(flat_lower), flat_lower).reshape(lower.shape)
    return columns, fixed


def box_columns(lower: torch.Tensor, upper: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The inputs that forward linear bounds give a coefficient, per domain: ``(columns, fixed)``
    for boxes ``lower``/``upper`` (B, *input_shape). ``columns`` (B, k): each box's flat indices of
    the inputs its interval lets vary (ascending), then inputs it fixes (so that every row has k =
    the most inputs any box lets vary, at least 1; the indices of a row are distinct); ``fixed``
    (B, *input_shape): every other input's value, 0 at the box's columns. A batch of queries that
    vary different inputs (nn4sys' mscn_dual: 9 over 960 queries, 1–3 each) then costs each box its
    own few, where :func:`varying_inputs` (their union) costs every box all 9. A fixed input among
    a box's columns has radius 0: the same bound as a constant, up to rounding."""
    batch = lower.shape[0]
    flat_lower, flat_upper = lower.reshape(batch, -1), upper.reshape(batch, -1)
    varies = flat_upper != flat_lower
    k = max(int(varies.sum(1).max()), 1)
    columns = torch.argsort((~varies).to(torch.int8), dim=1, stable=True)[:, :k]
    chosen = torch.zeros_like(varies).scatter_(1, columns, True)
    fixed = torch.where(chosen, torch.zeros_like(flat_lower), flat_lower).reshape(lower.shape)
    return columns, fixed


def _input_windows(plan: Plan) -> list:
    """:func:`~assay.bounds.forward_columns.tensor_windows` from the input, a tensor that reads
    no input element (a constant) counting as unknown (its columns are dense)."""
    return [None if w == () else w for w in tensor_windows(plan)]


def _columns(grouping: Grouping | None, windows, plan: Plan, tensor: int) -> ColumnMap | None:
    if grouping is None:
        return None
    return ColumnMap(grouping, windows[tensor], plan.network.shapes[tensor])


def _widened(plan: Plan, windows, grouping: Grouping, functions: dict, tensor: int) -> Grouping | None:
    """The grouping for computing ``tensor``: ``grouping`` while its spacing covers the tensor's
    window, else a wider one (None: one column per input element) into which every live
    function's columns are split (:func:`~assay.bounds.forward_columns.regroup`)."""
    shapes = plan.network.shapes
    need = spacing_for(windows[tensor], shapes[tensor], grouping.input_shape)
    if all(x <= y for x, y in zip(need, grouping.spacing)):
        return grouping
    wider = Grouping(grouping.input_shape, tuple(max(x, y) for x, y in zip(need, grouping.spacing)))
    for t, f in functions.items():
        for name in ("a_lo", "a_hi"):
            setattr(f, name, regroup(getattr(f, name), windows[t], shapes[t], grouping, wider))
        f.columns = None if wider.dense else ColumnMap(wider, windows[t], shapes[t])
    return None if wider.dense else wider


def forward_columns(plan: Plan) -> dict[int, int]:
    """{tensor: the number of coefficient columns :func:`forward_bounds` (grouped) carries for it},
    for the tensors it computes: the input's elements, or fewer for an image network whose
    windows are narrow (:mod:`assay.bounds.forward_columns`)."""
    shapes = plan.network.shapes
    n = math.prod(shapes[0])
    last = max(set(plan.relu_positions) | set(plan.operator_inputs), default=-1)
    windows = _input_windows(plan)
    if windows[0] is None:
        return {t: n for t in range(last + 1)}
    spacing = spacing_for(windows[1], shapes[1], shapes[0])
    counts = {0: shapes[0][0] * spacing[0] * spacing[1]}
    for t in range(1, last + 1):
        need = spacing_for(windows[t], shapes[t], shapes[0])
        spacing = tuple(max(x, y) for x, y in zip(need, spacing))
        counts[t] = shapes[0][0] * spacing[0] * spacing[1]
    return counts


def forward_fits(plan: Plan) -> bool:
    """Whether :func:`forward_bounds` suits the network: few inputs (at most
    :data:`MAX_FORWARD_INPUTS`), or grouped columns that keep every coefficient tensor within
    :data:`MAX_FORWARD_COEFFICIENTS` elements."""
    shapes = plan.network.shapes
    if math.prod(shapes[0]) <= MAX_FORWARD_INPUTS:
        return True
    return all(columns * math.prod(shapes[t]) <= MAX_FORWARD_COEFFICIENTS
               for t, columns in forward_columns(plan).items())


def cut_tensors(plan: Plan) -> list[int]:
    """The tensors t ≥ 1 that every path from the input to a later tensor crosses (no stage from
    t on reads a tensor before t), ascending: where a backward walk can stop (:class:`Cut`)."""
    reads_before = [min(stage.sources) for stage in plan.stages]
    cuts, earliest = [], len(plan.stages)
    for t in range(len(plan.stages), 0, -1):  # earliest = the least tensor read by stages t, t+1, …
        if t < len(plan.stages):
            earliest = min(earliest, reads_before[t])
        if earliest >= t:
            cuts.append(t)
    return sorted(cuts)


# Backward substitution for every refined tensor costs about this many coefficient operations
# (rows × the tensors each row's walk crosses) before forward bounds are preferred; below it the
# (tighter) backward bounds are cheap (ACAS Xu: ~10⁵).
_BACKWARD_BUDGET = 2e8


def backward_refinement_cost(plan: Plan) -> int:
    """Coefficient operations (a proxy: rows × the tensor elements each row's walk crosses) of
    bounding every refined intermediate tensor by backward substitution, per box."""
    sizes = [math.prod(shape) for shape in plan.network.shapes]
    prefix = list(itertools.accumulate(sizes))
    return sum(2 * sizes[t] * prefix[t] for t in set(plan.relu_positions) | set(plan.operator_inputs))


def intermediate_method_for(plan: Plan, inputs: int | None = None) -> str:
    """``"hybrid"`` (forward linear bounds, then CROWN where its walks are short, see
    :func:`~assay.bounds.compute_bounds`) where backward CROWN bounds of every intermediate
    tensor would cost far more than forward linear bounds, else ``"crown"``.

    Backward substitution walks the whole prefix of the network once per refined element (two
    rows); forward bounds push (inputs + 1) functions per side through the network once. A
    generator (cgan: 5 inputs, a 28,800-element image) takes minutes backwards per box and a
    fraction of a second forwards; a small dense network (ACAS Xu) is cheap either way and keeps
    the tighter backward bounds. Networks with MaxPool stages or more than
    :data:`MAX_FORWARD_INPUTS` inputs always get ``"crown"`` (forward bounds do not take them).
    ``inputs``: the number of inputs the boxes let vary (:func:`varying_inputs`; default: all
    the network's), which is what forward bounds cost.
    """
    sizes = [math.prod(shape) for shape in plan.network.shapes]
    inputs = sizes[0] if inputs is None else inputs
    if inputs > MAX_FORWARD_INPUTS or plan.has_maxpool:
        return "crown"
    backward = backward_refinement_cost(plan)
    forward = 2 * (inputs + 1) * sum(sizes)
    return "hybrid" if backward > _BACKWARD_BUDGET and backward > 8 * forward else "crown"
