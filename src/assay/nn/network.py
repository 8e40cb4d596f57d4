"""`Network`: the one representation of a ReLU network that every analysis reads."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch
import torch.nn.functional as F

from assay.errors import DataError, ModelLoadError
from assay.nn.layers import AvgPool2d, Conv2d, Flatten, Layer, Linear, ReLU, Reshape

__all__ = ["Network"]

_DTYPES = {"float32": torch.float32, "float64": torch.float64, torch.float32: torch.float32, torch.float64: torch.float64}


def resolve_dtype(dtype) -> torch.dtype:
    """Map ``"float32"``/``"float64"`` (or the torch dtypes) to a torch dtype."""
    try:
        return _DTYPES[dtype]
    except (KeyError, TypeError):
        raise DataError(f"dtype must be 'float32' or 'float64'; got {dtype!r}") from None


@dataclass(frozen=True, eq=False)
class Network:
    """An ordered list of layers applied to inputs of shape ``(batch, *input_shape)``.

    Layers are :class:`Linear`, :class:`Conv2d`, :class:`ReLU`, :class:`AvgPool2d` and
    :class:`Flatten` (and :class:`Reshape`, which analyses build); loaders fold batch normalisation and input normalisation into the
    neighbouring affine layers. Parameters are stored in float64; :meth:`forward` runs in
    float32 or float64.

    Attributes:
        layers: the layers, in order.
        input_shape: the shape of one input, without the batch dimension.
        input_name, output_name: names from the source model (ONNX), for messages and VNN-LIB.
        source: where the network came from (a path or a description), for messages.
    """

    layers: tuple[Layer, ...]
    input_shape: tuple[int, ...]
    input_name: str = "X"
    output_name: str = "Y"
    source: str = "<network>"
    shapes: tuple[tuple[int, ...], ...] = field(init=False, repr=False)
    _cast_cache: dict = field(init=False, repr=False, compare=False)

    def __post_init__(self):
        layers = tuple(self.layers)
        input_shape = tuple(int(d) for d in self.input_shape)
        if not layers:
            raise ModelLoadError(f"{self.source}: the network has no layers")
        shapes = [input_shape]
        for index, layer in enumerate(layers):
            if not isinstance(layer, (Linear, Conv2d, ReLU, AvgPool2d, Flatten, Reshape)):
                raise ModelLoadError(f"{self.source}: layer {index} is a {type(layer).__name__}, not an assay layer")
            try:
                shapes.append(layer.output_shape(shapes[-1]))
            except ModelLoadError as exc:
                raise ModelLoadError(f"{self.source}: layer {index} ({type(layer).__name__}): {exc}") from None
        object.__setattr__(self, "layers", layers)
        object.__setattr__(self, "input_shape", input_shape)
        object.__setattr__(self, "shapes", tuple(shapes))
        object.__setattr__(self, "_cast_cache", {})

    # ------------------------------------------------------------------ shape facts
    @property
    def output_shape(self) -> tuple[int, ...]:
        return self.shapes[-1]

    @property
    def input_size(self) -> int:
        return int(np.prod(self.input_shape))

    @property
    def output_size(self) -> int:
        return int(np.prod(self.output_shape))

    @property
    def num_parameters(self) -> int:
        return sum(layer.num_parameters for layer in self.layers)

    @property
    def relu_indices(self) -> tuple[int, ...]:
        """Positions of the ReLU layers in :attr:`layers`."""
        return tuple(i for i, layer in enumerate(self.layers) if isinstance(layer, ReLU))

    @property
    def num_relus(self) -> int:
        return sum(int(np.prod(self.shapes[i])) for i in self.relu_indices)

    # ------------------------------------------------------------------ evaluation
    def parameters_as(self, index: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """Weight and bias of affine layer ``index`` in ``dtype`` (cached)."""
        key = (index, dtype)
        if key not in self._cast_cache:
            layer = self.layers[index]
            self._cast_cache[key] = (layer.weight.to(dtype), layer.bias.to(dtype))
        return self._cast_cache[key]

    def forward(self, x, dtype="float64") -> torch.Tensor:
        """Plain forward pass.

        Args:
            x: array or tensor of shape ``(batch, *input_shape)`` or ``input_shape``.
            dtype: ``"float32"`` or ``"float64"``.
        Returns:
            tensor of shape ``(batch, *output_shape)`` (no batch dimension if none was given).
        """
        dtype = resolve_dtype(dtype)
        x = torch.as_tensor(x).to(dtype)
        unbatched = tuple(x.shape) == self.input_shape
        if unbatched:
            x = x.unsqueeze(0)
        if tuple(x.shape[1:]) != self.input_shape:
            raise DataError(
                f"{self.source} expects inputs of shape (batch, {', '.join(map(str, self.input_shape))}); "
                f"got {tuple(x.shape)}"
            )
        with torch.no_grad():
            for index in range(len(self.layers)):
                x = self.apply_layer(index, x)
        return x[0] if unbatched else x

    __call__ = forward

    def apply_layer(self, index: int, x: torch.Tensor) -> torch.Tensor:
        """Apply layer ``index`` to a batch ``x`` in ``x``'s dtype."""
        layer = self.layers[index]
        if isinstance(layer, (Linear, Conv2d)):
            weight, bias = self.parameters_as(index, x.dtype)
            return layer.apply(x, weight, bias)
        if isinstance(layer, ReLU):
            return torch.relu(x)
        if isinstance(layer, AvgPool2d):
            return F.avg_pool2d(x, layer.kernel_size, layer.stride, layer.padding, count_include_pad=True)
        if isinstance(layer, Reshape):
            return x.reshape(x.shape[0], *layer.shape)
        return x.reshape(x.shape[0], -1)

    def summary(self) -> list[dict]:
        """One row per layer: index, kind, output shape, parameter count (for `assay info`)."""
        rows = []
        for index, layer in enumerate(self.layers):
            rows.append(
                {
                    "index": index,
                    "layer": type(layer).__name__,
                    "input_shape": list(self.shapes[index]),
                    "output_shape": list(self.shapes[index + 1]),
                    "parameters": layer.num_parameters,
                }
            )
        return rows

    def to_torch(self) -> torch.nn.Sequential:
        """An equivalent float64 ``torch.nn.Sequential`` (for attacks and training-free checks)."""
        modules = []
        for layer in self.layers:
            if isinstance(layer, Linear):
                module = torch.nn.Linear(layer.weight.shape[1], layer.weight.shape[0], dtype=torch.float64)
                module.weight.data.copy_(layer.weight)
                module.bias.data.copy_(layer.bias)
            elif isinstance(layer, Conv2d):
                out_c, in_c, kh, kw = layer.weight.shape
                module = torch.nn.Conv2d(
                    in_c * layer.groups, out_c, (kh, kw), layer.stride, layer.padding, layer.dilation, layer.groups,
                    dtype=torch.float64,
                )
                module.weight.data.copy_(layer.weight)
                module.bias.data.copy_(layer.bias)
            elif isinstance(layer, ReLU):
                module = torch.nn.ReLU()
            elif isinstance(layer, AvgPool2d):
                module = torch.nn.AvgPool2d(layer.kernel_size, layer.stride, layer.padding, count_include_pad=True)
            elif isinstance(layer, Reshape):
                module = torch.nn.Unflatten(1, layer.shape) if len(layer.shape) > 1 else torch.nn.Flatten()
            else:
                module = torch.nn.Flatten()
            modules.append(module)
        return torch.nn.Sequential(*modules)
