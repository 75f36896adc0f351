"""The gRPC metadata keys of the fairshare protocol: every one is named here.

Request metadata:
- ``fairshare-forwarded: 1`` marks a call a replica forwards to a pool's owner; the owner
  answers from its own state and does not count the decision again (``FORWARDED``).
- ``authorization: Bearer <token>`` authorises an Admin call (``bearer``).
- ``fairshare-session: <id>.<secret>`` is the caller's holder session
  (``fairshare.sessions``), on Acquire, AcquireMany, Adopt and KeepAlive (``SESSION_KEY``;
  other calls ignore it). A forwarding replica sends its caller's on.

Trailing metadata of a failed call (written and read by ``fairshare.wire.errors`` only):
- ``fairshare-error``: the error's class name;
- ``fairshare-field``: the request field an ``InvalidArgument`` or ``PermissionDenied``
  names;
- ``fairshare-limit``: the limit a ``LimitExceeded`` met;
- ``fairshare-owner``, ``fairshare-owner-address``, ``fairshare-epoch``: the owner a
  ``WrongEpoch`` points to.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Final

from fairshare.sessions import SESSION_METADATA

FORWARDED_KEY: Final = "fairshare-forwarded"
ERROR_KEY: Final = "fairshare-error"
FIELD_KEY: Final = "fairshare-field"
OWNER_KEY: Final = "fairshare-owner"
OWNER_ADDRESS_KEY: Final = "fairshare-owner-address"
EPOCH_KEY: Final = "fairshare-epoch"
LIMIT_KEY: Final = "fairshare-limit"
AUTHORIZATION: Final = "authorization"
SESSION_KEY: Final = SESSION_METADATA

Metadata = tuple[tuple[str, str], ...]

FORWARDED: Final[Metadata] = ((FORWARDED_KEY, "1"),)
"""The metadata of every call a replica forwards."""


def bearer(token: str) -> tuple[str, str]:
    """The ``authorization`` entry that carries ``token``."""
    return (AUTHORIZATION, f"Bearer {token}")


def is_forwarded(metadata: Iterable[tuple[str, str | bytes]] | None) -> bool:
    """True when request ``metadata`` carries the forwarding mark."""
    return any(key == FORWARDED_KEY and value == "1" for key, value in metadata or ())


def session_entry(text: str) -> tuple[str, str]:
    """The entry that carries the session ``text`` (``<id>.<secret>``)."""
    return (SESSION_KEY, text)


def read_call(metadata: Iterable[tuple[str, str | bytes]] | None) -> tuple[bool, str | None]:
    """What a servicer reads from request ``metadata``, in one pass: whether it carries the
    forwarding mark, and the session text it carries (None: none; the last one wins)."""
    forwarded = False
    session: str | None = None
    for key, value in metadata or ():
        if key == FORWARDED_KEY:
            forwarded = forwarded or value == "1"
        elif key == SESSION_KEY:
            session = value.decode("ascii", "replace") if isinstance(value, bytes) else value
    return forwarded, session


def as_dict(metadata: Iterable[tuple[str, str | bytes]] | None) -> dict[str, str]:
    """Metadata as a dict of text values (the last value of a key wins)."""
    return {
        key: value.decode("utf-8", "replace") if isinstance(value, bytes) else value
        for key, value in metadata or ()
    }


__all__ = [
    "AUTHORIZATION",
    "EPOCH_KEY",
    "ERROR_KEY",
    "FIELD_KEY",
    "FORWARDED",
    "FORWARDED_KEY",
    "LIMIT_KEY",
    "OWNER_ADDRESS_KEY",
    "OWNER_KEY",
    "SESSION_KEY",
    "Metadata",
    "as_dict",
    "bearer",
    "is_forwarded",
    "read_call",
    "session_entry",
]
