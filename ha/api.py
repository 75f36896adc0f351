"""What the replication layer offers the server: ids, decisions, errors, the Allocator.

The server translates gRPC messages to these types and back, and maps the exceptions
below to status codes in one table; nothing here knows about gRPC.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final, NewType, Protocol

from fairshare import Class, TeamStat

PoolName = NewType("PoolName", str)
NodeId = NewType("NodeId", str)
Epoch = NewType("Epoch", int)
"""A pool's ownership generation: the create_revision of its owner key (fencing token).

A real epoch is at least 1 (etcd revisions start there). Epoch 0 is never an owner's; it
stands for one of the three names below, each in its own place."""

DEGRADED_EPOCH: Final = Epoch(0)
"""The epoch of a degraded decision (``Decision.degraded``, a degraded grant id): made by
no owner, counted by none until a later owner adopts it."""
NO_EPOCH: Final = Epoch(0)
"""The epoch reported when no owner is known: a ListPools or status line without a route,
a WrongEpoch that names nobody."""
ANY_EPOCH: Final = Epoch(0)
"""In a call that names the epoch it expects (Adopt, a forwarded Acquire): whichever epoch
the current owner has."""


# -- grant ids ----------------------------------------------------------------------------

_UNSIGNED_TAG = "g1"
_SIGNED_TAG = "g2"
MAC_BYTES = 16
"""Length of a grant id's MAC: HMAC-SHA256 truncated to 128 bits (22 base64url chars)."""


def _b64(text: str) -> str:
    return base64.urlsafe_b64encode(text.encode("utf-8")).decode("ascii").rstrip("=")


def _unb64(text: str) -> str:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4)).decode("utf-8")


@dataclass(frozen=True, slots=True)
class GrantRef:
    """What a grant id encodes: enough for any replica to route and settle a release.

    Two forms (see docs/ha.md, "Grant ids"):

    - signed, issued by a replica: ``g2.<epoch>.<seq>.<pool>.<team>.<holder>.<mac>``;
    - unsigned, made by a client while no replica answered: ``g1.<epoch>.<seq>.<pool>.
      <team>.<holder>``, honoured only with epoch 0 (a degraded grant).

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

    def signed_text(self) -> str:
        """What the MAC covers: the id's fields in their canonical encoding."""
        return ".".join(
            (
                _SIGNED_TAG,
                f"{self.epoch:x}",
                f"{self.seq:x}",
                _b64(self.pool),
                _b64(self.team),
                _b64(self.holder),
            )
        )

    def encode(self) -> str:
        """The opaque grant id string (signed when ``mac`` is set)."""
        if self.mac:
            return f"{self.signed_text()}.{self.mac}"
        return _UNSIGNED_TAG + self.signed_text()[len(_SIGNED_TAG) :]

    @classmethod
    def decode(cls, grant_id: str) -> GrantRef:
        """Parses a grant id (its form; not whether its MAC is genuine).

        Raises:
            InvalidArgument: not a grant id of this service.
        """
        parts = grant_id.split(".")
        signed = len(parts) == 7 and parts[0] == _SIGNED_TAG
        if not signed and (len(parts) != 6 or parts[0] != _UNSIGNED_TAG):
            raise InvalidArgument("grant_id", f"not a grant id: {grant_id[:200]!r}")
        try:
            epoch, seq = int(parts[1], 16), int(parts[2], 16)
            pool, team, holder = (_unb64(p) for p in parts[3:6])
        except (ValueError, binascii.Error, UnicodeDecodeError):
            raise InvalidArgument("grant_id", f"not a grant id: {grant_id[:200]!r}") from None
        mac = parts[6] if signed else ""
        if not pool or epoch < 0 or seq < 0 or (signed and not mac):
            raise InvalidArgument("grant_id", f"not a grant id: {grant_id[:200]!r}")
        return cls(PoolName(pool), Epoch(epoch), seq, team, holder, mac)


# -- results ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Decision:
    """The answer to one Acquire.

    Attributes:
        granted: False only when ``try_only`` found the pool full (other fields empty).
        grant_id: opaque id to release with; empty when not granted.
        priority: the vLLM priority to send the request with.
        borrowing: above the team's reservation.
        saturated: the pool already had C or more in flight.
        degraded: decided without an owner (fail_open); to be adopted by the next owner.
        owner: node id of the owner that decided (empty when degraded).
        epoch: the owner's epoch (``DEGRADED_EPOCH`` when degraded).
    """

    granted: bool
    grant_id: str
    priority: int
    borrowing: bool
    saturated: bool
    degraded: bool
    owner: NodeId
    epoch: Epoch


@dataclass(frozen=True, slots=True)
class HeldGrant:
    """A live grant a holder re-reports to a new owner with ``Adopt``."""

    grant_id: str
    team: str
    priority: int
    borrowing: bool
    est_tokens: int = 0


