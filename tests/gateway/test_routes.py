"""The gateway's other routes with the real SDK and a stand-in: embeddings and Responses
decided, sent with the grant's priority and charged from the answer's usage; one model
looked up by id (a name with a slash too); every other path an OpenAI error object."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import openai
import pytest

from harness.standin import Standin

from .conftest import MODEL, TEAM_HEADER, Stack, eventually, start_stack

pytestmark = pytest.mark.timeout(60)

SLASHED = "org/embedder"


@pytest.fixture
async def stack(tmp_path: Path) -> AsyncIterator[Stack]:
    def models(s: dict[str, Standin]) -> list[dict[str, object]]:
        return [
            {"name": MODEL, "pool": "gpu-a", "upstreams": [s["a"].url]},
            {"name": SLASHED, "pool": "gpu-a", "upstreams": [s["a"].url]},
        ]

    async with start_stack(
        tmp_path,
        pools={"gpu-a": {"capacity": 4}},
        standins={"a": {"models": (MODEL, SLASHED), "tokens_per_s": 500.0}},
        models=models,
    ) as running:
        yield running


async def charged(stack: Stack) -> float:
    return await stack.metric("fairshare_gateway_charged_total", pool="gpu-a")


async def released(stack: Stack) -> bool:
    return await stack.in_flight("gpu-a") == {}


async def test_embeddings_are_decided_and_charged_by_their_prompt(stack: Stack) -> None:
    client = stack.client("team-b", **{"x-fairshare-class": "batch"})
    raw = await client.embeddings.with_raw_response.create(
        model=SLASHED, input=["one two", "three"], extra_body={"priority": -9}
    )
    embedded = raw.parse()  # the SDK asked for base64 and decoded it
    assert [d.embedding for d in embedded.data] == [[0.0, 2.0, 0.5, 0.5], [1.0, 1.0, 0.5, 0.5]]
    assert embedded.usage.prompt_tokens == 3
    assert raw.headers["x-fairshare-priority"] == "1"  # team-b's batch class, within share
    [record] = await stack.records("a")
    assert (record["path"], record["priority"]) == ("/v1/embeddings", 1)
    assert record["body"]["encoding_format"] == "base64"  # type: ignore[index]
    await eventually(lambda: released(stack))
    assert await charged(stack) == 3.0  # prompt tokens only


async def test_responses_pass_through_with_the_grants_priority(stack: Stack) -> None:
    client = stack.client("team-a")
    answer = await client.responses.create(
        model=MODEL, input="one two three", max_output_tokens=3, extra_body={"priority": 50}
    )
    assert answer.output_text == "tok tok tok"
    events = [
        event
        async for event in await client.responses.create(
            model=MODEL,
            input=[{"role": "user", "content": "one"}],
            max_output_tokens=2,
            stream=True,
        )
    ]
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == "tok tok"
    assert events[-1].type == "response.completed"
    records = await stack.records("a")
    assert [(r["path"], r["priority"], r["stream"]) for r in records] == [
        ("/v1/responses", 0, False),
        ("/v1/responses", 0, True),
    ]
    assert "stream_options" not in records[1]["body"]  # type: ignore[operator]
    await eventually(lambda: released(stack))
    assert await charged(stack) == (3 + 3) + (1 + 2)  # input and output tokens, from usage


async def test_a_model_by_id_and_openai_errors_for_every_other_path(stack: Stack) -> None:
    client = stack.client("team-a")
    assert (await client.models.retrieve(MODEL)).id == MODEL
    assert (await client.models.retrieve(SLASHED)).id == SLASHED  # sent as org%2Fembedder
    with pytest.raises(openai.NotFoundError) as unknown:
        await client.models.retrieve("nope")
    assert unknown.value.code == "model_not_found"
    with pytest.raises(openai.AuthenticationError):
        await stack.client(team=None).models.retrieve(MODEL)
    with pytest.raises(openai.NotFoundError) as nowhere:
        await client.post("/audio/speech", cast_to=object, body={"model": MODEL})
    assert nowhere.value.code == "not_found"
    async with aiohttp.ClientSession() as session:
        for method, path, status in [
            ("GET", "/", 404),
            ("POST", "/v2/chat/completions", 404),
            ("GET", "/v1/chat/completions", 405),
        ]:
            url = stack.gateway.url + path
            async with session.request(method, url, headers={TEAM_HEADER: "team-a"}) as r:
                assert r.status == status, path
                assert r.content_type == "application/json"
                assert set((await r.json())["error"]) == {"message", "type", "code"}
                assert r.headers["x-request-id"]
                if status == 405:
                    assert r.headers["Allow"] == "POST"
    assert await stack.records("a") == []
