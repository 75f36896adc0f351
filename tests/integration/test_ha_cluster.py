"""Three replica processes on a real etcd: forwarding, fencing and failover over gRPC."""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import AsyncIterator

import grpc
import pytest
from drill_config import LEASE_TTL_S
from drill_harness import DrillCluster
from drill_replica import wait_serving
from grpc import aio

from fairshare.sessions import new_session, session_id
from fairshare.wire.metadata import session_entry
from fairshare.wire.pb.fairshare.v1 import allocator_pb2 as pb
from fairshare.wire.pb.fairshare.v1 import allocator_pb2_grpc as pb_grpc
from ha.store.etcd import connect

pytestmark = [pytest.mark.etcd, pytest.mark.timeout(60)]


@pytest.fixture
async def cluster() -> AsyncIterator[DrillCluster]:
    c = DrillCluster("integration", gateways=0)
    await c.start()
    yield c
    await c.close()


async def acquire(address: str, pool: str, team: str, *, epoch: int = 0) -> pb.AcquireResponse:
    async with aio.insecure_channel(address) as channel:
        stub = pb_grpc.AllocatorStub(channel)
        return await stub.Acquire(
            pb.AcquireRequest(pool=pool, team=team, holder="test", epoch=epoch), timeout=2.0
        )


async def release(address: str, grant_id: str, consumed: float) -> None:
    async with aio.insecure_channel(address) as channel:
        stub = pb_grpc.AllocatorStub(channel)
        await stub.Release(pb.ReleaseRequest(grant_id=grant_id, consumed=consumed), timeout=2.0)


async def decided_through(cluster: DrillCluster, pool: str, *, exclude: str) -> float:
    """Seconds until a non-degraded Acquire succeeds through a replica other than ``exclude``."""
    start = time.monotonic()
    address = next(r.address for r in cluster.replicas if r.node != exclude)
    for _ in range(2000):
        with_owner = await acquire(address, pool, "inst-b")
        if not with_owner.degraded and with_owner.owner != exclude:
            await release(address, with_owner.grant_id, 0.0)
            return time.monotonic() - start
        await asyncio.sleep(0.005)
    raise AssertionError(f"no decision for {pool} without {exclude}")


async def test_every_replica_answers_with_the_owner_and_epoch_and_releases_route_by_id(
    cluster: DrillCluster,
) -> None:
    owners = await cluster.owners()
    node, epoch = owners["gpu-a"]
    answers = [await acquire(r.address, "gpu-a", "inst-a") for r in cluster.replicas]
    assert {(a.owner, a.epoch) for a in answers} == {(node, epoch)}
    assert [a.priority for a in answers] == [0, 0, 0]
    # Each grant released through a different replica than the one that gave it.
    for i, answer in enumerate(answers):
        await release(cluster.replicas[(i + 1) % 3].address, answer.grant_id, 1.0)
    view = await cluster.snapshot("gpu-a")
    assert view is not None
    stat = next(t for t in view.teams if t.team == "inst-a")
    assert stat.in_flight == 0 and stat.usage == pytest.approx(3.0, rel=1e-3)


async def test_a_wrong_epoch_is_refused_with_the_current_owner(cluster: DrillCluster) -> None:
    node, epoch = (await cluster.owners())["gpu-a"]
    owner = cluster.replica(node)
    with pytest.raises(aio.AioRpcError) as err:
        await acquire(owner.address, "gpu-a", "inst-a", epoch=epoch + 1000)
    assert err.value.code() is grpc.StatusCode.FAILED_PRECONDITION
    trailers = dict(err.value.trailing_metadata() or ())
    assert trailers.get("fairshare-epoch") in (None, "0", str(epoch))


