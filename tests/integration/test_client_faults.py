"""The client library through faults: a partition from an owner that stays in place, a
restarted gateway, a grant that arrives late, and a backlog of releases and resends.

Findings 4 and 5 run against the real replication layer in embedded mode (one node owns
every pool, as ``test_embedded_node``) behind a TCP proxy the test cuts; the others
against the one-node fake allocator, whose answers a test can shape.
"""

from __future__ import annotations

import asyncio
import logging
import pathlib
import re
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest
from grpc import aio

from fairshare import Class
from fairshare.client import AllocatorClient
from fairshare.client import adoption as client_module
from fairshare.wire.channels import open_channel
from fairshare.wire.convert import acquire_request
from fairshare.wire.pb.fairshare.v1 import allocator_pb2 as pb
from fairshare.wire.pb.fairshare.v1 import allocator_pb2_grpc as pb_grpc
from ha.api import AdoptResult, Decision, Epoch, GrantRef, NodeId, NoOwner, PoolName
from harness.proxy import TcpProxy
from server.app import RunningServer, start_server
from server.config import Config

from .conftest import make_config
from .fakes import FakeAllocator
from .test_client import eventually, free_port, start_on

pytestmark = pytest.mark.timeout(30)


async def until(check: Callable[[], Awaitable[bool]], *, timeout_s: float = 5.0) -> None:
    """Polls an async ``check`` until it is true (fails after ``timeout_s``)."""
    deadline = time.monotonic() + timeout_s
    while not await check():
        assert time.monotonic() < deadline, "condition not reached in time"
        await asyncio.sleep(0.02)


@pytest.fixture
async def embedded(tmp_path: pathlib.Path) -> AsyncIterator[RunningServer]:
    running = await start_server(make_config(tmp_path), serve_metrics=False)
    try:
        yield running
    finally:
        await running.shutdown(0)


@pytest.fixture
async def proxy(embedded: RunningServer) -> AsyncIterator[tuple[TcpProxy, str]]:
    through = TcpProxy(embedded.address)
    try:
        yield through, through.address
    finally:
        through.close()


async def team(address: str, name: str, pool: str = "gpu-a") -> pb.TeamStat:
    """The owner's view of one team (read straight from the server, not through a proxy)."""
    async with open_channel(address) as channel:
        snap = await pb_grpc.AllocatorStub(channel).Snapshot(
            pb.SnapshotRequest(pool=pool), timeout=5, wait_for_ready=True
        )
    stat: pb.TeamStat = next(t for t in snap.teams if t.team == name)
    return stat


