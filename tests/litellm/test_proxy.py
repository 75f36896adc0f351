"""fairshare's callback in LiteLLM's real proxy (docs/litellm.md), end to end: a real
allocator (embedded mode), a stand-in vLLM server, LiteLLM's proxy from its own virtualenv
(bench/litellm_peer.py) loading ``fairshare.integrations.litellm``, and the real ``openai``
SDK as the client. One proxy for the module: its start takes tens of seconds.

The team comes from a request header or the request's metadata (the proxy runs without
LiteLLM's database, so without virtual keys or teams); LiteLLM's own ``UserAPIKeyAuth``
objects are mapped in that virtualenv's Python by a subprocess (``test_key_and_team``).

Skipped when that virtualenv is absent or not made from bench/litellm-requirements.txt as
it is now (``bench.litellm_peer.ensure_installed`` makes it).
"""

from __future__ import annotations

import asyncio
import json
import subprocess
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import pytest
from grpc import aio
from openai import APIStatusError, AsyncOpenAI

from bench import litellm_peer
from fairshare.wire.pb.fairshare.v1 import allocator_pb2 as pb
from fairshare.wire.pb.fairshare.v1 import allocator_pb2_grpc as pb_grpc
from harness.http import wait_http
from harness.serve import Allocator, wait_serving
from harness.standin import Standin, wait_standin
from tests.gateway.conftest import eventually, pools_yaml

pytestmark = [
    pytest.mark.skipif(
        not litellm_peer.is_current(litellm_peer.VENV),
        reason=f"no current LiteLLM virtualenv at {litellm_peer.VENV}: make it with "
        "bench.litellm_peer.ensure_installed() from bench/litellm-requirements.txt "
        "(FAIRSHARE_LITELLM_VENV names another)",
    ),
    pytest.mark.timeout(60),
]

MODEL = "standin"
POOL = "gpu-a"
TEAM_HEADER = "x-fairshare-team"
HOLDER = "litellm-test"


@dataclass
class Stack:
    allocator: Allocator
    standin: Standin
    proxy: litellm_peer.LiteLLM

    def client(self, team: str | None = "team-a") -> AsyncOpenAI:
        headers = {TEAM_HEADER: team} if team is not None else {}
        return AsyncOpenAI(
            base_url=self.proxy.url + "/v1",
            api_key=self.proxy.master_key,
            default_headers=headers,
            max_retries=0,
            timeout=30.0,
        )

    async def records(self) -> list[dict[str, object]]:
        async with (
            aiohttp.ClientSession() as session,
            session.get(self.standin.url + "/standin/requests") as r,
        ):
            return list(await r.json())

    async def forget(self) -> None:
        async with (
            aiohttp.ClientSession() as session,
            session.delete(self.standin.url + "/standin/requests") as r,
        ):
            r.raise_for_status()

    async def teams(self) -> dict[str, pb.TeamStat]:
        async with aio.insecure_channel(self.allocator.address) as channel:
            snapshot = await pb_grpc.AllocatorStub(channel).Snapshot(
                pb.SnapshotRequest(pool=POOL), timeout=5
            )
        return {t.team: t for t in snapshot.teams}

    async def in_flight(self) -> dict[str, int]:
        """The pool's grants in flight by team (phantoms left out)."""
        return {name: t.in_flight for name, t in (await self.teams()).items() if t.in_flight}

    async def none_in_flight(self) -> None:
        await eventually(lambda: _empty(self.in_flight()), timeout_s=10)


async def _empty(in_flight: object) -> bool:
    return not await in_flight  # type: ignore[misc]


def callback_settings(allocator: Allocator) -> dict[str, object]:
    return {
        "allocator": {"endpoints": [allocator.address], "holder": HOLDER, "deadline_s": 0.5},
        "pools": {MODEL: POOL},
        "team": {"from": ["team_alias", "team_id", "key_alias", "header", "metadata"]},
    }


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    work = tmp_path_factory.mktemp("litellm")
    config = work / "pools.yaml"
    config.write_text(pools_yaml({POOL: {"capacity": 2}}))
    allocator = Allocator(work, config)
    standin = Standin(work, models=(MODEL,), max_running=8, tokens_per_s=200.0)
    proxy = litellm_peer.LiteLLM(
        work, MODEL, standin.url, fairshare=callback_settings(allocator), name="litellm"
    )
    processes = (allocator, standin, proxy)
    try:
        for process in processes:
            process.start()

        async def ready() -> None:
            await wait_serving(allocator.address, process=allocator)
            await wait_standin(standin.url, process=standin)
            await wait_http(proxy.health_url, process=proxy, timeout_s=120)

        asyncio.run(ready())
        yield Stack(allocator, standin, proxy)
    finally:
        for process in reversed(processes):
            process.stop()


@pytest.fixture
async def clean(stack: Stack) -> AsyncIterator[Stack]:
    """The stack with the stand-in's records cleared; no grant may be left afterwards."""
    await stack.forget()
    yield stack
    await stack.none_in_flight()


def _priority(record: dict[str, object]) -> object:
    body = record["body"]
    assert isinstance(body, dict)
    assert "fairshare_headers" not in json.dumps(body), "the callback's metadata went upstream"
    return record["priority"]


