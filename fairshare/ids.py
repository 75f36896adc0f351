"""The names the allocator's parts share: pools, replicas, epochs and grant ids.

A grant id is the only thing a holder keeps of a grant, so it encodes what any replica
needs to route and settle its release (``GrantRef``). Encoding and decoding live here, in
the core, because the client library makes ids of its own (degraded grants) and every
replica reads them; computing and checking the MAC is the replication layer's
(``ha.grantkeys``).
"""

from __future__ import annotations

import base64
import binascii
import functools
from dataclasses import dataclass
from typing import Final, NewType

from fairshare.digest import grant_id_digest
from fairshare.errors import InvalidArgument
from fairshare.limits import MAX_NAME_BYTES

PoolName = NewType("PoolName", str)
NodeId = NewType("NodeId", str)
Epoch = NewType("Epoch", int)
"""A pool's ownership generation: the create_revision of its owner key (fencing token).

No owner holds epoch 0; it stands for what the three names below say, so code says which
it means."""

DEGRADED_EPOCH: Final = Epoch(0)
"""The epoch of a grant no owner decided: ``fail_open`` by a replica without an owner, or
by the client library when no replica answered."""
NO_EPOCH: Final = Epoch(0)
"""The epoch where no owner is known (ListPools, a ``WrongEpoch`` naming nobody)."""
ANY_EPOCH: Final = Epoch(0)
"""In a call that names the epoch it expects (Adopt, a forwarded Acquire): whichever epoch
the current owner has."""


_UNSIGNED_TAG = "g1"
_SIGNED_TAG = "g2"
_STANDING_TAG = "g3"
_UNSIGNED_PARTS = 6
"""Dot-separated parts of an unsigned id: tag, epoch, seq, pool, team, holder."""
_SIGNED_PARTS = _UNSIGNED_PARTS + 1
"""A signed id's parts (``g2``): those of an unsigned one, then the MAC."""
_STANDING_PARTS = _SIGNED_PARTS + 2
"""A signed id with its standing (``g3``): those of an unsigned one, the standing, the
session, the MAC."""
_SESSION_CHARS: Final = 64
"""The longest session part a ``g3`` id may carry (a session id is 22 characters)."""
_STANDINGS: Final = {"w": False, "b": True}
"""A ``g3`` id's standing part: within share or borrowing."""
MAC_BYTES = 16
"""Length of a grant id's MAC: HMAC-SHA256 truncated to 128 bits (22 base64url chars)."""


@functools.lru_cache(maxsize=4096)
def _b64(text: str) -> str:
    # Pools, teams and holders repeat on nearly every call; the cache is bounded, so
    # names that do not repeat only cost the encoding.
    return base64.urlsafe_b64encode(text.encode("utf-8")).decode("ascii").rstrip("=")


def _unb64(text: str) -> str:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4)).decode("utf-8")


def _not_a_grant_id(grant_id: str) -> InvalidArgument:
    # The id is named by its digest only: echoed back or logged, an id (even a near miss
    # of one) would hand a bearer capability to whoever reads the message.
    return InvalidArgument("grant_id", f"not a grant id ({grant_id_digest(grant_id)})")


