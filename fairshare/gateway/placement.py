"""Where a request goes: the grant of its model's pool, or of a fallback pool.

``place`` acquires on the model's primary pool. When that grant says the pool was
saturated (it already had its capacity in flight) and the model lists ``fallback`` routes,
it asks each in order with ``try_acquire`` (``try_only``): the first granted one is used
and the primary grant released at no cost; when none is granted the primary grant is kept.

Why two saturated pools never hand requests to each other: a fallback is asked with
``try_only``, which the allocator refuses when that pool already has its capacity in
flight, and a request placed on a fallback is never moved again (fallbacks of fallbacks
are not followed). A degraded grant (no owner answered) is never traded: a fallback
granted blind would be no better, and a degraded primary grant is not saturated.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass

from fairshare.client import AllocatorClient, ClientGrant
from fairshare.errors import AllocatorError
from fairshare.gateway.config import Model, Route
from fairshare.gateway.keys import Identity
from fairshare.gateway.releases import Releases

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Placement:
    """A grant and the route (pool and upstreams) it was granted for."""

    grant: ClientGrant
    route: Route
    fallback: bool


async def place(
    client: AllocatorClient,
    model: Model,
    identity: Identity,
    est_tokens: int,
    releases: Releases,
    *,
    wait_s: float = 0.0,
) -> Placement:
    """The placement of one request (see the module doc); the primary acquire may wait
    ``wait_s`` at the allocator (``AllocatorClient.acquire``).

    Every grant this call holds and does not return is released through ``releases``,
    also when the caller is cancelled (a client gone while a fallback is asked): the
    release then runs on in the background, at no cost.

    Raises:
        AllocatorError: the primary acquire failed (``NoOwner`` for a ``fail_closed`` pool
            without an owner; what the server answered otherwise). A failed fallback
            ``try_acquire`` is logged and the next one tried.
    """
    grant = await client.acquire(
        model.primary.pool, identity.team, identity.service_class, est_tokens, wait_s=wait_s
    )
    if not grant.saturated or grant.degraded or not model.fallback:
        return Placement(grant, model.primary, fallback=False)
    other: ClientGrant | None = None
    try:
        for route in model.fallback:
            other = None
            try:
                other = await client.try_acquire(
                    route.pool, identity.team, identity.service_class, est_tokens
                )
            except AllocatorError as e:
                logger.warning("fallback pool %s of %s: %r", route.pool, model.name, e)
                continue
            if other is None:
                continue
            if other.degraded:
                await asyncio.shield(releases.start(other, 0.0))
                continue
            await asyncio.shield(releases.start(grant, 0.0))
            return Placement(other, route, fallback=True)
    except BaseException:
        for held in (grant, other):
            if held is not None and not held.released:
                releases.start(held, 0.0)
        raise
    return Placement(grant, model.primary, fallback=False)
