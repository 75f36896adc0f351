"""Client-made degraded grants are charged once an owner counted them, and only then.

Issue 31, finding 3: made-up unsigned (epoch-0) ids charged any team without limit. An
owner now charges such an id only if it counted it first (its holder re-reported it), so
a client whose degraded grants ended while no replica answered re-reports them before it
releases them, in groups of at most a pool's capacity, one group at a time.
Made-up ids released alone charge nothing (tests/integration/test_grant_ids.py).
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from fairshare.client import AllocatorClient
from harness.serve import wait_serving

from .test_sessions import serving, snapshot, until

pytestmark = pytest.mark.timeout(60)


async def usage_and_in_flight(address: str) -> tuple[float, int]:
    stat = next(t for t in (await snapshot(address)).teams if t.team == "team-a")
    return stat.usage, stat.in_flight + stat.phantoms


async def test_degraded_grants_that_ended_in_an_outage_are_charged_in_full(
    tmp_path: Path,
) -> None:
    async with serving(tmp_path, ttl_s=4.0) as server:
        client = AllocatorClient([server.address], holder="gw", deadline_s=0.3, epoch_check_s=0.2)
        try:
            await client.refresh_pools()
            server.kill()
            # More than the pool's capacity (4): more than one group.
            grants = await asyncio.gather(*(client.acquire("gpu-a", "team-a") for _ in range(10)))
            assert all(g.degraded for g in grants)
            for grant in grants:
                await grant.release(2.0)
            assert client.pending_releases == 10

            server.start()
            await wait_serving(server.address, process=server)

            async def charged() -> bool:
                usage, held = await usage_and_in_flight(server.address)
                return usage == pytest.approx(20.0, rel=1e-3) and held == 0

            await until(charged, "each ended degraded grant charged once, none held")

            # The owner charges a group durably before it answers it, so the client drops
            # the group's releases a moment after the charge is visible: wait for that too.
            async def acknowledged() -> bool:
                return client.pending_releases == 0

            await until(acknowledged, "every release acknowledged to the client")
            await asyncio.sleep(0.5)  # nothing more arrives later
            assert (await usage_and_in_flight(server.address))[0] == pytest.approx(20.0, rel=1e-3)
        finally:
            await client.close()
