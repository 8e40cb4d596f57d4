"""Who may call the service, and where it may listen.

* :func:`check_bind`: the server listens on loopback unless a token is set — a monitor's
  decisions are personal data; an open port on a network must not hand them out.
* :func:`token_matches`: the token is compared in constant time (:func:`hmac.compare_digest`
  on the UTF-8 bytes), so response times tell nothing about how much of a guess was right.
  Clients send ``Authorization: Bearer TOKEN``; a browser signs in once through the login
  form, which sets the token as an HTTP-only, same-site cookie.
"""

from __future__ import annotations

import hmac
import ipaddress

from assay.errors import OptionError

__all__ = ["check_bind", "token_matches", "presented_token", "COOKIE", "is_loopback", "describe_access"]

COOKIE = "assay_token"


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_bind(host: str, token: str | None) -> None:
    """Refuse a non-loopback ``host`` without a token; refuse an empty or short token.

    An empty token is an error, not "no token": ``ASSAY_TOKEN=""`` usually means a secret that
    failed to load, and a server that then ran open would be the wrong default.
    """
    if token is not None and not token.strip():
        raise OptionError("the token is empty (--token '' or ASSAY_TOKEN=''): set one of at least 16 characters, or unset "
                          "ASSAY_TOKEN and leave out --token to run without a token on loopback")
    if token is not None and len(token) < 16:
        raise OptionError("the token must have at least 16 characters (e.g. `python -c 'import secrets; "
                          "print(secrets.token_urlsafe(24))'`)")
    if not is_loopback(host) and token is None:
        raise OptionError(f"refusing to listen on {host!r} without a token: anyone who reaches the port could read the "
                          "decisions; pass --token (or ASSAY_TOKEN), or keep the default host 127.0.0.1")


def presented_token(headers, cookies) -> str | None:
    """The token a request carries: ``Authorization: Bearer ...`` first, else the dashboard cookie."""
    header = headers.get("authorization")
    if header:
        scheme, _, value = header.partition(" ")
        return value.strip() if scheme.lower() == "bearer" else None
    return cookies.get(COOKIE)


def token_matches(presented: str | None, token: str) -> bool:
    """Constant-time comparison of the presented token with the server's."""
    if presented is None:
        presented = ""
    return hmac.compare_digest(presented.encode("utf-8"), token.encode("utf-8"))


def describe_access(host: str, port: int, token: str | None) -> str:
    """Where the server listens and who may call it, for its start-up line."""
    shown = f"[{host}]" if ":" in host else host
    where = f"http://{shown}:{port}/"
    reach = "loopback only" if is_loopback(host) else "reachable from the network"
    guard = "token required (Authorization: Bearer TOKEN)" if token is not None else "no token required"
    return f"{where} ({reach}; {guard})"
