"""Which clock decides what: fencing on boot time, ages on the monotonic clock, wall time
only between owners (in-memory store, fake clock; the Cluster helper is test_node.py's).
"""

from __future__ import annotations

import os
import pathlib
import time

import pytest
from test_node import TIMING, Cluster, LocalPeers, acquire

from fairshare import Class
from ha.api import Epoch, GrantRef, HeldGrant, NodeId, PoolName, WrongEpoch
from ha.clock import FakeClock, SystemClock, WallOffsetClock, system_clock
from ha.node import open_node
from ha.owned.pool import NotDeciding
from ha.settings import PoolConfig

pytestmark = pytest.mark.timeout(30)

# Team "a" has 5 reserved slots of 10; no decay, so charges can be read back exactly.
POOL = PoolConfig("p", 10, {"a": 0.5, "b": 0.5}, half_life_s=0.0, max_request_s=120.0)


def test_fake_clock_steps_wall_time_alone_and_models_a_suspend() -> None:
    clock = FakeClock()
    mono, boot, wall = clock.monotonic(), clock.boottime(), clock.time()
    clock.step_wall(-600.0)
    assert (clock.monotonic(), clock.boottime(), clock.time()) == (mono, boot, wall - 600.0)
    clock.suspend(30.0)
    assert (clock.monotonic(), clock.boottime(), clock.time()) == (mono, boot + 30, wall - 570)


def test_system_boottime_counts_like_the_kernels_boot_clock() -> None:
    clock = SystemClock()
    first = clock.boottime()
    if hasattr(time, "CLOCK_BOOTTIME"):
        assert abs(first - time.clock_gettime(time.CLOCK_BOOTTIME)) < 1.0
    assert clock.boottime() >= first


def test_the_wall_offset_hook_is_off_unless_set_and_follows_its_file(
    tmp_path: os.PathLike[str],
) -> None:
    assert type(system_clock({})) is SystemClock
    path = os.path.join(tmp_path, "offset")
    clock = system_clock({"FAIRSHARE_TEST_WALL_OFFSET_FILE": path})
    assert isinstance(clock, WallOffsetClock)
    hook = WallOffsetClock(path, check_every_s=0.0)
    assert abs(hook.time() - time.time()) < 1.0  # no file: offset 0
    with open(path, "w") as f:
        f.write("600.5\n")
    assert abs(hook.time() - time.time() - 600.5) < 1.0
    with open(path, "w") as f:
        f.write("-600\n")
    os.utime(path, ns=(1, 1))  # a new mtime, whatever the file system's resolution
    assert hook.offset == -600.0
    assert abs(hook.monotonic() - time.monotonic()) < 1.0  # durations are not shifted
    with open(path, "w") as f:
        f.write("-")  # caught half-written: the last offset stays
    assert hook.offset == -600.0
    os.remove(path)
    assert hook.offset == 0.0


async def _in_flight(node, team: str) -> int:  # type: ignore[no-untyped-def]
    view = await node.snapshot("p")
    return next(s.in_flight for s in view.teams if s.team == team)


async def _usage(node, team: str) -> float:  # type: ignore[no-untyped-def]
    view = await node.snapshot("p")
    return next(s.usage for s in view.teams if s.team == team)


@pytest.mark.parametrize("step_s", [600.0, -600.0], ids=["wall+10min", "wall-10min"])
async def test_a_wall_step_neither_expires_grants_nor_admits_more(step_s: float) -> None:
    c = Cluster(1, [POOL])
    await c.start()
    node = c.nodes[0]
    held = [await acquire(node, "p", "a") for _ in range(5)]
    assert not any(d.borrowing for d in held)
    c.clock.step_wall(step_s)
    # Several snapshot rounds: each one ends grants older than max_request_s.
    await c.clock.advance(4 * TIMING.snapshot_interval_s)
    assert await _in_flight(node, "a") == 5, "live grants were expired by a wall step"
    extra = await acquire(node, "p", "a")
    assert extra.borrowing, "a 6th request got one of the 5 reserved slots"
    before = await _usage(node, "a")
    for d in held[:4]:
        await node.release(d.grant_id, 10.0)
    assert await _usage(node, "a") == pytest.approx(before + 40.0)
    assert await _in_flight(node, "a") == 2
    # The ages still run on the monotonic clock: grants of a dead holder, issued before
    # and after the step, end max_request_s after they were issued, not 10 minutes off.
    await c.clock.advance(POOL.max_request_s + 2 * TIMING.snapshot_interval_s, step=1.0)
    assert await _in_flight(node, "a") == 0
    await c.close()


async def test_a_suspended_owner_stops_deciding_at_once() -> None:
    """Boot time jumps past the fence while monotonic time stands still (a VM suspended
    and resumed): no borrowing grant, no Adopt is decided from the old epoch any more."""
    c = Cluster(2, [POOL])
    await c.start()
    owner = c.owner("p")
    assert owner is not None
    owned = owner.ownership.owned[PoolName("p")]
    epoch = owned.epoch
    for _ in range(5):
        await acquire(owner, "p", "b")  # b's share is full: a's next ones would borrow
    earlier = GrantRef(owned.name, Epoch(epoch - 1), 1, "a", "gw").encode()
    report = [HeldGrant(earlier, "a", 0, True, 1)]
    assert owned.can_decide()

    c.clock.suspend(TIMING.lease_ttl_s)

    assert not owned.can_decide()
    with pytest.raises(NotDeciding):
        await owned.acquire(
            team="a",
            cls=Class.INTERACTIVE,
            est_tokens=1,
            holder="gw",
            request_id="",
            try_only=False,
        )
    with pytest.raises(NotDeciding):
        owned.adopt(holder="gw", grants=report, complete=True)
    # As a peer would ask it: refused, naming no decision of the old epoch.
    with pytest.raises(WrongEpoch):
        await owner.acquire(
            pool="p",
            team="b",
            cls=Class.INTERACTIVE,
            est_tokens=1,
            holder="gw",
            epoch=epoch,
            forwarded=True,
        )
    with pytest.raises(WrongEpoch):
        await owner.adopt(
            pool="p", epoch=epoch, holder="gw", grants=report, complete=True, forwarded=True
        )
    status = next(s for s in owner.status() if s.pool == "p")
    assert not status.owned and status.fence_left_s == 0.0
    await c.close()


async def test_a_real_node_reads_the_wall_offset_hook_at_start_up(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    offset = tmp_path / "wall-offset"
    offset.write_text("-600\n")
    monkeypatch.setenv("FAIRSHARE_TEST_WALL_OFFSET_FILE", str(offset))
    node = await open_node(
        node_id=NodeId("n"),
        advertise="addr-n",
        pools=[POOL],
        timing=TIMING,
        state_dir=tmp_path,
        etcd_endpoints=[],
        prefix="/t",
        peers=LocalPeers(),
    )
    try:
        assert isinstance(node._clock, WallOffsetClock)
        assert abs(node._clock.time() - (time.time() - 600.0)) < 1.0
    finally:
        await node._store.close()
    monkeypatch.delenv("FAIRSHARE_TEST_WALL_OFFSET_FILE")
    plain = await open_node(
        node_id=NodeId("m"),
        advertise="addr-m",
        pools=[POOL],
        timing=TIMING,
        state_dir=tmp_path / "m",
        etcd_endpoints=[],
        prefix="/t",
        peers=LocalPeers(),
    )
    try:
        assert type(plain._clock) is SystemClock
    finally:
        await plain._store.close()
