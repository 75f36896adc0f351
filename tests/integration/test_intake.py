"""The server's door (server.intake): the per-client call limit, over a real server."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import grpc
import pytest
from grpc import aio
from grpc_health.v1 import health as grpc_health
from grpc_health.v1 import health_pb2, health_pb2_grpc

from fairshare.wire.pb.fairshare.v1 import allocator_pb2 as pb
from server.intake import Intake, peer_host

pytestmark = pytest.mark.timeout(20)

METHOD = "/test.Slow/Call"


class Gate:
    """A handler whose calls block until opened, counting how many run at once."""

    def __init__(self) -> None:
        self.open = asyncio.Event()
        self.running: dict[str, int] = {}

    async def call(self, request: pb.AcquireRequest, context: aio.ServicerContext) -> bytes:
        self.running[request.holder] = self.running.get(request.holder, 0) + 1
        try:
            await self.open.wait()
        finally:
            self.running[request.holder] -= 1
        return b""


@pytest.fixture
async def served() -> AsyncIterator[tuple[str, Gate, Intake]]:
    gate = Gate()
    intake = Intake(max_calls=2, max_waiting=3)
    server = aio.server(interceptors=[intake])
    handler = grpc.unary_unary_rpc_method_handler(
        gate.call,
        request_deserializer=pb.AcquireRequest.FromString,
        response_serializer=lambda b: b,
    )
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler("test.Slow", {"Call": handler}),)
    )
    health = grpc_health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        yield f"127.0.0.1:{port}", gate, intake
    finally:
        gate.open.set()
        await server.stop(0)


async def test_one_clients_flood_waits_then_is_refused_while_another_runs(
    served: tuple[str, Gate, Intake],
) -> None:
    address, gate, intake = served
    async with aio.insecure_channel(address) as channel:
        call = channel.unary_unary(METHOD, request_serializer=pb.AcquireRequest.SerializeToString)
        flood = [asyncio.ensure_future(call(pb.AcquireRequest(), timeout=10)) for _ in range(8)]
        await asyncio.sleep(0.5)
        # 2 run, 3 wait, 3 are refused at once.
        assert gate.running.get("") == 2  # no holder: the client is its host
        refused = [f for f in flood if f.done()]
        assert len(refused) == 3
        for f in refused:
            error = f.exception()
            assert isinstance(error, aio.AioRpcError)
            assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert (
                dict(error.trailing_metadata() or ())["fairshare-limit"] == "max_calls_per_client"
            )
        # Health checks are outside the limit: a probe from the flood's host answers.
        check = health_pb2_grpc.HealthStub(channel).Check
        answer = await check(health_pb2.HealthCheckRequest(service=""), timeout=2)
        assert answer.status == health_pb2.HealthCheckResponse.SERVING
        # Another client is not behind the flood.
        other = asyncio.ensure_future(call(pb.AcquireRequest(holder="other"), timeout=10))
        await asyncio.sleep(0.2)
        assert gate.running.get("other") == 1
        gate.open.set()
        await other
        done = await asyncio.gather(*flood, return_exceptions=True)
        assert sum(not isinstance(r, Exception) for r in done) == 5
    assert intake.clients() == 0  # nothing kept for clients without calls


def test_peer_host_drops_the_port() -> None:
    assert peer_host("ipv4:10.0.0.7:51234") == "ipv4:10.0.0.7"
    assert peer_host("ipv6:[::1]:5") == "ipv6:[::1]"
    assert peer_host("unix:/run/x") == "unix:/run/x"
