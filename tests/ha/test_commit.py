"""Group commit on a fake clock: when writes start, whom they cover, and failures."""

from __future__ import annotations

import asyncio
import gc

import pytest

from ha.clock import FakeClock, settle
from ha.owned.commit import CommitFailed, GroupCommitter

pytestmark = pytest.mark.timeout(10)


class Disk:
    """Records the fake time at which each write starts; a write takes ``takes_s``."""

    def __init__(self, clock: FakeClock, takes_s: float = 0.0) -> None:
        self.clock = clock
        self.takes_s = takes_s
        self.starts: list[float] = []
        self.fail = False

    async def write(self) -> None:
        self.starts.append(self.clock.monotonic())
        if self.takes_s:
            await self.clock.sleep(self.takes_s)
        if self.fail:
            raise OSError("disk full")


def committer(
    *, window_s: float = 0.0, lazy_s: float = 0.005, takes_s: float = 0.0
) -> tuple[FakeClock, Disk, GroupCommitter]:
    clock = FakeClock()
    disk = Disk(clock, takes_s)
    c = GroupCommitter(disk.write, window_s=window_s, lazy_s=lazy_s, clock=clock, name="p")
    return clock, disk, c


async def test_an_urgent_sync_writes_at_once() -> None:
    clock, disk, c = committer()
    t0 = clock.monotonic()
    await c.sync()
    assert disk.starts == [t0] and c.writes == 1


async def test_a_lone_lazy_sync_writes_at_once() -> None:
    clock, disk, c = committer(lazy_s=1.0)
    t0 = clock.monotonic()
    await c.sync(lazy=True)
    assert disk.starts == [t0]


async def test_lazy_syncs_after_a_write_wait_for_their_window_and_share_a_write() -> None:
    clock, disk, c = committer(lazy_s=0.005)
    t0 = clock.monotonic()
    await c.sync()
    await clock.advance(0.002, step=0.001)
    first = asyncio.create_task(c.sync(lazy=True))
    await clock.advance(0.001, step=0.001)
    second = asyncio.create_task(c.sync(lazy=True))
    await settle()
    assert len(disk.starts) == 1 and not first.done()
    await clock.advance(0.003, step=0.001)
    await asyncio.gather(first, second)
    # One write, 5 ms after the previous one started, covers both.
    assert disk.starts == [t0, pytest.approx(t0 + 0.005)]


async def test_an_urgent_sync_starts_the_write_a_lazy_one_waits_for() -> None:
    clock, disk, c = committer(lazy_s=1.0)
    t0 = clock.monotonic()
    await c.sync()
    lazy = asyncio.create_task(c.sync(lazy=True))
    await clock.advance(0.01, step=0.005)
    assert not lazy.done()
    await c.sync()  # wakes the writer from its one-second nap
    await settle()
    assert lazy.done() and disk.starts == [t0, pytest.approx(t0 + 0.01)]


async def test_writes_start_at_most_once_per_window() -> None:
    clock, disk, c = committer(window_s=0.01)
    t0 = clock.monotonic()
    await c.sync()
    waiting = asyncio.create_task(c.sync())
    await settle()
    assert len(disk.starts) == 1
    await clock.advance(0.01, step=0.002)
    await waiting
    assert disk.starts == [t0, pytest.approx(t0 + 0.01)]


async def test_requests_during_a_write_share_the_next_one() -> None:
    clock, disk, c = committer(takes_s=0.004)
    first = asyncio.create_task(c.sync())
    await settle()
    during = [asyncio.create_task(c.sync()) for _ in range(5)]
    await settle()
    assert not any(t.done() for t in during)  # not covered by the write in progress
    await clock.advance(0.01, step=0.001)
    await asyncio.gather(first, *during)
    assert len(disk.starts) == 2


async def test_a_failed_write_fails_its_waiters_and_every_later_sync() -> None:
    _, disk, c = committer()
    disk.fail = True
    with pytest.raises(CommitFailed, match="disk full"):
        await c.sync()
    assert c.failed
    with pytest.raises(CommitFailed):
        await c.sync(lazy=True)


async def test_close_fails_a_lazy_waiter_that_no_write_will_cover() -> None:
    _, _, c = committer(lazy_s=10.0)
    await c.sync()
    lazy = asyncio.create_task(c.sync(lazy=True))
    await settle()
    await c.close()
    with pytest.raises(CommitFailed):
        await lazy


async def test_a_write_cancelled_midway_fails_the_committer_for_good() -> None:
    # A write stores what changed since the previous one: after a write that may not
    # have been stored, no later write may pretend to follow it.
    clock, disk, c = committer(takes_s=1.0)
    waiter = asyncio.create_task(c.sync())
    await clock.advance(0.5)
    assert disk.starts and c._task is not None
    c._task.cancel()
    await settle()
    with pytest.raises(CommitFailed):
        await waiter
    assert c.failed
    with pytest.raises(CommitFailed):
        await c.sync()
    assert len(disk.starts) == 1


async def test_a_waiter_that_gave_up_leaves_no_failure_unretrieved() -> None:
    # A caller cancelled while its write is under way (a client's deadline) must not
    # leave a future whose failure nobody reads: asyncio logs each as an ERROR.
    clock, disk, c = committer(takes_s=1.0)
    disk.fail = True
    unread: list[dict[str, object]] = []
    loop = asyncio.get_running_loop()
    loop.set_exception_handler(lambda _loop, context: unread.append(context))
    try:
        waiter = asyncio.create_task(c.sync())
        await clock.advance(0.5)
        waiter.cancel()
        await settle()
        await clock.advance(1.0)
        assert c.failed
        del waiter
        gc.collect()
        await settle()
    finally:
        loop.set_exception_handler(None)
    assert not unread, unread