async def _reconnected(client: AllocatorClient, timeout_s: float = 10.0) -> None:
    """Waits until ``client`` reads ListPools again (a call that decides nothing)."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            await client.refresh_pools()
            return
        except aio.AioRpcError:
            assert time.monotonic() < deadline, "the client did not reach the server again"
            await asyncio.sleep(0.05)


def client_of(address: str, **options: object) -> AllocatorClient:
    """A client of one address only: not routed to the owner's own address (which would
    go around the proxy)."""
    return AllocatorClient(
        [address],
        holder="gw",
        deadline_s=0.3,
        epoch_check_s=0.05,
        release_retry_s=0.05,
        route_to_owner=False,
        **options,  # type: ignore[arg-type]
    )


# -- finding 4: degraded grants are reported to an owner that stayed in place -----------------


async def test_degraded_grants_are_counted_by_the_owner_that_stayed_in_place(
    embedded: RunningServer, proxy: tuple[TcpProxy, str]
) -> None:
    cut, address = proxy
    client = client_of(address)
    try:
        held = await client.acquire("gpu-a", "inst-a")
        cut.cut()
        during = [await client.acquire("gpu-a", "inst-a") for _ in range(2)]
        assert all(g.degraded for g in during)
        cut.heal()
        # The acquires given up on are resent and their grants released first.
        await eventually(lambda: client.abandoned_acquires == client.pending_releases == 0)
        # No new epoch: the owner is the same. It must count all three live grants.
        await until(lambda: _in_flight(embedded.address, 3))
        assert (await team(embedded.address, "inst-a")).phantoms == 0
        view = await client.refresh_pools()
        assert {p.epoch for p in view if p.pool == "gpu-a"} == {held.epoch}
        for grant in (held, *during):
            await grant.release(1.0)
        await eventually(lambda: client.pending_releases == 0)
        stat = await team(embedded.address, "inst-a")
        assert stat.in_flight == 0 and stat.usage == pytest.approx(3.0, rel=1e-3)
    finally:
        await client.close()


async def _in_flight(address: str, count: int) -> bool:
    return (await team(address, "inst-a")).in_flight == count


# -- finding 5: degraded ids unique across a gateway's restarts ---------------------------------


async def test_a_restarted_gateway_makes_new_degraded_ids_that_the_owner_counts_and_charges(
    embedded: RunningServer, proxy: tuple[TcpProxy, str]
) -> None:
    cut, address = proxy

    async def gateway_run(consumed: float) -> set[str]:
        """One run of the gateway (holder "gw"): three degraded grants, counted once the
        owner answers again, then released."""
        client = client_of(address)
        try:
            await client.refresh_pools()
            cut.cut()
            grants = [await client.acquire("gpu-a", "inst-a") for _ in range(3)]
            assert all(g.degraded for g in grants)
            cut.heal()
            await eventually(lambda: client.abandoned_acquires == client.pending_releases == 0)
            await until(lambda: _in_flight(embedded.address, 3))
            for grant in grants:
                await grant.release(consumed)
            await eventually(lambda: client.pending_releases == 0)
            return {g.grant_id for g in grants}
        finally:
            await client.close()

    first = await gateway_run(1.0)
    stat = await team(embedded.address, "inst-a")
    assert stat.in_flight == 0 and stat.usage == pytest.approx(3.0, rel=1e-3)
    # The gateway restarts: a new client instance, same holder.
    second = await gateway_run(2.0)
    assert not first & second, "a restarted gateway reused a degraded grant id"
    stat = await team(embedded.address, "inst-a")
    assert stat.in_flight == 0 and stat.usage == pytest.approx(9.0, rel=1e-3)


# -- a phantom of a grant the gateway never received ----------------------------------------


async def test_a_gateway_with_no_signed_grant_closes_the_phantom_of_one_it_never_got(
    tmp_path: pathlib.Path, caplog: pytest.LogCaptureFixture
) -> None:
    # The restart drill's case: the owner wrote a grant for "gw" and went down before
    # answering, and by the time the next owner answers "gw" holds only a degraded
    # grant. Its complete re-report must still close the phantom of the grant it never
    # got, with the proof of holdership it has: a grant the new owner signed for it.
    # The lost grant was decided in the client's own session (its call carried it).
    caplog.set_level(logging.INFO, logger="ha.cluster.ownership")
    address = f"127.0.0.1:{free_port()}"
    config = make_config(tmp_path, environ={"FAIRSHARE_LISTEN": address})
    server = await start_server(config, serve_metrics=False)
    client = client_of(address)
    try:
        seen = await client.acquire("gpu-a", "inst-a")  # the client knows the first epoch
        await seen.release(1.0)
        assert client.pending_releases == 0
        async with open_channel(address) as channel:
            lost = await pb_grpc.AllocatorStub(channel).Acquire(
                acquire_request(
                    pool="gpu-a",
                    team="inst-a",
                    cls=Class.INTERACTIVE,
                    est_tokens=1,
                    holder="gw",
                    request_id="answer-lost",
                    try_only=False,
                ),
                timeout=5,
                metadata=client._calls._metadata,
            )
        assert lost.granted and not lost.borrowing
        await server.shutdown(0)  # its final snapshot lists the lost grant in flight
        degraded = await client.acquire("gpu-a", "inst-a")
        assert degraded.degraded
        server = await start_server(config, serve_metrics=False)
        # The client reaches the restarted server first, with calls that decide nothing:
        # on a loaded machine its reconnection took longer than its 0.3 s deadline, and
        # the next acquire came back degraded (one more degraded grant, not the fresh one).
        await _reconnected(client)
        fresh = await client.acquire("gpu-a", "inst-a")
        assert fresh.epoch > seen.epoch and not fresh.degraded
        restored = (
            rf"acquired pool gpu-a at epoch {fresh.epoch}: restored usage of \d+ teams, 1 phantoms"
        )
        assert re.search(restored, caplog.text), caplog.text
        await until(lambda: _phantoms(address, 0))
        # Both live grants count, the degraded one re-reported, the fresh one decided.
        await until(lambda: _in_flight(address, 2))
        for grant in (degraded, fresh):
            await grant.release(1.0)
        await eventually(lambda: client.pending_releases == 0)
    finally:
        await client.close()
        await server.shutdown(0)


async def _phantoms(address: str, count: int) -> bool:
    return (await team(address, "inst-a")).phantoms == count


# -- finding 6: a grant that arrives after its pool moved ---------------------------------------


class LateAllocator(FakeAllocator):
    """Answers one acquire, when asked, as the previous owner did: a grant of the epoch
    before this one, as if it had been on its way while the pool moved."""

    answer_late = False

    async def acquire(self, **kwargs: object) -> Decision:
        if not self.answer_late:
            return await super().acquire(**kwargs)  # type: ignore[arg-type]
        self.answer_late = False
        old = Epoch(self.epoch - 1)
        grant_id = GrantRef(
            PoolName(str(kwargs["pool"])), old, 1000, str(kwargs["team"]), str(kwargs["holder"])
        ).encode()
        return Decision(True, grant_id, 5, False, False, False, NodeId("test-old"), old)


async def test_a_grant_of_an_older_epoch_arriving_late_is_adopted(config: Config) -> None:
    port = free_port()
    allocator = LateAllocator(config.pools, node_id="test-0", epoch=1)
    server = await start_on(config, port, allocator)
    client = AllocatorClient(
        [f"127.0.0.1:{port}"], holder="gw", deadline_s=0.5, route_to_owner=False
    )
    try:
        held = await client.acquire("gpu-a", "inst-a")
        allocator.epoch = Epoch(2)  # the pool moves; the client learns it and re-reports
        await client.acquire("gpu-a", "inst-a")
        await eventually(lambda: held.grant_id in allocator.grants)
        allocator.answer_late = True
        late = await client.acquire("gpu-a", "inst-a")
        assert late.epoch == 1
        # Its complete re-report at epoch 2 went before it arrived: it is reported alone.
        await eventually(lambda: late.grant_id in allocator.grants)
    finally:
        await client.close()
        await server.shutdown(0)


# -- finding 9: the backlog -------------------------------------------------------------------


class PartlyOwnerless(FakeAllocator):
    """Refuses releases of the ``ownerless`` pools and acquires of the ``no_acquire``
    pools with NoOwner (retryable), holds every release ``release_s``, and records each
    acquire's arrival and request id and how many releases were in flight at most."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.ownerless: set[str] = set()
        self.refused: list[str] = []
        self.release_s = 0.0
        self.no_acquire: set[str] = set()
        self.acquired_at: list[float] = []
        self.request_ids: list[str] = []
        self.releasing = 0
        self.most_releasing = 0
        self.acquire_s = 0.0
        self.acquiring = 0
        self.most_acquiring = 0

    async def acquire(self, **kwargs: object) -> Decision:
        if kwargs["pool"] in self.no_acquire:
            self.request_ids.append(str(kwargs["request_id"]))
            raise NoOwner(str(kwargs["pool"]))
        self.acquired_at.append(time.monotonic())
        self.acquiring += 1
        self.most_acquiring = max(self.most_acquiring, self.acquiring)
        try:
            await asyncio.sleep(self.acquire_s)
            return await super().acquire(**kwargs)  # type: ignore[arg-type]
        finally:
            self.acquiring -= 1

    async def release(self, grant_id: str, consumed: float, *, forwarded: bool = False) -> None:
        if GrantRef.decode(grant_id).pool in self.ownerless:
            self.refused.append(grant_id)
            raise NoOwner(GrantRef.decode(grant_id).pool)
        self.releasing += 1
        self.most_releasing = max(self.most_releasing, self.releasing)
        try:
            await asyncio.sleep(self.release_s)
            await super().release(grant_id, consumed, forwarded=forwarded)
        finally:
            self.releasing -= 1


