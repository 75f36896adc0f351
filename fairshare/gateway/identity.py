"""Who a request is for: its team and class, from its bearer key or a trusted header.

Order: a bearer key (``Authorization: Bearer <key>``) listed in the keys file gives the
team and class; without a known key, the ``team_header`` when one is configured (a gateway
in front, such as LiteLLM, set it: the header is trusted, so the port must not be reachable
by clients directly); otherwise there is no identity and the request is refused (401). The
``class_header``, when configured and present, sets the class of a header-identified
request; a key's class is never overridden by a header.
"""

from __future__ import annotations

from collections.abc import Mapping

from fairshare.gateway.config import AuthSettings
from fairshare.gateway.keys import Identity, KeysFile, KeysFileError, parse_class

BEARER = "bearer "


class BadClass(ValueError):
    """The class header names no class."""


def bearer_key(authorization: str | None) -> str | None:
    """The key of an ``Authorization: Bearer <key>`` header, or None."""
    if authorization is None or authorization[: len(BEARER)].lower() != BEARER:
        return None
    key = authorization[len(BEARER) :].strip()
    return key or None


def identify(
    headers: Mapping[str, str], *, auth: AuthSettings, keys: KeysFile | None
) -> Identity | None:
    """The request's identity, or None (then answer 401).

    Raises:
        BadClass: the class header is there but names no class (answer 400).
    """
    if keys is not None:
        key = bearer_key(headers.get("authorization"))
        if key is not None:
            known = keys.lookup(key)
            if known is not None:
                return known
    if auth.team_header is None:
        return None
    team = headers.get(auth.team_header, "").strip()
    if not team:
        return None
    if auth.class_header is not None and auth.class_header in headers:
        try:
            return Identity(team, parse_class(headers[auth.class_header], auth.class_header))
        except KeysFileError as e:
            raise BadClass(str(e)) from e
    return Identity(team)
