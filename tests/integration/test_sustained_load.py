"""Reservations under sustained load through a real ``fairshare serve`` (docs/spec.md §4).

One embedded server; a team keeps more than its reservation in flight over gRPC and sends
the next request as each ends (oldest first, then in random order), while another team
floods the pool. At every step the team holds exactly its reservation within share, as
its answers say and as the owner's Snapshot counts.
"""

from __future__ import annotations

import pathlib
import random
from collections.abc import AsyncIterator

import pytest

from fairshare.wire.channels import open_channel
from fairshare.wire.pb.fairshare.v1 import allocator_pb2 as pb
from fairshare.wire.pb.fairshare.v1 import allocator_pb2_grpc as pb_grpc
from harness.serve import Allocator, wait_serving

pytestmark = [pytest.mark.timeout(60)]

CONFIG = """\
pools:
  - name: gpu
    capacity: 10
    shares: {a: 0.4, b: 0.6}
"""
RESERVED = {"a": 4, "b": 6}
STEPS = 60


@pytest.fixture
async def stub(tmp_path: pathlib.Path) -> AsyncIterator[pb_grpc.AllocatorStub]:
    config = tmp_path / "pools.yaml"
    config.write_text(CONFIG, encoding="utf-8")
    server = Allocator(tmp_path, config)
    server.start()
    try:
        await wait_serving(server.address, process=server)
        async with open_channel(server.address) as channel:
            yield pb_grpc.AllocatorStub(channel)
    finally:
        server.kill()


async def acquire(stub: pb_grpc.AllocatorStub, team: str) -> pb.AcquireResponse:
    reply: pb.AcquireResponse = await stub.Acquire(
        pb.AcquireRequest(pool="gpu", team=team, holder="gw"), timeout=5
    )
    assert reply.granted
    return reply


async def within_counted(stub: pb_grpc.AllocatorStub, team: str) -> int:
    """The team's within-share grants in flight as the owner's Snapshot counts them."""
    snap = await stub.Snapshot(pb.SnapshotRequest(pool="gpu"), timeout=5)
    stat = next(t for t in snap.teams if t.team == team)
    assert stat.phantoms == 0
    return int(stat.in_flight - stat.borrowing)


@pytest.mark.parametrize("order", ["oldest-first", "random"])
async def test_a_busy_team_keeps_its_reservation_within_share_at_every_step(
    stub: pb_grpc.AllocatorStub, order: str
) -> None:
    rng = random.Random(5)
    flood = [await acquire(stub, "b") for _ in range(15)]  # b: 6 within share, 9 borrowing
    assert sum(not r.borrowing for r in flood) == RESERVED["b"]
    running = [await acquire(stub, "a") for _ in range(9)]
    assert [r.borrowing for r in running] == [False] * 4 + [True] * 5
    for step in range(STEPS):
        index = 0 if order == "oldest-first" else rng.randrange(len(running))
        done = running.pop(index)
        await stub.Release(pb.ReleaseRequest(grant_id=done.grant_id, consumed=1.0), timeout=5)
        running.append(await acquire(stub, "a"))
        held = sum(1 for r in running if not r.borrowing)
        assert held == RESERVED["a"], f"step {step}: {held} within share"
        assert await within_counted(stub, "a") == RESERVED["a"]
    # Within-share answers carry a within-share priority; borrowers a borrowing one.
    assert max(r.priority for r in running if not r.borrowing) < min(
        r.priority for r in running if r.borrowing
    )


async def test_the_other_teams_reservation_is_kept_while_one_team_churns(
    stub: pb_grpc.AllocatorStub,
) -> None:
    flood = [await acquire(stub, "b") for _ in range(12)]
    running = [await acquire(stub, "a") for _ in range(8)]
    for _ in range(30):
        done = running.pop(0)
        await stub.Release(pb.ReleaseRequest(grant_id=done.grant_id, consumed=2.0), timeout=5)
        running.append(await acquire(stub, "a"))
    assert sum(not r.borrowing for r in flood) == RESERVED["b"]
    assert await within_counted(stub, "b") == RESERVED["b"]
    assert await within_counted(stub, "a") == RESERVED["a"]
