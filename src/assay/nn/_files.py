"""Model files that may be gzipped (``.onnx.gz``, ``.nnet.gz``, as some VNN-COMP benchmarks ship them)."""

from __future__ import annotations

import gzip
from pathlib import Path

from assay.errors import ModelLoadError

__all__ = ["is_gzipped", "gunzipped"]


def is_gzipped(path: Path) -> bool:
    """Whether the file name ends in ``.gz`` (any case)."""
    return path.suffix.lower() == ".gz"


def gunzipped(path: Path) -> bytes:
    """The decompressed contents of ``path``.

    Raises FileNotFoundError as ``open`` does (the readers name the missing file themselves), and
    :class:`~assay.errors.ModelLoadError` naming the file when it is not a complete gzip archive.
    """
    try:
        with gzip.open(path, "rb") as handle:
            return handle.read()
    except FileNotFoundError:
        raise
    except (OSError, EOFError) as exc:
        raise ModelLoadError(f"{path}: cannot decompress ({exc}); check that the .gz file is complete") from exc
