"""Upstream health and the upstream timeouts, end to end: a stand-in paused with SIGSTOP
(as a hung or partitioned vLLM looks from outside), one answering 5xx; the real ``openai``
SDK as client, the allocator counting the grants. Short timeouts, so each test takes
seconds."""

from __future__ import annotations

import asyncio
import signal
import time
from pathlib import Path

import aiohttp
import openai
import pytest

from harness.standin import Standin

from .conftest import MODEL, Stack, eventually, model_on_a, start_stack

pytestmark = pytest.mark.timeout(120)

MESSAGES = [{"role": "user", "content": "hello"}]
HEALTHY = "fairshare_gateway_upstream_healthy"


async def _nothing_in_flight(stack: Stack) -> bool:
    return await stack.in_flight("gpu-a") == {}


async def _readyz(stack: Stack) -> tuple[int, str]:
    async with aiohttp.ClientSession() as session, session.get(stack.gateway.url + "/readyz") as r:
        return r.status, await r.text()


async def _ready_is(stack: Stack, status: int) -> bool:
    return (await _readyz(stack))[0] == status


async def _healthy_is(stack: Stack, url: str, value: float) -> bool:
    return await stack.metric(HEALTHY, upstream=url) == value


async def test_a_paused_upstream_cuts_a_stream_when_idle_and_answers_504_before_its_first_byte(
    tmp_path: Path,
) -> None:
    async with start_stack(
        tmp_path,
        pools={"gpu-a": {"capacity": 4}},
        standins={"a": {"tokens_per_s": 30.0}},
        models=model_on_a,
        limits={"upstream_connect_s": 1, "upstream_first_byte_s": 2, "upstream_idle_s": 1},
        # The probes stay out of it: what ends these requests is the timeouts.
        health={"interval_s": 300},
    ) as stack:
        client = stack.client()
        # A live stream runs longer than both timeouts together: no total bound.
        started = time.monotonic()
        stream = await client.chat.completions.create(
            model=MODEL, messages=MESSAGES, max_tokens=100, stream=True
        )
        chunks = [c async for c in stream]
        assert time.monotonic() - started > 3.0
        assert sum(1 for c in chunks if c.choices and c.choices[0].delta.content) == 100

        stream = await client.chat.completions.create(
            model=MODEL, messages=MESSAGES, max_tokens=10_000, stream=True
        )
        async for _ in stream:
            break
        stack.standins["a"].signal(signal.SIGSTOP)
        try:
            paused = time.monotonic()
            with pytest.raises(openai.APIError) as stalled:
                async for _ in stream:
                    pass
            assert time.monotonic() - paused < 1 + 3  # the idle timeout, not 600 s
            assert "sent nothing for 1s" in str(stalled.value)
            await eventually(lambda: _nothing_in_flight(stack))

            sent = time.monotonic()
            with pytest.raises(openai.APIStatusError) as timed_out:
                await client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=2)
            assert 2 <= time.monotonic() - sent < 2 + 3  # the first-byte timeout
            answer = timed_out.value.response
            assert answer.status_code == 504
            error = answer.json()["error"]
            assert (error["type"], error["code"]) == ("upstream_error", "upstream_timeout")
            assert error["message"] == "the upstream sent nothing within 2s"
            await eventually(lambda: _nothing_in_flight(stack))
        finally:
            stack.standins["a"].signal(signal.SIGCONT)
        answer = await client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=2)
        assert answer.choices[0].message.content == "tok tok"
        assert await stack.metric("fairshare_gateway_upstream_errors_total", kind="timeout") == 2