async def test_an_ownerless_pool_does_not_hold_back_the_releases_of_other_pools(
    config: Config,
) -> None:
    port = free_port()
    allocator = PartlyOwnerless(config.pools, node_id="test-0")
    server = await start_on(config, port, allocator)
    client = client_of(f"127.0.0.1:{port}")
    try:
        stuck = [await client.acquire("gpu-b", "research") for _ in range(2)]
        free = [await client.acquire("gpu-a", "inst-a") for _ in range(3)]
        await server.shutdown(0)
        for grant in (*stuck, *free):  # the ownerless pool's releases first in the buffer
            await grant.release(1.0)
        assert client.pending_releases == 5
        allocator.ownerless.add("gpu-b")
        server = await start_on(config, port, allocator)
        await eventually(lambda: client.pending_releases == 2)
        assert {g.grant_id for g in free} <= allocator.released
        # While its owner does not answer, a pool gets one probe per round, not a call per
        # buffered release.
        await asyncio.sleep(0.2)
        assert set(allocator.refused) == {stuck[0].grant_id}
    finally:
        await client.close(flush_timeout_s=0.2)
        await server.shutdown(0)


async def test_buffered_releases_are_sent_concurrently_within_the_bound(config: Config) -> None:
    port = free_port()
    allocator = PartlyOwnerless(config.pools, node_id="test-0")
    allocator.release_s = 0.05
    server = await start_on(config, port, allocator)
    client = client_of(f"127.0.0.1:{port}", flush_concurrency=4)
    try:
        grants = [await client.acquire("gpu-a", "inst-a") for _ in range(12)]
        await server.shutdown(0)
        for grant in grants:
            await grant.release(1.0)
        server = await start_on(config, port, allocator)
        await eventually(lambda: client.pending_releases == 0)
        # One at a time would be 1; more than the bound would overrun it.
        assert allocator.most_releasing == 4
    finally:
        await client.close()
        await server.shutdown(0)


