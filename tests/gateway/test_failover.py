"""The allocator killed and restarted under the gateway: requests go on fail-open, and the
fail-open requests that had not started are decided again once an owner answers."""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path

import aiohttp
import openai
import pytest

from harness.serve import wait_serving
from harness.standin import Standin

from .conftest import MODEL, Stack, eventually, start_stack

pytestmark = pytest.mark.timeout(180)

MESSAGES = [{"role": "user", "content": "hello"}]


def models(s: dict[str, Standin]) -> list[dict[str, object]]:
    return [{"name": MODEL, "pool": "gpu-a", "upstreams": [s["a"].url]}]


async def test_allocator_killed_and_restarted_mid_load(tmp_path: Path) -> None:
    async with start_stack(
        tmp_path,
        pools={"gpu-a": {"capacity": 8}},
        standins={"a": {"max_running": 8, "tokens_per_s": 200.0}},
        models=models,
    ) as stack:
        seen: list[str] = []
        failures: list[BaseException] = []
        stop = asyncio.Event()

        async def load(team: str) -> None:
            client = stack.client(team)
            while not stop.is_set():
                try:
                    raw = await client.chat.completions.with_raw_response.create(
                        model=MODEL, messages=MESSAGES, max_tokens=2
                    )
                    seen.append(raw.headers["x-fairshare-degraded"])
                except openai.OpenAIError as e:
                    failures.append(e)

        workers = [asyncio.create_task(load(t)) for t in ("team-a", "team-b") * 3]
        try:
            await eventually(lambda: len(seen) >= 20)
            stack.allocator.kill()
            mark = len(seen)
            await eventually(lambda: "true" in seen[mark:])  # fail-open answers
            stack.allocator.start()
            await wait_serving(stack.allocator.address, process=stack.allocator)
            mark = len(seen)
            await eventually(lambda: seen[mark + 10 :][-5:] == ["false"] * 5, timeout_s=30)
        finally:
            stop.set()
            await asyncio.gather(*workers)
        assert failures == []  # every request was answered, degraded or not
        await eventually(lambda: _nothing_in_flight(stack), timeout_s=30)


async def test_degraded_modes_and_readiness_without_the_allocator(tmp_path: Path) -> None:
    def two(s: dict[str, Standin]) -> list[dict[str, object]]:
        return [
            {"name": "open", "pool": "gpu-a", "upstreams": [s["a"].url]},
            {"name": "closed", "pool": "gpu-b", "upstreams": [s["a"].url]},
        ]

    async with start_stack(
        tmp_path,
        pools={"gpu-a": {"degraded_mode": "fail_open"}, "gpu-b": {"degraded_mode": "fail_closed"}},
        standins={"a": {"models": ("open", "closed"), "tokens_per_s": 200.0}},
        models=two,
    ) as stack:
        client = stack.client("team-a")
        stack.allocator.kill()
        raw = await client.chat.completions.with_raw_response.create(
            model="open", messages=MESSAGES, max_tokens=1
        )
        assert raw.headers["x-fairshare-degraded"] == "true"
        assert raw.headers["x-fairshare-standing"] == "degraded"
        assert raw.headers["x-fairshare-priority"] == "100"  # the lowest borrower's
        with pytest.raises(openai.APIStatusError) as refused:
            await client.chat.completions.create(model="closed", messages=MESSAGES)
        assert refused.value.status_code == 503
        assert refused.value.response.headers["retry-after"] == "1"
        # Not ready: a model's pool fails closed and no allocator answers.
        async with aiohttp.ClientSession() as session:
            await eventually(lambda: _status(session, stack.gateway.url + "/readyz", 503))
            stack.allocator.start()
            await eventually(lambda: _status(session, stack.gateway.url + "/readyz", 200))


async def _status(session: aiohttp.ClientSession, url: str, status: int) -> bool:
    async with session.get(url) as r:
        return r.status == status


async def _nothing_in_flight(stack: Stack) -> bool:
    return await stack.in_flight("gpu-a") == {}


async def _records_where(stack: Stack, count: int, **match: object) -> bool:
    records = await stack.records("a")
    return sum(1 for r in records if all(r[k] == v for k, v in match.items())) >= count


async def test_fail_open_requests_not_started_are_decided_again(tmp_path: Path) -> None:
    async with start_stack(
        tmp_path,
        # team-a's reservation (8) holds the stream and the three re-decided requests
        # however their releases and new acquires interleave.
        pools={"gpu-a": {"capacity": 10, "shares": {"team-a": 0.8, "team-b": 0.2}}},
        standins={"a": {"max_running": 1, "tokens_per_s": 100.0}},
        models=models,
    ) as stack:
        client = stack.client("team-a")
        # One stream holds the stand-in's only slot, decided by a live allocator.
        holder = await client.chat.completions.create(
            model=MODEL, messages=MESSAGES, max_tokens=100_000, stream=True
        )
        async for _ in holder:
            break
        stack.allocator.kill()
        # Three requests sent fail-open: they wait at the stand-in, no first token yet.
        waiting = [
            asyncio.create_task(
                client.chat.completions.with_raw_response.create(
                    model=MODEL, messages=MESSAGES, max_tokens=3, stream=True
                )
            )
            for _ in range(3)
        ]
        await eventually(lambda: _records_where(stack, 3, priority=100, start_s=None))
        # The owner is back: the gateway hears it (its client's background ListPools while
        # grants are live) and sends the three again with fresh decisions.
        stack.allocator.start()
        await wait_serving(stack.allocator.address, process=stack.allocator)
        await eventually(lambda: _records_where(stack, 3, priority=100, disconnected=True))
        await eventually(lambda: _records_where(stack, 3, priority=0, start_s=None))
        assert not any(task.done() for task in waiting)  # nothing reached the clients yet
        await holder.close()
        for task in waiting:
            raw = await task
            assert raw.headers["x-fairshare-degraded"] == "false"
            assert raw.headers["x-fairshare-priority"] == "0"
            chunks = [c async for c in raw.parse()]
            assert "".join(c.choices[0].delta.content or "" for c in chunks) == "tok tok tok"
        assert await stack.metric("fairshare_gateway_redecided_total", pool="gpu-a") == 3
        # Each was decided again once only: three fail-open records, three fresh ones.
        records = await stack.records("a")
        assert sorted(r["priority"] for r in records[1:]) == [0, 0, 0, 100, 100, 100]  # type: ignore[type-var]
        await eventually(lambda: _nothing_in_flight(stack), timeout_s=30)
        with contextlib.suppress(Exception):
            await holder.close()
