"""The bounds of client connections, with real sockets: a thousand connections that sent
part of a request head are closed after ``limits.header_timeout_s``, before any
authentication; past ``limits.max_client_connections`` a new connection is closed at once;
a keep-alive connection idle between requests is left open. The ``openai`` SDK is the
client whose requests are refused, then served."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import openai
import pytest

from harness.net import LOOPBACK

from .conftest import MODEL, Stack, eventually, model_on_a, start_stack

pytestmark = pytest.mark.timeout(120)

MESSAGES = [{"role": "user", "content": "hello"}]
PARTIAL = 1000
HEADER_TIMEOUT_S = 3.0
PARTIAL_HEAD = (
    b"POST /v1/chat/completions HTTP/1.1\r\nHost: gateway\r\nx-fairshare-team: team-a\r\n"
)
OPEN = "fairshare_gateway_client_connections"
CLOSED = "fairshare_gateway_client_connections_closed_total"


Connection = tuple[asyncio.StreamReader, asyncio.StreamWriter]


async def _connect(stack: Stack, head: bytes = b"") -> Connection:
    reader, writer = await asyncio.open_connection(LOOPBACK, stack.gateway.port)
    if head:
        writer.write(head)
        await writer.drain()
    return reader, writer


async def _closed_within(connection: Connection, seconds: float) -> bool:
    """The gateway closed it: end of stream (or a reset) before ``seconds``."""
    reader, _ = connection
    try:
        async with asyncio.timeout(seconds):
            return await reader.read(1024) == b""
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False


async def _get_healthz(connection: Connection) -> bytes:
    reader, writer = connection
    writer.write(b"GET /healthz HTTP/1.1\r\nHost: gateway\r\n\r\n")
    await writer.drain()
    head = await reader.readuntil(b"\r\n\r\n")
    await reader.readexactly(len(b"ok\n"))
    return head.split(b"\r\n", 1)[0]


async def test_partial_heads_are_closed_and_the_cap_refuses_new_connections(
    tmp_path: Path,
) -> None:
    async with start_stack(
        tmp_path,
        pools={"gpu-a": {"capacity": 4}},
        standins={"a": {"tokens_per_s": 200.0}},
        models=model_on_a,
        limits={"header_timeout_s": HEADER_TIMEOUT_S, "max_client_connections": PARTIAL + 1},
    ) as stack:
        client = stack.client()
        # A keep-alive connection that served a request, then idles past the head timeout.
        kept = await _connect(stack)
        assert await _get_healthz(kept) == b"HTTP/1.1 200 OK"
        started = time.monotonic()
        partial = await asyncio.gather(*(_connect(stack, PARTIAL_HEAD) for _ in range(PARTIAL)))
        await eventually(lambda: _metric_is(stack, OPEN, PARTIAL + 1))
        # At the cap: the SDK's connection is closed at once, before it is read.
        with pytest.raises(openai.APIConnectionError):
            await client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=1)
        assert time.monotonic() - started < HEADER_TIMEOUT_S, "too slow a machine for this test"
        assert await stack.metric(CLOSED, reason="over_limit") >= 1
        # The partial heads are closed once their time is up, every one of them.
        closed = await asyncio.gather(*(_closed_within(c, HEADER_TIMEOUT_S + 10) for c in partial))
        assert all(closed)
        assert time.monotonic() - started >= HEADER_TIMEOUT_S
        assert await stack.metric(CLOSED, reason="header_timeout") == PARTIAL
        assert await stack.records("a") == []  # nothing of them went anywhere
        # Room again: served; the idle keep-alive connection was left open and still serves.
        answer = await client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=1)
        assert answer.choices[0].message.content == "tok"
        assert await _get_healthz(kept) == b"HTTP/1.1 200 OK"
        # A later request on it that never ends its head is timed from its first byte.
        writer = kept[1]
        writer.write(b"GET /healthz HTTP/1.1\r\n")
        await writer.drain()
        later = time.monotonic()
        assert await _closed_within(kept, HEADER_TIMEOUT_S + 10)
        assert time.monotonic() - later >= HEADER_TIMEOUT_S - 0.5
        for _, w in (*partial, kept):
            w.close()


async def _metric_is(stack: Stack, name: str, value: float) -> bool:
    return await stack.metric(name) == value
