"""Optional test packages: required in CI, skipped with the reason elsewhere.

The test extras (``pip install -e '.[test]'``) bring the independent oracles and optional
backends that some tests need: maraboupy (an independent complete solver), faiss-cpu and dd
(monitor backends), pyarrow (Parquet streams) and distributed (Dask clusters). In CI — the
environment variable ``CI`` set to any non-empty value — a missing one fails the test with the
command that installs it, so that no soundness check silently stops running. Elsewhere the
test is skipped, with the same words as its reason.
"""

from __future__ import annotations

import importlib
import os
from types import ModuleType

import pytest

# import name -> what to install
INSTALL = {
    "maraboupy": "maraboupy==2.0.0",
    "faiss": "faiss-cpu",
    "dd": "dd==0.6.0",
    "pyarrow": "pyarrow",
    "distributed": "distributed",
    "psycopg": "psycopg[binary]",
    "selenium": "selenium",
    "schemathesis": "schemathesis",
}


def in_ci() -> bool:
    """True when the environment variable CI is set to any non-empty value (CI=true, CI=1, ...)."""
    return bool(os.environ.get("CI", "").strip())


def missing_message(module: str) -> str:
    package = INSTALL.get(module, module)
    return (f"the test needs the package {package!r} (import {module}), which is not installed: install the "
            f"test extras with `pip install -e '.[test]'` (or just `pip install '{package}'`)")


def require(module: str) -> ModuleType:
    """Import ``module``; if it is missing, fail the test in CI and skip it elsewhere."""
    try:
        return importlib.import_module(module)
    except ImportError:
        if in_ci():
            pytest.fail(missing_message(module), pytrace=False)
        pytest.skip(missing_message(module))


def is_installed(module: str) -> bool:
    try:
        importlib.import_module(module)
    except ImportError:
        return False
    return True
