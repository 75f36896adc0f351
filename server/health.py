"""The replica's gRPC health services, and what keeps them in line with the node.

Services (``grpc.health.v1``; ``server.app`` adds the servicer to the port):

- ``""`` (``OVERALL``), the Allocator and the Admin service: SERVING once started, also
  before the node has joined the cluster (etcd did not answer at start: the replica
  answers every call as when etcd is lost later, each pool per its degraded mode, and
  joins in the background);
- ``fairshare.member`` (``MEMBER_SERVICE``): NOT_SERVING until the node has joined,
  SERVING from then on;
- ``fairshare.v1.Allocator/<pool>`` (``pool_health_service``), one per pool: NOT_SERVING
  while the store refuses this replica's writes for the pool for lack of space
  (``PoolStatus.store_full``), SERVING again once a write succeeds. When that holds for
  every pool, the Allocator service and the overall status are NOT_SERVING too: the
  replica can serve no pool.

Guaranteed: ``watch_health`` changes a status only when what it stands for changed, and
logs each change; a failing ``status()`` is logged and changes nothing. Not guaranteed: a
status younger than ``HEALTH_POLL_S`` (the watcher polls), or anything after the watcher
is cancelled (the stop turns every service NOT_SERVING itself).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Final, Protocol

from grpc_health.v1 import health as grpc_health
from grpc_health.v1 import health_pb2

from fairshare.wire.pb.fairshare.v1 import allocator_pb2 as pb
from ha import PoolStatus

logger = logging.getLogger(__name__)

ALLOCATOR_SERVICE: Final = pb.DESCRIPTOR.services_by_name["Allocator"].full_name
ADMIN_SERVICE: Final = pb.DESCRIPTOR.services_by_name["Admin"].full_name
OVERALL: Final = ""
"""The health service name that stands for the whole server."""
MEMBER_SERVICE: Final = "fairshare.member"
"""The health service that is SERVING once the node has joined the cluster."""
HEALTH_POLL_S: Final = 0.5
"""How often the per-pool health is brought up to date with the node's status."""


class Watched(Protocol):
    """What the health services follow of ``ha.node.Node``."""

    @property
    def joined(self) -> bool:
        """True once the node has joined the cluster."""
        ...

    def status(self) -> list[PoolStatus]:
        """The state of every configured pool on this replica."""
        ...


def pool_health_service(pool: str) -> str:
    """The health service name of one pool."""
    return f"{ALLOCATOR_SERVICE}/{pool}"


def serving_status(serving: bool) -> health_pb2.HealthCheckResponse.ServingStatus.ValueType:
    """SERVING or NOT_SERVING."""
    if serving:
        return health_pb2.HealthCheckResponse.SERVING
    return health_pb2.HealthCheckResponse.NOT_SERVING


async def start_health(health: grpc_health.aio.HealthServicer, *, joined: bool) -> None:
    """The statuses of a replica that has just started serving."""
    for service in (ALLOCATOR_SERVICE, ADMIN_SERVICE, OVERALL):
        await health.set(service, health_pb2.HealthCheckResponse.SERVING)
    await health.set(MEMBER_SERVICE, serving_status(joined))


async def watch_health(health: grpc_health.aio.HealthServicer, node: Watched) -> None:
    """Keeps each pool's health service (and, when every pool is refused, the Allocator's
    and the overall) in line with ``node.status()``, and the member service with
    ``node.joined``, until cancelled."""
    known: dict[str, bool] = {}  # pool -> serving, as last set
    overall = True
    joined = False
    while True:
        if not joined and node.joined:
            joined = True
            logger.info("health of %s: SERVING (joined the cluster)", MEMBER_SERVICE)
            await health.set(MEMBER_SERVICE, serving_status(True))
        try:
            pools = node.status()
        except Exception:
            logger.exception("health: reading the node status failed")
            pools = []
        for view in pools:
            serving = not view.store_full
            if known.get(view.pool) != serving:
                known[view.pool] = serving
                logger.info(
                    "health of pool %s: %s (store %s)",
                    view.pool,
                    "SERVING" if serving else "NOT_SERVING",
                    "accepts writes" if serving else "full",
                )
                await health.set(pool_health_service(view.pool), serving_status(serving))
        any_serving = not known or any(known.values())
        if overall != any_serving:
            overall = any_serving
            for service in (ALLOCATOR_SERVICE, OVERALL):
                await health.set(service, serving_status(overall))
        await asyncio.sleep(HEALTH_POLL_S)
