"""The gRPC server over the real replication layer in embedded mode (no etcd).

Every test starts ``start_server`` with the default node factory (``ha.node.open_node``
with no etcd endpoints: one node owns every pool, state in a file under the test's own
state dir) on 127.0.0.1:0, so what is checked is the decision path a one-machine user
runs: servicer, node, owner, group commit, file store, restore.
"""

from __future__ import annotations

import asyncio
import pathlib
from collections.abc import AsyncIterator, Callable

import grpc
import pytest
from grpc import aio

from fairshare import BORROW_BASE, RANK_STEP, WITHIN_SHARE_BASE
from fairshare.client import AllocatorClient
from fairshare.wire.pb.fairshare.v1 import allocator_pb2 as pb
from fairshare.wire.pb.fairshare.v1 import allocator_pb2_grpc as pb_grpc
from ha.api import Epoch, GrantRef, PoolName
from ha.owned.poolstate import load
from ha.store.file import FileStore
from ha.store.keys import Keys
from harness.net import free_port
from server.app import RunningServer, start_server
from server.config import Config

from .conftest import make_config

pytestmark = pytest.mark.timeout(30)

TOKEN = "embedded-admin-token"
GOOD = (("authorization", f"Bearer {TOKEN}"),)


@pytest.fixture
def node_config(tmp_path: pathlib.Path) -> Config:
    token_file = tmp_path / "admin-token"
    token_file.write_text(TOKEN + "\n", encoding="utf-8")
    return make_config(tmp_path, f"admin: {{token_file: {token_file}}}")


@pytest.fixture
async def server(node_config: Config) -> AsyncIterator[RunningServer]:
    running = await start_server(node_config, serve_metrics=False)
    try:
        yield running
    finally:
        await running.shutdown(0)


@pytest.fixture
async def stub(server: RunningServer) -> AsyncIterator[pb_grpc.AllocatorStub]:
    async with aio.insecure_channel(server.address) as channel:
        yield pb_grpc.AllocatorStub(channel)


@pytest.fixture
async def admin(server: RunningServer) -> AsyncIterator[pb_grpc.AdminStub]:
    async with aio.insecure_channel(server.address) as channel:
        yield pb_grpc.AdminStub(channel)


def acquire(team: str, **fields: object) -> pb.AcquireRequest:
    fields.setdefault("pool", "gpu-a")
    fields.setdefault("holder", "gw-1")
    return pb.AcquireRequest(team=team, **fields)  # type: ignore[arg-type]


async def table(stub: pb_grpc.AllocatorStub, pool: str = "gpu-a") -> dict[str, pb.TeamStat]:
    # wait_for_ready: right after a restart the channel may still be in its reconnect backoff.
    snap = await stub.Snapshot(pb.SnapshotRequest(pool=pool), timeout=5, wait_for_ready=True)
    return {t.team: t for t in snap.teams}


def held(r: pb.AcquireResponse, team: str) -> pb.HeldGrant:
    return pb.HeldGrant(grant_id=r.grant_id, team=team, priority=r.priority, borrowing=r.borrowing)


def on_port(config: Config, port: int) -> Config:
    fields = {f: getattr(config, f) for f in config.__slots__}
    return Config(**{**fields, "listen": f"127.0.0.1:{port}", "advertise": f"127.0.0.1:{port}"})