@dataclass(frozen=True, slots=True)
class AdoptResult:
    """What an Adopt changed: grants counted again and phantoms dropped."""

    adopted: int
    phantoms_dropped: int
    owner: NodeId
    epoch: Epoch


@dataclass(frozen=True, slots=True)
class PoolView:
    """A pool's team table with its owner and epoch (the Snapshot RPC)."""

    pool: PoolName
    capacity: int
    owner: NodeId
    epoch: Epoch
    teams: Sequence[TeamStat]


@dataclass(frozen=True, slots=True)
class PoolInfo:
    """One line of ListPools."""

    pool: PoolName
    capacity: int
    owner: NodeId
    owner_address: str
    epoch: Epoch


@dataclass(frozen=True, slots=True)
class PoolStatus:
    """One pool as this replica sees it, for metrics and health.

    Attributes:
        pool: pool name.
        owned: this replica owns the pool and may decide for it now.
        owner: node id of the owner this replica routes to (empty: none known).
        epoch: that owner's epoch (0: none).
        transitions: epochs of this pool that this replica started (each ownership
            change is counted once, by the new owner; summed over replicas it is the
            number of ownership changes).
        fence_left_s: seconds before this replica self-fences (0 when it does not own).
        snapshot_age_s: seconds since the last snapshot written (owner only; -1 if none).
        teams: the owner's team table; empty when this replica does not own the pool.
        degraded_decisions: decisions made without an owner by this replica.
        store_full: the store refused this replica's last write for the pool for lack
            of space (the pool cannot be served from here until a write succeeds).
        store_refused_writes: writes for the pool refused as full, since start.
        charges_clamped: releases this replica, as owner, charged at the pool's bound
            (``PoolConfig.max_charge``) instead of the larger amount claimed.
        grant_ids_refused: releases and adopted grants this replica, as owner, refused
            as not genuine (bad MAC, unsigned with an epoch, another holder's).
    """

    pool: PoolName
    owned: bool
    owner: NodeId
    epoch: Epoch
    transitions: int
    fence_left_s: float
    snapshot_age_s: float
    teams: Sequence[TeamStat]
    degraded_decisions: int
    store_full: bool = False
    store_refused_writes: int = 0
    charges_clamped: int = 0
    grant_ids_refused: int = 0


# -- errors -------------------------------------------------------------------------------


class AllocatorError(Exception):
    """Base of the errors the server maps to gRPC status codes."""


class UnknownPool(AllocatorError):
    """No pool of that name is configured (NOT_FOUND)."""

    def __init__(self, pool: str) -> None:
        super().__init__(f"unknown pool {pool!r}")
        self.pool = pool


class InvalidArgument(AllocatorError):
    """A request field is invalid (INVALID_ARGUMENT); ``field`` names it."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field


class PermissionDenied(AllocatorError):
    """A grant id is not genuine, or the caller is not its holder (PERMISSION_DENIED);
    ``field`` names the request field."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field


class OutOfRange(InvalidArgument):
    """A numeric request field is outside what the service can hold (OUT_OF_RANGE)."""


class LimitExceeded(AllocatorError):
    """A request would take the service past a configured or built-in limit
    (RESOURCE_EXHAUSTED); ``limit`` names it (``max_teams``, ``max_adopt_grants`` ...)."""

    def __init__(self, limit: str, message: str) -> None:
        super().__init__(f"{limit}: {message}")
        self.limit = limit


class WrongEpoch(AllocatorError):
    """The request named an epoch this replica does not own (FAILED_PRECONDITION).

    Carries this replica's view of the current owner, so the caller can refresh its
    route: empty owner and ``NO_EPOCH`` when it knows of none.
    """

    def __init__(self, pool: str, owner: NodeId, address: str, epoch: Epoch) -> None:
        super().__init__(f"pool {pool!r} is owned by {owner or 'nobody'!r} at epoch {epoch}")
        self.pool = pool
        self.owner = owner
        self.address = address
        self.epoch = epoch


class NoOwner(AllocatorError):
    """No owner could be reached and the pool fails closed (UNAVAILABLE)."""

    def __init__(self, pool: str) -> None:
        super().__init__(f"pool {pool!r} has no reachable owner and fails closed")
        self.pool = pool


class StoreUnavailable(AllocatorError):
    """The store cannot be reached, or a write's outcome cannot be known (UNAVAILABLE)."""


class StoreFull(StoreUnavailable):
    """The store refuses writes for lack of space (UNAVAILABLE).

    etcd raises its NOSPACE alarm when its database reaches the backend quota; the embedded
    file store meets ENOSPC or EDQUOT on its disk. Unlike a plain ``StoreUnavailable`` the
    cause is known and lasts until an operator frees space, so callers report it as such
    (log, metric, health) and retry with backoff instead of at once.
    """