async def test_probes_eject_a_paused_upstream_and_readmit_it(tmp_path: Path) -> None:
    def models(s: dict[str, Standin]) -> list[dict[str, object]]:
        return [
            {"name": "solo", "pool": "gpu-a", "upstreams": [s["a"].url]},
            {
                "name": "pair",
                "pool": "gpu-a",
                "upstreams": [s["a"].url, s["b"].url],
                "routing": "round-robin",
            },
        ]

    async with start_stack(
        tmp_path,
        pools={"gpu-a": {"capacity": 8}},
        standins={
            "a": {"models": ("solo", "pair"), "tokens_per_s": 200.0},
            "b": {"models": ("solo", "pair"), "tokens_per_s": 200.0},
        },
        models=models,
        # A first byte may take long: what ends the waiting request is the probes.
        limits={"upstream_first_byte_s": 60},
        health={"interval_s": 0.2, "timeout_s": 0.5, "unhealthy_after": 2},
    ) as stack:
        a, b = stack.standins["a"], stack.standins["b"]
        client = stack.client()
        assert await _readyz(stack) == (200, "ready\n")
        assert await stack.metric(HEALTHY, upstream=a.url) == 1
        waiting = asyncio.ensure_future(
            client.chat.completions.create(
                model="solo", messages=MESSAGES, extra_body={"standin_hang": True}
            )
        )
        await eventually(lambda: _hung(stack))
        a.signal(signal.SIGSTOP)
        try:
            paused = time.monotonic()
            with pytest.raises(openai.APIStatusError) as cut:
                await waiting
            assert time.monotonic() - paused < 5  # two probes, not the 60 s first byte
            assert cut.value.status_code == 504
            assert cut.value.response.json()["error"]["message"] == (
                "the upstream stopped answering its health probes"
            )
            assert await stack.metric(HEALTHY, upstream=a.url) == 0
            ejections = "fairshare_gateway_upstream_ejections_total"
            assert await stack.metric(ejections, upstream=a.url, reason="probe") == 1
            status, text = await _readyz(stack)
            assert status == 503 and text == "no healthy upstream: solo (pool gpu-a)\n"
            # The pair's requests all go to b; the solo model has none left: 503 at once.
            for _ in range(4):
                answer = await client.chat.completions.create(
                    model="pair", messages=MESSAGES, max_tokens=1
                )
                assert answer.choices[0].message.content == "tok"
            assert len(await stack.records("b")) == 4
            with pytest.raises(openai.APIStatusError) as refused:
                await client.chat.completions.create(model="solo", messages=MESSAGES)
            assert refused.value.status_code == 503
            assert refused.value.code == "no_healthy_upstream"
        finally:
            a.signal(signal.SIGCONT)
        await eventually(lambda: _ready_is(stack, 200))
        assert await stack.metric(HEALTHY, upstream=a.url) == 1
        answer = await client.chat.completions.create(model="solo", messages=MESSAGES, max_tokens=1)
        assert answer.choices[0].message.content == "tok"
        await eventually(lambda: _nothing_in_flight(stack))
        assert b.alive


async def _hung(stack: Stack) -> bool:
    return any(r["end_s"] is None for r in await stack.records("a"))


async def test_an_upstream_answering_5xx_is_ejected_until_a_later_probe(tmp_path: Path) -> None:
    async with start_stack(
        tmp_path,
        pools={"gpu-a": {"capacity": 4}},
        standins={"a": {"tokens_per_s": 200.0}},
        models=model_on_a,
        # An ejection by requests holds at least one interval: the checks below fit in it.
        health={"interval_s": 3, "eject_after": 2},
    ) as stack:
        client = stack.client()
        url = stack.standins["a"].url
        for _ in range(2):
            with pytest.raises(openai.InternalServerError):  # passed through as it came
                await client.chat.completions.create(
                    model=MODEL, messages=MESSAGES, extra_body={"standin_status": 500}
                )
        ejected = time.monotonic()
        with pytest.raises(openai.APIStatusError) as refused:
            await client.chat.completions.create(model=MODEL, messages=MESSAGES)
        assert refused.value.status_code == 503 and refused.value.code == "no_healthy_upstream"
        assert len(await stack.records("a")) == 2  # the third never reached it
        assert await stack.metric(HEALTHY, upstream=url) == 0
        ejections = "fairshare_gateway_upstream_ejections_total"
        assert await stack.metric(ejections, upstream=url, reason="requests") == 1
        assert time.monotonic() - ejected < 3, "too slow a machine for this test's timing"
        # Its probes still answer: the next one readmits it.
        await eventually(lambda: _healthy_is(stack, url, 1))
        answer = await client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=1)
        assert answer.choices[0].message.content == "tok"
        await eventually(lambda: _nothing_in_flight(stack))