async def test_a_request_within_share_is_sent_with_priority_0(clean: Stack) -> None:
    async with clean.client("team-a") as client:
        raw = await client.chat.completions.with_raw_response.create(
            model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=3
        )
    answer = raw.parse()
    assert answer.usage is not None and answer.usage.completion_tokens == 3
    assert raw.headers["x-fairshare-priority"] == "0"
    assert raw.headers["x-fairshare-standing"] == "within"
    assert raw.headers["x-fairshare-pool"] == POOL
    (record,) = await clean.records()
    assert _priority(record) == 0


async def test_the_class_comes_from_the_request_metadata(clean: Stack) -> None:
    async with clean.client(None) as client:
        await client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "hi"}],
            max_tokens=1,
            extra_body={"metadata": {"fairshare_team": "team-b", "fairshare_class": "batch"}},
        )
    (record,) = await clean.records()
    assert _priority(record) == 1


async def test_a_borrower_is_ranked_below_the_teams_within_share(clean: Stack) -> None:
    """team-a holds its one slot with a stream (of 5 s, closed early); its next request
    borrows (10 or more)."""
    async with clean.client("team-a") as client:
        stream = await client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=1000, stream=True
        )
        first = await anext(aiter(stream))
        assert first is not None
        raw = await client.chat.completions.with_raw_response.create(
            model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=1
        )
        assert raw.headers["x-fairshare-standing"] == "borrowing"
        assert int(raw.headers["x-fairshare-priority"]) >= 10
        await stream.close()
    priorities = [_priority(r) for r in await clean.records()]
    assert priorities[0] == 0 and isinstance(priorities[1], int) and priorities[1] >= 10


async def test_a_stream_is_released_with_its_usage_at_its_end(clean: Stack) -> None:
    before = (await clean.teams())["team-a"].usage
    async with clean.client("team-a") as client:
        stream = await client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=5, stream=True
        )
        chunks = [chunk async for chunk in stream]
    assert all(chunk.usage is None for chunk in chunks), "a usage chunk nobody asked for"
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    (record,) = await clean.records()
    assert _priority(record) == 0 and record["include_usage"] is True
    await clean.none_in_flight()
    after = (await clean.teams())["team-a"].usage
    assert after - before >= 5  # the completion's tokens at least (decay is an hour)


async def test_a_client_gone_mid_stream_releases(clean: Stack) -> None:
    async with clean.client("team-b") as client:
        stream = await client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "hi"}],
            max_tokens=2000,
            stream=True,
        )
        await anext(aiter(stream))
        assert await clean.in_flight() == {"team-b": 1}
        await stream.close()
    await clean.none_in_flight()


async def test_an_upstream_error_is_answered_and_released(clean: Stack) -> None:
    async with clean.client("team-a") as client:
        with pytest.raises(APIStatusError) as raised:
            await client.chat.completions.create(
                model=MODEL,
                messages=[{"role": "user", "content": "hi"}],
                max_tokens=1,
                extra_body={"standin_status": 500},
            )
    assert raised.value.status_code >= 500
    records = await clean.records()
    assert records and all(r["status"] == 500 for r in records)


async def test_a_request_without_a_team_is_refused(clean: Stack) -> None:
    async with clean.client(None) as client:
        with pytest.raises(APIStatusError) as raised:
            await client.chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=1
            )
    assert raised.value.status_code == 401
    assert await clean.records() == []


async def test_without_an_allocator_the_pool_fails_open(stack: Stack) -> None:
    """Last: it stops the allocator; the degraded grant counts once it is back."""
    stack.allocator.stop()
    try:
        async with stack.client("team-a") as client:
            raw = await client.chat.completions.with_raw_response.create(
                model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=1
            )
        assert raw.headers["x-fairshare-degraded"] == "true"
        assert raw.headers["x-fairshare-standing"] == "degraded"
    finally:
        stack.allocator.start()
    await wait_serving(stack.allocator.address, process=stack.allocator)
    await stack.none_in_flight()


KEY_PROBE = """
import json
from litellm.proxy._types import UserAPIKeyAuth
from fairshare.integrations.litellm import team_of
from fairshare.integrations.litellm_config import TeamSettings

settings = TeamSettings(sources=("team_alias", "team_id", "key_alias", "header"))
header = {"proxy_server_request": {"headers": {"x-fairshare-team": "from-header"}}}
keys = {
    "alias": UserAPIKeyAuth(team_id="t-1", team_alias="research", key_alias="k"),
    "id": UserAPIKeyAuth(team_id="t-1", key_alias="k"),
    "key": UserAPIKeyAuth(key_alias="ci-bot"),
    "none": UserAPIKeyAuth(),
}
print(json.dumps({name: team_of(key, header, settings) for name, key in keys.items()}))
"""


def test_key_and_team(tmp_path: Path) -> None:
    """LiteLLM's own ``UserAPIKeyAuth`` (a virtual key of a team) maps as documented."""
    done = subprocess.run(
        [str(litellm_peer.python_of(litellm_peer.VENV)), "-c", KEY_PROBE],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env=litellm_peer.environment(tmp_path),
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout.strip().splitlines()[-1]) == {
        "alias": "research",
        "id": "t-1",
        "key": "ci-bot",
        "none": "from-header",
    }
