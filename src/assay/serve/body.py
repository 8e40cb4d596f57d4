"""Request bodies read strictly at the edge of the service: bounded before they are parsed, exact once parsed.

:func:`check_content_headers` and :func:`check_idempotency_key` check the headers that say how
to read a body and whether it was sent before (400/415 when malformed).

:func:`decode_json` turns the raw bytes of a request body into a JSON value, refusing
(:class:`MalformedBodyError`, answered 400) anything a careless or hostile client could use to
make the server work hard or guess:

* a body that is empty, not UTF-8, starts with a byte-order mark, or is not JSON;
* arrays and objects nested deeper than :data:`MAX_DEPTH` levels — measured on the raw bytes
  (strings blanked out, brackets counted by numpy) *before* the parser is run, so that a body of
  100,000 ``[`` costs a scan, not a recursion;
* an object holding the same key twice (which one would count?).

Numbers are parsed exactly: an integer literal that a float64 cannot hold exactly (more than
2^53 in size and not a multiple of a high enough power of two, e.g. ``10**400``) is not
converted but kept as an :class:`InexactInteger`, so that the payload check can name the field
that holds it (``x[0]``); a literal of more than 309 digits is not even converted. ``NaN`` and
``Infinity`` are parsed as floats and refused later with their field's name.
"""

from __future__ import annotations

import json
import re

import numpy as np

from assay.errors import DataError

__all__ = ["decode_json", "nesting_depth", "check_content_headers", "check_idempotency_key", "InexactInteger",
           "MalformedBodyError", "UnsupportedMediaError", "MAX_DEPTH", "IDEMPOTENCY_KEY"]

#: Deepest nesting of arrays and objects accepted in a body. The deepest shape the API takes,
#: ``{"decisions": [{"x": [...]}]}``, has 3 levels; the margin leaves room for future shapes.
MAX_DEPTH = 16

# A JSON string, or an unterminated one up to the end of the body (so every quote starts one
# match and the scan stays linear: a body of escaped quotes cannot make the search quadratic).
_STRING = re.compile(rb'"(?:[^"\\]|\\.)*+(?:"|\\?\Z)', re.DOTALL)

# What each byte does to the depth (+1 opening, −1 closing), and every byte that is not a bracket.
_STEP = np.zeros(256, dtype=np.int32)
_STEP[[ord("["), ord("{")]] = 1
_STEP[[ord("]"), ord("}")]] = -1
_NOT_BRACKETS = bytes(code for code in range(256) if code not in b"[]{}")

# Integers this long cannot be within float64's range (≈ 1.8e308): never converted.
_MAX_INTEGER_DIGITS = 309


class MalformedBodyError(DataError):
    """The body is not JSON this service reads (not UTF-8, too deep, duplicate keys, ...): HTTP 400."""


class UnsupportedMediaError(DataError):
    """The body is declared as something other than plain UTF-8 JSON (another type, a charset, compressed): HTTP 415."""


#: The header that makes a post exactly-once (its value: 1–255 visible ASCII characters).
IDEMPOTENCY_KEY = "Idempotency-Key"


def check_idempotency_key(key: str | None) -> str | None:
    """``key`` (an ``Idempotency-Key`` header's value, or None) if well formed; else :class:`MalformedBodyError`."""
    if key is not None and (not 1 <= len(key) <= 255 or not all(33 <= ord(c) <= 126 for c in key)):
        raise MalformedBodyError(f"the {IDEMPOTENCY_KEY} header must be 1–255 visible ASCII characters (e.g. a UUID); "
                                 f"got {key[:40]!r}{'…' if len(key) > 40 else ''} ({len(key)} characters)")
    return key


def check_content_headers(content_type: str | None, content_encoding: str | None) -> None:
    """Bodies are plain JSON: a declared Content-Type must be JSON in UTF-8, and nothing may be compressed.

    No Content-Type at all is read as JSON (so that ``curl --data-binary`` works with the header
    forgotten); a form or text body is refused rather than guessed at.
    """
    if content_type is not None:
        media, _, parameters = content_type.partition(";")
        media = media.strip().lower()
        if media != "application/json" and not (media.startswith("application/") and media.endswith("+json")):
            raise UnsupportedMediaError(f"Content-Type {content_type[:60]!r} is not JSON; post JSON with "
                                        "Content-Type: application/json")
        charset = next((value.strip().strip('"').lower() for name, _, value in
                        (part.partition("=") for part in parameters.split(";")) if name.strip().lower() == "charset"), None)
        if charset not in (None, "utf-8", "utf8"):
            raise UnsupportedMediaError(f"Content-Type charset {charset!r} is not UTF-8; JSON bodies must be UTF-8")
    if content_encoding is not None and content_encoding.strip().lower() != "identity":
        raise UnsupportedMediaError(f"Content-Encoding {content_encoding[:40]!r} is not accepted; send the JSON uncompressed")


class InexactInteger(str):
    """An integer literal of the body that a float64 cannot hold exactly (kept as its text, never converted)."""

    def describe(self) -> str:
        digits = len(self) - self.startswith("-")
        shown = self if len(self) <= 24 else f"{self[:10]}…{self[-6:]}"
        return f"the integer {shown} ({digits} digits), which a float64 cannot hold exactly"


def nesting_depth(raw: bytes) -> int:
    """The deepest nesting of ``[``/``{`` in ``raw`` outside JSON strings (linear time, no parsing)."""
    brackets = _STRING.sub(b'""', raw).translate(None, _NOT_BRACKETS)  # C loops: only the brackets are left
    if not brackets:
        return 0
    depth = _STEP.take(np.frombuffer(brackets, dtype=np.uint8))
    return int(np.cumsum(depth, out=depth).max(initial=0))


def _integer(text: str):
    digits = len(text) - text.startswith("-")
    if digits > _MAX_INTEGER_DIGITS:
        return InexactInteger(text)
    value = int(text)
    if abs(value) > 2**53:
        try:
            exact = float(value) == value
        except OverflowError:
            exact = False
        if not exact:
            return InexactInteger(text)
    return value


def _object(pairs: list[tuple[str, object]]) -> dict:
    found = dict(pairs)
    if len(found) != len(pairs):
        seen = set()
        for key, _ in pairs:
            if key in seen:
                raise MalformedBodyError(f"an object of the body has the key {key!r} twice; each key may appear once")
            seen.add(key)
    return found


def decode_json(raw: bytes, max_depth: int = MAX_DEPTH):
    """The JSON value of ``raw`` (a request body), or :class:`MalformedBodyError` saying what is wrong with it."""
    if not raw.strip():
        raise MalformedBodyError("the body is empty; post a JSON object (Content-Type: application/json)")
    if raw.startswith(b"\xef\xbb\xbf"):
        raise MalformedBodyError("the body starts with a byte-order mark; send plain UTF-8 JSON")
    depth = nesting_depth(raw)
    if depth > max_depth:
        raise MalformedBodyError(f"the body nests arrays and objects {depth} levels deep; at most {max_depth} are accepted")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise MalformedBodyError(f"the body is not UTF-8 (byte {exc.start} is {raw[exc.start:exc.start + 1]!r}); "
                                 "JSON bodies must be UTF-8") from None
    try:
        return json.loads(text, parse_int=_integer, object_pairs_hook=_object)
    except RecursionError:  # cannot happen below MAX_DEPTH; kept as a last guard
        raise MalformedBodyError(f"the body nests too deeply; at most {max_depth} levels are accepted") from None
    except ValueError as exc:
        raise MalformedBodyError(f"the body is not valid JSON: {exc}") from None
