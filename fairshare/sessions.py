"""Holder sessions: how one client process proves that the grants it holds are its own.

A client makes a session when it starts: an id and a secret, both random, that only it
knows (``new_session``). It presents both with every call (``SESSION_METADATA``, the text
``<id>.<secret>``); an owner keeps the id, the holder it was opened for and a digest of
the secret, durably with the grants. Every grant made in a session names the session in
its signed id, so any later owner knows whose it is.

What a session proves: that a call comes from the process that opened it (or from one it
gave its secret to). Two processes that share a holder name have two sessions. It does
not prove who the holder is: under ``tls.peer_identities`` the certificate does that.
"""

from __future__ import annotations

import hashlib
import secrets
from dataclasses import dataclass, field
from typing import Final

from fairshare.errors import InvalidArgument

SESSION_METADATA: Final = "fairshare-session"
"""The call metadata that carries a session, as ``<id>.<secret>``."""

ID_CHARS: Final = 22
"""A session id: 16 random bytes, base64url without padding."""
SECRET_CHARS: Final = 43
"""A session secret: 32 random bytes, base64url without padding."""
_ALPHABET: Final = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_")


@dataclass(frozen=True, slots=True)
class Session:
    """A session as a call presents it: its id and the digest of its secret.

    ``text`` is what the call presented (``<id>.<secret>``), kept only so that a replica
    can forward the call with the caller's own session (``server.peers``): a session
    made otherwise has none and cannot be forwarded. It is a bearer credential: it is
    left out of ``repr`` and comparisons, and must never be logged or persisted (an
    owner keeps ``id`` and ``digest`` only).
    """

    id: str
    digest: str
    """Hex SHA-256 of the secret."""
    text: str = field(default="", repr=False, compare=False)

    @classmethod
    def parse(cls, text: str) -> Session:
        """Reads ``<id>.<secret>`` as ``new_session`` makes it.

        Raises:
            InvalidArgument: not a session of that form.
        """
        sid, dot, secret = text.partition(".")
        if (
            not dot
            or len(sid) != ID_CHARS
            or len(secret) != SECRET_CHARS
            or not _ALPHABET.issuperset(sid)
            or not _ALPHABET.issuperset(secret)
        ):
            raise InvalidArgument(
                SESSION_METADATA, f"a session is {ID_CHARS} + {SECRET_CHARS} base64url chars"
            )
        return cls(sid, hashlib.sha256(secret.encode("ascii")).hexdigest(), text)


def new_session() -> str:
    """A new session, as its holder presents it (``<id>.<secret>``; keep it private)."""
    return f"{secrets.token_urlsafe(16)}.{secrets.token_urlsafe(32)}"


def session_id(text: str) -> str:
    """The id part of a session text (what may be logged; the secret may not)."""
    return text.partition(".")[0]
