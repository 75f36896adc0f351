"""The gateway client library against a real server: retries, degraded mode, releases, adopt."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from typing import Any

import grpc
import pytest
from grpc import aio
from grpc_health.v1 import health_pb2, health_pb2_grpc

from fairshare import Class
from fairshare.client import AllocatorClient, SyncAllocatorClient
from fairshare.wire.channels import open_channel
from fairshare.wire.pb.fairshare.v1 import allocator_pb2 as pb
from ha.api import Decision, NoOwner, UnknownPool
from harness.net import free_port
from server.app import RunningServer, start_server
from server.config import Config

from .fakes import FakeAllocator

pytestmark = pytest.mark.timeout(20)


async def start_on(config: Config, port: int, fake: FakeAllocator) -> RunningServer:
    moved = Config(
        **{**{f: getattr(config, f) for f in config.__slots__}, "listen": f"127.0.0.1:{port}"}
    )
    return await start_server(moved, node=fake, serve_metrics=False)


async def eventually(check: object, *, timeout_s: float = 5.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not check():  # type: ignore[operator]
        assert asyncio.get_running_loop().time() < deadline, "condition not reached in time"
        await asyncio.sleep(0.02)


async def test_acquire_release(running: RunningServer, fake: FakeAllocator) -> None:
    async with AllocatorClient([running.address], holder="gw-1") as client:
        grant = await client.acquire("gpu-a", "inst-b", Class.BATCH, 10)
        assert (grant.priority, grant.borrowing, grant.degraded, grant.epoch) == (
            1,
            False,
            False,
            1,
        )
        assert client.live_grants == [grant]
        await grant.release(3.0)
        await grant.release(3.0)
        assert client.live_grants == [] and client.pending_releases == 0
        assert fake.pools["gpu-a"].usage()[0]["inst-b"] == pytest.approx(3.0)
        with pytest.raises(UnknownPool):
            await client.acquire("nope", "inst-b")
        for _ in range(10):
            assert await client.try_acquire("gpu-a", "inst-a") is not None
        assert await client.try_acquire("gpu-a", "inst-a") is None


async def test_retries_on_the_next_target(running: RunningServer) -> None:
    dead = f"127.0.0.1:{free_port()}"
    async with AllocatorClient([dead, running.address], holder="gw", deadline_s=2.0) as client:
        grant = await client.acquire("gpu-a", "inst-a")
        assert not grant.degraded and grant.owner == "test-0"
        await grant.release()


async def test_degraded_modes_when_no_replica_answers(config: Config, fake: FakeAllocator) -> None:
    port = free_port()
    server = await start_on(config, port, fake)
    async with AllocatorClient([f"127.0.0.1:{port}"], holder="gw", deadline_s=0.2) as client:
        await client.refresh_pools()
        await server.shutdown(0)
        started = asyncio.get_running_loop().time()
        grant = await client.acquire("gpu-a", "inst-a", Class.BATCH)
        assert asyncio.get_running_loop().time() - started < 1.0
        assert (grant.degraded, grant.priority, grant.borrowing) == (True, 101, True)
        with pytest.raises(NoOwner):
            await client.acquire("gpu-b", "research")
        await grant.release(1.0)
        assert client.pending_releases == 1
        await client.close(flush_timeout_s=0.3)


async def test_releases_are_buffered_until_acknowledged(config: Config) -> None:
    port = free_port()
    first = FakeAllocator(config.pools, node_id="test-0")
    server = await start_on(config, port, first)
    # A deadline well above a loaded machine's first call (a connection, a ListPools):
    # at 0.2 s the first acquire could miss it and come back degraded, which this test
    # is not about.
    client = AllocatorClient(
        [f"127.0.0.1:{port}"], holder="gw", deadline_s=2.0, release_retry_s=0.05
    )
    try:
        grant = await client.acquire("gpu-a", "inst-a")
        assert not grant.degraded
        await server.shutdown(0)
        await grant.release(2.0)
        assert client.pending_releases == 1
        # The same replica comes back (same grants: a restart that kept its state).
        server = await start_on(config, port, first)
        await eventually(lambda: client.pending_releases == 0)
        assert grant.grant_id in first.released
    finally:
        await client.close()
        await server.shutdown(0)


class HeldAnswers(FakeAllocator):
    """Decides each acquire at once but answers only when ``answer`` is set."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.answer = asyncio.Event()
        self.decided = asyncio.Event()

    async def acquire(self, **kwargs: Any) -> Decision:
        decision = await super().acquire(**kwargs)
        self.decided.set()
        await self.answer.wait()
        return decision