@dataclass(frozen=True, slots=True)
class GrantRef:
    """What a grant id encodes: enough for any replica to route and settle a release.

    Three forms (see docs/ha.md, "Grant ids"):

    - signed, issued by a replica, with the grant's standing and session: ``g3.<epoch>.
      <seq>.<pool>.<team>.<holder>.<standing>.<session>.<mac>``, ``standing`` ``w``
      (within share) or ``b`` (borrowing), ``session`` the id of the holder session it
      was made in (``fairshare.sessions``; empty: none), so that a later owner counts a
      re-reported grant with the standing and in the session it was decided with,
      whatever its holder claims;
    - signed, as replicas issued them before ids carried a standing: ``g2.<epoch>.<seq>.
      <pool>.<team>.<holder>.<mac>`` (``borrowing`` None: unknown);
    - unsigned, made by a client while no replica answered: ``g1.<epoch>.<seq>.<pool>.
      <team>.<holder>``, honoured only with epoch 0 (a degraded grant: borrowing).

    Epoch and seq are lower-case hex, pool, team and holder base64url of their UTF-8
    without padding, and ``mac`` base64url of ``MAC_BYTES`` bytes (``ha.grantkeys``
    computes and checks it over ``signed_text``). Decoding checks the form only; whether
    the MAC is genuine is for ``ha.grantkeys.GrantKeys.verify``.
    """

    pool: PoolName
    epoch: Epoch
    seq: int
    team: str = ""
    holder: str = ""
    mac: str = ""
    """The MAC of a signed id; empty for an unsigned one."""
    borrowing: bool | None = None
    """The standing a signed id was issued with; None when the id does not say (``g2``,
    unsigned). Signed with the rest, so a holder cannot change it."""
    session: str = ""
    """The id of the holder session a ``g3`` id was issued in; empty when none."""

    def signed_text(self) -> str:
        """What the MAC covers: the id's fields in their canonical encoding (``g3`` with
        the standing when it is known, ``g2`` otherwise)."""
        fields = [
            _SIGNED_TAG,
            f"{self.epoch:x}",
            f"{self.seq:x}",
            _b64(self.pool),
            _b64(self.team),
            _b64(self.holder),
        ]
        if self.borrowing is not None:
            fields[0] = _STANDING_TAG
            fields += ("b" if self.borrowing else "w", self.session)
        return ".".join(fields)

    def encode(self) -> str:
        """The opaque grant id string (signed when ``mac`` is set; an unsigned id does
        not carry a standing)."""
        if self.mac:
            return f"{self.signed_text()}.{self.mac}"
        return ".".join(
            (
                _UNSIGNED_TAG,
                f"{self.epoch:x}",
                f"{self.seq:x}",
                _b64(self.pool),
                _b64(self.team),
                _b64(self.holder),
            )
        )

    @classmethod
    def decode(cls, grant_id: str) -> GrantRef:
        """Parses a grant id (its form; not whether its MAC is genuine).

        Raises:
            InvalidArgument: not a grant id of this service.
        """
        parts = grant_id.split(".")
        form = (parts[0], len(parts))
        if form not in _FORMS:
            raise _not_a_grant_id(grant_id)
        try:
            epoch, seq = int(parts[1], 16), int(parts[2], 16)
            pool, team, holder = (_unb64(p) for p in parts[3:6])
        except (ValueError, binascii.Error, UnicodeDecodeError):
            raise _not_a_grant_id(grant_id) from None
        borrowing: bool | None = None
        session = ""
        if form[0] == _STANDING_TAG:
            if parts[6] not in _STANDINGS or len(parts[7]) > _SESSION_CHARS:
                raise _not_a_grant_id(grant_id)
            borrowing, session = _STANDINGS[parts[6]], parts[7]
        mac = parts[-1] if form[0] != _UNSIGNED_TAG else ""
        if not pool or epoch < 0 or seq < 0 or (form[0] != _UNSIGNED_TAG and not mac):
            raise _not_a_grant_id(grant_id)
        if any(len(name.encode("utf-8")) > MAX_NAME_BYTES for name in (pool, team, holder)):
            # The limit every request's names have, on this path too.
            raise InvalidArgument(
                "grant_id", f"a name in the grant id is longer than {MAX_NAME_BYTES} bytes"
            )
        return cls(PoolName(pool), Epoch(epoch), seq, team, holder, mac, borrowing, session)


_FORMS: Final = {
    (_UNSIGNED_TAG, _UNSIGNED_PARTS),
    (_SIGNED_TAG, _SIGNED_PARTS),
    (_STANDING_TAG, _STANDING_PARTS),
}
"""(tag, number of parts) of each form ``GrantRef.decode`` reads."""
