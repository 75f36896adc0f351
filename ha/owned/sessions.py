"""One owner's holder sessions (``fairshare.sessions``): who may confirm or close what.

A session is opened by the first call that presents it to the pool's owner, for the
holder that call names; it lives while its holder renews it (any call presenting it, or a
KeepAlive) at least once per ``ttl_s``, and lapses otherwise. A new owner restores every
session of the state it reads with one ``ttl_s`` from the restore.

Guarantees:
- ``check`` accepts a session only with the secret it was opened with and for the holder
  it was opened for (``PermissionDenied`` otherwise), so nobody else can speak for it.
- ``lapsed`` returns each session once, when it has not been renewed for ``ttl_s`` on
  the epoch's clock; it is then forgotten.
- At most ``max_sessions`` are kept; ``check`` refuses a new one beyond (``LimitExceeded``).

Non-guarantees: a session's secret is a bearer credential: a process that has it is the
session. Under ``tls.peer_identities`` the server binds holders to certificates.
"""

from __future__ import annotations

import hmac
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Final

from fairshare.errors import LimitExceeded, PermissionDenied
from fairshare.sessions import SESSION_METADATA, Session

MAX_SESSIONS: Final = 16_384
"""Most holder sessions one pool's owner keeps open at once."""


@dataclass(slots=True)
class Opened:
    """A session as an owner keeps it."""

    digest: str
    holder: str
    deadline: float  # the epoch's clock: it lapses when not renewed by then


class Sessions:
    """The sessions of one owner (see module)."""

    def __init__(self, ttl_s: float, max_sessions: int) -> None:
        self.ttl_s = ttl_s
        self._max = max_sessions
        self._open: dict[str, Opened] = {}

    def __len__(self) -> int:
        return len(self._open)

    def __contains__(self, sid: object) -> bool:
        return sid in self._open

    def check(self, session: Session, holder: str, now: float) -> bool:
        """Accepts ``session`` for ``holder`` and renews it; returns True when this call
        opened it (the caller persists it before answering).

        Raises:
            PermissionDenied: the session is open with another secret or holder.
            LimitExceeded: opening it would keep more than ``max_sessions``.
        """
        opened = self._open.get(session.id)
        if opened is None:
            if len(self._open) >= self._max:
                raise LimitExceeded(
                    "max_sessions", f"the pool keeps {self._max} holder sessions already"
                )
            self._open[session.id] = Opened(session.digest, holder, now + self.ttl_s)
            return True
        if not hmac.compare_digest(opened.digest, session.digest):
            raise PermissionDenied(SESSION_METADATA, "not the secret this session was opened with")
        if opened.holder != holder:
            raise PermissionDenied(
                SESSION_METADATA, f"a session of holder {opened.holder[:64]!r}, not {holder[:64]!r}"
            )
        opened.deadline = now + self.ttl_s
        return False

    def renew(self, session: Session, now: float) -> bool:
        """Renews ``session`` if it is open with that secret; False if it is not open.

        Raises:
            PermissionDenied: it is open with another secret.
        """
        opened = self._open.get(session.id)
        if opened is None:
            return False
        if not hmac.compare_digest(opened.digest, session.digest):
            raise PermissionDenied(SESSION_METADATA, "not the secret this session was opened with")
        opened.deadline = now + self.ttl_s
        return True

    def live(self, sid: str) -> bool:
        """True while session ``sid`` is open (not lapsed)."""
        return sid in self._open

    def lapsed(self, now: float) -> list[str]:
        """Forgets, and returns, the sessions not renewed since ``now - ttl_s``."""
        gone = [sid for sid, opened in self._open.items() if opened.deadline <= now]
        for sid in gone:
            del self._open[sid]
        return gone

    def restore(self, rows: Iterable[tuple[str, str, str]], now: float) -> None:
        """Opens the sessions a previous owner kept, ``(id, digest, holder)``, each with one
        ``ttl_s`` from ``now`` to be renewed."""
        for sid, digest, holder in rows:
            self._open[sid] = Opened(digest, holder, now + self.ttl_s)

    def rows(self) -> Iterator[tuple[str, str, str]]:
        """Every open session as ``(id, digest, holder)``, for the persisted state."""
        return ((sid, o.digest, o.holder) for sid, o in self._open.items())