class PeerUnavailable(AllocatorError):
    """A peer replica did not answer (connection refused, deadline exceeded)."""

    def __init__(self, address: str, message: str = "") -> None:
        super().__init__(f"peer {address} unavailable" + (f": {message}" if message else ""))
        self.address = address


class UnknownNode(AllocatorError):
    """A switchover named a replica that is not a live member (FAILED_PRECONDITION)."""

    def __init__(self, node: str) -> None:
        super().__init__(f"no live replica named {node!r}")
        self.node = node


# -- the service ----------------------------------------------------------------------------


class Allocator(Protocol):
    """The allocator as the server sees it: embedded (one node) or replicated.

    Every coroutine is safe to call concurrently. Errors are the classes above.

    ``forwarded`` is the one mark of a call a peer forwarded (``Peers``): it is answered
    from this replica's own state, never forwarded again; a replica that does not decide
    for the pool raises WrongEpoch naming the owner it routes to.
    """

    async def acquire(
        self,
        *,
        pool: str,
        team: str,
        cls: Class,
        est_tokens: int,
        holder: str = "",
        request_id: str = "",
        try_only: bool = False,
        epoch: Epoch = ANY_EPOCH,
        forwarded: bool = False,
    ) -> Decision:
        """Decides one request; forwards to the owner when this replica is not it.

        ``request_id`` (with ``holder``) makes a retry return the same grant. A forwarded
        call names the ``epoch`` its forwarder routed to: a replica that does not own the
        pool at exactly that epoch (at any, for ``ANY_EPOCH``) raises WrongEpoch instead
        of forwarding again. ``epoch`` means nothing in a call that is not forwarded.
        """
        ...

    async def release(self, grant_id: str, consumed: float, *, forwarded: bool = False) -> None:
        """Ends a grant; idempotent. Non-finite or negative consumption counts as 0."""
        ...

    async def adopt(
        self,
        *,
        pool: str,
        epoch: Epoch,
        holder: str,
        grants: Sequence[HeldGrant],
        complete: bool,
        forwarded: bool = False,
    ) -> AdoptResult:
        """Re-reports a holder's live grants of earlier epochs to the current owner.

        ``epoch`` is the owner epoch the holder expects (``ANY_EPOCH``: the current one);
        an owner at another epoch raises WrongEpoch.
        """
        ...

    async def snapshot(self, pool: str, *, forwarded: bool = False) -> PoolView:
        """The pool's team table, from its owner."""
        ...

    async def list_pools(self) -> list[PoolInfo]:
        """Every configured pool with its current owner, as this replica sees it."""
        ...

    async def set_capacity(self, pool: str, capacity: int, *, forwarded: bool = False) -> int:
        """Changes C on the owner, persists it, and returns the previous C."""
        ...

    async def switchover(self, pool: str, node: str, *, forwarded: bool = False) -> None:
        """Moves a pool to the named replica through the graceful handover."""
        ...

    def status(self) -> list[PoolStatus]:
        """Every configured pool as this replica sees it (cheap; for metrics scrapes)."""
        ...


class Peers(Protocol):
    """How a replica calls another one (the server implements it over gRPC).

    Every call is marked as forwarded, so the receiver answers from its own state and
    never forwards again. Errors: WrongEpoch (the peer does not own the pool at that
    epoch; it says whom it routes to), PeerUnavailable (no answer within ``timeout``),
    and UnknownPool, InvalidArgument, NoOwner as the peer raised them.
    """

    async def acquire(
        self,
        address: str,
        *,
        pool: str,
        team: str,
        cls: Class,
        est_tokens: int,
        holder: str,
        request_id: str,
        try_only: bool,
        epoch: Epoch,
        timeout: float,
    ) -> Decision:
        """Acquire on the owner at ``address``, which must own ``pool`` at ``epoch``."""
        ...

    async def release(self, address: str, grant_id: str, consumed: float, timeout: float) -> None:
        """Release on the owner at ``address``."""
        ...

    async def adopt(
        self,
        address: str,
        *,
        pool: str,
        epoch: Epoch,
        holder: str,
        grants: Sequence[HeldGrant],
        complete: bool,
        timeout: float,
    ) -> AdoptResult:
        """Adopt on the owner at ``address``."""
        ...

    async def snapshot(self, address: str, pool: str, timeout: float) -> PoolView:
        """Snapshot from the owner at ``address``."""
        ...

    async def set_capacity(self, address: str, pool: str, capacity: int, timeout: float) -> int:
        """SetCapacity on the owner at ``address``; returns the previous C."""
        ...

    async def switchover(self, address: str, pool: str, node: str, timeout: float) -> None:
        """Switchover on the owner at ``address``."""
        ...

    async def close(self) -> None:
        """Closes every channel."""
        ...