async def test_a_cancelled_acquire_does_not_leave_its_grant_counted(config: Config) -> None:
    """A caller cancelled (a client gone) after the owner decided but before its answer:
    the acquire is resent with the same request id and the grant released at no cost."""
    port = free_port()
    allocator = HeldAnswers(config.pools, node_id="test-0")
    server = await start_on(config, port, allocator)
    client = AllocatorClient(
        [f"127.0.0.1:{port}"], holder="gw", deadline_s=5.0, release_retry_s=0.05
    )
    try:
        await client.refresh_pools()
        acquiring = asyncio.ensure_future(client.acquire("gpu-a", "inst-a"))
        async with asyncio.timeout(5.0):
            await allocator.decided.wait()
        acquiring.cancel()
        await asyncio.wait({acquiring})
        assert acquiring.cancelled() and len(allocator.grants) == 1
        assert client.abandoned_acquires == 1
        allocator.answer.set()
        await eventually(lambda: client.abandoned_acquires == client.pending_releases == 0)
        assert not allocator.grants and len(allocator.released) == 1
    finally:
        await client.close()
        await server.shutdown(0)


async def test_new_epoch_triggers_adopt_of_live_grants(config: Config) -> None:
    port = free_port()
    old = FakeAllocator(config.pools, node_id="test-0", epoch=1)
    server = await start_on(config, port, old)
    client = AllocatorClient([f"127.0.0.1:{port}"], holder="gw", deadline_s=0.5)
    try:
        held = await client.acquire("gpu-a", "inst-a")
        await server.shutdown(0)
        new = FakeAllocator(config.pools, node_id="test-1", epoch=2)
        server = await start_on(config, port, new)
        fresh = await client.acquire("gpu-a", "inst-a")
        assert fresh.epoch == 2
        await eventually(lambda: held.grant_id in new.grants)
        assert new.pools["gpu-a"].snapshot()[0].in_flight == 2
    finally:
        await client.close()
        await server.shutdown(0)


async def test_owner_answer_listener_hears_of_an_owner_after_an_outage(
    config: Config, fake: FakeAllocator
) -> None:
    port = free_port()
    server = await start_on(config, port, fake)
    heard: list[tuple[str, int]] = []
    client = AllocatorClient([f"127.0.0.1:{port}"], holder="gw", deadline_s=0.2, epoch_check_s=0.05)
    client.on_owner_answer(lambda pool, epoch: heard.append((pool, epoch)))

    def broken(pool: str, epoch: int) -> None:
        raise RuntimeError("a listener's failure is not the client's")

    client.on_owner_answer(broken)
    try:
        await client.acquire("gpu-a", "inst-a")
        assert ("gpu-a", 1) in heard
        await server.shutdown(0)
        # A ListPools of the background checks answered just before the shutdown may be
        # heard a moment after it: a first degraded acquire lets the loop run past it.
        assert (await client.acquire("gpu-a", "inst-a")).degraded
        heard.clear()
        degraded = await client.acquire("gpu-a", "inst-a")
        assert degraded.degraded and heard == []  # a degraded answer names no owner
        server = await start_on(config, port, fake)
        # No new acquire: the background ListPools, run while grants are live, tells it.
        await eventually(lambda: ("gpu-a", 1) in heard)
    finally:
        await client.close(flush_timeout_s=0.5)
        await server.shutdown(0)


async def serving(address: str, *, timeout_s: float = 5.0) -> None:
    """Returns once the server at ``address`` answers health SERVING (on a fresh channel)."""
    async with open_channel(address) as channel:
        health = health_pb2_grpc.HealthStub(channel)
        r = await health.Check(
            health_pb2.HealthCheckRequest(service=""), timeout=timeout_s, wait_for_ready=True
        )
        assert r.status == health_pb2.HealthCheckResponse.SERVING


