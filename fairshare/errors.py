"""The errors of the allocator, shared by every layer that raises or carries them.

Each class stands for one answer a caller can act on; ``fairshare.wire.errors`` maps each to a gRPC
status code and back in one table, so an error crosses the network (a forwarding replica,
the client library) as the same class with the same fields. Nothing here knows about gRPC.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from fairshare.ids import Epoch, NodeId


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
    route: empty owner and epoch 0 when it knows of none.
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