async def eventually(check: Callable[[], object], what: str, *, timeout_s: float = 5.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not check():
        assert loop.time() < deadline, f"not reached within {timeout_s} s: {what}"
        await asyncio.sleep(0.02)


# -- decisions --------------------------------------------------------------------------


async def test_two_institutions_get_their_shares_then_borrow_by_rank(
    stub: pb_grpc.AllocatorStub,
) -> None:
    # C=10 at 0.8125 / 0.1875 apportions to 8 + 2 (rounding each up would promise 11).
    a = [await stub.Acquire(acquire("inst-a", est_tokens=5), timeout=5) for _ in range(8)]
    assert [(r.priority, r.borrowing, r.saturated) for r in a] == [
        (WITHIN_SHARE_BASE, False, False)
    ] * 8
    b = [await stub.Acquire(acquire("inst-b", service_class=pb.BATCH), timeout=5) for _ in range(2)]
    assert [(r.priority, r.borrowing) for r in b] == [(WITHIN_SHARE_BASE + 1, False)] * 2
    assert {(r.owner, r.epoch) for r in a + b} == {("test-0", a[0].epoch)} and a[0].epoch > 0
    # Beyond its share a team borrows; with no usage yet every LF is +inf: rank 0.
    over = await stub.Acquire(acquire("inst-a"), timeout=5)
    assert (over.priority, over.borrowing, over.saturated) == (BORROW_BASE, True, True)

    # inst-a consumed 10 and inst-b 1: LF(a) = 0.8125 / (10/11) < LF(b) = 0.1875 / (1/11).
    stub_release = stub.Release
    for r in a[:5]:
        await stub_release(pb.ReleaseRequest(grant_id=r.grant_id, consumed=2.0), timeout=5)
    await stub_release(pb.ReleaseRequest(grant_id=b[0].grant_id, consumed=1.0), timeout=5)
    teams = await table(stub)
    assert teams["inst-a"].usage == pytest.approx(10.0, rel=1e-4)
    assert teams["inst-b"].usage == pytest.approx(1.0, rel=1e-4)
    assert (teams["inst-b"].rank, teams["inst-a"].rank) == (0, 1)
    assert teams["inst-a"].level_fairshare == pytest.approx(0.8125 / (10 / 11), rel=1e-4)

    # inst-a: 3 within share in flight (its borrower uses no reserved slot) < 8 reserved,
    # so five more are within share, and the next borrows.
    again = [await stub.Acquire(acquire("inst-a"), timeout=5) for _ in range(6)]
    assert [(r.priority, r.borrowing) for r in again] == [(WITHIN_SHARE_BASE, False)] * 5 + [
        (BORROW_BASE + RANK_STEP * 1, True)
    ]
    batch = await stub.Acquire(acquire("inst-a", service_class=pb.BATCH), timeout=5)
    assert (batch.priority, batch.borrowing) == (BORROW_BASE + RANK_STEP * 1 + 1, True)
    # inst-b has 1 of 2 in flight: within share; then it borrows at rank 0.
    b2 = [await stub.Acquire(acquire("inst-b"), timeout=5) for _ in range(2)]
    assert [(r.priority, r.borrowing) for r in b2] == [(0, False), (BORROW_BASE, True)]
    # A team with no share has LF 0: ranked below both institutions.
    guest = await stub.Acquire(acquire("guest"), timeout=5)
    assert (guest.priority, guest.borrowing) == (BORROW_BASE + RANK_STEP * 2, True)

    teams = await table(stub)
    assert [
        (t.team, t.share, t.reserved, t.in_flight, t.borrowing, t.rank, t.phantoms)
        for t in teams.values()
    ] == [
        ("guest", 0.0, 0, 1, 1, 2, 0),
        ("inst-a", 0.8125, 8, 3 + 1 + 6 + 1, 3, 1, 0),
        ("inst-b", 0.1875, 2, 3, 1, 0, 0),
    ]
    assert teams["inst-a"].in_flight_tokens == 3 * 5


async def test_request_id_returns_the_same_grant(stub: pb_grpc.AllocatorStub) -> None:
    first = await stub.Acquire(acquire("inst-b", request_id="req-1"), timeout=5)
    retry = await stub.Acquire(acquire("inst-b", request_id="req-1"), timeout=5)
    other_holder = await stub.Acquire(acquire("inst-b", request_id="req-1", holder="gw-2"))
    assert first == retry
    assert other_holder.grant_id != first.grant_id
    assert (await table(stub))["inst-b"].in_flight == 2


async def test_try_only_never_passes_capacity(stub: pb_grpc.AllocatorStub) -> None:
    granted = [await stub.Acquire(acquire("inst-a", try_only=True), timeout=5) for _ in range(10)]
    assert all(r.granted for r in granted)
    refused = await stub.Acquire(acquire("inst-b", try_only=True), timeout=5)
    assert (refused.granted, refused.grant_id, refused.saturated) == (False, "", True)
    assert (await table(stub))["inst-b"].in_flight == 0
    forced = await stub.Acquire(acquire("inst-b"), timeout=5)
    assert forced.granted and forced.saturated and not forced.borrowing


async def test_list_pools_names_this_node_as_owner(
    stub: pb_grpc.AllocatorStub, server: RunningServer
) -> None:
    pools = (await stub.ListPools(pb.ListPoolsRequest(), timeout=5)).pools
    assert [(p.pool, p.capacity, p.owner, p.degraded_mode) for p in pools] == [
        ("gpu-a", 10, "test-0", pb.FAIL_OPEN),
        ("gpu-b", 4, "test-0", pb.FAIL_CLOSED),
    ]
    assert {p.owner_address for p in pools} == {server.address}
    assert all(p.epoch > 0 for p in pools) and pools[0].epoch != pools[1].epoch


async def test_set_capacity_needs_the_token_and_reapportions(
    stub: pb_grpc.AllocatorStub, admin: pb_grpc.AdminStub
) -> None:
    for metadata, code in (
        ((), grpc.StatusCode.UNAUTHENTICATED),
        ((("authorization", "Bearer wrong"),), grpc.StatusCode.PERMISSION_DENIED),
    ):
        with pytest.raises(aio.AioRpcError) as info:
            await admin.SetCapacity(
                pb.SetCapacityRequest(pool="gpu-a", capacity=16), metadata=metadata, timeout=5
            )
        assert info.value.code() == code
    assert (await stub.Snapshot(pb.SnapshotRequest(pool="gpu-a"), timeout=5)).capacity == 10
    r = await admin.SetCapacity(
        pb.SetCapacityRequest(pool="gpu-a", capacity=16), metadata=GOOD, timeout=5
    )
    assert r.previous == 10
    snap = await stub.Snapshot(pb.SnapshotRequest(pool="gpu-a"), timeout=5)
    assert snap.capacity == 16
    assert {t.team: t.reserved for t in snap.teams} == {"inst-a": 13, "inst-b": 3}
    with pytest.raises(aio.AioRpcError) as info:
        await admin.SetCapacity(pb.SetCapacityRequest(pool="nope", capacity=1), metadata=GOOD)
    assert info.value.code() == grpc.StatusCode.NOT_FOUND


async def test_release_is_idempotent(stub: pb_grpc.AllocatorStub) -> None:
    r = await stub.Acquire(acquire("inst-b"), timeout=5)
    for _ in range(3):
        await stub.Release(pb.ReleaseRequest(grant_id=r.grant_id, consumed=4.0), timeout=5)
    teams = await table(stub)
    assert teams["inst-b"].in_flight == 0
    assert teams["inst-b"].usage == pytest.approx(4.0)
    with pytest.raises(aio.AioRpcError) as info:
        await stub.Release(pb.ReleaseRequest(grant_id="not-a-grant"), timeout=5)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT


async def test_adopt_counts_a_degraded_grant_until_released(stub: pb_grpc.AllocatorStub) -> None:
    ours = await stub.Acquire(acquire("inst-b"), timeout=5)
    degraded = GrantRef(PoolName("gpu-a"), Epoch(0), 77, "inst-b", "gw-1").encode()
    grant = pb.HeldGrant(grant_id=degraded, team="inst-b", priority=100, borrowing=True)
    r = await stub.Adopt(
        pb.AdoptRequest(pool="gpu-a", epoch=ours.epoch, holder="gw-1", grants=[grant]), timeout=5
    )
    assert (r.adopted, r.phantoms_dropped, r.owner, r.epoch) == (1, 0, "test-0", ours.epoch)
    again = await stub.Adopt(
        pb.AdoptRequest(pool="gpu-a", epoch=ours.epoch, holder="gw-1", grants=[grant]), timeout=5
    )
    assert again.adopted == 0, "a grant is adopted once"
    b = (await table(stub))["inst-b"]
    assert (b.in_flight, b.borrowing) == (2, 1)
    # The adopted grant counts as the borrower every degraded grant is: it uses none of
    # inst-b's 2 reserved slots, so the next request is within share, the one after not.
    assert not (await stub.Acquire(acquire("inst-b"), timeout=5)).borrowing
    assert (await stub.Acquire(acquire("inst-b"), timeout=5)).borrowing
    for _ in range(2):
        await stub.Release(pb.ReleaseRequest(grant_id=degraded, consumed=2.5), timeout=5)
    b = (await table(stub))["inst-b"]
    assert (b.in_flight, b.borrowing) == (3, 1)
    assert b.usage == pytest.approx(2.5)


async def persisted_usage(config: Config) -> dict[str, float]:
    """The usage in the pool snapshot on disk: what a restart after a crash restores."""
    store = FileStore(config.state_dir, read_only=True)
    try:
        loaded = await load(store, Keys(config.etcd.prefix), "gpu-a", decay_rate=0.0, timeout_s=5.0)
    finally:
        await store.close()
    return dict(loaded.snapshot.usage) if loaded.snapshot is not None else {}


async def test_an_acknowledged_release_is_on_disk(tmp_path: pathlib.Path) -> None:
    # A gateway stops retrying a release once it is acknowledged, so a crash right after
    # the answer must not lose the consumption it charged. A long group-commit window
    # makes a release that is only written "soon" visible as missing from the disk.
    config = make_config(tmp_path, "timing: {commit_window_s: 0.3}")
    server = await start_server(config, serve_metrics=False)
    try:
        async with aio.insecure_channel(server.address) as ch:
            stub = pb_grpc.AllocatorStub(ch)
            for i in range(1, 4):
                # A team with no share borrows: its grant needs no durable write.
                r = await stub.Acquire(acquire("guest"), timeout=5)
                assert r.borrowing
                await stub.Release(pb.ReleaseRequest(grant_id=r.grant_id, consumed=1.0))
                usage = await persisted_usage(config)
                assert usage.get("guest", 0.0) == pytest.approx(float(i), rel=1e-4), i
    finally:
        await server.shutdown(0)


async def test_an_acquire_the_client_gave_up_on_does_not_keep_a_slot(
    tmp_path: pathlib.Path,
) -> None:
    # A within-share answer waits for its durable write (here at least 0.3 s), longer than
    # this client waits: it falls back to a degraded grant while the owner counts one.
    config = make_config(tmp_path, "timing: {commit_window_s: 0.3}")
    server = await start_server(config, serve_metrics=False)
    client = AllocatorClient([server.address], holder="gw-slow", deadline_s=0.1)
    try:
        grant = await client.acquire("gpu-a", "inst-a")
        assert grant.degraded
        async with aio.insecure_channel(server.address) as ch:
            stub = pb_grpc.AllocatorStub(ch)
            seen: list[pb.TeamStat] = []

            async def counted() -> int:
                seen.append((await table(stub))["inst-a"])
                return seen[-1].in_flight

            # The grant the owner decided is released at no cost; the degraded grant the
            # client holds is reported and counted instead, as a borrower: one in flight.
            loop = asyncio.get_running_loop()
            deadline = loop.time() + 5
            while await counted() != 1 or seen[-1].borrowing != 1:
                assert loop.time() < deadline, f"the owner still counts it: {seen[-1]}"
                await asyncio.sleep(0.05)
            await grant.release()
            while await counted() != 0:
                assert loop.time() < deadline, f"the owner still counts one: {seen[-1]}"
                await asyncio.sleep(0.05)
            assert seen[-1].usage == 0.0
    finally:
        await client.close(flush_timeout_s=0.5)
        await server.shutdown(0)


# -- restart ------------------------------------------------------------------------------


async def test_restart_restores_usage_and_counts_live_grants_as_phantoms(
    node_config: Config,
) -> None:
    first = await start_server(node_config, serve_metrics=False)
    try:
        async with aio.insecure_channel(first.address) as ch:
            stub = pb_grpc.AllocatorStub(ch)
            a = [await stub.Acquire(acquire("inst-a"), timeout=5) for _ in range(6)]
            b = [await stub.Acquire(acquire("inst-b", holder="gw-2"), timeout=5) for _ in range(3)]
            for r in a[:2]:
                await stub.Release(pb.ReleaseRequest(grant_id=r.grant_id, consumed=3.0))
            await stub.Release(pb.ReleaseRequest(grant_id=b[0].grant_id, consumed=0.5))
            await pb_grpc.AdminStub(ch).SetCapacity(
                pb.SetCapacityRequest(pool="gpu-a", capacity=12), metadata=GOOD, timeout=5
            )
            old_epoch = a[0].epoch
    finally:
        await first.shutdown(0)

    second = await start_server(node_config, serve_metrics=False)
    try:
        async with aio.insecure_channel(second.address) as ch:
            stub = pb_grpc.AllocatorStub(ch)
            snap = await stub.Snapshot(pb.SnapshotRequest(pool="gpu-a"), timeout=5)
            assert snap.epoch > old_epoch and snap.capacity == 12
            teams = {t.team: t for t in snap.teams}
            assert teams["inst-a"].usage == pytest.approx(6.0, rel=1e-4)
            assert teams["inst-b"].usage == pytest.approx(0.5, rel=1e-4)
            # What was in flight at shutdown counts as phantoms, not as grants.
            assert [(t.in_flight, t.phantoms) for t in (teams["inst-a"], teams["inst-b"])] == [
                (0, 4),
                (0, 2),
            ]
            # inst-b's 2 phantoms kept their standing: one within share, one borrowing.
            # Against its 2 reserved slots (of C=12) the next request is within share.
            assert not (await stub.Acquire(acquire("inst-b", holder="gw-3"), timeout=5)).borrowing

            # gw-2 re-reports one of its two live grants; the complete inventory closes
            # the other phantom (that request ended while the server was down).
            r = await stub.Adopt(
                pb.AdoptRequest(
                    pool="gpu-a",
                    epoch=snap.epoch,
                    holder="gw-2",
                    complete=True,
                    grants=[held(b[1], "inst-b")],
                ),
                timeout=5,
            )
            assert (r.adopted, r.phantoms_dropped) == (1, 2)
            # gw-1 re-reports all four of its live grants.
            r = await stub.Adopt(
                pb.AdoptRequest(
                    pool="gpu-a",
                    epoch=snap.epoch,
                    holder="gw-1",
                    complete=True,
                    grants=[held(x, "inst-a") for x in a[2:]],
                ),
                timeout=5,
            )
            assert (r.adopted, r.phantoms_dropped) == (4, 4)
            teams = await table(stub)
            assert [(t.in_flight, t.borrowing, t.phantoms) for t in teams.values()] == [
                (4, 0, 0),
                (2, 0, 0),
            ]
            # Old grants release on the new owner once, charged once.
            for _ in range(2):
                await stub.Release(pb.ReleaseRequest(grant_id=a[2].grant_id, consumed=1.0))
                # b[2] was never re-reported: its release is charged to its team.
                await stub.Release(pb.ReleaseRequest(grant_id=b[2].grant_id, consumed=1.0))
            teams = await table(stub)
            assert teams["inst-a"].in_flight == 3
            assert teams["inst-a"].usage == pytest.approx(7.0, rel=1e-4)
            assert teams["inst-b"].usage == pytest.approx(1.5, rel=1e-4)
    finally:
        await second.shutdown(0)


async def test_the_client_library_closes_phantoms_after_a_restart(node_config: Config) -> None:
    config = on_port(node_config, free_port())
    server = await start_server(config, serve_metrics=False)
    client = AllocatorClient([config.listen], holder="gw-lib", deadline_s=1.0)
    try:
        live = [await client.acquire("gpu-a", "inst-a") for _ in range(3)]
        gone = await client.acquire("gpu-a", "inst-a")
        await server.shutdown(0)
        await gone.release(2.0)  # buffered: no server answers now
        server = await start_server(config, serve_metrics=False)
        async with aio.insecure_channel(config.listen) as ch:
            stub = pb_grpc.AllocatorStub(ch)
            assert (await table(stub))["inst-a"].phantoms == 4
            # The first answer at the new epoch makes the client re-report what it holds.
            fresh = await client.acquire("gpu-a", "inst-a")
            assert fresh.epoch > live[0].epoch
            seen: list[pb.TeamStat] = []

            async def settled() -> bool:
                seen.append((await table(stub))["inst-a"])
                return seen[-1].phantoms == 0 and seen[-1].in_flight == 4

            loop = asyncio.get_running_loop()
            deadline = loop.time() + 5
            while not await settled():
                assert loop.time() < deadline, f"phantoms not closed: {seen[-1]}"
                await asyncio.sleep(0.05)
            await eventually(lambda: client.pending_releases == 0, "buffered release sent")
            assert (await table(stub))["inst-a"].usage == pytest.approx(2.0, rel=1e-4)
            for grant in [*live, fresh]:
                await grant.release(1.0)
            teams = await table(stub)
            assert teams["inst-a"].in_flight == 0
            assert teams["inst-a"].usage == pytest.approx(6.0, rel=1e-4)
    finally:
        await client.close(flush_timeout_s=1.0)
        await server.shutdown(0)


async def test_a_client_that_only_holds_grants_still_re_reports_after_a_restart(
    node_config: Config,
) -> None:
    config = on_port(node_config, free_port())
    server = await start_server(config, serve_metrics=False)
    client = AllocatorClient([config.listen], holder="gw-quiet", epoch_check_s=0.1)
    try:
        held = [await client.acquire("gpu-a", "inst-b") for _ in range(2)]
        await server.shutdown(0)
        server = await start_server(config, serve_metrics=False)
        async with aio.insecure_channel(config.listen) as ch:
            stub = pb_grpc.AllocatorStub(ch)
            # No acquire: the client notices the new epoch through ListPools on its own.
            loop = asyncio.get_running_loop()
            deadline = loop.time() + 5
            while (stat := (await table(stub))["inst-b"]).phantoms:
                assert loop.time() < deadline, f"phantoms not closed: {stat}"
                await asyncio.sleep(0.05)
            assert stat.in_flight == 2
        for grant in held:
            await grant.release(0.5)
    finally:
        await client.close(flush_timeout_s=1.0)
        await server.shutdown(0)
