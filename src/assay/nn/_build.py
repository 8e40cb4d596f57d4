"""Assemble a chain of assay layers, folding elementwise affine maps into affine layers.

Shared by the loaders (ONNX, torch, .nnet, scikit-learn). A loader walks its model in order and
calls :meth:`LayerBuilder.linear`, :meth:`~LayerBuilder.conv`, :meth:`~LayerBuilder.relu`,
:meth:`~LayerBuilder.avgpool`, :meth:`~LayerBuilder.flatten` and :meth:`~LayerBuilder.affine`.

``affine(scale, shift)`` records the elementwise map ``x -> scale * x + shift`` (input
normalisation, batch normalisation, a bias ``Add``). It never becomes a layer of its own when it
can be folded exactly:

* **backward**, into the affine layer that produced the current tensor (a ``Linear``; a
  ``Conv2d`` when the map is per channel): ``s * (W x + b) + t = (s W) x + (s b + t)``;
* otherwise it stays *pending* and folds **forward** into the next ``Linear`` (also through a
  ``Flatten``: ``W (s x + t) + b = (W diag s) x + (W t + b)``) or ``Conv2d`` (per-channel maps;
  a non-zero shift only when the convolution has no padding, since zero padding is applied
  after the shift);
* before a ReLU, a pooling layer or the end of the model a pending map that could not be folded
  becomes an explicit layer: ``Linear(diag(s), t)`` on vectors, a depthwise 1x1 ``Conv2d`` on
  images with a per-channel map. A per-pixel map on an image that cannot be folded raises
  :class:`UnsupportedOperatorError`.

All arithmetic is float64 numpy; the layers convert to float64 torch tensors.
"""

from __future__ import annotations

import numpy as np
import torch

from assay.errors import ModelLoadError, UnsupportedOperatorError
from assay.nn.layers import AvgPool2d, Conv2d, Flatten, Linear, ReLU

__all__ = ["LayerBuilder"]


def _f64(array) -> np.ndarray:
    if isinstance(array, torch.Tensor):
        array = array.detach().cpu().to(torch.float64).numpy()
    return np.asarray(array, dtype=np.float64)


