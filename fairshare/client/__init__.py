"""The allocator's client library, what a gateway installs: acquire a priority, release it.

``AllocatorClient`` (asyncio) and ``SyncAllocatorClient`` (blocking) talk to any replica
and keep their promises when replicas fail: see ``fairshare.client.allocator`` for the guarantees.
The package imports the core (``fairshare``), the wire protocol (``fairshare.wire``), grpc and
tenacity only, never the server or the replication layer.

Modules: ``fairshare.client.allocator`` (the client, which holds the parts below and wires
them together), ``fairshare.client.calls`` (channels, retries over replicas, batches),
``fairshare.client.adoption`` (re-reporting grants to new owners), ``fairshare.client.backlog``
(releases and acquires still owed), ``fairshare.client.sessions`` (the client's holder session
and its keepalives), ``fairshare.client.state`` (what those parts share),
``fairshare.client.grants`` (the grants held), ``fairshare.client.sync`` (the blocking wrapper).
"""

from fairshare import degraded_priority
from fairshare.client.allocator import AllocatorClient
from fairshare.client.grants import ClientGrant, degraded_grant_id
from fairshare.client.sync import SyncAllocatorClient, SyncGrant
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