async def test_a_full_release_buffer_drops_the_oldest_and_warns_once(
    config: Config, caplog: pytest.LogCaptureFixture
) -> None:
    port = free_port()
    allocator = PartlyOwnerless(config.pools, node_id="test-0")
    server = await start_on(config, port, allocator)
    client = client_of(f"127.0.0.1:{port}", max_pending_releases=5)
    try:
        grants = [await client.acquire("gpu-a", "inst-a") for _ in range(8)]
        await server.shutdown(0)
        with caplog.at_level(logging.WARNING, logger="fairshare.client"):
            for grant in grants:
                await grant.release(1.0)
        assert (client.pending_releases, client.dropped_releases) == (5, 3)
        warnings = [r for r in caplog.records if "releases are buffered" in r.getMessage()]
        assert len(warnings) == 1 and "dropping the oldest" in warnings[0].getMessage()
        server = await start_on(config, port, allocator)
        await eventually(lambda: client.pending_releases == 0)
        assert allocator.released == {g.grant_id for g in grants[3:]}
    finally:
        await client.close()
        await server.shutdown(0)


async def test_acquires_given_up_on_are_probed_one_at_a_time_then_resent_paced(
    config: Config,
) -> None:
    port = free_port()
    allocator = PartlyOwnerless(config.pools, node_id="test-0")
    server = await start_on(config, port, allocator)
    client = client_of(f"127.0.0.1:{port}", resend_batch=4)
    try:
        await client.refresh_pools()
        allocator.no_acquire.add("gpu-a")  # the replica answers; the pool has no owner
        given_up = await asyncio.gather(
            *(client.acquire("gpu-a", "inst-a", Class.BATCH) for _ in range(24))
        )
        assert all(g.degraded for g in given_up) and client.abandoned_acquires == 24
        # An acquire given up on while its message was on the client's stream is still
        # read and refused. One more acquire, of another pool on the same stream, is
        # answered after those: from then on only the probes arrive.
        marker = await client.acquire("gpu-b", "research")
        assert not marker.degraded
        await marker.release()
        allocator.request_ids.clear()
        await asyncio.sleep(0.6)
        # While the pool has no owner, one queued request probes it, not all 24 each.
        assert 1 <= len(set(allocator.request_ids)) <= 2, len(set(allocator.request_ids))
        allocator.acquire_s = 0.02  # long enough for a burst to show as calls in flight
        allocator.no_acquire.clear()
        # The server records a release before its answer reaches the client, which counts
        # it as pending until then: wait for both sides, not for the server alone.
        await eventually(
            lambda: (
                len(allocator.released - {marker.grant_id}) == 24
                and client.abandoned_acquires == 0
                and client.pending_releases == 0
            )
        )
        # Each at least once; a resend whose answer came after the client's deadline is
        # sent again with the same request id (the same grant), so a few may come twice.
        assert len(allocator.acquired_at) >= 24
        # A round resends at most resend_batch and waits for them before the next: never
        # more than that in flight at once, whatever the timing (a burst would send 24).
        assert allocator.most_acquiring <= 4, allocator.most_acquiring
        # Each grant they named was released at no cost; the degraded ones are still live.
        assert client.dropped_abandoned == 0
    finally:
        await client.close()
        await server.shutdown(0)


