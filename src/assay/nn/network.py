"""`Network`: the one representation of a network (a graph of layers) that every analysis reads."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.nn.functional as F

from assay.errors import DataError, ModelLoadError
from assay.nn.layers import (
    RELU_NETWORK_LAYERS,
    Add,
    AvgPool2d,
    Conv2d,
    Layer,
    Linear,
    MaxPool2d,
    ReLU,
    Reshape,
    arity,
)
from assay.nn.ops.base import Operator
from assay.nn.sparse import SparseLinear, is_sparse_weight

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
    """A graph of layers, in topological order, applied to inputs of shape ``(batch, *input_shape)``.

    Layers are :class:`Linear`, :class:`Conv2d`, :class:`ReLU`, :class:`AvgPool2d`,
    :class:`Flatten`, :class:`Reshape` and :class:`Add` (and :class:`MaxPool2d`, in
    :attr:`pooled` twins only), and the general operators of :mod:`assay.nn.ops` (each owns its
    forward pass; a layer may read any number of tensors); loaders fold batch normalisation and
    input normalisation into the neighbouring affine layers and lower MaxPool to convolutions,
    ReLUs and Adds (``max(a, b) = a + relu(b − a)``, exact). Parameters are stored in float64;
    :meth:`forward` runs in float32 or float64.

    The network's tensors are numbered: tensor 0 is the input and tensor ``i + 1`` the output of
    layer ``i``; the last one is the network's output. ``sources[i]`` names the tensors layer
    ``i`` reads (earlier ones only); omitted, every layer reads the previous one (a chain).
    A ReLU always reads the tensor just before it (``sources[i] == (i,)``), so ``shapes[i]`` is
    the shape of its pre-activations; loaders keep to this.

    Attributes:
        layers: the layers, in topological order.
        input_shape: the shape of one input, without the batch dimension.
        input_name, output_name: names from the source model (ONNX), for messages and VNN-LIB.
        source: where the network came from (a path or a description), for messages.
        sources: per layer, the indices of the tensors it reads.
        shapes: the shape of every tensor (``shapes[0]`` the input, ``shapes[-1]`` the output).
        pooled: for a model with MaxPool, the same function with :class:`MaxPool2d` layers kept
            whole (else None). Bound propagation relaxes a pooling window as one max, which is
            far tighter than relaxing its lowered ReLUs one by one; complete methods (ReLU
            splitting, leaf LPs) read the lowered layers. Analyses that only bound may use either.
        origins: per layer, where in the source model it came from (an ONNX node's name and
            operator), for messages; None where the loader does not say.
        onnx_file: the ONNX file (a path, gzipped or not) this network was loaded from, as
            loaded; None for any other network, including one rebuilt from a loaded network
            (``dataclasses.replace`` drops it). Counterexamples are re-checked on it by
            onnxruntime (:mod:`assay.verify.onnx_recheck`). Set by the loader only.
    """

    layers: tuple[Layer, ...]
    input_shape: tuple[int, ...]
    input_name: str = "X"
    output_name: str = "Y"
    source: str = "<network>"
    sources: tuple[tuple[int, ...], ...] | None = None
    pooled: Network | None = field(default=None, repr=False, compare=False)
    origins: tuple[str, ...] | None = field(default=None, repr=False, compare=False)
    onnx_file: str | None = field(default=None, init=False, repr=False, compare=False)
    shapes: tuple[tuple[int, ...], ...] = field(init=False, repr=False)
    _cast_cache: dict = field(init=False, repr=False, compare=False)

    def __post_init__(self):
        layers = tuple(self.layers)
        input_shape = tuple(int(d) for d in self.input_shape)
        if not layers:
            raise ModelLoadError(f"{self.source}: the network has no layers")
        if self.sources is None:
            sources = tuple((index,) for index in range(len(layers)))
        else:
            sources = tuple(tuple(int(s) for s in entry) for entry in self.sources)
            if len(sources) != len(layers):
                raise ModelLoadError(f"{self.source}: {len(sources)} source entries for {len(layers)} layers")
        if self.origins is not None and len(self.origins) != len(layers):
            # Messages only: a network rebuilt with other layers (replace(..., layers=...)) loses them.
            object.__setattr__(self, "origins", None)
        shapes = [input_shape]
        for index, (layer, reads) in enumerate(zip(layers, sources)):
            kind = type(layer).__name__
            if not isinstance(layer, (*RELU_NETWORK_LAYERS, Operator)):
                raise ModelLoadError(f"{self.source}: layer {index} is a {kind}, not an assay layer")
            count = arity(layer)
            if (len(reads) != count if count is not None else not reads) or not all(0 <= s <= index for s in reads):
                needed = "one or more" if count is None else str(count)
                raise ModelLoadError(
                    f"{self.source}: layer {index} ({kind}) reads tensors {list(reads)}; it must read {needed} of the "
                    f"tensors 0..{index} (the input or earlier layers' outputs)"
                )
            if isinstance(layer, ReLU) and reads != (index,):
                raise ModelLoadError(f"{self.source}: ReLU layer {index} must read the tensor just before it ({index})")
            try:
                shapes.append(layer.output_shape(*(shapes[s] for s in reads)))
            except ModelLoadError as exc:
                raise ModelLoadError(f"{self.source}: layer {index} ({kind}): {exc}") from None
        object.__setattr__(self, "layers", layers)
        object.__setattr__(self, "input_shape", input_shape)
        object.__setattr__(self, "sources", sources)
        object.__setattr__(self, "shapes", tuple(shapes))
        object.__setattr__(self, "_cast_cache", {})

    @property
    def is_chain(self) -> bool:
        """True when every layer reads the previous layer's output (no branches)."""
        return all(reads == (index,) for index, reads in enumerate(self.sources))

    # ------------------------------------------------------------------ shape facts
    @property
    def output_shape(self) -> tuple[int, ...]:
        return self.shapes[-1]

    @property
    def input_size(self) -> int:
        return math.prod(self.input_shape)

    @property
    def output_size(self) -> int:
        return math.prod(self.output_shape)

    @property
    def num_parameters(self) -> int:
        return sum(layer.num_parameters for layer in self.layers)

    @property
    def relu_indices(self) -> tuple[int, ...]:
        """Positions of the ReLU layers in :attr:`layers`."""
        return tuple(i for i, layer in enumerate(self.layers) if isinstance(layer, ReLU))

    @property
    def is_relu_network(self) -> bool:
        """True when every layer is one of :mod:`assay.nn.layers` (no general operator)."""
        return not any(isinstance(layer, Operator) for layer in self.layers)

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
            x = self.tensors(x)[-1]
        return x[0] if unbatched else x

    __call__ = forward

    def tensors(self, x: torch.Tensor) -> list[torch.Tensor]:
        """Every tensor of the network on a batch ``x`` (in ``x``'s dtype): ``[input, layer 0's
        output, ...]``, so ``tensors(x)[i]`` for a ReLU layer ``i`` are its pre-activations.

        Differentiable when ``x`` requires a gradient; call it under ``torch.no_grad()`` otherwise.
        """
        values = [x]
        for index, reads in enumerate(self.sources):
            values.append(self.apply_layer(index, *(values[s] for s in reads)))
        return values

    def pre_activations(self, x: torch.Tensor) -> list[torch.Tensor]:
        """The inputs of every ReLU layer on a batch ``x``, in order (float64 for float64 x)."""
        with torch.no_grad():
            values = self.tensors(x)
        return [values[i] for i in self.relu_indices]

    def apply_layer(self, index: int, x: torch.Tensor, *others: torch.Tensor) -> torch.Tensor:
        """Apply layer ``index`` to the batch(es) it reads, in ``x``'s dtype."""
        layer = self.layers[index]
        if isinstance(layer, Operator):
            return layer.forward(x, *others)
        if isinstance(layer, Add):
            return x + others[0]
        if isinstance(layer, (Linear, Conv2d)):
            weight, bias = self.parameters_as(index, x.dtype)
            return layer.apply(x, weight, bias)
        if isinstance(layer, ReLU):
            return torch.relu(x)
        if isinstance(layer, AvgPool2d):
            return F.avg_pool2d(x, layer.kernel_size, layer.stride, layer.padding, count_include_pad=True)
        if isinstance(layer, MaxPool2d):
            return F.max_pool2d(x, layer.kernel_size, layer.stride)
        if isinstance(layer, Reshape):
            return x.reshape(x.shape[0], *layer.shape)
        return x.reshape(x.shape[0], -1)

    def summary(self) -> list[dict]:
        """One row per layer: index, kind, the tensors it reads, shapes, parameter count (for `assay info`)."""
        rows = []
        for index, layer in enumerate(self.layers):
            rows.append(
                {
                    "index": index,
                    "layer": type(layer).__name__,
                    "reads": list(self.sources[index]),
                    "input_shape": list(self.shapes[self.sources[index][0]]),
                    "output_shape": list(self.shapes[index + 1]),
                    "parameters": layer.num_parameters,
                }
            )
        return rows

    def to_torch(self, replace: dict[int, torch.nn.Module] | None = None) -> torch.nn.Module:
        """An equivalent float64 torch module (for attacks and training-free checks): a
        ``torch.nn.Sequential`` for a chain, else a module that evaluates the graph.

        ``replace`` maps layer indices to modules used for those layers instead (each called
        with the tensors the layer reads, like the module it replaces): an attack can give a
        layer another gradient, or drop a layer, without walking the graph itself. The result
        computes this network only where the replacements compute the replaced layers.
        """
        modules = self._torch_modules()
        for index, module in (replace or {}).items():
            if not 0 <= index < len(modules):
                raise ValueError(f"to_torch: no layer {index} to replace ({len(modules)} layers)")
            modules[index] = module
        if self.is_chain:
            return torch.nn.Sequential(*modules)
        return _GraphModule(modules, self.sources)

    def _torch_modules(self) -> list[torch.nn.Module]:
        modules = []
        for layer in self.layers:
            if isinstance(layer, Linear) and is_sparse_weight(layer.weight):
                module = SparseLinear(layer.weight.to(torch.float64), layer.bias.to(torch.float64))
            elif isinstance(layer, Linear):
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
            elif isinstance(layer, MaxPool2d):
                module = torch.nn.MaxPool2d(layer.kernel_size, layer.stride)
            elif isinstance(layer, Reshape):
                module = _Reshape(layer.shape)
            elif isinstance(layer, Add):
                module = _Sum()
            elif isinstance(layer, Operator):
                module = _OperatorModule(layer)
            else:
                module = torch.nn.Flatten()
            modules.append(module)
        return modules


class _Reshape(torch.nn.Module):
    def __init__(self, shape: tuple[int, ...]):
        super().__init__()
        self.shape = shape

    def forward(self, x):
        return x.reshape(x.shape[0], *self.shape)


class _Sum(torch.nn.Module):
    def forward(self, a, b):
        return a + b


class _OperatorModule(torch.nn.Module):
    """A general operator as a torch module (its constants are cast to the input's dtype)."""

    def __init__(self, operator: Operator):
        super().__init__()
        self.operator = operator

    def forward(self, *inputs):
        return self.operator.forward(*inputs)


class _GraphModule(torch.nn.Module):
    """Evaluates a :class:`Network`'s graph with torch modules (what ``to_torch`` returns for non-chains)."""

    def __init__(self, modules: list[torch.nn.Module], sources: tuple[tuple[int, ...], ...]):
        super().__init__()
        self.steps = torch.nn.ModuleList(modules)
        self.sources = sources

    def forward(self, x):
        values = [x]
        for module, reads in zip(self.steps, self.sources):
            values.append(module(*(values[s] for s in reads)))
        return values[-1]
