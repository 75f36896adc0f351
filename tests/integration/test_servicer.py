"""Every RPC over a real grpc.aio server, with the status codes of docs/design.md §17."""

from __future__ import annotations

import math
import pathlib

import grpc
import pytest
from grpc import aio

from fairshare import BORROW_BASE, RANK_STEP, WITHIN_SHARE_BASE, Class
from fairshare.wire.pb.fairshare.v1 import allocator_pb2 as pb
from fairshare.wire.pb.fairshare.v1 import allocator_pb2_grpc as pb_grpc
from ha.api import (
    Epoch,
    GrantRef,
    InvalidArgument,
    NoOwner,
    PeerUnavailable,
    PoolName,
    UnknownPool,
    WrongEpoch,
)
from server.app import RunningServer
from server.peers import GrpcPeers

from .fakes import FakeAllocator

pytestmark = pytest.mark.timeout(20)


def acquire(pool: str = "gpu-a", team: str = "inst-b", **kw: object) -> pb.AcquireRequest:
    return pb.AcquireRequest(pool=pool, team=team, **kw)


async def test_acquire_release_round_trip(stub: pb_grpc.AllocatorStub, fake: FakeAllocator) -> None:
    r = await stub.Acquire(acquire(est_tokens=100, holder="gw-1", request_id="r1"))
    assert r.granted and r.grant_id and r.owner == "test-0" and r.epoch == 1
    assert (r.priority, r.borrowing, r.saturated, r.degraded) == (0, False, False, False)
    assert GrantRef.decode(r.grant_id).pool == "gpu-a"
    snap = await stub.Snapshot(pb.SnapshotRequest(pool="gpu-a"))
    team = {t.team: t for t in snap.teams}["inst-b"]
    assert (team.in_flight, team.in_flight_tokens, team.reserved) == (1, 100, 2)
    await stub.Release(pb.ReleaseRequest(grant_id=r.grant_id, consumed=2.5))
    await stub.Release(pb.ReleaseRequest(grant_id=r.grant_id, consumed=2.5))  # idempotent
    snap = await stub.Snapshot(pb.SnapshotRequest(pool="gpu-a"))
    team = {t.team: t for t in snap.teams}["inst-b"]
    assert team.in_flight == 0
    assert team.usage == pytest.approx(2.5, rel=1e-6)
    assert (snap.pool, snap.capacity, snap.owner, snap.epoch) == ("gpu-a", 10, "test-0", 1)
    assert [t.team for t in snap.teams] == ["inst-a", "inst-b"]
    assert math.isinf(snap.teams[0].level_fairshare)


async def test_priorities_match_spec(stub: pb_grpc.AllocatorStub) -> None:
    got = []
    for _ in range(3):
        r = await stub.Acquire(acquire(team="inst-b", service_class=pb.BATCH))
        got.append((r.priority, r.borrowing))
    # inst-b reserves 2 of 10 (apportion of 0.1875): two within share, then a borrower
    # of rank 0 (no usage yet: every team's LF is +inf).
    assert got == [(WITHIN_SHARE_BASE + 1, False)] * 2 + [(BORROW_BASE + 1, True)]
    # A team with no share is ranked below the configured ones (LF = 0 < inf).
    r = await stub.Acquire(acquire(team="guest"))
    assert (r.priority, r.borrowing) == (BORROW_BASE + RANK_STEP * 1, True)


async def test_request_id_dedupes(stub: pb_grpc.AllocatorStub) -> None:
    a = await stub.Acquire(acquire(holder="gw", request_id="x"))
    b = await stub.Acquire(acquire(holder="gw", request_id="x"))
    c = await stub.Acquire(acquire(holder="gw", request_id="y"))
    assert a.grant_id == b.grant_id != c.grant_id
    snap = await stub.Snapshot(pb.SnapshotRequest(pool="gpu-a"))
    assert {t.team: t.in_flight for t in snap.teams}["inst-b"] == 2


