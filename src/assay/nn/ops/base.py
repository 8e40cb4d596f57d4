"""The base class of the general operators of a :class:`~assay.nn.Network`.

Every operator is a frozen value that owns its forward pass and its output shape. Conventions,
shared by every module of :mod:`assay.nn.ops`:

* **Batch first.** ``forward`` receives tensors of shape ``(batch, *shape)`` (float32 or float64)
  and returns one of shape ``(batch, *output_shape)`` in the same dtype.
* **Axes exclude the batch.** An operator's ``axis``/``axes``/``perm`` count the dimensions of one
  sample (axis 0 is the first dimension after the batch); loaders translate ONNX axes and refuse
  an axis that is the batch dimension.
* **Constants are float64** (index constants int64) and are cast to the input's dtype and device
  in ``forward`` (so :meth:`Operator.output_shape` can run ``forward`` on meta tensors).
* ``arity`` is the number of tensors the operator reads (``None``: one or more).

A bound rule for an operator (in :mod:`assay.bounds`) is attached to its class; the loader's map
from ONNX op types to builders is :data:`assay.nn._onnx_builders.BUILDERS`.
"""

from __future__ import annotations

from typing import ClassVar

import torch

from assay.errors import ModelLoadError

__all__ = ["Operator", "as_constant", "cast_like"]


class Operator:
    """Base of the general operators: subclasses are frozen dataclasses defining :meth:`forward`."""

    arity: ClassVar[int | None] = 1
    num_parameters: ClassVar[int] = 0

    def forward(self, *inputs: torch.Tensor) -> torch.Tensor:  # pragma: no cover - abstract
        raise NotImplementedError

    def output_shape(self, *input_shapes: tuple[int, ...]) -> tuple[int, ...]:
        """The shape of one output sample, found by running :meth:`forward` on one sample of zeros.

        (Not on meta tensors: their arithmetic runs torch's Python decompositions, whose first use
        imports torch._dynamo — about 2 s of every process that loads such a network.)"""
        probes = [torch.zeros((1, *shape), dtype=torch.float64) for shape in input_shapes]
        try:
            out = self.forward(*probes)
        except (RuntimeError, ValueError, IndexError, TypeError) as exc:
            shapes = ", ".join(str(tuple(s)) for s in input_shapes)
            raise ModelLoadError(f"a {type(self).__name__} layer cannot take inputs of shape {shapes} ({exc})") from None
        return tuple(int(d) for d in out.shape[1:])


def as_constant(value, name: str) -> torch.Tensor:
    """``value`` as a finite float64 tensor (a layer's constant operand)."""
    tensor = torch.as_tensor(value).detach().to(torch.float64).contiguous()
    if not torch.isfinite(tensor).all():
        raise ModelLoadError(f"the {name} contains NaN or infinite values; a network's constants must be finite")
    return tensor


def cast_like(constant: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """``constant`` in ``x``'s dtype and on ``x``'s device."""
    return constant.to(device=x.device, dtype=x.dtype)
