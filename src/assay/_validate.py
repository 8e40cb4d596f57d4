"""Small checks shared by the public boundaries, with scikit-learn-style messages."""

from __future__ import annotations

from collections.abc import Iterable

from assay.errors import OptionError


def check_int(value, name: str, owner: str, minimum: int | None = None) -> int:
    """Return ``value`` if it is an int ≥ ``minimum``; otherwise raise :class:`OptionError`."""
    if isinstance(value, bool) or not isinstance(value, int) or (minimum is not None and value < minimum):
        bound = f" ≥ {minimum}" if minimum is not None else ""
        raise OptionError(f"the `{name}` option of {owner} must be an int{bound}; got {value!r}")
    return value


def check_float(value, name: str, owner: str, minimum: float | None = None, strict: bool = False) -> float:
    """Return ``float(value)`` if it is a finite real ≥ (or > when ``strict``) ``minimum``."""
    ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    if ok:
        value = float(value)
        ok = value == value and abs(value) != float("inf")
        if ok and minimum is not None:
            ok = value > minimum if strict else value >= minimum
    if not ok:
        bound = "" if minimum is None else (f" > {minimum}" if strict else f" ≥ {minimum}")
        raise OptionError(f"the `{name}` option of {owner} must be a finite number{bound}; got {value!r}")
    return value


def check_choice(value, name: str, owner: str, choices: Iterable[str]) -> str:
    """Return ``value`` if it is one of ``choices``; otherwise raise :class:`OptionError`."""
    choices = tuple(choices)
    if value not in choices:
        listed = ", ".join(repr(c) for c in choices)
        raise OptionError(f"the `{name}` option of {owner} must be one of {listed}; got {value!r}")
    return value