async def test_try_only_refuses_a_full_pool(stub: pb_grpc.AllocatorStub) -> None:
    for _ in range(10):
        assert (await stub.Acquire(acquire(team="inst-a", try_only=True))).granted
    r = await stub.Acquire(acquire(team="inst-b", try_only=True))
    assert not r.granted and not r.grant_id
    r = await stub.Acquire(acquire(team="inst-b"))
    assert r.granted and r.saturated


async def test_adopt_list_pools_and_admin(
    stub: pb_grpc.AllocatorStub, admin: pb_grpc.AdminStub, fake: FakeAllocator
) -> None:
    old = GrantRef(PoolName("gpu-a"), Epoch(0), 7, "inst-a", "gw").encode()
    r = await stub.Adopt(
        pb.AdoptRequest(
            pool="gpu-a",
            epoch=1,
            holder="gw",
            complete=True,
            grants=[pb.HeldGrant(grant_id=old, team="inst-a", priority=0, est_tokens=3)],
        )
    )
    assert (r.adopted, r.owner, r.epoch) == (1, "test-0", 1)
    pools = await stub.ListPools(pb.ListPoolsRequest())
    assert [(p.pool, p.capacity, p.degraded_mode) for p in pools.pools] == [
        ("gpu-a", 10, pb.FAIL_OPEN),
        ("gpu-b", 4, pb.FAIL_CLOSED),
    ]
    # Admin calls need credentials; without any configured, every call is refused.
    with pytest.raises(aio.AioRpcError) as info:
        await admin.SetCapacity(pb.SetCapacityRequest(pool="gpu-a", capacity=20))
    assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED


BAD = [
    pytest.param(acquire(team=""), grpc.StatusCode.INVALID_ARGUMENT, "team", id="empty-team"),
    pytest.param(acquire(pool=""), grpc.StatusCode.INVALID_ARGUMENT, "pool", id="empty-pool"),
    pytest.param(
        acquire(service_class=7), grpc.StatusCode.INVALID_ARGUMENT, "service_class", id="class"
    ),
    pytest.param(
        acquire(est_tokens=-1), grpc.StatusCode.INVALID_ARGUMENT, "est_tokens", id="tokens"
    ),
    pytest.param(acquire(pool="nope"), grpc.StatusCode.NOT_FOUND, "nope", id="unknown-pool"),
    pytest.param(acquire(epoch=9), grpc.StatusCode.FAILED_PRECONDITION, "epoch 1", id="epoch"),
]


@pytest.mark.parametrize(("request_", "code", "words"), BAD)
async def test_bad_acquire(
    stub: pb_grpc.AllocatorStub, request_: pb.AcquireRequest, code: grpc.StatusCode, words: str
) -> None:
    with pytest.raises(aio.AioRpcError) as info:
        await stub.Acquire(request_)
    assert info.value.code() == code
    assert words in (info.value.details() or "")


async def test_wrong_epoch_names_the_owner_in_trailing_metadata(
    stub: pb_grpc.AllocatorStub,
) -> None:
    with pytest.raises(aio.AioRpcError) as info:
        await stub.Acquire(acquire(epoch=9))
    meta = dict(info.value.trailing_metadata() or ())
    assert meta["fairshare-owner"] == "test-0"
    assert meta["fairshare-epoch"] == "1"
    assert "fairshare-owner-address" in meta


@pytest.mark.parametrize(
    ("grant_id", "code"),
    [
        pytest.param("", grpc.StatusCode.INVALID_ARGUMENT, id="empty"),
        pytest.param("garbage", grpc.StatusCode.INVALID_ARGUMENT, id="garbage"),
        pytest.param(
            GrantRef(PoolName("nope"), Epoch(1), 1).encode(),
            grpc.StatusCode.NOT_FOUND,
            id="unknown-pool",
        ),
    ],
)
async def test_bad_release(
    stub: pb_grpc.AllocatorStub, grant_id: str, code: grpc.StatusCode
) -> None:
    with pytest.raises(aio.AioRpcError) as info:
        await stub.Release(pb.ReleaseRequest(grant_id=grant_id))
    assert info.value.code() == code
    if code == grpc.StatusCode.INVALID_ARGUMENT:
        assert "grant_id" in (info.value.details() or "")


