"""SIGTERM to the gateway with streams open: it stops accepting, finishes the streams
within the grace (or cuts them after it), releases every grant, and exits 0."""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path

import aiohttp
import openai
import pytest
from openai import AsyncStream
from openai.types.chat import ChatCompletionChunk

from harness.standin import Standin

from .conftest import MODEL, Stack, eventually, start_stack

pytestmark = pytest.mark.timeout(120)

MESSAGES = [{"role": "user", "content": "hello"}]


def models(s: dict[str, Standin]) -> list[dict[str, object]]:
    return [{"name": MODEL, "pool": "gpu-a", "upstreams": [s["a"].url]}]


async def _nothing_in_flight(stack: Stack) -> bool:
    return await stack.in_flight("gpu-a") == {}


async def _refused(url: str) -> bool:
    try:
        async with aiohttp.ClientSession() as session, session.get(url + "/healthz") as r:
            return r.status != 200
    except aiohttp.ClientConnectionError:
        return True


@pytest.mark.parametrize("grace_s", [30.0, 0.5])
async def test_sigterm_with_streams_open(tmp_path: Path, grace_s: float) -> None:
    async with start_stack(
        tmp_path,
        pools={"gpu-a": {"capacity": 8}},
        standins={"a": {"max_running": 8, "tokens_per_s": 50.0}},
        models=models,
        limits={"shutdown_grace_s": grace_s},
    ) as stack:
        client = stack.client("team-a")
        tokens = 40 if grace_s > 1 else 100_000
        streams = [
            await client.chat.completions.create(
                model=MODEL, messages=MESSAGES, max_tokens=tokens, stream=True
            )
            for _ in range(3)
        ]
        first = []  # content tokens of each stream's first chunk (read before SIGTERM)
        for stream in streams:
            async for chunk in stream:
                first.append(sum(1 for c in chunk.choices if c.delta.content))
                break

        async def drain(stream: AsyncStream[ChatCompletionChunk]) -> tuple[int, bool]:
            """(content tokens read, whether the stream ended with an error)."""
            tokens = 0
            try:
                async for chunk in stream:
                    tokens += sum(1 for c in chunk.choices if c.delta.content)
            except openai.OpenAIError:
                return tokens, True
            return tokens, False

        readers = [asyncio.create_task(drain(s)) for s in streams]
        stack.gateway.signal(signal.SIGTERM)
        await eventually(lambda: _refused(stack.gateway.url))  # no longer accepting
        counts = await asyncio.gather(*readers)
        status = await asyncio.to_thread(stack.gateway.wait, 30.0)
        assert status == 0
        if grace_s > 1:
            # Every stream finished.
            assert [
                (read + f, failed) for (read, failed), f in zip(counts, first, strict=True)
            ] == [(tokens, False)] * 3
        else:
            assert all(read < tokens - 1 for read, _ in counts)  # cut after the grace
            records = await stack.records("a")
            assert all(r["disconnected"] for r in records)  # upstreams closed
        await eventually(lambda: _nothing_in_flight(stack))  # every grant released
