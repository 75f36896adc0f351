"""A gateway's use of the allocator: acquire a priority, run the request, release it.

Start a server first (``make run``), then: ``python examples/client_example.py``.
"""

from __future__ import annotations

import asyncio
import random
import time

from fairshare import Class
from fairshare.client import AllocatorClient, SyncAllocatorClient

TARGETS = ["127.0.0.1:50051"]


async def one_request(client: AllocatorClient, team: str) -> None:
    grant = await client.acquire("gpu-a", team, Class.INTERACTIVE, est_tokens=512)
    consumed = 0.0
    try:
        # Send the request to vLLM with priority=grant.priority; here we just wait.
        started = time.monotonic()
        await asyncio.sleep(random.uniform(0.01, 0.05))
        consumed = time.monotonic() - started  # e.g. GPU-seconds
    finally:
        await grant.release(consumed)
    print(
        f"{team:<8} priority {grant.priority:>3}  borrowing {grant.borrowing!s:<5} "
        f"degraded {grant.degraded!s:<5} owner {grant.owner or '-'} epoch {grant.epoch}"
    )


async def main() -> None:
    async with AllocatorClient(TARGETS, holder="example-gateway", deadline_s=0.2) as client:
        await client.refresh_pools()  # learns each pool's degraded mode
        await asyncio.gather(*(one_request(client, "inst-a") for _ in range(9)))
        await asyncio.gather(*(one_request(client, "inst-b") for _ in range(3)))

    # The same from synchronous code (a private event loop runs in a thread).
    with SyncAllocatorClient(TARGETS, holder="example-sync-gateway") as sync_client:
        grant = sync_client.acquire("gpu-b", "research", Class.BATCH, 2048)
        print(f"sync: research batch priority {grant.priority}")
        grant.release(1.25)


if __name__ == "__main__":
    asyncio.run(main())
