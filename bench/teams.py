"""What many teams cost one pool's owner: Snapshot, an Acquire and a durable write.

In-process, on ``ha.owned.pool.OwnedPool`` with a fake clock and a write that does nothing, so
it measures the owner's own work (encoding included), not a store. A flood of ``--flood``
new team names, each acquired once and released with a charge of 1.0 (so none is
negligible and none can be forgotten), then 50 Snapshots (``view``), 200 within-share
Acquires of a configured team and 20 durable writes are timed.

Not part of ``make test`` or ``make bench``; run by hand:

    .venv/bin/python -m bench.teams [--flood 20000] [--max-teams N]

It prints one line of figures; it writes nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time

from fairshare import Class
from ha.api import AllocatorError, Epoch, GrantRef, NodeId
from ha.clock import FakeClock
from ha.owned.journal import MemoryLog
from ha.owned.pool import OwnedPool
from ha.settings import PoolConfig


async def measure(flood: int, max_teams: int | None) -> str:
    limits = {} if max_teams is None else {"max_teams": max_teams}
    config = PoolConfig("bench", 64, {"a": 0.5, "b": 0.5}, **limits)
    owned = OwnedPool(
        config=config,
        epoch=Epoch(1),
        node=NodeId("bench-0"),
        clock=FakeClock(),
        fenced=lambda: True,
        log=MemoryLog(),
        commit_window_s=0.0,
        release_commit_s=0.0,
        release_memory_s=600.0,
    )
    refused = 0
    for i in range(flood):
        try:
            decision = await owned.acquire(
                team=f"t{i}",
                cls=Class.BATCH,
                est_tokens=0,
                holder="bench",
                request_id="",
                try_only=False,
            )
        except AllocatorError:
            refused += 1
            continue
        owned.release(GrantRef.decode(decision.grant_id), 1.0)

    views = []
    for _ in range(50):
        start = time.perf_counter()
        owned.view()
        views.append(time.perf_counter() - start)
    acquires = []
    for _ in range(200):
        start = time.perf_counter()
        await owned.acquire(
            team="a",
            cls=Class.INTERACTIVE,
            est_tokens=0,
            holder="bench",
            request_id="",
            try_only=False,
        )
        acquires.append(time.perf_counter() - start)
    writes = []
    for _ in range(20):
        start = time.perf_counter()
        await owned.durable()
        writes.append(time.perf_counter() - start)
    teams = len(owned.view().teams)
    return (
        f"flood={flood} max_teams={config.max_teams}: teams kept={teams} refused={refused}; "
        f"Snapshot first {views[0] * 1e3:.1f} ms, "
        f"mean of 50 {statistics.mean(views) * 1e3:.2f} ms; "
        f"Acquire p50 {statistics.median(acquires) * 1e3:.3f} ms; "
        f"durable write p50 {statistics.median(writes) * 1e3:.2f} ms"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--flood", type=int, default=20_000, help="new team names sent")
    parser.add_argument("--max-teams", type=int, default=None, help="the pool's max_teams")
    args = parser.parse_args()
    print(asyncio.run(measure(args.flood, args.max_teams)))


if __name__ == "__main__":
    main()