@pytest.mark.parametrize("consumed", [math.nan, math.inf, -math.inf, -5.0])
async def test_non_finite_consumption_counts_as_zero(
    stub: pb_grpc.AllocatorStub, consumed: float
) -> None:
    r = await stub.Acquire(acquire())
    await stub.Release(pb.ReleaseRequest(grant_id=r.grant_id, consumed=consumed))
    snap = await stub.Snapshot(pb.SnapshotRequest(pool="gpu-a"))
    assert {t.team: t.usage for t in snap.teams}["inst-b"] == 0.0


async def test_bad_adopt_names_the_grant_field(stub: pb_grpc.AllocatorStub) -> None:
    request = pb.AdoptRequest(
        pool="gpu-a",
        epoch=1,
        grants=[pb.HeldGrant(grant_id=GrantRef(PoolName("gpu-a"), Epoch(0), 1).encode())],
    )
    with pytest.raises(aio.AioRpcError) as info:
        await stub.Adopt(request)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "grants[0].team" in (info.value.details() or "")


async def test_no_owner_fail_closed_is_unavailable(
    stub: pb_grpc.AllocatorStub, fake: FakeAllocator
) -> None:
    fake.owned = False
    with pytest.raises(aio.AioRpcError) as info:
        await stub.Acquire(acquire(pool="gpu-b", team="research"))
    assert info.value.code() == grpc.StatusCode.UNAVAILABLE
    r = await stub.Acquire(acquire(pool="gpu-a", service_class=pb.BATCH))
    assert (r.degraded, r.priority, r.borrowing) == (True, 101, True)


async def test_peers_map_status_codes_back(running: RunningServer, fake: FakeAllocator) -> None:
    peers = GrpcPeers()
    try:
        kw = dict(team="inst-a", cls=Class.INTERACTIVE, est_tokens=0, holder="", request_id="")
        d = await peers.acquire(
            running.address, pool="gpu-a", try_only=False, epoch=1, timeout=2, **kw
        )
        assert d.granted and d.owner == "test-0"
        await peers.release(running.address, d.grant_id, 1.0, timeout=2)
        assert fake.forwarded_calls == 1
        with pytest.raises(WrongEpoch) as wrong:
            await peers.acquire(
                running.address, pool="gpu-a", try_only=False, epoch=5, timeout=2, **kw
            )
        assert (wrong.value.owner, wrong.value.epoch) == ("test-0", 1)
        with pytest.raises(UnknownPool):
            await peers.snapshot(running.address, "nope", timeout=2)
        with pytest.raises(InvalidArgument) as bad:
            await peers.release(running.address, "garbage", 0.0, timeout=2)
        assert bad.value.field == "grant_id"
        fake.owned = False
        with pytest.raises(NoOwner):
            await peers.acquire(
                running.address, pool="gpu-b", try_only=False, epoch=1, timeout=2, **kw
            )
        view = await peers.snapshot(running.address, "gpu-a", timeout=2)
        assert [t.team for t in view.teams] == ["inst-a", "inst-b"]
        assert await peers.set_capacity(running.address, "gpu-a", 12, timeout=2) is not None
    except PeerUnavailable as e:
        # set_capacity without an admin token is refused: mapped to PeerUnavailable.
        assert "PERMISSION_DENIED" in str(e) or "UNAUTHENTICATED" in str(e)
    finally:
        await peers.close()


async def test_peers_unreachable_is_peer_unavailable(tmp_path: pathlib.Path) -> None:
    peers = GrpcPeers()
    try:
        with pytest.raises(PeerUnavailable):
            # Port 1 on loopback: nothing listens there.
            await peers.snapshot("127.0.0.1:1", "gpu-a", timeout=0.5)
    finally:
        await peers.close()
