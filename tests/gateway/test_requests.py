"""One gateway in front of one stand-in: what a request carries there and back.

Priorities injected and overwritten, the x-fairshare headers, streaming with and without
usage, bad input, upstream failures, timeouts and refused connections, client disconnects;
after each, the grant is released (the allocator counts nothing in flight).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import openai
import pytest

from harness.net import free_port
from harness.standin import Standin

from .conftest import MODEL, Stack, eventually, keyed_auth, start_stack

pytestmark = pytest.mark.timeout(120)

MESSAGES = [{"role": "user", "content": "one two three four"}]


@pytest.fixture
def upstream_timeout_s() -> float:
    """The gateway's ``limits.upstream_first_byte_s`` and ``upstream_idle_s`` (a test may
    parametrize another)."""
    return 1.5


@pytest.fixture
async def stack(tmp_path: Path, upstream_timeout_s: float) -> AsyncIterator[Stack]:
    dead = f"http://127.0.0.1:{free_port()}"

    def models(s: dict[str, Standin]) -> list[dict[str, object]]:
        return [
            {"name": MODEL, "pool": "gpu-a", "upstreams": [s["a"].url]},
            # A refused connection goes to the next upstream. Round-robin, so that most
            # requests try the dead one first (fewest-ahead breaks ties at random).
            {
                "name": "half-dead",
                "pool": "gpu-a",
                "upstreams": [dead, s["a"].url],
                "routing": "round-robin",
            },
            {"name": "dead", "pool": "gpu-a", "upstreams": [dead]},
        ]

    async with start_stack(
        tmp_path,
        auth=keyed_auth(tmp_path, {"sk-batch-b": {"team": "team-b", "class": "batch"}}),
        pools={"gpu-a": {"capacity": 4}},
        standins={"a": {"models": (MODEL, "half-dead", "dead"), "tokens_per_s": 200.0}},
        models=models,
        limits={
            "max_body_bytes": 20_000,
            "upstream_first_byte_s": upstream_timeout_s,
            "upstream_idle_s": upstream_timeout_s,
        },
        # The dead upstream never turns healthy: ready it is not, serving it is. Its
        # probes leave it to the requests (they are what this file tests).
        ready_path="/healthz",
        health={"interval_s": 300},
    ) as running:
        yield running


async def released(stack: Stack) -> None:
    """Waits until the allocator counts nothing in flight for the pool."""
    await eventually(lambda: _nothing_in_flight(stack))


async def _nothing_in_flight(stack: Stack) -> bool:
    return await stack.in_flight("gpu-a") == {}


async def test_priority_injected_and_overwritten_and_headers(stack: Stack) -> None:
    client = stack.client("team-a")
    raw = await client.chat.completions.with_raw_response.create(
        model=MODEL, messages=MESSAGES, max_tokens=3, extra_body={"priority": -50}
    )
    answer = raw.parse()
    assert answer.choices[0].message.content == "tok tok tok"
    assert answer.usage is not None and answer.usage.completion_tokens == 3
    assert raw.headers["x-fairshare-priority"] == "0"  # within team-a's share
    assert raw.headers["x-fairshare-standing"] == "within"
    assert raw.headers["x-fairshare-borrowing"] == "false"
    assert raw.headers["x-fairshare-degraded"] == "false"
    assert raw.headers["x-fairshare-pool"] == "gpu-a"
    batch = await stack.client("team-a", **{"x-fairshare-class": "batch"}).completions.create(
        model=MODEL, prompt="a b", max_tokens=2, extra_body={"priority": 7}
    )
    assert batch.usage is not None and batch.usage.prompt_tokens == 2
    records = await stack.records("a")
    assert [r["priority"] for r in records] == [0, 1]  # the grants', not the clients'
    assert records[0]["body"]["priority"] == 0  # type: ignore[index]
    await released(stack)


async def test_a_known_bearer_key_names_the_team_and_class(stack: Stack) -> None:
    keyed = stack.client("team-a", key="sk-batch-b", **{"x-fairshare-class": "interactive"})
    raw = await keyed.chat.completions.with_raw_response.create(
        model=MODEL, messages=MESSAGES, max_tokens=1
    )
    assert raw.headers["x-fairshare-priority"] == "1"  # team-b's batch class, not the header's
    await released(stack)


async def test_models_lists_the_configured_names(stack: Stack) -> None:
    listed = await stack.client().models.list()
    assert [m.id for m in listed.data] == [MODEL, "half-dead", "dead"]


async def test_streaming_with_and_without_usage(stack: Stack) -> None:
    client = stack.client("team-b")
    plain = await client.chat.completions.create(
        model=MODEL, messages=MESSAGES, max_tokens=4, stream=True
    )
    chunks = [c async for c in plain]
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == (
        "tok tok tok tok"
    )
    assert all(c.usage is None for c in chunks)  # the usage chunk was stripped
    assert all(c.choices for c in chunks)
    with_usage = await client.chat.completions.create(
        model=MODEL,
        messages=MESSAGES,
        max_tokens=4,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = [c async for c in with_usage]
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == 4
    records = await stack.records("a")
    assert [r["include_usage"] for r in records] == [True, True]  # always asked upstream
    await released(stack)
    # The charge came from the usage: 4 prompt + 4 completion tokens, twice.
    assert await stack.metric("fairshare_gateway_charged_total", pool="gpu-a") == pytest.approx(
        16.0
    )
    # Both streams had a first chunk, within the team's share; nothing waits to be released.
    first = "fairshare_gateway_time_to_first_token_seconds_count"
    assert await stack.metric(first, pool="gpu-a", kind="within") == 2
    assert await stack.metric("fairshare_gateway_pending_releases") == 0


async def test_bad_input(stack: Stack) -> None:
    client = stack.client("team-a")
    with pytest.raises(openai.NotFoundError) as unknown:
        await client.chat.completions.create(model="nope", messages=MESSAGES)
    assert unknown.value.code == "model_not_found"
    with pytest.raises(openai.BadRequestError):
        await client.chat.completions.create(model=MODEL, messages=[])
    with pytest.raises(openai.APIStatusError) as large:
        await client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "x" * 30_000}]
        )
    assert large.value.status_code == 413
    with pytest.raises(openai.AuthenticationError):
        await stack.client(team=None).chat.completions.create(model=MODEL, messages=MESSAGES)
    async with aiohttp.ClientSession() as session:
        url = stack.gateway.url + "/v1/chat/completions"
        headers = {"x-fairshare-team": "team-a", "content-type": "application/json"}
        async with session.post(url, data=b"{not json", headers=headers) as r:
            assert r.status == 400
            error = (await r.json())["error"]
            assert set(error) == {"message", "type", "code"}
        async with session.post(url, data=b'{"model": "standin"}', headers=headers) as r:
            assert r.status == 400
    assert await stack.records("a") == []  # nothing reached the upstream
    await released(stack)


async def test_upstream_error_status_and_body_pass_through(stack: Stack) -> None:
    with pytest.raises(openai.InternalServerError) as failed:
        await stack.client().chat.completions.create(
            model=MODEL, messages=MESSAGES, extra_body={"standin_status": 500}
        )
    assert failed.value.status_code == 500
    with pytest.raises(openai.RateLimitError):
        await stack.client().chat.completions.create(
            model=MODEL, messages=MESSAGES, extra_body={"standin_status": 429}
        )
    await released(stack)


async def test_upstream_timeout_is_504_and_closes_the_upstream_request(stack: Stack) -> None:
    with pytest.raises(openai.APIStatusError) as timed_out:
        await stack.client().chat.completions.create(
            model=MODEL, messages=MESSAGES, extra_body={"standin_hang": True}
        )
    assert timed_out.value.status_code == 504
    await eventually(lambda: _disconnected(stack, 1))
    await released(stack)


async def test_refused_connections_try_another_upstream(stack: Stack) -> None:
    client = stack.client()
    for _ in range(4):
        answer = await client.chat.completions.create(
            model="half-dead", messages=MESSAGES, max_tokens=1
        )
        assert answer.choices[0].message.content == "tok"
    with pytest.raises(openai.APIStatusError) as refused:
        await client.chat.completions.create(model="dead", messages=MESSAGES)
    assert refused.value.status_code == 502
    assert await stack.metric("fairshare_gateway_upstream_errors_total", kind="refused") >= 4
    await released(stack)


async def test_a_stream_cut_by_the_upstream_ends_with_an_error(stack: Stack) -> None:
    stream = await stack.client().chat.completions.create(
        model=MODEL,
        messages=MESSAGES,
        max_tokens=10,
        stream=True,
        extra_body={"standin_fail_after": 2},
    )
    seen: list[str] = []
    with pytest.raises(openai.APIError):
        async for chunk in stream:
            if chunk.choices:
                seen.append(chunk.choices[0].delta.content or "")
    assert len([s for s in seen if s]) == 2
    await released(stack)


async def _disconnected(stack: Stack, count: int) -> bool:
    records = await stack.records("a")
    return sum(1 for r in records if r["disconnected"]) >= count


async def _hung(stack: Stack) -> bool:
    records = await stack.records("a")
    return any(
        r["end_s"] is None and (r["body"] or {}).get("standin_hang")  # type: ignore[union-attr]
        for r in records
    )


# The gateway must not give up on the upstream before the client goes: with the fixture's
# 1.5 s, a loaded machine could turn the client's disconnect into an upstream timeout.
@pytest.mark.parametrize("upstream_timeout_s", [300.0])
async def test_client_disconnect_closes_the_upstream_at_once(stack: Stack) -> None:
    client = stack.client()
    # Streaming: the client reads one chunk, then goes away.
    stream = await client.chat.completions.create(
        model=MODEL, messages=MESSAGES, max_tokens=2000, stream=True
    )
    async for _ in stream:
        break
    await stream.close()
    await eventually(lambda: _disconnected(stack, 1))
    # Not streaming: the client goes away once the upstream has the request, unanswered.
    hanging = asyncio.ensure_future(
        client.chat.completions.create(
            model=MODEL, messages=MESSAGES, extra_body={"standin_hang": True}
        )
    )
    await eventually(lambda: _hung(stack))
    assert not hanging.done()
    hanging.cancel()  # the SDK closes its connection
    await asyncio.wait({hanging})
    await eventually(lambda: _disconnected(stack, 2))
    await released(stack)
    assert await stack.metric("fairshare_gateway_client_disconnects_total") == 2
    await eventually(lambda: _metric_is(stack, "fairshare_gateway_in_flight", 0))
    records = await stack.records("a")
    assert all(r["end_s"] is not None or r["disconnected"] for r in records)


async def _metric_is(stack: Stack, name: str, value: float) -> bool:
    return await stack.metric(name) == value
