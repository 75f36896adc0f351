"""Who a request is for: its team and class, from its bearer key or a trusted header.

The rules, in order:

1. **A key.** With a keys file, a request that carries an ``Authorization`` header is
   identified by it alone: a listed bearer key gives the team and class; any other
   (unknown, or not ``Bearer <key>``) is refused (401), whatever headers come with it.
   Without a keys file the ``Authorization`` header names nobody and is not looked at
   (clients such as the OpenAI SDK or LiteLLM always send one).
2. **A trusted header**, for a request without a key: the ``team_header``, else (with
   ``fairness_id``) the Gateway API Inference Extension's ``FAIRNESS_ID_HEADER``. A
   header is trusted only on a connection from ``trusted_peers`` (the TCP peer's address;
   this host's own connections by default): a proxy in front sets it, so the gateway's port
   must not be reachable by clients directly, and a header from any other peer is refused
   (401). The ``class_header``, when configured and present, sets the class of a
   header-identified request; a key's class is never overridden by a header.
3. Otherwise there is no identity and the request is refused (401).

No refusal's message carries the presented key.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from typing import Final

from fairshare.gateway.config import AuthSettings, Network
from fairshare.gateway.keys import Identity, KeysFile, KeysFileError, parse_class

BEARER: Final = "bearer "
FAIRNESS_ID_HEADER: Final = "x-gateway-inference-fairness-id"
"""The Gateway API Inference Extension's header grouping requests for fairness (its
endpoint picker's flow control): read as the team when ``auth.fairness_id`` is on."""
NO_IDENTITY: Final = "a known API key or team is required"


class BadClass(ValueError):
    """The class header names no class (answer 400)."""


class Unauthorized(ValueError):
    """No identity (answer 401); the message says why, without key material."""


def bearer_key(authorization: str | None) -> str | None:
    """The key of an ``Authorization: Bearer <key>`` header, or None."""
    if authorization is None or authorization[: len(BEARER)].lower() != BEARER:
        return None
    key = authorization[len(BEARER) :].strip()
    return key or None


def trusted(peer: str | None, networks: tuple[Network, ...]) -> bool:
    """Whether the connection's peer address ``peer`` is in one of ``networks`` (an
    IPv4 address mapped into IPv6 counts as the IPv4 address; None, no IP peer: never)."""
    if peer is None:
        return False
    try:
        address = ipaddress.ip_address(peer.partition("%")[0])
    except ValueError:
        return False
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    return any(address in network for network in networks)


def header_team(headers: Mapping[str, str], auth: AuthSettings) -> str | None:
    """The team a header names (the team header first, then the fairness id), or None."""
    names = [auth.team_header] if auth.team_header is not None else []
    if auth.fairness_id:
        names.append(FAIRNESS_ID_HEADER)
    for name in names:
        team = headers.get(name, "").strip()
        if team:
            return team
    return None


def identify(
    headers: Mapping[str, str],
    *,
    peer: str | None,
    auth: AuthSettings,
    keys: KeysFile | None,
) -> Identity:
    """The identity of a request with ``headers`` on a connection from ``peer``.

    Raises:
        Unauthorized: no identity (answer 401).
        BadClass: the class header is there but names no class (answer 400).
    """
    if keys is not None:
        authorization = headers.get("authorization")
        if authorization is not None:
            key = bearer_key(authorization)
            if key is None:
                raise Unauthorized("expected an API key as Authorization: Bearer <key>")
            known = keys.lookup(key)
            if known is None:
                raise Unauthorized("the API key is not valid")
            return known
    team = header_team(headers, auth)
    if team is None:
        raise Unauthorized(NO_IDENTITY)
    if not trusted(peer, auth.trusted_peers):
        raise Unauthorized(
            f"{NO_IDENTITY}: a team header is trusted only from a proxy in auth.trusted_peers"
        )
    if auth.class_header is not None and auth.class_header in headers:
        try:
            return Identity(team, parse_class(headers[auth.class_header], auth.class_header))
        except KeysFileError as e:
            raise BadClass(str(e)) from e
    return Identity(team)
