"""A renewal acknowledged after the fencing deadline is logged: the node decided nothing
meanwhile although no renewal failed, which is otherwise seen only as degraded answers."""

from __future__ import annotations

import asyncio
import contextlib
import logging

import pytest
from test_node import TIMING

from ha.clock import FakeClock
from ha.cluster.lease import NodeLease
from ha.store.contract import LeaseId
from ha.store.keys import Keys
from ha.store.memory import MemoryStore

pytestmark = pytest.mark.timeout(30)


class SlowStore(MemoryStore):
    """Holds every renewal until ``answer`` is set (an etcd stall, a starved process)."""

    def __init__(self, clock: FakeClock) -> None:
        super().__init__(clock)
        self.answer = asyncio.Event()
        self.answer.set()

    async def keepalive(self, lease: LeaseId, *, timeout_s: float | None = None) -> float:
        await self.answer.wait()
        return await super().keepalive(lease, timeout_s=timeout_s)


async def test_a_renewal_answered_after_the_deadline_is_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = FakeClock()
    store = SlowStore(clock)
    lease = NodeLease(
        store=store,
        clock=clock,
        timing=TIMING,
        keys=Keys("/t"),
        node="n1",
        address="a1",
        on_lost=lambda: None,
    )
    await lease.acquire()
    task = asyncio.create_task(lease.run())
    try:
        await clock.advance(2.0)
        assert lease.fenced() and not caplog.records  # on time: nothing to say
        store.answer.clear()
        fenced_for = 0.2
        # Past the fencing deadline, not past the lease (the store would expire it).
        await clock.advance(lease.valid_until - clock.boottime() + fenced_for)
        assert not lease.fenced()
        with caplog.at_level(logging.WARNING, logger="ha.cluster.lease"):
            store.answer.set()
            await clock.advance(0.1)
        assert lease.fenced()
        late = [
            r.getMessage() for r in caplog.records if "after the fencing deadline" in r.getMessage()
        ]
        assert len(late) == 1 and "n1" in late[0]
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await store.close()
