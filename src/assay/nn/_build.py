"""Assemble a graph of assay layers, folding elementwise affine maps into affine layers.

Shared by the loaders (ONNX, torch, .nnet, scikit-learn). A loader walks its model in
topological order and calls :meth:`LayerBuilder.linear`, :meth:`~LayerBuilder.conv`,
:meth:`~LayerBuilder.relu`, :meth:`~LayerBuilder.avgpool`, :meth:`~LayerBuilder.maxpool`,
:meth:`~LayerBuilder.pad`, :meth:`~LayerBuilder.flatten`, :meth:`~LayerBuilder.affine` and
:meth:`~LayerBuilder.add`, each on the *current* tensor. A model with branches moves between
tensors with :meth:`~LayerBuilder.materialize` (name the current tensor, so another node can
read it later) and :meth:`~LayerBuilder.switch_to`.

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
  images with a per-channel map; any other map becomes an :class:`assay.nn.ops.Affine` layer.

Once a tensor is materialized (read by several nodes, or left for another branch) nothing is
folded into the layers that computed it any more.

MaxPool is lowered exactly: ``max(a, b) = a + relu(b − a)``, applied as a tournament over each
window (``⌈log2 k⌉`` rounds of a difference convolution, a ReLU, a selection convolution and an
Add). The convolutions are ``fixed`` (structural, not model parameters).

All arithmetic is float64 numpy; the layers convert to float64 torch tensors.
"""

from __future__ import annotations

import numpy as np
import torch