class LayerBuilder:
    """Collects layers for inputs of shape ``input_shape`` (without the batch dimension).

    ``shape`` is always the shape of the current tensor (without the batch dimension). Every
    method takes ``where`` (e.g. ``"model.onnx: node 'conv1' (Conv)"``), used to start error
    messages.
    """

    def __init__(self, input_shape: tuple[int, ...]):
        self.shape = tuple(int(d) for d in input_shape)
        self.layers: list = []
        self._pending: tuple[np.ndarray, np.ndarray] | None = None  # scale, shift, both of `shape`

    # ------------------------------------------------------------------ affine layers
    def linear(self, weight, bias, where: str) -> None:
        """Append ``y = weight @ x + bias``; ``weight`` is ``(out, in)``."""
        weight, bias = _f64(weight), _f64(bias)
        if weight.ndim != 2 or bias.shape != (weight.shape[0],):
            raise ModelLoadError(f"{where}: weight {weight.shape} and bias {bias.shape} do not form a dense layer")
        if self.shape != (weight.shape[1],):
            raise ModelLoadError(
                f"{where}: the layer takes {weight.shape[1]} inputs but receives a tensor of shape {self.shape}; "
                "check the model's input shape (flatten images before a dense layer)"
            )
        if self._pending is not None:
            scale, shift = (a.reshape(-1) for a in self._pending)
            bias = bias + weight @ shift
            weight = weight * scale[None, :]
            self._pending = None
        self._append(Linear(weight, bias), where)

    def conv(self, weight, bias, stride, padding, dilation, groups: int, where: str) -> None:
        """Append a 2-D convolution; ``weight`` is ``(C_out, C_in / groups, kh, kw)``."""
        weight, bias = _f64(weight), _f64(bias)
        if weight.ndim != 4:
            raise UnsupportedOperatorError(f"{where}: only 2-D convolutions are supported; the kernel has shape {weight.shape}")
        if len(self.shape) != 3 or self.shape[0] != weight.shape[1] * groups:
            raise ModelLoadError(
                f"{where}: the convolution expects {weight.shape[1] * groups} input channels (C, H, W) "
                f"but receives a tensor of shape {self.shape}"
            )
        if self._pending is not None:
            per_channel = self._per_channel(*self._pending)
            if per_channel is None:
                raise UnsupportedOperatorError(
                    f"{where}: an elementwise map that differs between pixels precedes this convolution; "
                    "it cannot be folded into the convolution's weights. Normalise per channel instead"
                )
            scale, shift = per_channel
            if np.any(shift != 0) and any(p != 0 for p in _pair(padding)):
                self._emit_pending(where)  # zero padding is applied after the shift: keep it a layer
            else:
                out_channels, in_per_group = weight.shape[:2]
                group_of = np.arange(out_channels) // (out_channels // groups)
                channel = group_of[:, None] * in_per_group + np.arange(in_per_group)[None, :]
                bias = bias + np.einsum("oikl,oi->o", weight, shift[channel])
                weight = weight * scale[channel][:, :, None, None]
                self._pending = None
        self._append(Conv2d(weight, bias, stride, padding, dilation, groups), where)

    # ------------------------------------------------------------------ other layers
    def relu(self, where: str) -> None:
        self._emit_pending(where)
        self._append(ReLU(), where)

    def avgpool(self, kernel_size, stride, padding, where: str) -> None:
        self._emit_pending(where)
        self._append(AvgPool2d(kernel_size, stride, padding), where)

    def flatten(self, where: str) -> None:
        """Row-major flatten; a no-op on vectors. A pending map is carried through."""
        if len(self.shape) == 1:
            return
        if self._pending is not None:
            self._pending = tuple(a.reshape(-1) for a in self._pending)
        self._append(Flatten(), where)

    def affine(self, scale, shift, where: str) -> None:
        """Record ``x -> scale * x + shift``; both broadcast to :attr:`shape`."""
        try:
            scale = np.broadcast_to(_f64(scale), self.shape).copy()
            shift = np.broadcast_to(_f64(shift), self.shape).copy()
        except ValueError:
            raise ModelLoadError(
                f"{where}: a constant of shape {np.shape(scale)} / {np.shape(shift)} does not broadcast to the "
                f"tensor shape {self.shape} without changing it"
            ) from None
        if not (np.isfinite(scale).all() and np.isfinite(shift).all()):
            raise ModelLoadError(f"{where}: the elementwise map has NaN or infinite coefficients (a division by zero?)")
        if self._pending is not None:
            old_scale, old_shift = self._pending
            self._pending = (scale * old_scale, scale * old_shift + shift)
            return
        last = self.layers[-1] if self.layers else None
        if isinstance(last, Linear):
            self.layers[-1] = Linear(last.weight.numpy() * scale[:, None], last.bias.numpy() * scale + shift)
            return
        if isinstance(last, Conv2d):
            per_channel = self._per_channel(scale, shift)
            if per_channel is not None:
                s, t = per_channel
                self.layers[-1] = Conv2d(
                    last.weight.numpy() * s[:, None, None, None], last.bias.numpy() * s + t,
                    last.stride, last.padding, last.dilation, last.groups,
                )
                return
        self._pending = (scale, shift)

    def finish(self, where: str) -> list:
        """The layers, with any pending map emitted. An empty model becomes an identity Linear."""
        self._emit_pending(where)
        if not self.layers:
            if len(self.shape) != 1:
                raise ModelLoadError(f"{where}: the model computes nothing (no layer) on inputs of shape {self.shape}")
            size = self.shape[0]
            self.layers.append(Linear(np.eye(size), np.zeros(size)))
        return list(self.layers)

    # ------------------------------------------------------------------ helpers
    def _append(self, layer, where: str) -> None:
        try:
            self.shape = tuple(layer.output_shape(self.shape))
        except ModelLoadError as exc:
            raise ModelLoadError(f"{where}: {exc}") from None
        self.layers.append(layer)

    def _per_channel(self, scale: np.ndarray, shift: np.ndarray):
        """``(scale[C], shift[C])`` if the map on a (C, H, W) tensor is constant over pixels, else None."""
        if len(self.shape) != 3:
            return None
        if np.all(scale == scale[:, :1, :1]) and np.all(shift == shift[:, :1, :1]):
            return scale[:, 0, 0].copy(), shift[:, 0, 0].copy()
        return None

    def _emit_pending(self, where: str) -> None:
        if self._pending is None:
            return
        scale, shift = self._pending
        self._pending = None
        if len(self.shape) == 1:
            self._append(Linear(np.diag(scale), shift), where)
            return
        per_channel = self._per_channel(scale, shift)
        if per_channel is None:
            raise UnsupportedOperatorError(
                f"{where}: an elementwise map that differs between positions of a tensor of shape {self.shape} "
                "cannot be folded into a neighbouring dense or convolution layer, and assay has no layer for it"
            )
        s, t = per_channel
        channels = self.shape[0]
        self._append(Conv2d(s.reshape(channels, 1, 1, 1), t, (1, 1), (0, 0), (1, 1), channels), where)


def _pair(value) -> tuple[int, int]:
    return (value, value) if isinstance(value, int) else tuple(value)