async def test_a_killed_owner_is_replaced_within_T_plus_1s_with_its_usage(
    cluster: DrillCluster,
) -> None:
    node, _ = (await cluster.owners())["gpu-a"]
    owner = cluster.replica(node)
    grant = await acquire(owner.address, "gpu-a", "inst-a")
    await release(owner.address, grant.grant_id, 7.0)  # durable before it is acknowledged
    owner.signal(signal.SIGKILL)
    took = await decided_through(cluster, "gpu-a", exclude=node)
    assert took <= LEASE_TTL_S + 1.0, f"no decision {took:.2f}s after SIGKILL (T = {LEASE_TTL_S}s)"
    view = await cluster.snapshot("gpu-a")
    assert view is not None and view.owner != node
    usage = next(t.usage for t in view.teams if t.team == "inst-a")
    assert usage == pytest.approx(7.0, rel=0.01)


async def test_a_gracefully_stopped_owner_has_a_successor_deciding_within_250ms(
    cluster: DrillCluster,
) -> None:
    node, _ = (await cluster.owners())["gpu-b"]
    owner = cluster.replica(node)
    owner.signal(signal.SIGTERM)
    took = await decided_through(cluster, "gpu-b", exclude=node)
    assert owner.wait(10.0) == 0
    assert took <= 0.25, f"successor decided {took * 1000:.0f} ms after SIGTERM\n{cluster.logs()}"


async def test_a_stale_owner_resumed_after_a_pause_refuses_to_decide_and_cannot_write(
    cluster: DrillCluster,
) -> None:
    node, old_epoch = (await cluster.owners())["gpu-a"]
    owner = cluster.replica(node)
    owner.signal(signal.SIGSTOP)
    try:
        await decided_through(cluster, "gpu-a", exclude=node)
    finally:
        owner.signal(signal.SIGCONT)
    # The resumed replica may answer ListPools first, while its watch has seen its own
    # owner key go but not yet the successor's come (no owner, epoch 0): read the owners
    # once every live replica names the same ones.
    await cluster.wait_agreed()
    new_node, new_epoch = (await cluster.owners())["gpu-a"]
    assert new_epoch > old_epoch and new_node != node
    # Asked as a forwarding peer would ask it, for its old epoch, it refuses.
    with pytest.raises(aio.AioRpcError) as err:
        await acquire(owner.address, "gpu-a", "inst-a", epoch=old_epoch)
    assert err.value.code() is grpc.StatusCode.FAILED_PRECONDITION
    # Asked as a gateway would ask it, it forwards to the new owner.
    answer = await acquire(owner.address, "gpu-a", "inst-a")
    assert (answer.owner, answer.epoch) == (new_node, new_epoch)
    # A write fenced on its old epoch fails: the state belongs to the successor.
    store = await connect(cluster.etcd.endpoints, rpc_timeout_s=1.0)
    try:
        written = await store.put_fenced(
            f"{cluster.prefix}/state/gpu-a",
            b"stale",
            fence_key=f"{cluster.prefix}/owners/gpu-a",
            fence_revision=old_epoch,
        )
    finally:
        await store.close()
    assert written is False


async def test_etcd_restarted_under_load_recovers_without_restarting_a_replica(
    cluster: DrillCluster,
) -> None:
    pids = [r.proc.pid for r in cluster.replicas if r.proc is not None]
    cluster.etcd.restart()
    await cluster.wait_owned(timeout_s=20.0)
    for replica in cluster.replicas:
        await wait_serving(replica.address)
        answer = await acquire(replica.address, "gpu-b", "research")
        for _ in range(100):
            if not answer.degraded:
                break
            await asyncio.sleep(0.05)
            answer = await acquire(replica.address, "gpu-b", "research")
        assert not answer.degraded and answer.epoch > 0
    assert [r.proc.pid for r in cluster.replicas if r.proc is not None] == pids
    assert all(r.alive for r in cluster.replicas)


