"""`load`: one entry point that turns a model file or object into a :class:`~assay.nn.Network`.

Supported sources (each format's contract is in its private module's docstring):

=============================================  ===========================================
source                                         reader
=============================================  ===========================================
path ending in ``.onnx``, or ``onnx.ModelProto``  :mod:`assay.nn._onnx`
path ending in ``.nnet`` (Reluplex/NNet text)  :mod:`assay.nn._nnet`
path ending in ``.onnx.gz`` or ``.nnet.gz``     the same readers, decompressed in memory
``torch.nn.Sequential`` (needs ``input_shape``)  :mod:`assay.nn._torch`
fitted ``sklearn`` ``MLPClassifier``/``MLPRegressor``  :mod:`assay.nn._sklearn`
a :class:`Network`                             returned unchanged (after the shape check)
=============================================  ===========================================

Every failure is a :class:`~assay.errors.ModelLoadError` (an operator assay cannot represent:
its subclass :class:`~assay.errors.UnsupportedOperatorError`) whose message names the file
(or object), the place, and the fix.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from assay.errors import ModelLoadError, OptionError
from assay.nn.network import Network

__all__ = ["load", "nnet_input_bounds", "SUPPORTED_FORMATS"]

SUPPORTED_FORMATS = (
    ".onnx files (or onnx.ModelProto)",
    ".nnet files",
    "either gzipped (.onnx.gz, .nnet.gz)",
    "torch.nn.Sequential (with input_shape=...)",
    "fitted sklearn MLPClassifier / MLPRegressor",
)


def load(source, *, input_shape=None) -> Network:
    """Load a ReLU network from a file or an in-memory model.

    Args:
        source: a path (``str`` or ``os.PathLike``) to an ``.onnx`` or ``.nnet`` file (or a
            gzipped one: ``.onnx.gz``, ``.nnet.gz``, read without a temporary file), an
            ``onnx.ModelProto``, a ``torch.nn.Sequential``, a fitted scikit-learn
            ``MLPClassifier``/``MLPRegressor``, or a :class:`Network`.
        input_shape: the shape of one input without the batch dimension. Required for torch
            models; for the other formats optional, filling in unknown dimensions and otherwise
            checked against the model.

    Returns:
        a :class:`Network` with float64 parameters. Batch and input normalisation are folded into
        the affine layers; dropout is dropped (inference). ``Network.source`` is the path, or
        ``"torch.nn.Sequential"`` / ``"sklearn MLPClassifier"`` / ``"sklearn MLPRegressor"``.
        For ``.nnet`` files, the input clipping box is not part of the network: see
        :func:`nnet_input_bounds`. For scikit-learn classifiers the outputs are logits (before
        softmax/logistic).

    Raises:
        ModelLoadError: missing, malformed or damaged (gzip) file, unknown format, inconsistent shapes.
        UnsupportedOperatorError: an operator/module/activation the Network cannot represent.
        OptionError: ``input_shape`` is not a tuple of positive ints.
    """
    input_shape = _checked_shape(input_shape)
    if isinstance(source, Network):
        if input_shape is not None and tuple(input_shape) != source.input_shape:
            raise ModelLoadError(f"{source.source}: input_shape={tuple(input_shape)} but the network takes "
                                 f"{source.input_shape}")
        return source
    if isinstance(source, (str, os.PathLike)):
        path = Path(source)
        suffix = _format_suffix(path)
        if suffix == ".onnx":
            from assay.nn._onnx import load_onnx

            return load_onnx(path, input_shape)
        if suffix == ".nnet":
            from assay.nn._nnet import load_nnet

            return load_nnet(path, input_shape)
        raise ModelLoadError(
            f"{path}: unknown model format {suffix or '(no suffix)'!r}; supported: {'; '.join(SUPPORTED_FORMATS)}. "
            "Convert the model to ONNX (e.g. torch.onnx.export, tf2onnx, skl2onnx), or for a torch checkpoint "
            "torch.load it and pass the nn.Sequential"
        )
    module = type(source).__module__ or ""
    if module.startswith("onnx") and hasattr(source, "graph"):
        from assay.nn._onnx import load_onnx

        return load_onnx(source, input_shape)
    if module.startswith("sklearn"):
        from assay.nn._sklearn import load_sklearn

        return load_sklearn(source, input_shape)
    import torch

    if isinstance(source, torch.nn.Module):
        from assay.nn._torch import load_torch

        return load_torch(source, input_shape)
    raise ModelLoadError(
        f"cannot load a {type(source).__module__}.{type(source).__name__}; supported: {'; '.join(SUPPORTED_FORMATS)}, "
        "or a path to a model file"
    )


def _format_suffix(path: Path) -> str:
    """``.onnx`` or ``.nnet`` for those files gzipped or not (the readers decompress), else the last suffix."""
    suffix = path.suffix.lower()
    if suffix == ".gz" and path.with_suffix("").suffix.lower() in (".onnx", ".nnet"):
        return path.with_suffix("").suffix.lower()
    return suffix


def _checked_shape(input_shape) -> tuple[int, ...] | None:
    if input_shape is None:
        return None
    try:
        shape = tuple(int(d) for d in input_shape)
        valid = len(shape) > 0 and all(d >= 1 and d == e for d, e in zip(shape, input_shape))
    except (TypeError, ValueError):
        valid = False
    if not valid:
        raise OptionError(
            f"the `input_shape` option of load must be a non-empty tuple of positive ints (one input, without the "
            f"batch dimension), e.g. (3, 32, 32) or (5,); got {input_shape!r}"
        )
    return shape


def nnet_input_bounds(path) -> tuple[np.ndarray, np.ndarray]:
    """The box ``(mins, maxes)`` (float64, shape ``(inputSize,)``) a ``.nnet`` file clips raw inputs to.

    ``load(path)`` does not clip: its Network equals the file's network only inside this box,
    so intersect input sets with it before analysing.
    """
    from assay.nn._nnet import read_nnet_input_bounds

    return read_nnet_input_bounds(path)
