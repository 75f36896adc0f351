"""Stored Responses API responses through the gateway, with the real SDK and two stand-ins
that store them (vLLM's ``VLLM_ENABLE_RESPONSES_API_STORE=1``): each lives on the one
server that made it, so its retrieval, its cancel and a request continuing it
(``previous_response_id``) go there; another team's id, or one this gateway never passed
on, is 404 before anything reaches a server."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import openai
import pytest

from harness.standin import Standin

from .conftest import MODEL, TEAM_HEADER, Stack, start_stack

pytestmark = pytest.mark.timeout(60)

STORING = {"models": (MODEL,), "tokens_per_s": 500.0, "extra": ["--store-responses"]}


@pytest.fixture
async def stack(tmp_path: Path) -> AsyncIterator[Stack]:
    def models(s: dict[str, Standin]) -> list[dict[str, object]]:
        # Round-robin: the responses are made on both servers, one after the other.
        upstreams = [s["a"].url, s["b"].url]
        return [{"name": MODEL, "pool": "gpu-a", "upstreams": upstreams, "routing": "round-robin"}]

    async with start_stack(
        tmp_path,
        pools={"gpu-a": {"capacity": 4}},
        standins={"a": STORING, "b": STORING},
        models=models,
    ) as running:
        yield running


async def made_on(stack: Stack) -> dict[str, list[tuple[str, object]]]:
    """Each stand-in's records: (path, previous_response_id) in arrival order."""
    return {
        name: [(str(r["path"]), (r["body"] or {}).get("previous_response_id")) for r in records]  # type: ignore[attr-defined]
        for name in ("a", "b")
        for records in [await stack.records(name)]
    }


async def holder_of(stack: Stack, response_id: str) -> str:
    """The stand-in that holds ``response_id``, asked directly."""
    async with aiohttp.ClientSession() as session:
        for name, standin in stack.standins.items():
            async with session.get(f"{standin.url}/v1/responses/{response_id}") as r:
                if r.status == 200:
                    return name
    raise AssertionError(f"no stand-in holds {response_id}")


async def test_a_stored_response_is_retrieved_and_continued_where_it_lives(stack: Stack) -> None:
    client = stack.client("team-a")
    made = [
        await client.responses.create(model=MODEL, input="one two", max_output_tokens=2)
        for _ in range(3)
    ]
    streamed = [
        e
        async for e in await client.responses.create(
            model=MODEL, input="three", max_output_tokens=2, stream=True
        )
    ]
    made_ids = [r.id for r in made] + [streamed[-1].response.id]  # type: ignore[union-attr]
    before = await made_on(stack)
    assert before["a"] and before["b"], "the four responses are made on both servers"

    for response_id in made_ids:  # each from the one server that holds it
        retrieved = await client.responses.retrieve(response_id)
        assert (retrieved.id, retrieved.output_text) == (response_id, "tok tok")
    # A retrieval as a stream comes back event by event, its query passed on.
    replayed = [e async for e in await client.responses.retrieve(made_ids[2], stream=True)]
    assert [(e.type, e.response.id) for e in replayed] == [  # type: ignore[union-attr]
        ("response.created", made_ids[2]),
        ("response.completed", made_ids[2]),
    ]
    rest = await client.responses.retrieve(made_ids[2], stream=True, starting_after=0)
    assert [e.type async for e in rest] == ["response.completed"]

    continued = await client.responses.create(
        model=MODEL, input="and then", max_output_tokens=1, previous_response_id=made_ids[1]
    )
    assert continued.output_text == "tok"
    after = await made_on(stack)
    holder = await holder_of(stack, made_ids[1])
    assert after[holder][-1] == ("/v1/responses", made_ids[1]), "continued where it lives"

    # vLLM refuses to cancel a response that is not running in the background: passed on.
    with pytest.raises(openai.BadRequestError) as cancel:
        await client.responses.cancel(made_ids[0])
    assert "Cannot cancel" in cancel.value.message


async def test_another_teams_or_an_unknown_id_is_not_found(stack: Stack) -> None:
    mine = await stack.client("team-a").responses.create(
        model=MODEL, input="one", max_output_tokens=1
    )
    other = stack.client("team-b")
    requests_before = {name: len(records) for name, records in (await made_on(stack)).items()}
    with pytest.raises(openai.NotFoundError) as read:
        await other.responses.retrieve(mine.id)
    with pytest.raises(openai.NotFoundError) as cancel:
        await other.responses.cancel(mine.id)
    with pytest.raises(openai.NotFoundError) as continued:
        await other.responses.create(
            model=MODEL, input="steal", max_output_tokens=1, previous_response_id=mine.id
        )
    with pytest.raises(openai.NotFoundError) as unknown:
        await other.responses.retrieve("resp_never_made")
    with pytest.raises(openai.NotFoundError) as unknown_continued:
        await stack.client("team-a").responses.create(
            model=MODEL, input="x", max_output_tokens=1, previous_response_id="resp_never_made"
        )
    for refused in (read, cancel, continued, unknown, unknown_continued):
        assert refused.value.code == "not_found"
        assert "known to this gateway" in refused.value.message
    async with aiohttp.ClientSession(headers={TEAM_HEADER: "team-a"}) as session:
        for escape in ("%2E%2E/cancel", "a%2Fb", "..%2Fhealth"):  # no other upstream path
            async with session.get(f"{stack.gateway.url}/v1/responses/{escape}") as r:
                assert r.status == 404, escape
    assert {n: len(r) for n, r in (await made_on(stack)).items()} == requests_before
    assert await stack.in_flight("gpu-a") == {}, "no grant was taken for them"
    with pytest.raises(openai.AuthenticationError):
        await stack.client(team=None).responses.retrieve(mine.id)
