"""AcquireStream over a real grpc.aio server, and the client that sends lone Acquires on it.

Each request on the stream is answered as the plain Acquire would answer it, tagged with
its request id; only a malformed message or session ends the stream.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import grpc
import pytest
from grpc import aio
from grpc_health.v1 import health_pb2, health_pb2_grpc

from fairshare.client import AllocatorClient
from fairshare.client import streams as streams_module
from fairshare.client.streams import AcquireStreams, Unstreamed
from fairshare.wire.errors import trailing
from fairshare.wire.pb.fairshare.v1 import allocator_pb2 as pb
from fairshare.wire.pb.fairshare.v1 import allocator_pb2_grpc as pb_grpc
from ha.api import UnknownPool
from server.app import RunningServer, start_server
from server.config import Config
from server.servicer import AllocatorServicer
from server.streams import DEFAULT_MAX_STREAMS_PER_CLIENT as MAX_PER_CLIENT

from .fakes import FakeAllocator
from .test_batched_calls import in_flight, unimplemented

pytestmark = pytest.mark.timeout(20)

STREAM = "/fairshare.v1.Allocator/AcquireStream"


def acquire(request_id: str, pool: str = "gpu-a", holder: str = "gw") -> pb.AcquireRequest:
    return pb.AcquireRequest(
        pool=pool, team="inst-b", holder=holder, est_tokens=10, request_id=request_id
    )


async def test_each_request_is_answered_as_alone_under_its_id(
    stub: pb_grpc.AllocatorStub, fake: FakeAllocator
) -> None:
    call = stub.AcquireStream()
    items = [acquire("a"), acquire("b", pool="nope"), acquire("c", holder="x" * 300), acquire("")]
    for item in items:
        await call.write(item)
    replies = {}
    for _ in items:
        reply = await call.read()
        replies[reply.request_id] = reply.outcome
    await call.done_writing()
    assert await call.read() is aio.EOF
    assert replies["a"].response.granted
    assert replies["b"].error.code == grpc.StatusCode.NOT_FOUND.value[0]
    assert replies["c"].error.code == grpc.StatusCode.INVALID_ARGUMENT.value[0]
    assert "holder" in replies["c"].error.message
    # Without its request id an answer could not be told from another's.
    assert replies[""].error.code == grpc.StatusCode.INVALID_ARGUMENT.value[0]
    assert "request_id" in replies[""].error.message
    assert in_flight(fake) == {"inst-b": 1}


async def test_a_malformed_message_ends_the_stream_invalid_argument(
    channel: aio.Channel, running: RunningServer
) -> None:
    call = channel.stream_stream(STREAM)()  # bytes in and out, unchecked
    await call.write(b"\xff\xff\xff garbage")
    with pytest.raises(aio.AioRpcError) as info:
        await call.read()
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert trailing(info.value)["fairshare-field"] == "request"


async def test_the_client_sends_lone_acquires_on_its_stream(
    running: RunningServer, fake: FakeAllocator, monkeypatch: pytest.MonkeyPatch
) -> None:
    plain = 0
    original = AllocatorServicer.Acquire

    async def counted(self: AllocatorServicer, request: object, context: object) -> object:
        nonlocal plain
        plain += 1
        return await original(self, request, context)  # type: ignore[arg-type]

    monkeypatch.setattr(AllocatorServicer, "Acquire", counted)
    async with AllocatorClient([running.address], holder="gw") as client:
        grants = [await client.acquire("gpu-a", "inst-a") for _ in range(3)]
        with pytest.raises(UnknownPool):
            await client.acquire("nope", "inst-a")
        assert all(not g.degraded for g in grants)
        assert in_flight(fake) == {"inst-a": 3}
        await asyncio.gather(*(g.release(1.0) for g in grants))
        assert in_flight(fake) == {}
    assert plain == 0


async def test_a_server_without_the_stream_gets_plain_acquires(
    config: Config, fake: FakeAllocator, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An older replica answers AcquireStream UNIMPLEMENTED: the client sends plain calls."""
    monkeypatch.setattr(AllocatorServicer, "AcquireStream", unimplemented)
    server = await start_server(config, node=fake, serve_metrics=False)
    try:
        async with AllocatorClient([server.address], holder="gw") as client:
            grants = [await client.acquire("gpu-a", "inst-a") for _ in range(3)]
            assert all(not g.degraded for g in grants)
            assert server.address in client._calls._unstreamed  # it did fall back
            assert in_flight(fake) == {"inst-a": 3}
            await asyncio.gather(*(g.release() for g in grants))
            assert in_flight(fake) == {}
    finally:
        await server.shutdown(0)


