"""Borrowers held at the owner by a pool's lending limit, through ``fairshare serve`` and the
client library (issue 30): answered when a slot opens, at once for within-share requests,
gone when their caller goes away, refused at the wait's end where the pool says so, and
sent again with the wait they have left across a SIGKILL of the owner.

Pool ``lent``: C = 4 shared by ``a`` (reservation 2, lends nothing) and ``b``; team ``x``
has no share, so its requests borrow, and only 2 slots are lent to them while ``a`` idles.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import aiohttp
import pytest

from fairshare.client import AllocatorClient, ClientGrant
from fairshare.errors import LimitExceeded
from harness.serve import Allocator, serving, wait_serving

pytestmark = pytest.mark.timeout(90)

CONFIG = """
node_id: held-0
timing: {snapshot_interval_s: 0.2}
pools:
  - name: lent
    capacity: 4
    shares: {a: 0.5, b: 0.5}
    lend: {a: 0.0}
    max_request_s: 60
  - name: refusing
    capacity: 4
    shares: {a: 0.5, b: 0.5}
    lend: {a: 0.0}
    on_wait_end: refuse
  - name: open
    capacity: 4
    shares: {a: 0.5, b: 0.5}
"""


async def held(metrics_url: str) -> float:
    """The allocator's ``fairshare_held`` of team x in pool ``lent`` (x has no share: its
    label is that of every unconfigured team)."""
    async with aiohttp.ClientSession() as session, session.get(metrics_url) as reply:
        text = await reply.text()
    pattern = r'^fairshare_held\{pool="lent",team="\(unconfigured\)"\} (\S+)$'
    found = re.search(pattern, text, re.M)
    return float(found.group(1)) if found else 0.0


async def held_becomes(metrics_url: str, value: float) -> None:
    """Waits (bounded) until the owner holds ``value`` borrowers of x in ``lent``."""
    for _ in range(200):
        if await held(metrics_url) == value:
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"fairshare_held never became {value}")


@asynccontextmanager
async def client_of(server: Allocator) -> AsyncIterator[AllocatorClient]:
    """A client whose deadline outlasts a restart of the server: a call sent while it is
    down reaches the restarted one instead of being decided degraded."""
    client = AllocatorClient([server.address], holder="gw", deadline_s=8.0)
    try:
        yield client
    finally:
        await client.close()


async def borrow(client: AllocatorClient, pool: str = "lent", wait_s: float = 20.0) -> ClientGrant:
    return await client.acquire(pool, "x", wait_s=wait_s)


async def test_a_held_borrower_waits_for_a_slot_and_reserved_work_starts_at_once(
    tmp_path: Path,
) -> None:
    async with serving(tmp_path, CONFIG) as (server, metrics), client_of(server) as client:
        lent = [await borrow(client) for _ in range(2)]
        assert all(g.borrowing for g in lent)
        waiting = asyncio.ensure_future(borrow(client))
        await held_becomes(metrics, 1)
        # Team a's reserved slots were kept free: its requests start at once.
        reserved = [await client.acquire("lent", "a", wait_s=20.0) for _ in range(2)]
        assert not any(g.borrowing for g in reserved)
        started = time.monotonic()
        await lent[0].release(1.0)
        grant = await asyncio.wait_for(waiting, 5)
        assert grant.borrowing
        assert time.monotonic() - started < 2.0
        # A caller that goes away leaves the queue: the next slot goes to a later one.
        gone = asyncio.ensure_future(borrow(client))
        await held_becomes(metrics, 1)
        gone.cancel()
        await held_becomes(metrics, 0)
        later = asyncio.ensure_future(borrow(client))
        await held_becomes(metrics, 1)
        await lent[1].release(1.0)
        assert (await asyncio.wait_for(later, 5)).borrowing
        for g in (*reserved, grant, later.result()):
            await g.release(1.0)


async def test_a_wait_that_ends_is_refused_where_the_pool_says_so(tmp_path: Path) -> None:
    async with serving(tmp_path, CONFIG) as (server, _), client_of(server) as client:
        lent = [await borrow(client, "refusing") for _ in range(2)]
        started = time.monotonic()
        with pytest.raises(LimitExceeded) as info:
            await borrow(client, "refusing", wait_s=0.5)
        assert info.value.limit == "lend"
        assert 0.5 <= time.monotonic() - started < 3.0
        # The lent pool borrows anyway at the wait's end (on_wait_end: borrow).
        others = [await borrow(client) for _ in range(2)]
        assert (await borrow(client, wait_s=0.5)).borrowing
        for g in (*lent, *others):
            await g.release(1.0)


async def test_a_held_borrower_is_sent_again_with_its_wait_left_across_a_sigkill(
    tmp_path: Path,
) -> None:
    async with serving(tmp_path, CONFIG) as (server, metrics), client_of(server) as client:
        lent = [await borrow(client) for _ in range(2)]
        waiting = asyncio.ensure_future(borrow(client, wait_s=30.0))
        await held_becomes(metrics, 1)
        # Borrowing grants are written with the next snapshot: then the successor counts
        # them (as phantoms, until the client re-reports them).
        await asyncio.sleep(0.5)
        server.kill()
        server.start()
        await wait_serving(server.address, process=server)
        await held_becomes(metrics, 1)  # held again at the new owner: 2 slots are taken
        await client.refresh_pools()  # the new epoch: the client re-reports its grants
        assert not waiting.done()
        await lent[0].release(1.0)
        assert (await asyncio.wait_for(waiting, 10)).borrowing
        await lent[1].release(1.0)
        await waiting.result().release(1.0)


async def test_a_pool_that_lends_all_gets_its_acquires_batched_whatever_their_wait(
    tmp_path: Path,
) -> None:
    # ``open`` has no lend key: its owner holds nobody, so a wait_s changes nothing there
    # and the client batches its Acquires like any others; ``lent`` may hold: one call each.
    async with serving(tmp_path, CONFIG) as (server, _), client_of(server) as client:
        acquires = client._calls._acquires
        first = await borrow(client, "open")  # not listed yet: sent as one that may be held
        assert acquires.items == 0
        for _ in range(100):  # the pools are listed in the background meanwhile
            if "open" in client._lends_all:
                break
            await asyncio.sleep(0.02)
        assert client._lends_all == {"lent": False, "refusing": False, "open": True}
        grants = await asyncio.gather(*(borrow(client, "open") for _ in range(30)))
        assert acquires.items == 30 and acquires.calls < 30, "sent in batches"
        assert all(g.borrowing for g in grants)  # x has no share: answered at once
        lent = await asyncio.gather(*(borrow(client, "lent") for _ in range(2)))
        assert acquires.items == 30, "a pool that may hold: each Acquire alone"
        for grant in [first, *grants, *lent]:
            await grant.release(0.0)
