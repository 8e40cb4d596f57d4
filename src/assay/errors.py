"""The errors assay raises to its users.

Every failure a user can cause (a bad file, a bad option, data of the wrong shape) is an
:class:`AssayError` whose message names the file or value, the place, and the fix. Foreign
exceptions (onnx, onnxruntime, numpy parsing) are translated at the boundary that met them,
with ``raise ... from exc`` so the original stays visible to whoever debugs.

::

    AssayError
    ├── ModelLoadError            a model file or object could not be read into a Network
    │   └── UnsupportedOperatorError   the model uses an operator assay cannot represent
    ├── SpecError                 a property / input set / VNN-LIB file is malformed
    ├── DataError                 data of the wrong shape, NaN, missing columns
    ├── OptionError               an option value outside its documented range
    └── UnsupportedError          a valid request assay does not implement (yet)
"""

from __future__ import annotations

__all__ = [
    "AssayError",
    "ModelLoadError",
    "UnsupportedOperatorError",
    "SpecError",
    "DataError",
    "OptionError",
    "UnsupportedError",
]


class AssayError(Exception):
    """Base class of every error assay raises on purpose."""


class ModelLoadError(AssayError):
    """A model could not be loaded (missing file, malformed ONNX, inconsistent shapes)."""


class UnsupportedOperatorError(ModelLoadError):
    """The model contains an operator that assay's Network cannot represent."""


class SpecError(AssayError):
    """An input set or output specification is malformed (e.g. a bad VNN-LIB file)."""


class DataError(AssayError):
    """Input data has the wrong shape, contains NaN, or misses a column."""


class OptionError(AssayError, ValueError):
    """An option is outside its documented range."""


class UnsupportedError(AssayError):
    """A well-formed request that assay does not support."""
