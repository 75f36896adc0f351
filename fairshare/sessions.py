"""Holder sessions: how one client process proves that the grants it holds are its own.

A client makes a session when it starts: a random secret that only it knows, and an id derived from
it (``new_session``, ``derive_id``), so that nobody can present another client's session id without
its secret. It presents both with every call (``SESSION_METADATA``, the text ``<id>.<secret>``); an
owner keeps the id, the holder it was opened for and a digest of the secret, durably with the
grants. Every grant made in a session names the session in its signed id, so any later owner knows
whose it is.

What a session proves: that a call comes from the process that opened it (or from one it
gave its secret to). Its id is public (grant ids carry it), but a session id another
caller presents with a secret of its own is not of that form and is refused at the door
(``Session.parse``): a session cannot be taken over, nor opened first elsewhere to lock its
client out. Two processes that share a holder name have two sessions. It does
not prove who the holder is: under ``tls.peer_identities`` the certificate does that.
"""

from __future__ import annotations

import base64
import hashlib
import secrets
from dataclasses import dataclass, field
from typing import Final

from fairshare.errors import InvalidArgument

SESSION_METADATA: Final = "fairshare-session"
"""The call metadata that carries a session, as ``<id>.<secret>``."""

ID_CHARS: Final = 22
"""A session id: 16 bytes of a digest of the secret, base64url without padding."""
_ID_DOMAIN: Final = b"fairshare-session-id\0"
"""What a session id's digest is taken over, before the secret: unlike the digest an owner
keeps (of the secret alone), so that the public id tells nothing of it."""
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
        if not secrets.compare_digest(sid, derive_id(secret)):
            raise InvalidArgument(SESSION_METADATA, "the session id is not its secret's")
        return cls(sid, hashlib.sha256(secret.encode("ascii")).hexdigest(), text)


def new_session() -> str:
    """A new session, as its holder presents it (``<id>.<secret>``; keep it private)."""
    secret = secrets.token_urlsafe(32)
    return f"{derive_id(secret)}.{secret}"


def derive_id(secret: str) -> str:
    """The id of the session whose secret is ``secret``."""
    digest = hashlib.sha256(_ID_DOMAIN + secret.encode("ascii")).digest()[:16]
    return base64.urlsafe_b64encode(digest).decode("ascii").rstrip("=")


def session_id(text: str) -> str:
    """The id part of a session text (what may be logged; the secret may not)."""
    return text.partition(".")[0]
