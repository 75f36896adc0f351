"""A shutdown always ends: a cancelled store call is cancelled, and ``Node.close`` is
bounded whatever its tasks do."""

from __future__ import annotations

import asyncio
import time

import pytest

from ha.api import NodeId
from ha.node import Node
from ha.settings import PoolConfig, Timing
from ha.store.contract import bounded
from ha.store.memory import MemoryStore

pytestmark = pytest.mark.timeout(30)

TIMING = Timing(
    lease_ttl_s=2.0,
    keepalive_interval_s=0.3,
    rpc_timeout_s=0.2,
    fence_margin_s=0.5,
    snapshot_interval_s=0.5,
    commit_window_s=0.0,
    release_commit_s=0.0,
    campaign_delay_s=0.1,
    degraded_after_s=0.2,
    forward_deadline_s=1.0,
    release_memory_s=600.0,
)


async def test_a_store_call_cancelled_just_as_it_finishes_is_cancelled() -> None:
    # The lease task's pattern: a bounded store call whose answer arrives in the same
    # loop iteration as the cancellation of the task (a shutdown). asyncio.wait_for on
    # Python 3.11 returned the answer and dropped the cancellation, and the task went on
    # renewing for ever while close() waited for it.
    for _ in range(20):
        answer: asyncio.Future[int] = asyncio.get_running_loop().create_future()

        async def call(answer: asyncio.Future[int] = answer) -> int:
            return await answer

        task = asyncio.create_task(bounded(call(), 10.0))
        for _ in range(5):
            await asyncio.sleep(0)  # the call is now waiting for its answer
        answer.set_result(1)
        task.cancel()
        await asyncio.wait([task], timeout=5)
        assert task.cancelled()


class _Peers:
    """No peers: an embedded node never forwards."""

    def __getattr__(self, name: str) -> object:
        raise AssertionError(f"an embedded node called peers.{name}")


async def test_close_ends_in_bounded_time_when_a_task_ignores_its_cancellation(
    caplog: pytest.LogCaptureFixture,
) -> None:
    node = Node(
        node_id=NodeId("n0"),
        advertise="n0:1",
        pools=[PoolConfig("p", 4, {"a": 1.0})],
        timing=TIMING,
        store=MemoryStore(),
        peers=_Peers(),  # type: ignore[arg-type]
        embedded=True,
        owns_store=True,
    )
    await node.start()
    stop = asyncio.Event()

    async def stubborn() -> None:
        while not stop.is_set():
            try:
                await asyncio.sleep(0.01)
            except asyncio.CancelledError:
                continue  # a task that swallows its cancellation, as wait_for made ours do

    node._spawn("stubborn", stubborn())
    started = time.monotonic()
    try:
        async with asyncio.timeout(TIMING.close_bound_s):
            await node.close()
        assert time.monotonic() - started <= TIMING.close_bound_s
        assert "BUG: task stubborn of node n0 did not end when cancelled" in caplog.text
    finally:
        stop.set()