from assay.errors import ModelLoadError, UnsupportedOperatorError
from assay.nn.layers import Add, AvgPool2d, Conv2d, Flatten, Linear, MaxPool2d, ReLU, Reshape
from assay.nn.ops.arith import Affine

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

    def __init__(self, input_shape: tuple[int, ...], lower_maxpool: bool = True, affine_layers: bool = False):
        self.lower_maxpool = lower_maxpool  # False: MaxPool stays one MaxPool2d layer (a `pooled` twin)
        # True (general graphs): an unfoldable element-wise map on a vector is an Affine layer, not a
        # diagonal Linear (whose n² weights a 23,328-entry vector cannot afford)
        self.affine_layers = affine_layers
        self.shape = tuple(int(d) for d in input_shape)
        self.layers: list = []
        self.sources: list[tuple[int, ...]] = []
        # Per layer, where in the source model it came from (e.g. "net.onnx: node 'fc1' (Gemm)").
        self.origins: list[str] = []
        self.shapes: list[tuple[int, ...]] = [self.shape]  # of every tensor; 0 is the input
        self.current = 0  # the tensor the next layer reads (before any pending map)
        self._frozen = 0  # layers before this index may no longer be changed by folding
        self._pending: tuple[np.ndarray, np.ndarray] | None = None  # scale, shift, both of `shape`

    # ------------------------------------------------------------------ branches
    def materialize(self, where: str) -> int:
        """Emit any pending map and return the current tensor's index; nothing is folded into
        the layers that computed it from now on (other nodes may read it)."""
        self._emit_pending(where)
        self._frozen = len(self.layers)
        return self.current

    def switch_to(self, tensor: int, where: str) -> None:
        """Make the materialized ``tensor`` the current one (the current one is materialized first)."""
        self.materialize(where)
        self.current, self.shape = tensor, self.shapes[tensor]

    def add(self, other: int, where: str) -> None:
        """Append ``current + other`` (a residual connection); ``other`` is a materialized tensor."""
        self.materialize(where)
        if self.shapes[other] != self.shape:
            raise ModelLoadError(f"{where}: adds tensors of shapes {self.shape} and {self.shapes[other]}; they must match")
        self._append(Add(), where, (self.current, other))

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
        if self.current != len(self.layers):  # a ReLU reads the tensor just before it: copy
            self._append(Reshape(self.shape), where)
        self._append(ReLU(), where)

    def avgpool(self, kernel_size, stride, padding, where: str) -> None:
        self._emit_pending(where)
        self._append(AvgPool2d(kernel_size, stride, padding), where)

    def pad(self, padding, where: str) -> None:
        """Zero padding of an image by ``padding`` = (rows, cols) on both sides."""
        if len(self.shape) != 3:
            raise ModelLoadError(f"{where}: padding needs an image (C, H, W); got shape {self.shape}")
        self._emit_pending(where)
        channels = self.shape[0]
        weight = np.ones((channels, 1, 1, 1))
        self._append(Conv2d(weight, np.zeros(channels), (1, 1), _pair(padding), (1, 1), channels, fixed=True), where)

    def maxpool(self, kernel_size, stride, where: str) -> None:
        """Max pooling without padding, lowered to convolutions, ReLUs and Adds (exact); with
        ``lower_maxpool=False``, one :class:`MaxPool2d` layer."""
        if len(self.shape) != 3:
            raise ModelLoadError(f"{where}: max pooling needs an image (C, H, W); got shape {self.shape}")
        (kh, kw), (sh, sw) = _pair(kernel_size), _pair(stride)
        channels, height, width = self.shape
        if height < kh or width < kw:
            raise ModelLoadError(f"{where}: a {kh}x{kw} max pool does not fit an input of shape {self.shape}")
        if not self.lower_maxpool:
            self._emit_pending(where)
            self._append(MaxPool2d((kh, kw), (sh, sw)), where)
            return
        source = self.materialize(where)
        # Round 0 reads the window's elements straight from the input (a strided kxk selection);
        # later rounds read the previous round's candidates (1x1 convolutions), n per channel.
        candidates = [np.eye(kh * kw)[j].reshape(kh, kw) for j in range(kh * kw)]
        kernel, conv_stride, n = (kh, kw), (sh, sw), kh * kw
        while n > 1:
            pairs, carried = n // 2, n % 2
            kept = pairs + carried
            first = [candidates[2 * i] for i in range(pairs)] + ([candidates[-1]] if carried else [])
            difference = [candidates[2 * i + 1] - candidates[2 * i] for i in range(pairs)]
            self.switch_to(source, where)
            self._append(self._grouped(difference, channels, kernel, conv_stride), where)
            self._append(ReLU(), where)
            rectified = self.current
            if carried:  # place the pairs' maxima among the kept slots (the carried one gets 0)
                slots = [(np.eye(pairs)[j] if j < pairs else np.zeros(pairs)).reshape(pairs, 1, 1) for j in range(kept)]
                self._append(self._grouped(slots, channels, (1, 1), (1, 1)), where)
                rectified = self.current
            self.switch_to(source, where)
            self._append(self._grouped(first, channels, kernel, conv_stride), where)
            self._append(Add(), where, (self.current, rectified))
            source = self.materialize(where)
            candidates = [np.eye(kept)[i].reshape(kept, 1, 1) for i in range(kept)]
            kernel, conv_stride, n = (1, 1), (1, 1), kept
        if kh * kw == 1:  # a 1x1 pool is a strided selection
            self._append(self._grouped(candidates, channels, kernel, conv_stride), where)

    @staticmethod
    def _grouped(kernels: list, channels: int, kernel, stride) -> Conv2d:
        """A fixed grouped convolution applying each kernel of ``kernels`` to every channel's group.

        ``kernels`` are arrays of shape (kh, kw) (one input channel per group) or
        (n, 1, 1) (n input channels per group). Output channel ``c * len(kernels) + j`` is kernel j
        on channel group c.
        """
        stacked = np.stack([np.asarray(k, dtype=np.float64).reshape(-1, *kernel) for k in kernels])
        q = stacked.shape[0]
        weight = np.tile(stacked, (channels, 1, 1, 1))
        return Conv2d(weight, np.zeros(channels * q), stride, (0, 0), (1, 1), channels, fixed=True)

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
        last = self.layers[-1] if len(self.layers) > self._frozen and self.current == len(self.layers) else None
        if isinstance(last, Linear):
            self.layers[-1] = Linear(last.weight.numpy() * scale[:, None], last.bias.numpy() * scale + shift)
            return
        if isinstance(last, Conv2d):
            per_channel = self._per_channel(scale, shift)
            if per_channel is not None:
                s, t = per_channel
                self.layers[-1] = Conv2d(
                    last.weight.numpy() * s[:, None, None, None], last.bias.numpy() * s + t,
                    last.stride, last.padding, last.dilation, last.groups, last.fixed,
                )
                return
        self._pending = (scale, shift)

    def finish(self, where: str) -> list:
        """The layers, with any pending map emitted. An empty model becomes an identity Linear.

        The network's output is the current tensor; :attr:`sources` then holds what each layer reads.
        """
        self._emit_pending(where)
        if not self.layers:
            if len(self.shape) != 1:
                raise ModelLoadError(f"{where}: the model computes nothing (no layer) on inputs of shape {self.shape}")
            size = self.shape[0]
            self._append(Linear(np.eye(size), np.zeros(size)), where)
        if self.current != len(self.layers):  # the output is an earlier tensor: copy it to the end
            self._append(Reshape(self.shape), where)
        return list(self.layers)

    def append(self, layer, sources: tuple[int, ...], where: str) -> None:
        """Append a general operator (:mod:`assay.nn.ops`) reading the materialized tensors ``sources``."""
        self._emit_pending(where)
        self._append(layer, where, sources)

    # ------------------------------------------------------------------ helpers
    def _append(self, layer, where: str, sources: tuple[int, ...] | None = None) -> None:
        sources = (self.current,) if sources is None else sources
        try:
            self.shape = tuple(layer.output_shape(*(self.shapes[s] for s in sources)))
        except ModelLoadError as exc:
            raise ModelLoadError(f"{where}: {exc}") from None
        self.layers.append(layer)
        self.sources.append(tuple(sources))
        self.origins.append(where)
        self.shapes.append(self.shape)
        self.current = len(self.layers)

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
        if len(self.shape) == 1 and not self.affine_layers:
            self._append(Linear(np.diag(scale), shift), where)
            return
        per_channel = self._per_channel(scale, shift)
        if per_channel is None or self.affine_layers:  # a layer of its own
            self._append(Affine(scale, shift), where)
            return
        s, t = per_channel
        channels = self.shape[0]
        self._append(Conv2d(s.reshape(channels, 1, 1, 1), t, (1, 1), (0, 0), (1, 1), channels), where)


def _pair(value) -> tuple[int, int]:
    return (value, value) if isinstance(value, int) else tuple(value)