async def test_the_client_library_goes_straight_to_the_owner_once_it_knows_it(
    cluster: DrillCluster,
) -> None:
    from fairshare.client import AllocatorClient

    node, epoch = (await cluster.owners())["gpu-a"]
    other = next(r for r in cluster.replicas if r.node != node)
    client = AllocatorClient([other.address], holder="direct-gw", deadline_s=1.0)
    try:
        first = await client.acquire("gpu-a", "inst-a")  # forwarded by the only target
        assert (first.owner, first.epoch) == (node, epoch)
        for _ in range(100):  # the owner's address is learnt in the background
            if client._calls._owners.get("gpu-a") == cluster.replica(node).address:
                break
            await asyncio.sleep(0.02)
        # The only configured replica dies: calls still reach the owner, undegraded.
        other.signal(signal.SIGKILL)
        other.wait(5.0)
        second = await client.acquire("gpu-a", "inst-a")
        assert not second.degraded and second.owner == node
        await first.release(1.0)
        await second.release(1.0)
        assert client.pending_releases == 0
    finally:
        await client.close(flush_timeout_s=1.0)


async def test_a_session_reaches_the_owner_through_a_forwarder_and_survives_its_failover(
    cluster: DrillCluster,
) -> None:
    node, epoch = (await cluster.owners())["gpu-a"]
    survivors = [r for r in cluster.replicas if r.node != node]
    text = new_session()
    forged = f"{session_id(text)}.{new_session().partition('.')[2]}"
    own, other = ((session_entry(text),), (session_entry(forged),))
    keepalive = pb.KeepAliveRequest(pools=["gpu-a"])
    async with aio.insecure_channel(survivors[0].address) as channel:
        stub = pb_grpc.AllocatorStub(channel)
        # Through a replica that does not own the pool: the owner opens the caller's
        # session; the same id with another secret is refused (at the door: an id is
        # derived from its secret).
        granted = await stub.Acquire(
            pb.AcquireRequest(pool="gpu-a", team="inst-a", holder="gw"), timeout=2, metadata=own
        )
        assert (granted.owner, granted.epoch) == (node, epoch)
        renewed = await stub.KeepAlive(keepalive, timeout=2, metadata=own)
        assert list(renewed.renewed) == ["gpu-a"] and renewed.ttl_s > 0
        with pytest.raises(aio.AioRpcError) as refused:
            await stub.KeepAlive(keepalive, timeout=2, metadata=other)
        assert refused.value.code() is grpc.StatusCode.INVALID_ARGUMENT

    cluster.replica(node).signal(signal.SIGKILL)
    await decided_through(cluster, "gpu-a", exclude=node)
    new_node, new_epoch = (await cluster.owners())["gpu-a"]
    assert new_epoch > epoch and new_node != node
    async with aio.insecure_channel(survivors[1].address) as channel:
        stub = pb_grpc.AllocatorStub(channel)
        # The successor restored the session with its grant: it renews it, and still
        # refuses the forged secret.
        renewed = await stub.KeepAlive(keepalive, timeout=2, metadata=own)
        assert list(renewed.renewed) == ["gpu-a"], renewed
        with pytest.raises(aio.AioRpcError) as refused:
            await stub.KeepAlive(keepalive, timeout=2, metadata=other)
        assert refused.value.code() is grpc.StatusCode.INVALID_ARGUMENT
        # Its grant is a phantom of the session, closed by the session's own re-report.
        report = pb.AdoptRequest(
            pool="gpu-a",
            epoch=new_epoch,
            holder="gw",
            complete=True,
            grants=[pb.HeldGrant(grant_id=granted.grant_id, team="inst-a")],
        )
        adopted = await stub.Adopt(report, timeout=2, metadata=own)
        assert adopted.epoch == new_epoch
        # Counted once, with no phantom left: by this re-report, or already by the
        # forwarding replica's own re-report of the grant it obtained for its caller (its
        # stub), whichever reached the new owner first (then this one adopts 0).
        snap = await stub.Snapshot(pb.SnapshotRequest(pool="gpu-a"), timeout=2)
        team = next(t for t in snap.teams if t.team == "inst-a")
        assert (team.in_flight, team.phantoms) == (1, 0), (adopted.adopted, team)
        await stub.Release(pb.ReleaseRequest(grant_id=granted.grant_id, consumed=1.0), timeout=2)
