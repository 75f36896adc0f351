"""What one Acquire costs its owner's event loop in CPU, with and without a durable write.

In-process, on an embedded node (``ha.open_node`` on the local file store, as ``fairshare
serve`` runs without etcd): no gRPC, no other process, so its figures have the resolution
that an end-to-end latency, which wakes several processes per request, lacks. One pool of
C = 100 shared by teams a, b, c (0.5, 0.3, 0.2); team c holds its whole share (20 grants)
throughout. Then, ``--pairs`` times, in turn: a within-share Acquire of team a (it waits
for the pool's durable write: one fdatasync'd append) and a borrowing Acquire of team c
(no write), each followed by its Release and a pause of ``--gap-ms``, and a bare append of
``RECORD_BYTES`` to a file of its own in the same folder, fdatasync'd (the floor of any
durable write there). Each figure's CPU is the event loop thread's (``time.thread_time``:
what the kernel spends in fdatasync for this thread is counted, the waiting is not); the
first tenth is warm-up.

The within-share Acquire's CPU less the borrowing one's is what its durable write costs
the owner's CPU beyond the decision; less the bare append's, what the owner's own code of
that write (the pool's record, the store's layers) costs.

Not part of ``make test`` or ``make bench``; run by hand:

    .venv/bin/python -m bench.acquire_cpu [--pairs 2000] [--gap-ms 10]

It prints its figures; it writes nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import statistics
import time
from typing import Any, cast

from bench._common import machine, machine_lines, workdir
from fairshare import Class
from ha import NodeId, PoolConfig, Timing, open_node
from ha.api import Peers

POOL = "bench"
SHARES = {"a": 0.5, "b": 0.3, "c": 0.2}
CAPACITY = 100
RECORD_BYTES = 300
"""About the size of the store's record of one within-share Acquire here."""


class _NoPeers:
    """The peers of a lone embedded node: never called."""

    def __getattr__(self, name: str) -> Any:
        async def refuse(*args: object, **kwargs: object) -> None:
            raise RuntimeError(f"a lone node has no peer to call ({name})")

        return refuse


async def measure(pairs: int, gap_s: float) -> str:
    work = workdir("fairshare-bench-acquire-cpu-")
    node = await open_node(
        node_id=NodeId("bench-0"),
        advertise="127.0.0.1:1",
        pools=[PoolConfig(POOL, CAPACITY, SHARES)],
        timing=Timing(),
        state_dir=work,
        etcd_endpoints=[],
        prefix="/fairshare",
        peers=cast(Peers, _NoPeers()),
    )
    await node.start()
    try:
        for _ in range(100):
            if all(status.owner for status in node.status()):
                break
            await asyncio.sleep(0.05)
        else:
            raise RuntimeError("the node did not take its pool")
        held = []
        for i in range(int(CAPACITY * SHARES["c"])):
            held.append(
                await node.acquire(
                    pool=POOL,
                    team="c",
                    cls=Class.INTERACTIVE,
                    est_tokens=10,
                    holder="bench",
                    request_id=f"h{i}",
                )
            )
        cpu: dict[bool, list[float]] = {False: [], True: []}
        wall: dict[bool, list[float]] = {False: [], True: []}
        append_cpu: list[float] = []
        append_wall: list[float] = []
        bare = os.open(work / "bare-append.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        record = b"x" * (RECORD_BYTES - 1) + b"\n"
        for i in range(2 * pairs):
            borrowing = i % 2 == 1
            wall_0, cpu_0 = time.perf_counter(), time.thread_time()
            decision = await node.acquire(
                pool=POOL,
                team="c" if borrowing else "a",
                cls=Class.INTERACTIVE,
                est_tokens=10,
                holder="bench",
                request_id=f"r{i}",
            )
            cpu_1, wall_1 = time.thread_time(), time.perf_counter()
            if decision.borrowing != borrowing or not decision.granted:
                raise RuntimeError(f"expected a {'borrowing' if borrowing else 'within'} grant")
            if i >= pairs // 5:  # the first tenth of the Acquires warm up
                cpu[borrowing].append(cpu_1 - cpu_0)
                wall[borrowing].append(wall_1 - wall_0)
            await node.release(decision.grant_id, 1.0)
            await asyncio.sleep(gap_s)
            if borrowing:
                wall_0, cpu_0 = time.perf_counter(), time.thread_time()
                os.write(bare, record)
                os.fdatasync(bare)
                cpu_1, wall_1 = time.thread_time(), time.perf_counter()
                if i >= pairs // 5:
                    append_cpu.append(cpu_1 - cpu_0)
                    append_wall.append(wall_1 - wall_0)
                await asyncio.sleep(gap_s)
        os.close(bare)
        for grant in held:
            await node.release(grant.grant_id, 1.0)
    finally:
        await node.close()
        shutil.rmtree(work, ignore_errors=True)

    def ms(values: list[float]) -> float:
        return statistics.median(values) * 1e3

    within, borrowing = ms(cpu[False]), ms(cpu[True])
    return "\n".join(
        [
            f"Acquires timed: {len(cpu[False])} within share, {len(cpu[True])} borrowing"
            f" (gap {gap_s * 1e3:g} ms)",
            f"within-share Acquire: CPU {within:.3f} ms, wall {ms(wall[False]):.3f} ms (median)",
            f"borrowing Acquire:    CPU {borrowing:.3f} ms, wall {ms(wall[True]):.3f} ms (median)",
            f"bare append of {RECORD_BYTES} bytes, fdatasync'd: CPU {ms(append_cpu):.3f} ms,"
            f" wall {ms(append_wall):.3f} ms (median)",
            f"the durable write's CPU (within - borrowing): {within - borrowing:.3f} ms",
            f"the owner's own code of it (within - borrowing - bare append):"
            f" {within - borrowing - ms(append_cpu):.3f} ms",
            machine_lines(machine()),
        ]
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=2000)
    parser.add_argument("--gap-ms", type=float, default=10.0)
    args = parser.parse_args()
    print(asyncio.run(measure(args.pairs, args.gap_ms / 1e3)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