async def test_the_queue_of_acquires_given_up_on_is_bounded(
    caplog: pytest.LogCaptureFixture,
) -> None:
    client = client_of(f"127.0.0.1:{free_port()}", max_abandoned=3)  # nobody listens
    try:
        with caplog.at_level(logging.WARNING, logger="fairshare.client"):
            given_up = await asyncio.gather(*(client.acquire("gpu-a", "t") for _ in range(5)))
        assert all(g.degraded for g in given_up)
        assert (client.abandoned_acquires, client.dropped_abandoned) == (3, 2)
        warnings = [r for r in caplog.records if "queued for resending" in r.getMessage()]
        assert len(warnings) == 1
    finally:
        await client.close(flush_timeout_s=0.1)


# -- an inventory larger than one Adopt may carry ---------------------------------------------


class RecordingAdopts(FakeAllocator):
    """Records (number of grants, complete) of every Adopt it answers."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.adopts: list[tuple[int, bool]] = []

    async def adopt(self, **kwargs: Any) -> AdoptResult:
        self.adopts.append((len(kwargs["grants"]), bool(kwargs["complete"])))
        return await super().adopt(**kwargs)


async def test_a_large_inventory_is_re_reported_in_adopts_within_the_limit(
    config: Config, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(client_module, "MAX_ADOPT_GRANTS", 3)
    port = free_port()
    allocator = RecordingAdopts(config.pools, node_id="test-0", epoch=1)
    server = await start_on(config, port, allocator)
    client = AllocatorClient(
        [f"127.0.0.1:{port}"], holder="gw", deadline_s=0.5, route_to_owner=False
    )
    try:
        held = [await client.acquire("gpu-a", "inst-a") for _ in range(7)]
        allocator.epoch = Epoch(2)  # the pool moves; the client re-reports its 7 grants
        await client.acquire("gpu-a", "inst-a")
        await eventually(lambda: sum(n for n, _ in allocator.adopts) == len(held))
        # 3 + 3 + 1, and only the last one speaks for the whole inventory.
        assert allocator.adopts == [(3, False), (3, False), (1, True)]
    finally:
        await client.close()
        await server.shutdown(0)


class SlowOnce(FakeAllocator):
    """Decides the next ``slow`` acquires at once but answers only after ``delay_s``
    (after the client gave up): the grant is counted, its answer lost."""

    slow = 0
    delay_s = 0.6

    async def acquire(self, **kwargs: Any) -> Decision:
        decision = await super().acquire(**kwargs)
        if self.slow:
            self.slow -= 1
            await asyncio.sleep(self.delay_s)
        return decision


async def test_closing_settles_the_acquires_it_gave_up_on(config: Config) -> None:
    """An acquire the client gave up on may still be granted at the owner: closing the
    client resends it (same request id, so the same grant) and releases that grant, so a
    gateway that stops leaves nothing counted that it could release."""
    port = free_port()
    allocator = SlowOnce(config.pools, node_id="test-0")
    server = await start_on(config, port, allocator)
    client = AllocatorClient(
        [f"127.0.0.1:{port}"],
        holder="gw",
        deadline_s=0.2,
        route_to_owner=False,
        release_retry_s=5.0,  # the background round would come too late: close must do it
    )
    try:
        await client.refresh_pools()
        allocator.slow = 1
        given_up = await client.acquire("gpu-a", "inst-a")
        assert given_up.degraded and client.abandoned_acquires == 1
        await asyncio.sleep(allocator.delay_s)  # the owner has now granted it
        assert len(allocator.grants) == 1
    finally:
        await client.close(flush_timeout_s=3.0)
    try:
        assert client.abandoned_acquires == 0
        assert not allocator.grants, "a grant the closed client could release is still held"
    finally:
        await server.shutdown(0)
