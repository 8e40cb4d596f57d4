"""The registry of bound methods: what each is, its options, and the ReLU relaxation it uses.

Every part of assay that lists or checks bound methods (the command line, the verifier, the
demo) reads :data:`METHODS`. A new method is a :class:`BoundMethod` entry here plus, if it
needs a new step, a rule in the engine (see :mod:`assay.bounds` for the steps). The registry
does not load torch, so the command line lists the methods without it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from assay.bounds.options import AlphaCrownOptions, BetaCrownOptions
from assay.errors import OptionError

__all__ = ["BoundMethod", "METHODS", "method_names", "bound_method"]


@dataclass(frozen=True)
class BoundMethod:
    """One bound method.

    Attributes:
        name: what callers pass as ``method=`` (``"crown"``).
        title: how reports print it (``"CROWN"``).
        summary: one line for ``--help`` and the README.
        linear: it yields linear bounds w.r.t. the input (CROWN family) as well as concrete ones.
        options: the frozen options type of an optimised method (None: the method takes none).
        for_splits: it optimises the multipliers of ReLU split constraints (branch and bound over
            ReLUs); without splits it is its parent method.
        relaxation: the ReLU relaxation it uses, ``(lower, upper) -> ReluRelaxation``; None means
            CROWN's (:func:`assay.bounds.relax_relu`). Any sound relaxation can be plugged in: the
            backward passes rely only on its inequalities (forward-mode intermediate bounds always
            use CROWN's).
    """

    name: str
    title: str
    summary: str
    linear: bool
    options: type | None = None
    for_splits: bool = False
    relaxation: Callable | None = None

    @property
    def optimised(self) -> bool:
        return self.options is not None

    def relax(self) -> Callable:
        """The ReLU relaxation function of this method."""
        if self.relaxation is not None:
            return self.relaxation
        from assay.bounds.relaxation import relax_relu

        return relax_relu

    def resolve_options(self, options):
        """``options`` checked against this method (its defaults when None)."""
        if self.options is None:
            if options is not None:
                raise OptionError(f"method {self.name!r} takes no options; got {type(options).__name__}")
            return None
        options = options if options is not None else self.options()
        if not isinstance(options, self.options):
            raise OptionError(f"method {self.name!r} takes {self.options.__name__}; got {type(options).__name__}")
        return options


METHODS: dict[str, BoundMethod] = {
    method.name: method
    for method in (
        BoundMethod("ibp", "IBP", "interval bound propagation: fastest, loosest", linear=False),
        BoundMethod("crown", "CROWN", "backward linear relaxation (CROWN): the default", linear=True),
        BoundMethod("alpha", "α-CROWN", "CROWN with optimised lower ReLU slopes (α-CROWN)", linear=True,
                    options=AlphaCrownOptions),
        BoundMethod("beta", "β-CROWN", "α-CROWN plus optimised multipliers of ReLU split constraints (β-CROWN)",
                    linear=True, options=BetaCrownOptions, for_splits=True),
    )
}


def method_names() -> tuple[str, ...]:
    """The names of the registered methods, in registry order."""
    return tuple(METHODS)


def bound_method(name: str, owner: str = "compute_bounds") -> BoundMethod:
    """The registered method called ``name``; an OptionError naming the choices otherwise."""
    try:
        return METHODS[name]
    except (KeyError, TypeError):
        listed = ", ".join(repr(n) for n in METHODS)
        raise OptionError(f"the `method` option of {owner} must be one of {listed}; got {name!r}") from None
