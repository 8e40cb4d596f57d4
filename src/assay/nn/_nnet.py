"""Read a Reluplex/NNet ``.nnet`` text file into a :class:`~assay.nn.Network`.

The format (https://github.com/sisl/NNet): any number of header lines starting with ``//``,
then comma-separated lines (a trailing comma is allowed):

1. ``numLayers, inputSize, outputSize, maxLayerSize``
2. the ``numLayers + 1`` layer sizes, input first
3. a flag (unused, historically "symmetric")
4. the ``inputSize`` input minimums, 5. the input maximums
6. ``inputSize + 1`` means, 7. ``inputSize + 1`` ranges (the last entry of each is for the outputs)
8. per layer: ``out`` lines of ``in`` weights, then ``out`` lines holding one bias each.

Every layer but the last is followed by a ReLU.

Normalisation is folded into the network, so the returned :class:`Network` maps *raw* inputs
to *raw* outputs: the input normalisation ``(x - mean) / range`` becomes part of the first
Linear layer and the output de-normalisation ``y * range_out + mean_out`` part of the last one.
The file's clipping of inputs to ``[min, max]`` is **not** part of the Network (it is not
affine): the network is exact only for inputs inside that box. Read the box with
:func:`read_nnet_input_bounds` (exposed as :func:`assay.nn.load.nnet_input_bounds`) and
intersect your input set with it.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from assay.errors import ModelLoadError
from assay.nn._build import LayerBuilder
from assay.nn._files import gunzipped, is_gzipped
from assay.nn.network import Network

__all__ = ["load_nnet", "read_nnet_input_bounds"]


class _Lines:
    """The non-comment lines of a file, parsed into floats, with their 1-based line numbers."""

    def __init__(self, path: Path):
        self.path = path
        try:
            text = gunzipped(path).decode() if is_gzipped(path) else path.read_text()
        except FileNotFoundError:
            raise ModelLoadError(f"{path}: no such file; check the path") from None
        except (OSError, UnicodeDecodeError) as exc:
            raise ModelLoadError(f"{path} could not be read as a text .nnet file ({exc})") from exc
        self.rows = [(number, line) for number, line in enumerate(text.splitlines(), 1)
                     if line.strip() and not line.lstrip().startswith("//")]
        self.position = 0

    def next(self, count: int | None, what: str) -> np.ndarray:
        if self.position >= len(self.rows):
            raise ModelLoadError(f"{self.path}: the file ends before the {what}; the file is truncated")
        number, line = self.rows[self.position]
        self.position += 1
        try:
            values = np.array([float(v) for v in line.split(",") if v.strip()], dtype=np.float64)
        except ValueError as exc:
            raise ModelLoadError(f"{self.path}, line {number}: expected numbers for the {what} ({exc})") from exc
        if count is not None and values.size != count:
            raise ModelLoadError(f"{self.path}, line {number}: expected {count} values for the {what}, got {values.size}")
        if not np.isfinite(values).all():
            raise ModelLoadError(f"{self.path}, line {number}: the {what} contains NaN or infinite values")
        return values


def _read(path) -> tuple[list[tuple[np.ndarray, np.ndarray]], np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Raw ``(layers, mins, maxes, means, ranges)`` of a .nnet file."""
    lines = _Lines(Path(path))
    header = lines.next(None, "header 'numLayers, inputSize, outputSize, maxLayerSize'")
    if header.size < 3 or np.any(header[:3] != np.round(header[:3])) or np.any(header[:3] < 1):
        raise ModelLoadError(f"{path}: the first line must hold 'numLayers, inputSize, outputSize, maxLayerSize'")
    num_layers, input_size, output_size = (int(v) for v in header[:3])
    sizes = lines.next(num_layers + 1, "layer sizes").astype(int)
    if sizes[0] != input_size or sizes[-1] != output_size or np.any(sizes < 1):
        raise ModelLoadError(f"{path}: the layer sizes {sizes.tolist()} disagree with inputSize {input_size} "
                             f"and outputSize {output_size}")
    lines.next(None, "flag line")
    mins = lines.next(input_size, "input minimums")
    maxes = lines.next(input_size, "input maximums")
    means = lines.next(input_size + 1, "means (inputs, then output)")
    ranges = lines.next(input_size + 1, "ranges (inputs, then output)")
    if np.any(ranges == 0):
        raise ModelLoadError(f"{path}: a normalisation range is 0; ranges divide the inputs and must be non-zero")
    layers = []
    for k in range(num_layers):
        fan_in, fan_out = int(sizes[k]), int(sizes[k + 1])
        weight = np.stack([lines.next(fan_in, f"weights of layer {k + 1}") for _ in range(fan_out)])
        bias = np.concatenate([lines.next(1, f"biases of layer {k + 1}") for _ in range(fan_out)])
        layers.append((weight, bias))
    return layers, mins, maxes, means, ranges


def load_nnet(path, input_shape=None) -> Network:
    """Load a .nnet file as a raw-input -> raw-output Network (see the module docstring)."""
    layers, _, _, means, ranges = _read(path)
    input_size = layers[0][0].shape[1]
    if input_shape is not None and tuple(int(d) for d in input_shape) != (input_size,):
        raise ModelLoadError(f"{path}: input_shape={tuple(input_shape)} but the file's network takes {input_size} inputs")
    builder = LayerBuilder((input_size,))
    first, last = 0, len(layers) - 1
    for k, (weight, bias) in enumerate(layers):
        where = f"{path}: layer {k + 1}"
        if k == first:
            bias = bias - weight @ (means[:-1] / ranges[:-1])
            weight = weight / ranges[None, :-1]
        if k == last:
            weight, bias = weight * ranges[-1], bias * ranges[-1] + means[-1]
        builder.linear(weight, bias, where)
        if k != last:
            builder.relu(where)
    return Network(tuple(builder.finish(str(path))), (input_size,), "X", "Y", str(path), sources=tuple(builder.sources))


def read_nnet_input_bounds(path) -> tuple[np.ndarray, np.ndarray]:
    """The input box ``(mins, maxes)`` a .nnet file clips its inputs to (float64, shape ``(inputSize,)``)."""
    _, mins, maxes, _, _ = _read(path)
    return mins, maxes
