"""Public names of a package loaded on first use (PEP 562), so that light modules stay light.

The command line reads the method registry and the verifier's defaults without loading torch;
a package's ``__init__`` lists where each public name lives and this loads it when asked.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable


def lazy_names(package: str, homes: dict[str, str]) -> tuple[Callable[[str], object], Callable[[], list[str]]]:
    """``(__getattr__, __dir__)`` for ``package``, whose name ``n`` lives in module ``homes[n]``."""

    def __getattr__(name: str):
        if name in homes:
            value = getattr(importlib.import_module(homes[name]), name)
            setattr(sys.modules[package], name, value)  # loaded once
            return value
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    def __dir__() -> list[str]:
        return sorted(set(vars(sys.modules[package])) | set(homes))

    return __getattr__, __dir__
