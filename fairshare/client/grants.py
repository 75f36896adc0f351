"""The grants a client holds, and the ids of the ones it decides itself.

``ClientGrant`` is what ``AllocatorClient.acquire`` answers; releasing it hands it back to
its client, which sends (or buffers) the release. ``degraded_grant_id`` makes the id of a
grant decided with no replica answering (``fail_open``).
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from fairshare import Class
from fairshare.errors import AllocatorError
from fairshare.ids import DEGRADED_EPOCH, GrantRef, PoolName

if TYPE_CHECKING:
    from fairshare.client.allocator import AllocatorClient


def pool_of(grant_id: str) -> str:
    """The pool a grant id names ('' when it is not one of ours: the server says why)."""
    try:
        return GrantRef.decode(grant_id).pool
    except AllocatorError:
        return ""


def client_made(grant_id: str) -> bool:
    """True for the id of a grant a client decided itself (``degraded_grant_id``): it
    carries no replica's MAC, so an owner charges it only once it counted it."""
    try:
        return not GrantRef.decode(grant_id).mac
    except AllocatorError:
        return False


def degraded_grant_id(pool: str, team: str, holder: str) -> str:
    """The id of a grant this client decides itself (``fail_open``, no replica answered).

    Epoch 0 marks it degraded; its sequence number is random (62 bits, as the owners'
    own degraded ids), so ids stay unique across the gateway's restarts: a restarted
    gateway's grant never collides with one an owner remembers as settled. It carries no
    owner's authentication: only owners can issue those.
    """
    return GrantRef(PoolName(pool), DEGRADED_EPOCH, secrets.randbits(62), team, holder).encode()


@dataclass(eq=False)
class ClientGrant:
    """One live grant held by this client.

    Attributes:
        pool, team, service_class, est_tokens: what was asked.
        grant_id: the opaque id releases go by; left out of ``repr``, which may end
            up in a log (``fairshare.digest``).
        priority: the vLLM priority to send the request with.
        borrowing: above the team's reservation.
        saturated: the pool was full when it was decided.
        degraded: decided locally with no replica reachable (``fail_open``).
        owner, epoch: who decided (empty / 0 when degraded).
    """

    pool: str
    team: str
    service_class: Class
    est_tokens: int
    grant_id: str = field(repr=False)  # a bearer capability: kept out of logs
    priority: int
    borrowing: bool
    saturated: bool
    degraded: bool
    owner: str
    epoch: int
    _client: AllocatorClient | None = field(default=None, repr=False)
    _released: bool = field(default=False, repr=False)

    @property
    def released(self) -> bool:
        """True once ``release`` was called."""
        return self._released

    async def release(self, consumed: float = 0.0) -> None:
        """Ends the grant; idempotent. Returns once the release is sent or buffered.

        Args:
            consumed: cost units the request consumed (e.g. GPU-seconds); negative or
                non-finite values count as 0.
        """
        if self._released:
            return
        self._released = True
        if self._client is not None:
            await self._client._release(self, consumed)
