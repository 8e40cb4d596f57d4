"""Convert a ``torch.nn.Sequential`` into a :class:`~assay.nn.Network`.

Contract:

* ``input_shape`` (without the batch dimension) is required: torch modules do not record it.
* Nested ``Sequential`` containers are flattened; the modules run in order.
* Supported modules: ``Linear``, ``Conv2d`` (zero padding mode; ``padding`` an int, a pair,
  ``"valid"`` or ``"same"`` when that is symmetric), ``ReLU``, ``AvgPool2d``
  (``count_include_pad=True`` or no padding, ``ceil_mode`` only where it changes nothing, no
  ``divisor_override``), ``Flatten`` (``start_dim=1, end_dim=-1``), ``BatchNorm1d``/``BatchNorm2d``
  in eval mode with running statistics (folded into the neighbouring affine layer), ``Identity``
  and dropout modules (ignored: the Network is the inference-time model). A single supported
  module that is not in a ``Sequential`` is accepted too.
* Anything else raises :class:`UnsupportedOperatorError` naming the module class and its position
  (index in the flattened order and its dotted path in the model).
* Parameters are copied to float64; the model is not modified. ``Network.source`` is
  ``"torch.nn.Sequential"``.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from assay.errors import ModelLoadError, UnsupportedOperatorError
from assay.nn._build import LayerBuilder
from assay.nn.network import Network

__all__ = ["load_torch", "SUPPORTED_MODULES"]

SUPPORTED_MODULES = ("Linear", "Conv2d", "ReLU", "AvgPool2d", "Flatten", "BatchNorm1d", "BatchNorm2d",
                     "Identity", "Dropout", "Sequential")
_SOURCE = "torch.nn.Sequential"
_DROPOUT = (nn.Dropout, nn.Dropout1d, nn.Dropout2d, nn.Dropout3d, nn.AlphaDropout, nn.FeatureAlphaDropout)


def _leaves(module: nn.Module, path: str):
    if isinstance(module, nn.Sequential):
        for name, child in module.named_children():
            yield from _leaves(child, f"{path}.{name}" if path else name)
    else:
        yield path or "<model>", module


def _numpy(tensor: torch.Tensor) -> np.ndarray:
    return tensor.detach().cpu().to(torch.float64).numpy()


def _pair(value) -> tuple[int, int]:
    return (int(value), int(value)) if isinstance(value, int) else tuple(int(v) for v in value)


def load_torch(model: nn.Module, input_shape=None) -> Network:
    """Convert ``model`` (see the module docstring for what is supported)."""
    if input_shape is None:
        raise ModelLoadError(
            f"{_SOURCE}: input_shape is required for torch models (a module does not record the shape it expects); "
            "pass e.g. load(model, input_shape=(3, 32, 32)) or input_shape=(n_features,), without the batch dimension"
        )
    try:
        shape = tuple(int(d) for d in input_shape)
    except (TypeError, ValueError):
        raise ModelLoadError(f"{_SOURCE}: input_shape must be a tuple of positive ints; got {input_shape!r}") from None
    if not shape or any(d < 1 for d in shape):
        raise ModelLoadError(f"{_SOURCE}: input_shape must be a non-empty tuple of positive ints; got {input_shape!r}")
    builder = LayerBuilder(shape)
    for position, (path, module) in enumerate(_leaves(model, "")):
        where = f"{_SOURCE}: module {position} ('{path}', {type(module).__name__})"
        try:
            _convert(module, builder, where)
        except ModelLoadError as exc:
            if where in str(exc):
                raise
            raise type(exc)(f"{where}: {exc}") from exc
    return Network(tuple(builder.finish(f"{_SOURCE}: end of the model")), shape, "X", "Y", _SOURCE, sources=tuple(builder.sources))


def _convert(module: nn.Module, builder: LayerBuilder, where: str) -> None:
    if isinstance(module, nn.Linear):
        bias = module.bias if module.bias is not None else torch.zeros(module.out_features)
        builder.linear(module.weight, bias, where)
    elif isinstance(module, nn.Conv2d):
        _conv(module, builder, where)
    elif isinstance(module, nn.ReLU):
        builder.relu(where)
    elif isinstance(module, nn.AvgPool2d):
        _avgpool(module, builder, where)
    elif isinstance(module, nn.Flatten):
        rank = len(builder.shape) + 1
        if module.start_dim != 1 or module.end_dim not in (-1, rank - 1):
            raise UnsupportedOperatorError(
                f"{where}: only Flatten(start_dim=1, end_dim=-1) is supported; got start_dim={module.start_dim}, "
                f"end_dim={module.end_dim}"
            )
        builder.flatten(where)
    elif isinstance(module, (nn.BatchNorm1d, nn.BatchNorm2d)):
        _batchnorm(module, builder, where)
    elif isinstance(module, (nn.Identity, *_DROPOUT)):
        pass
    else:
        custom = not type(module).__module__.startswith("torch.nn")
        raise UnsupportedOperatorError(
            f"{where}: {type(module).__name__} cannot be represented by assay's Network; "
            f"supported modules: {', '.join(SUPPORTED_MODULES)} (and other dropout variants)"
            + ("; rewrite the custom module as an nn.Sequential of these, or export it to ONNX" if custom else "")
        )


def _conv(module: nn.Conv2d, builder: LayerBuilder, where: str) -> None:
    if module.padding_mode != "zeros":
        raise UnsupportedOperatorError(f"{where}: padding_mode={module.padding_mode!r} is not supported; use 'zeros'")
    kernel, dilation, stride = _pair(module.kernel_size), _pair(module.dilation), _pair(module.stride)
    padding = module.padding
    if padding == "valid":
        padding = (0, 0)
    elif padding == "same":
        total = [d * (k - 1) for d, k in zip(dilation, kernel)]
        if any(t % 2 for t in total):
            raise UnsupportedOperatorError(f"{where}: padding='same' with an even kernel pads asymmetrically")
        padding = tuple(t // 2 for t in total)
    bias = module.bias if module.bias is not None else torch.zeros(module.out_channels)
    builder.conv(module.weight, bias, stride, _pair(padding), dilation, module.groups, where)


def _avgpool(module: nn.AvgPool2d, builder: LayerBuilder, where: str) -> None:
    kernel = _pair(module.kernel_size)
    stride = _pair(module.stride) if module.stride is not None and module.stride != [] else kernel
    padding = _pair(module.padding)
    if module.divisor_override is not None:
        raise UnsupportedOperatorError(f"{where}: divisor_override is not supported")
    if any(padding) and not module.count_include_pad:
        raise UnsupportedOperatorError(
            f"{where}: count_include_pad=False with padding divides border windows by fewer elements; assay's "
            "AvgPool2d counts the padding (use count_include_pad=True or no padding)"
        )
    if module.ceil_mode and len(builder.shape) == 3 and any(
            (n + 2 * p - k) % s for n, p, k, s in zip(builder.shape[1:], padding, kernel, stride)):
        raise UnsupportedOperatorError(f"{where}: ceil_mode=True adds partial windows here; use ceil_mode=False")
    builder.avgpool(kernel, stride, padding, where)


def _batchnorm(module, builder: LayerBuilder, where: str) -> None:
    if module.training:
        raise ModelLoadError(
            f"{where}: the model is in training mode, where batch normalisation uses batch statistics; "
            "call model.eval() before loading"
        )
    if module.running_mean is None or module.running_var is None:
        raise UnsupportedOperatorError(f"{where}: batch normalisation without running statistics "
                                       "(track_running_stats=False) depends on the batch; it is not supported")
    var, mean = _numpy(module.running_var), _numpy(module.running_mean)
    gamma = _numpy(module.weight) if module.weight is not None else np.ones_like(mean)
    beta = _numpy(module.bias) if module.bias is not None else np.zeros_like(mean)
    scale = gamma / np.sqrt(var + module.eps)
    shift = beta - mean * scale
    if not builder.shape or builder.shape[0] != mean.size:
        raise ModelLoadError(f"{where}: normalises {mean.size} channels but receives a tensor of shape {builder.shape}")
    trailing = (1,) * (len(builder.shape) - 1)
    builder.affine(scale.reshape(-1, *trailing), shift.reshape(-1, *trailing), where)
