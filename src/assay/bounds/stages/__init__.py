"""The stage kinds of the bound engine, each with its own rules (see :mod:`assay.bounds.stages.base`).

One module per kind: :mod:`~assay.bounds.stages.affine` (Linear, Conv2d, AvgPool2d, reshapes),
:mod:`~assay.bounds.stages.relu`, :mod:`~assay.bounds.stages.add` (residual sums),
:mod:`~assay.bounds.stages.maxpool` and :mod:`~assay.bounds.stages.operator` (every general
operator, through its registered rule, :mod:`assay.bounds.rules`). :class:`assay.bounds.plan.Plan`
lowers a network's layers to them.
"""

from __future__ import annotations

from assay.bounds.stages.add import AddStage
from assay.bounds.stages.affine import AffineStage, SparseWeights
from assay.bounds.stages.base import Stage
from assay.bounds.stages.maxpool import MaxPoolStage
from assay.bounds.stages.operator import OperatorStage
from assay.bounds.stages.relu import ReluStage

__all__ = ["Stage", "AffineStage", "SparseWeights", "ReluStage", "AddStage", "MaxPoolStage", "OperatorStage"]