async def test_a_late_answer_is_deadline_exceeded_and_the_stream_stays(
    running: RunningServer, channel: aio.Channel, monkeypatch: pytest.MonkeyPatch
) -> None:
    original = AllocatorServicer._acquire
    slow = {"first"}

    async def late(self: AllocatorServicer, request: pb.AcquireRequest, *args: object) -> object:
        if request.request_id in slow:
            await asyncio.sleep(0.5)
        return await original(self, request, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(AllocatorServicer, "_acquire", late)
    streams = AcquireStreams(())
    stub = pb_grpc.AllocatorStub(channel)
    try:
        with pytest.raises(aio.AioRpcError) as info:
            await streams.acquire(running.address, stub, acquire("first"), 0.1)
        assert info.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        opened = streams._streams[running.address]
        answer = await streams.acquire(running.address, stub, acquire("second"), 2.0)
        assert answer.granted
        await asyncio.sleep(0.6)  # the late answer comes, and is dropped
        assert streams._streams[running.address] is opened
        assert not opened.waiting
    finally:
        await streams.close()


async def test_a_stream_that_ends_fails_its_acquires_and_the_next_opens_another(
    config: Config, fake: FakeAllocator
) -> None:
    server = await start_server(config, node=fake, serve_metrics=False)
    address = server.address
    streams = AcquireStreams(())
    channel = aio.insecure_channel(address)
    stub = pb_grpc.AllocatorStub(channel)
    try:
        assert (await streams.acquire(address, stub, acquire("one"), 2.0)).granted
        first = streams._streams[address]
        await server.shutdown(0)
        await asyncio.wait_for(first.reader, 5)
        with pytest.raises(aio.AioRpcError) as info:
            await streams.acquire(address, stub, acquire("two"), 2.0)
        assert info.value.code() == grpc.StatusCode.UNAVAILABLE
        assert streams._streams.get(address) is not first  # the next Acquire opens another
    finally:
        await streams.close()
        await channel.close()


async def test_a_stopping_server_answers_what_its_streams_decide_then_ends_them(
    running: RunningServer, stub: pb_grpc.AllocatorStub, monkeypatch: pytest.MonkeyPatch
) -> None:
    original = AllocatorServicer._acquire

    async def slow(self: AllocatorServicer, *args: object) -> object:
        await asyncio.sleep(0.3)
        return await original(self, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(AllocatorServicer, "_acquire", slow)
    call = stub.AcquireStream()
    await call.write(acquire("deciding"))
    await asyncio.sleep(0.1)  # read, and being decided
    running.servicer.end_streams()
    reply = await call.read()
    assert reply.request_id == "deciding" and reply.outcome.response.granted
    assert await call.read() is aio.EOF
    assert await call.code() == grpc.StatusCode.OK
    # One opened now ends at once, before it reads anything. A message written to it
    # races that end: grpc.aio fails a write that meets the server's trailers with
    # INTERNAL, so the stream is read here, and a write after its end is refused whole.
    later = stub.AcquireStream()
    assert await later.read() is aio.EOF
    assert await later.code() == grpc.StatusCode.OK
    with pytest.raises(asyncio.InvalidStateError):
        await later.write(acquire("late"))


async def test_a_caller_that_gives_up_while_its_message_is_written_leaves_the_stream_alone(
    running: RunningServer, stub: pb_grpc.AllocatorStub
) -> None:
    """grpc.aio cancels a whole call when one of its writes is cancelled half done: every
    Acquire waiting on the stream would fail CANCELLED, which is not retried."""
    streams = AcquireStreams(())
    try:
        assert (await streams.acquire(running.address, stub, acquire("open"), 2.0)).granted
        opened = streams._streams[running.address]
        for attempt in range(20):
            hasty = asyncio.ensure_future(
                streams.acquire(running.address, stub, acquire(f"hasty-{attempt}"), 1e-6)
            )
            await asyncio.sleep(0)  # its write has started when its time is up
            patient = streams.acquire(running.address, stub, acquire(f"patient-{attempt}"), 2.0)
            assert (await patient).granted
            with pytest.raises(aio.AioRpcError) as info:
                await hasty
            assert info.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        assert streams._streams[running.address] is opened
    finally:
        await streams.close()


async def test_a_server_with_no_room_for_the_stream_gets_plain_acquires(
    running: RunningServer, channel: aio.Channel, fake: FakeAllocator
) -> None:
    """The client's host already has its streams open (health Watches here): the stream is
    refused RESOURCE_EXHAUSTED as a whole, which is no refusal of the Acquire."""
    watch = health_pb2_grpc.HealthStub(channel)
    watches = [watch.Watch(health_pb2.HealthCheckRequest()) for _ in range(MAX_PER_CLIENT)]
    try:
        for call in watches:
            await call.read()  # admitted
        async with AllocatorClient([running.address], holder="gw") as client:
            grant = await client.acquire("gpu-a", "inst-a")
            assert not grant.degraded
            assert running.address in client._calls._unstreamed  # it did fall back
            assert in_flight(fake) == {"inst-a": 1}
            await grant.release()
    finally:
        for call in watches:
            call.cancel()


async def test_a_decision_that_fails_unexpectedly_is_answered_unknown_and_the_stream_goes_on(
    stub: pb_grpc.AllocatorStub, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    original = AllocatorServicer._acquire

    async def broken(self: AllocatorServicer, request: pb.AcquireRequest, *args: object) -> object:
        if request.request_id == "bug":
            raise RuntimeError("a bug")
        return await original(self, request, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(AllocatorServicer, "_acquire", broken)
    call = stub.AcquireStream()
    await call.write(acquire("bug"))
    reply = await call.read()
    assert reply.request_id == "bug"
    assert reply.outcome.error.code == grpc.StatusCode.UNKNOWN.value[0]
    await call.write(acquire("fine"))
    assert (await call.read()).outcome.response.granted
    assert "deciding a request of an acquire stream failed" in caplog.text
    await call.done_writing()
    assert await call.read() is aio.EOF


async def test_a_stream_that_fails_with_a_status_of_its_own_is_retried_as_unavailable(
    config: Config, fake: FakeAllocator, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A status that says nothing of the Acquire (the core's INTERNAL when a write meets a
    call already over, a replica's abort) must not reach the caller as a refusal."""

    async def failing(
        self: AllocatorServicer, requests: AsyncIterator[pb.AcquireRequest], context: object
    ) -> AsyncIterator[pb.AcquireReply]:
        first = await anext(requests)
        granted = pb.AcquireOutcome(response=pb.AcquireResponse(granted=True))
        yield pb.AcquireReply(request_id=first.request_id, outcome=granted)
        await anext(requests)
        await context.abort(grpc.StatusCode.INTERNAL, "the replica's stream broke")  # type: ignore[attr-defined]

    monkeypatch.setattr(AllocatorServicer, "AcquireStream", failing)
    server = await start_server(config, node=fake, serve_metrics=False)
    streams = AcquireStreams(())
    channel = aio.insecure_channel(server.address)
    stub = pb_grpc.AllocatorStub(channel)
    try:
        assert (await streams.acquire(server.address, stub, acquire("one"), 2.0)).granted
        with pytest.raises(aio.AioRpcError) as info:
            await streams.acquire(server.address, stub, acquire("two"), 2.0)
        assert info.value.code() == grpc.StatusCode.UNAVAILABLE
        assert "INTERNAL" in (info.value.details() or "")
    finally:
        await streams.close()
        await channel.close()
        await server.shutdown(0)


async def test_closing_cancels_the_acquires_waiting_and_refuses_later_ones(
    running: RunningServer, stub: pb_grpc.AllocatorStub, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As closing a channel cancels its plain calls: an Acquire failed UNAVAILABLE instead
    would be retried on a channel being closed."""
    original = AllocatorServicer._acquire
    deciding = asyncio.Event()

    async def slow(self: AllocatorServicer, *args: object) -> object:
        deciding.set()
        await asyncio.sleep(5)
        return await original(self, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(AllocatorServicer, "_acquire", slow)
    streams = AcquireStreams(())
    waiting = asyncio.ensure_future(streams.acquire(running.address, stub, acquire("w"), 10.0))
    await asyncio.wait_for(deciding.wait(), 5)
    await streams.close()
    await asyncio.wait({waiting}, timeout=5)
    assert waiting.cancelled()
    with pytest.raises(aio.AioRpcError) as info:
        await streams.acquire(running.address, stub, acquire("late"), 2.0)
    assert info.value.code() == grpc.StatusCode.CANCELLED


async def test_an_old_stream_answers_what_it_was_sent_and_the_next_acquire_opens_a_new_one(
    running: RunningServer,
    stub: pb_grpc.AllocatorStub,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A replica's connection age limit closes an aged connection under its calls after a
    grace: a stream renewed before that loses no Acquire."""
    monkeypatch.setattr(streams_module, "RENEW_AFTER_S", 0.2)
    original = AllocatorServicer._acquire

    async def slow(self: AllocatorServicer, request: pb.AcquireRequest, *args: object) -> object:
        if request.request_id == "slow":
            await asyncio.sleep(0.5)
        return await original(self, request, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(AllocatorServicer, "_acquire", slow)
    streams = AcquireStreams(())
    try:
        slowly = asyncio.ensure_future(streams.acquire(running.address, stub, acquire("slow"), 5.0))
        await asyncio.sleep(0.3)  # the stream is old; "slow" is being decided on it
        old = streams._streams[running.address]
        assert (await streams.acquire(running.address, stub, acquire("next"), 5.0)).granted
        new = streams._streams[running.address]
        assert new is not old
        assert (await slowly).granted  # answered on the old stream
        await asyncio.wait({old.reader}, timeout=5)  # which ends once nothing waits on it
        assert old.ended and streams._retired == set()
        await asyncio.sleep(0.25)  # the new stream is old too, and nothing waits on it
        assert (await streams.acquire(running.address, stub, acquire("last"), 5.0)).granted
        assert streams._streams[running.address] is not new
        assert new.ended  # closed when it was renewed: no Acquire was left to answer
    finally:
        await streams.close()


def test_a_stream_that_fails_internal_before_any_answer_counts_as_refused() -> None:
    """grpc.aio may put its own INTERNAL in place of a refusal's status when a write meets
    the refused call: retried as UNAVAILABLE, each new stream would be refused again."""
    internal = aio.AioRpcError(grpc.StatusCode.INTERNAL, aio.Metadata(), aio.Metadata(), "core")
    assert isinstance(streams_module._stream_failure(internal, answered=False), Unstreamed)
    later = streams_module._stream_failure(internal, answered=True)
    assert isinstance(later, aio.AioRpcError) and later.code() == grpc.StatusCode.UNAVAILABLE
