"""The bound on open streams (server.streams), over a real grpc.aio server.

Two clients: one over 127.0.0.1, one over [::1] (a client is its peer's host).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable

import grpc
import pytest
from grpc import aio
from grpc_health.v1 import health as grpc_health
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection, reflection_pb2, reflection_pb2_grpc

from server.intake import Intake
from server.streams import StreamLimit

pytestmark = pytest.mark.timeout(30)

HEALTH = health_pb2.DESCRIPTOR.services_by_name["Health"].full_name

Start = Callable[[int, int], Awaitable[tuple[list[str], StreamLimit, list[str]]]]
"""Starts a server with these bounds (per client, total): its two addresses, its limit and
the limits it refused at, in order."""


class Watches:
    """Health Watch streams of one channel, each open once its first answer came."""

    def __init__(self, channel: aio.Channel) -> None:
        self._stub = health_pb2_grpc.HealthStub(channel)
        self.calls: list[aio.UnaryStreamCall] = []

    async def open(self) -> aio.UnaryStreamCall:
        """Opens one; returns it once the server answered its first status (admitted), or
        raises the refusal."""
        call = self._stub.Watch(health_pb2.HealthCheckRequest())
        first = await call.read()
        assert first.status == health_pb2.HealthCheckResponse.SERVING
        self.calls.append(call)
        return call

    async def refused(self) -> str:
        """Opens one expecting a refusal; returns the limit it names."""
        with pytest.raises(aio.AioRpcError) as info:
            await self.open()
        assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        return dict(info.value.trailing_metadata() or ())["fairshare-limit"]

    def close(self, n: int) -> None:
        for call in self.calls[:n]:
            call.cancel()
        del self.calls[:n]


@pytest.fixture
async def server() -> AsyncIterator[Start]:
    servers: list[aio.Server] = []

    async def start(
        max_per_client: int, max_total: int
    ) -> tuple[list[str], StreamLimit, list[str]]:
        refusals: list[str] = []
        limit = StreamLimit(
            max_per_client=max_per_client, max_total=max_total, on_refused=refusals.append
        )
        srv = aio.server(interceptors=[Intake(), limit])
        health = grpc_health.aio.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(health, srv)
        reflection.enable_server_reflection((HEALTH, reflection.SERVICE_NAME), srv)
        port = srv.add_insecure_port("127.0.0.1:0")
        srv.add_insecure_port(f"[::1]:{port}")
        await srv.start()
        servers.append(srv)
        return [f"127.0.0.1:{port}", f"[::1]:{port}"], limit, refusals

    try:
        yield start
    finally:
        for srv in servers:
            await srv.stop(0)


async def eventually(check: Callable[[], bool], timeout_s: float = 5.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not check():
        assert asyncio.get_running_loop().time() < deadline, "not reached in time"
        await asyncio.sleep(0.02)


async def test_one_client_past_its_bound_is_refused_another_is_not(
    server: Start,
) -> None:
    (v4, v6), limit, refusals = await server(3, 10)
    async with aio.insecure_channel(v4) as one, aio.insecure_channel(v6) as other:
        mine, theirs = Watches(one), Watches(other)
        for _ in range(3):
            await mine.open()
        assert await mine.refused() == "max_streams_per_client"
        # Probes use Check: never refused, whatever the client's streams.
        check = health_pb2_grpc.HealthStub(one).Check
        assert (await check(health_pb2.HealthCheckRequest(), timeout=2)).status == 1
        for _ in range(3):
            await theirs.open()  # another client has a bound of its own
        assert (limit.open_streams(), limit.clients()) == (6, 2)
        mine.close(1)  # a stream that ends gives its place back
        await eventually(lambda: limit.open_streams() == 5)
        await mine.open()
        assert await mine.refused() == "max_streams_per_client"
        assert refusals == ["max_streams_per_client"] * 2
        mine.close(3)
        theirs.close(3)
        await eventually(lambda: limit.open_streams() == 0)
    assert limit.clients() == 0  # nothing kept for clients without streams


async def test_the_servers_total_bounds_all_clients_and_reflection(
    server: Start,
) -> None:
    (v4, v6), limit, refusals = await server(10, 4)
    async with aio.insecure_channel(v4) as one, aio.insecure_channel(v6) as other:
        mine, theirs = Watches(one), Watches(other)
        for _ in range(2):
            await mine.open()
        await theirs.open()
        # A reflection stream counts too (it is an async generator handler).
        info = reflection_pb2_grpc.ServerReflectionStub(other).ServerReflectionInfo()
        await info.write(reflection_pb2.ServerReflectionRequest(list_services=""))
        listed = await info.read()
        assert HEALTH in {s.name for s in listed.list_services_response.service}
        await eventually(lambda: limit.open_streams() == 4)
        assert await mine.refused() == "max_streams"
        assert await theirs.refused() == "max_streams"
        await info.done_writing()
        assert await info.read() is aio.EOF
        await eventually(lambda: limit.open_streams() == 3)
        await theirs.open()
        assert refusals == ["max_streams", "max_streams"]
        mine.close(2)
        theirs.close(2)
        await eventually(lambda: limit.open_streams() == 0)
