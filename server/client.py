"""The client library's old address, kept so ``from server.client import ...`` still works.

The library lives in the top-level package ``client`` (a gateway installs it without the
server); import it from there.
"""

from client import (
    AllocatorClient,
    ClientGrant,
    NoOwner,
    PeerUnavailable,
    SyncAllocatorClient,
    SyncGrant,
    degraded_priority,
)

__all__ = [
    "AllocatorClient",
    "ClientGrant",
    "NoOwner",
    "PeerUnavailable",
    "SyncAllocatorClient",
    "SyncGrant",
    "degraded_priority",
]
