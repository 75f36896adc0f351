"""The allocator's client library, what a gateway installs: acquire a priority, release it.

``AllocatorClient`` (asyncio) and ``SyncAllocatorClient`` (blocking) talk to any replica
and keep their promises when replicas fail: see ``client.allocator`` for the guarantees.
The package imports the core (``fairshare``), the wire protocol (``wire``), grpc and
tenacity only, never the server or the replication layer.

Modules: ``client.allocator`` (the client), ``client.calls`` (retries over replicas),
``client.adoption`` (re-reporting grants to new owners), ``client.backlog`` (releases and
acquires still owed), ``client.grants`` (the grants held), ``client.sessions`` (the
client's holder session and its keepalives), ``client.sync`` (the blocking wrapper).
"""

from client.allocator import AllocatorClient
from client.grants import ClientGrant, degraded_grant_id
from client.sync import SyncAllocatorClient, SyncGrant
from fairshare import degraded_priority
from fairshare.errors import NoOwner, PeerUnavailable

__all__ = [
    "AllocatorClient",
    "ClientGrant",
    "NoOwner",
    "PeerUnavailable",
    "SyncAllocatorClient",
    "SyncGrant",
    "degraded_grant_id",
    "degraded_priority",
]