@pytest.mark.timeout(60)
async def test_a_server_restarted_on_its_port_is_reached_again_once_it_serves(
    config: Config,
) -> None:
    # 20 restarts on the same port. While the port is closed the gateway calls (and gives
    # up after 0.1 s), so its channel fails to connect and backs off. Once health answers,
    # its next acquire must reach the server, not apply fail_open: gRPC's default backoff
    # would keep the channel failing for 1 s and more, longer than the acquire deadline.
    port = free_port()
    address = f"127.0.0.1:{port}"
    allocator = FakeAllocator(config.pools, node_id="test-0")
    server = await start_on(config, port, allocator)
    client = AllocatorClient([address], holder="gw", deadline_s=0.5)
    rng = random.Random(11)
    degraded = []
    try:
        for restart in range(20):
            grant = await client.acquire("gpu-a", "inst-a")
            await grant.release()
            await server.shutdown(0)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(0.1):
                    await client.refresh_pools()
            await asyncio.sleep(rng.uniform(0.0, 0.05))
            server = await start_on(config, port, allocator)
            await serving(address)
            grant = await client.acquire("gpu-a", "inst-a")
            if grant.degraded:
                degraded.append(restart)
            await grant.release()
        assert degraded == [], f"degraded after restarts {degraded}"
    finally:
        await client.close()
        await server.shutdown(0)


async def test_sync_client(running: RunningServer, fake: FakeAllocator) -> None:
    # The server runs on this test's loop: drive the blocking client from a thread.
    def work() -> int:
        with SyncAllocatorClient([running.address], holder="sync-gw", deadline_s=2.0) as client:
            grant = client.acquire("gpu-a", "inst-b")
            priority = int(grant.priority)  # type: ignore[call-overload]
            grant.release(1.5)
            return priority

    assert await asyncio.to_thread(work) == 0
    assert fake.pools["gpu-a"].usage()[0]["inst-b"] == pytest.approx(1.5)


async def test_each_client_has_its_session_sends_it_and_keeps_it_alive(
    running: RunningServer, fake: FakeAllocator, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="fairshare.client")
    fake.session_ttl_s = 0.3  # a keepalive every 0.1 s once the client learnt it
    one = AllocatorClient([running.address], holder="gw", calls_in_flight=1)
    other = AllocatorClient([running.address], holder="gw")
    try:
        assert one.session_id != other.session_id
        # Plain and batched Acquires carry the client's session, each client its own.
        grants = await asyncio.gather(*(one.acquire("gpu-a", "inst-a") for _ in range(6)))
        theirs = await other.acquire("gpu-b", "research")
        assert {s.id for s in fake.presented if s is not None} == {
            one.session_id,
            other.session_id,
        }
        assert None not in fake.presented
        # Kept alive while grants are live, for the pools they are in.
        await eventually(lambda: len(fake.keepalives) >= 6, timeout_s=5)
        assert {tuple(p) for p in fake.keepalives} == {("gpu-a",), ("gpu-b",)}
        # A session its owner no longer knows is said once, by its id.
        fake.sessions.discard(one.session_id)
        await eventually(lambda: "does not know holder session" in caplog.text)
        await asyncio.sleep(0.5)
        lapsed = [r for r in caplog.records if "does not know holder session" in r.message]
        assert len(lapsed) == 1 and one.session_id in lapsed[0].message
        # No grant live: no keepalive.
        for grant in [*grants, theirs]:
            await grant.release(1.0)
        await asyncio.sleep(0.3)
        sent = len(fake.keepalives)
        await asyncio.sleep(0.5)
        assert len(fake.keepalives) == sent
    finally:
        await one.close()
        await other.close()
    # The secrets were never logged.
    for client in (one, other):
        assert client._keeper._session.partition(".")[2] not in caplog.text


async def test_a_closed_client_opens_no_channel_for_a_late_call(running: RunningServer) -> None:
    """A retry that was waiting out its backoff while the client closed must not open a
    channel that nobody will close."""
    client = AllocatorClient([running.address], holder="gw")
    await client.close()
    with pytest.raises(aio.AioRpcError) as info:
        await client._calls.call("ListPools", pb.ListPoolsRequest(), deadline_s=0.5)
    assert info.value.code() == grpc.StatusCode.CANCELLED
    assert client._calls._channels == {}
