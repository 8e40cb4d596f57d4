"""The operator registry of the bound engine: one rule object per operator family.

A rule knows how bounds pass through its operator (see :mod:`assay.bounds.rules.base` for the
contracts) and which stage a layer of it becomes (:meth:`~assay.bounds.rules.base.LayerRule.stage`);
:func:`rule_for` finds the rule of a layer, and :class:`~assay.bounds.plan.Plan` builds every
stage through it. A new operator is one rule class in one
module of this package, registered with :func:`register`, and one line in :data:`_MODULES` if the
module is new; the walks over the network (:mod:`assay.bounds.ibp`, :mod:`assay.bounds.crown`)
never name an operator.

==================  ====================================================================
module              operators
==================  ====================================================================
``relu_network``    ReLU, Linear, Conv2d, AvgPool2d, Flatten, Reshape, Add, MaxPool2d (the
                    engine's own stage kinds, :mod:`assay.bounds.stages`)
``linear``          every operator that is affine in its inputs: Slice, Gather, Concat,
                    Transpose, Pad, Resize, Reduce, Neg, Affine, ConstMatMul, Conv, Add/Sub
``s_shaped``        Sigmoid, Tanh
``convex``          Exp, Log, Reciprocal, Sqrt, Pow (constant exponent)
``trigonometric``   Sin, Cos
``piecewise``       Abs, Sign, LeakyRelu, Clip
``steps``           Floor, Cast
``bilinear``        Mul/Div of two tensors, MatMul of two tensors
``minmax``          Min, Max
``softmax``         Softmax
``decisions``       ArgMax, Equal, IndexTable (interval rules, constant lines)
==================  ====================================================================
"""

from __future__ import annotations

import importlib
from collections.abc import Callable

__all__ = ["register", "rule_for", "registered_layers"]

# layer class -> [(predicate or None, rule)], first match wins
_REGISTRY: dict[type, list[tuple[Callable | None, object]]] = {}
_MODULES = ("relu_network", "linear", "s_shaped", "convex", "trigonometric", "piecewise", "steps", "bilinear", "minmax",
            "softmax", "decisions")
_loaded = False


def register(*layer_classes: type, when: Callable | None = None):
    """Class decorator: an instance of the rule class becomes the rule of ``layer_classes``
    (for the layers where ``when(layer)`` is true, if given)."""

    def decorate(rule_class):
        rule = rule_class()
        for layer_class in layer_classes:
            _REGISTRY.setdefault(layer_class, []).append((when, rule))
        return rule_class

    return decorate


def _load() -> None:
    global _loaded
    if _loaded:
        return
    _loaded = True
    for name in _MODULES:
        try:
            importlib.import_module(f"{__name__}.{name}")
        except ModuleNotFoundError as exc:  # a family not written yet
            if exc.name != f"{__name__}.{name}":
                raise


def rule_for(layer):
    """The rule registered for ``layer`` (by its class, then its predicate), or None."""
    _load()
    for when, rule in _REGISTRY.get(type(layer), ()):
        if when is None or when(layer):
            return rule
    return None


def registered_layers() -> tuple[type, ...]:
    """The layer classes that have at least one rule, in the order they were registered (the ReLU
    network's layers first)."""
    _load()
    return tuple(_REGISTRY)
