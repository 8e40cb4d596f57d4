"""The contract every stage kind of the bound engine keeps.

A *stage* is one layer of the network as the engine sees it: it produces tensor ``index + 1``
from the tensors ``sources`` (tensor 0 is the input). Each stage kind owns its rules, so the
walks over the network (IBP, CROWN's backward substitution, forward linear bounds, α/β-CROWN's
optimisation and the shared walks of :mod:`assay.bounds.walks`) call the stage and never ask
what kind it is:

* :meth:`Stage.interval` — IBP: sound bounds of the output from those of the sources;
* :attr:`Stage.clamped` — the sources whose bounds IBP tightens first (known bounds, splits):
  the tensors the stage relaxes;
* :meth:`Stage.crown_step` — CROWN: carry the walk's coefficients on the output back to the
  sources, adding the relaxation's offset and the rounding owed into the walk;
* :meth:`Stage.forward_step` — forward linear bounds: the output's linear functions;
* :meth:`Stage.split_point`, :meth:`Stage.relaxation_lines` — the general split
  (:mod:`assay.verify.operator_split`): where to cut the interval of an element the stage
  relaxes, and the lines its branching scores weigh;
* :meth:`Stage.backward_magnitude`, :meth:`Stage.forward_magnitude`, :meth:`Stage.linear_form`
  — the sensitivity and linear-region walks of :mod:`assay.bounds.walks` (affine stages, sums
  and the affine general operators; a ReLU's own part is the walk's, read by
  :attr:`Stage.splits_at_zero`).

The class attributes say what a :class:`~assay.bounds.plan.Plan` derives from its stages (ReLU
positions, operator inputs, rounding terms), without testing their kinds.
"""

from __future__ import annotations

from typing import ClassVar

import torch

from assay.errors import UnsupportedOperatorError


def kink_or_middle(lower: torch.Tensor, upper: torch.Tensor) -> torch.Tensor:
    """0 where ``[lower, upper]`` straddles it (where ReLU, sign, sigmoid and tanh change shape),
    else the middle: the general split's point (see :meth:`Stage.split_point`)."""
    return torch.where((lower < 0) & (upper > 0), torch.zeros_like(lower), lower / 2 + upper / 2)


class Stage:
    """Defaults of every stage kind (the subclasses are frozen dataclasses with ``index`` and
    ``sources``)."""

    # whether a backward walk crossing it chooses a relaxation per row (walks that cross only
    # stages without one reproduce forward bounds exactly)
    relaxes: ClassVar[bool] = False
    # whether :meth:`window` knows its receptive field (see assay.bounds.forward_columns)
    windowed: ClassVar[bool] = False
    # a ReLU: relaxed by CROWN's ReLU relaxation with per-row slopes α and split multipliers β,
    # split at 0 by β-CROWN's search (assay.verify.relu_split); Plan.relu_positions lists them
    splits_at_zero: ClassVar[bool] = False
    # a general operator bounded through its registered rule (assay.bounds.rules)
    general: ClassVar[bool] = False
    # not affine in its sources
    nonlinear: ClassVar[bool] = False
    # a max-pooling stage (walks for ReLU networks only refuse it, see Plan.require_no_maxpool)
    max_pooling: ClassVar[bool] = False
    # an affine stage with a weight tensor (Linear, Conv2d, AvgPool2d): CROWN charges its
    # products' rounding by a per-stage scale (assay.bounds.crown.rounding_scales)
    weighted: ClassVar[bool] = False
    # its weights are model parameters (interval weights perturb them)
    perturbable: ClassVar[bool] = False
    # free parameters of the relaxation of a general operator (α-CROWN tunes them)
    parameters: ClassVar[int] = 0

    @property
    def rounding_terms(self) -> int:
        """The products one entry of the stage's maps sums, plus the 3 roundings every stage adds
        (:func:`assay.bounds.plan.rounding_factor` adds them over the stages)."""
        return 3

    @property
    def clamped(self) -> tuple[int, ...]:
        """The sources whose bounds IBP's ``clamp`` tightens before this stage relaxes them."""
        return ()

    def window(self, sources):
        """The receptive field of an output element over the image from its sources' windows
        (see :func:`assay.bounds.forward_columns.tensor_windows`); None if unknown."""
        return None

    def interval(self, bounds, delta: float = 0.0):
        """``(lower, upper)`` of the output from ``bounds[t]`` of the tensors it reads, sound for
        every weight within ``delta`` of its value (a perturbable stage)."""
        raise NotImplementedError

    def crown_step(self, walk, position: int, A) -> None:
        """Cross the stage backwards in ``walk`` (an :class:`assay.bounds.crown` walk): ``A``
        (B, S, *output shape), the rows' summed coefficients on its output; sends coefficients
        to the sources (``walk.send``), adds the offset into ``walk.b`` and the rounding owed."""
        raise NotImplementedError

    def rounding_scale(self, bounds):
        """A :attr:`weighted` stage's factor of CROWN's rounding term for ``bounds`` (|W|·m of its
        input, see :func:`assay.bounds.crown.rounding_scales`)."""
        raise NotImplementedError

    def forward_step(self, state, position: int):
        """The output's :class:`~assay.bounds.linear_functions.LinearFunctions` in a forward pass
        (``state``: the pass, :class:`assay.bounds.forward.ForwardState`)."""
        raise UnsupportedOperatorError(f"forward linear bounds do not cross a {type(self).__name__} stage")

    def split_point(self, lower: torch.Tensor, upper: torch.Tensor) -> torch.Tensor:
        """Where the general split cuts the intervals ``[lower, upper]`` of elements of a tensor
        this stage relaxes (its :attr:`clamped` sources): :func:`kink_or_middle`. A ReLU is split
        at 0, where its interval straddles it: ReLU splitting is the general split's case s = 0
        (β-CROWN's search, :mod:`assay.verify.relu_split`, adds its multipliers)."""
        return kink_or_middle(lower, upper)

    def relaxation_lines(self, lower: torch.Tensor, upper: torch.Tensor):
        """(lower slope, lower intercept, upper slope, upper intercept) of the stage's relaxation
        of one input over ``[lower, upper]`` (the general split's branching scores read their
        widest gap); None where it has no lines per input (an operator of several inputs)."""
        return None

    def backward_magnitude(self, G):
        """``|L|ᵀ G`` per source (a gradient's magnitude carried back through an affine stage)."""
        raise UnsupportedOperatorError(f"gradient bounds do not cross a {type(self).__name__} stage")

    def forward_magnitude(self, values):
        """``|L| v`` of the sources' tensors ``values`` (a sensitivity carried forwards)."""
        raise UnsupportedOperatorError(f"sensitivities do not cross a {type(self).__name__} stage")

    def linear_form(self, forms):
        """The output's (coefficients, offset) from the sources' ``forms`` (an affine stage)."""
        raise UnsupportedOperatorError(f"affine forms do not cross a {type(self).__name__} stage")
