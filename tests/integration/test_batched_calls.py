"""AcquireMany and ReleaseMany over a real grpc.aio server, and the client that batches.

Each item of a batch is answered as the plain call would answer it; only a bad batch (too
many items, a holder the caller may not act as) is refused whole.
"""

from __future__ import annotations

import asyncio

import grpc
import pytest
from grpc import aio

from fairshare.client import AllocatorClient
from fairshare.limits import MAX_BATCH_ITEMS
from fairshare.wire.errors import trailing
from fairshare.wire.pb.fairshare.v1 import allocator_pb2 as pb
from fairshare.wire.pb.fairshare.v1 import allocator_pb2_grpc as pb_grpc
from ha.api import UnknownPool
from server.app import RunningServer, start_server
from server.config import Config
from server.servicer import AllocatorServicer

from .fakes import FakeAllocator

pytestmark = pytest.mark.timeout(20)


def in_flight(fake: FakeAllocator, pool: str = "gpu-a") -> dict[str, int]:
    """The teams of ``pool`` with grants in flight, and how many."""
    return {t.team: t.in_flight for t in fake.pools[pool].snapshot() if t.in_flight}


def acquire(pool: str = "gpu-a", team: str = "inst-b", holder: str = "gw") -> pb.AcquireRequest:
    return pb.AcquireRequest(pool=pool, team=team, holder=holder, est_tokens=10)


async def test_each_item_is_answered_in_its_place(
    stub: pb_grpc.AllocatorStub, fake: FakeAllocator
) -> None:
    items = [acquire(), acquire(pool="nope"), acquire(holder="other"), acquire(team="inst-a")]
    answer = await stub.AcquireMany(pb.AcquireManyRequest(holder="gw", requests=items))
    first, unknown, foreign, last = answer.outcomes
    assert first.response.granted and last.response.granted
    assert first.response.grant_id != last.response.grant_id
    assert unknown.error.code == grpc.StatusCode.NOT_FOUND.value[0]
    assert "nope" in unknown.error.message
    assert foreign.error.code == grpc.StatusCode.INVALID_ARGUMENT.value[0]
    assert "holder" in foreign.error.message
    assert in_flight(fake) == {"inst-a": 1, "inst-b": 1}

    grants = [first.response.grant_id, "garbage", last.response.grant_id]
    releases = [pb.ReleaseRequest(grant_id=g, consumed=1.0) for g in grants]
    answer = await stub.ReleaseMany(pb.ReleaseManyRequest(holder="gw", releases=releases))
    done, bad, also_done = answer.outcomes
    assert not done.HasField("error") and not also_done.HasField("error")
    assert bad.error.code == grpc.StatusCode.INVALID_ARGUMENT.value[0]
    assert in_flight(fake) == {}


async def test_a_batch_over_the_limit_is_refused_whole(stub: pb_grpc.AllocatorStub) -> None:
    items = [acquire()] * (MAX_BATCH_ITEMS + 1)
    with pytest.raises(aio.AioRpcError) as info:
        await stub.AcquireMany(pb.AcquireManyRequest(holder="gw", requests=items))
    assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert trailing(info.value)["fairshare-limit"] == "max_batch_items"
    releases = [pb.ReleaseRequest(grant_id="x")] * (MAX_BATCH_ITEMS + 1)
    with pytest.raises(aio.AioRpcError) as info:
        await stub.ReleaseMany(pb.ReleaseManyRequest(holder="gw", releases=releases))
    assert trailing(info.value)["fairshare-limit"] == "max_batch_items"


async def test_the_client_batches_a_burst_and_answers_each_as_alone(
    running: RunningServer, fake: FakeAllocator
) -> None:
    async with AllocatorClient([running.address], holder="gw", calls_in_flight=1) as client:
        teams = ["inst-a"] * 12 + ["inst-b"] * 3
        results = await asyncio.gather(
            *(client.acquire("gpu-a", team) for team in teams),
            client.acquire("gpu-b", "research"),
            client.acquire("nope", "inst-a"),
            return_exceptions=True,
        )
        *grants, unknown = results
        assert isinstance(unknown, UnknownPool)
        assert all(not isinstance(g, BaseException) and not g.degraded for g in grants)
        assert client._calls._acquires.calls < client._calls._acquires.items == len(results)
        assert sum(in_flight(fake).values()) == 15
        await asyncio.gather(*(g.release(1.0) for g in grants))  # type: ignore[union-attr]
        assert client._calls._releases.calls < client._calls._releases.items
        assert in_flight(fake) == {}
        assert client.pending_releases == 0


async def unimplemented(self: object, request: object, context: aio.ServicerContext) -> None:
    """A servicer method as a replica of an older version answers it."""
    await context.abort(grpc.StatusCode.UNIMPLEMENTED, "Method not implemented!")


async def test_a_server_without_batched_calls_gets_plain_ones(
    config: Config, fake: FakeAllocator, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An older replica answers AcquireMany UNIMPLEMENTED: the client sends plain calls."""
    monkeypatch.setattr(AllocatorServicer, "AcquireMany", unimplemented)
    monkeypatch.setattr(AllocatorServicer, "ReleaseMany", unimplemented)
    server = await start_server(config, node=fake, serve_metrics=False)
    try:
        async with AllocatorClient([server.address], holder="gw", calls_in_flight=1) as client:
            grants = await asyncio.gather(*(client.acquire("gpu-a", "inst-a") for _ in range(6)))
            assert all(not g.degraded for g in grants)
            assert "AcquireMany" in client._calls._unbatched  # it did fall back
            assert sum(in_flight(fake).values()) == 6
            await asyncio.gather(*(g.release() for g in grants))
            assert client.pending_releases == 0
            assert in_flight(fake) == {}
    finally:
        await server.shutdown(0)
