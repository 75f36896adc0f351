"""fairshare.gateway.proxy in one process: a fake allocator client, an aiohttp upstream whose answer
each test scripts, the proxy served on loopback, and an aiohttp client. What each request
was charged at its release, and what the client saw, when the upstream misbehaves."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field, replace

import aiohttp
import pytest
from aiohttp import web

from fairshare import Class
from fairshare.client import ClientGrant
from fairshare.gateway.app import upstream_session
from fairshare.gateway.config import (
    AllocatorSettings,
    AuthSettings,
    CostSettings,
    GatewayConfig,
    Limits,
    Model,
    Route,
)
from fairshare.gateway.metrics import GatewayMetrics
from fairshare.gateway.proxy import Proxy, grant_headers
from harness.net import free_port

pytestmark = pytest.mark.timeout(30)

TEAM_HEADER = "x-fairshare-team"
PROMPT = [{"role": "user", "content": "x" * 40}]
PROMPT_TOKENS = 10 + 4  # fairshare.gateway.body's estimate of PROMPT
WAIT_S = 10.0
"""The bound of every wait of these tests (never reached when the code is right)."""

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@dataclass
class FakeClient:
    """Grants every acquire; records each release and its charge."""

    released: list[float] = field(default_factory=list)
    changed: asyncio.Event = field(default_factory=asyncio.Event)

    def on_owner_answer(self, hook: object) -> None:
        pass

    async def acquire(
        self, pool: str, team: str, cls: Class, est: int, *, wait_s: float = 0.0
    ) -> ClientGrant:
        grant = ClientGrant(
            pool=pool,
            team=team,
            service_class=cls,
            est_tokens=est,
            grant_id=f"g{len(self.released)}",
            priority=10,
            borrowing=False,
            saturated=False,
            degraded=False,
            owner="o",
            epoch=1,
        )
        grant._client = self  # type: ignore[assignment]
        return grant

    async def _release(self, grant: ClientGrant, consumed: float) -> None:
        self.released.append(consumed)
        self.changed.set()

    async def releases(self, count: int) -> list[float]:
        """The charges once ``count`` releases were made (bounded wait)."""
        async with asyncio.timeout(WAIT_S):
            while len(self.released) < count:
                self.changed.clear()
                await self.changed.wait()
        return self.released


@dataclass
class Rig:
    """The proxy in front of a scripted upstream."""

    client: FakeClient
    proxy: Proxy
    url: str
    upstream: dict[str, Handler]
    session: aiohttp.ClientSession

    async def post(self, body: dict[str, object], **headers: str) -> aiohttp.ClientResponse:
        response = await self.session.post(
            self.url + "/v1/chat/completions",
            json={"model": "m", "messages": PROMPT, **body},
            headers={TEAM_HEADER: "team-a", **headers},
        )
        await response.read()
        return response


def config_of(upstreams: tuple[str, ...], **limits: float) -> GatewayConfig:
    return GatewayConfig(
        allocator=AllocatorSettings(endpoints=("127.0.0.1:1",), holder="gw"),
        models=(Model("m", Route("gpu-a", upstreams)),),
        auth=AuthSettings(team_header=TEAM_HEADER, class_header="x-fairshare-class"),
        limits=replace(Limits(), **limits),
    )


async def serve(app: web.Application) -> tuple[web.AppRunner, str]:
    runner = web.AppRunner(app, handler_cancellation=True, access_log=None)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    return runner, f"http://127.0.0.1:{port}"


@pytest.fixture
async def rig() -> AsyncIterator[Rig]:
    upstream: dict[str, Handler] = {}

    async def scripted(request: web.Request) -> web.StreamResponse:
        return await upstream["handler"](request)

    upstream_app = web.Application()
    upstream_app.router.add_post("/v1/chat/completions", scripted)
    upstream_runner, upstream_url = await serve(upstream_app)
    client = FakeClient()
    config = config_of(
        (upstream_url,), upstream_first_byte_s=0.5, upstream_idle_s=0.5, upstream_connect_s=2.0
    )
    session = upstream_session(config)
    proxy = Proxy(
        config,
        client=client,  # type: ignore[arg-type]
        session=session,
        keys=None,
        metrics=GatewayMetrics(),
    )
    app = web.Application()
    proxy.add_routes(app)
    runner, url = await serve(app)
    tester = aiohttp.ClientSession()
    try:
        yield Rig(client, proxy, url, upstream, tester)
    finally:
        await tester.close()
        await runner.cleanup()
        await proxy.wait_releases()
        await session.close()
        await upstream_runner.cleanup()
    # Every upstream request was counted until it ended, whatever way it ended.
    for upstreams in proxy.upstreams.values():
        assert [upstreams.in_flight(u) for u in upstreams.urls] == [0] * len(upstreams.urls)


async def stall(request: web.Request) -> web.StreamResponse:
    """Reads the request, then answers nothing until the gateway gives up."""
    await request.read()
    await asyncio.sleep(WAIT_S)
    return web.Response(status=500)


async def test_a_non_streaming_request_that_times_out_charges_its_prompt(rig: Rig) -> None:
    rig.upstream["handler"] = stall
    response = await rig.post({})
    assert response.status == 504
    assert await rig.client.releases(1) == [PROMPT_TOKENS]


async def test_a_stream_cut_before_its_first_chunk_charges_its_prompt(rig: Rig) -> None:
    async def headers_then_stall(request: web.Request) -> web.StreamResponse:
        await request.read()
        answer = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await answer.prepare(request)
        await asyncio.sleep(WAIT_S)
        return answer

    rig.upstream["handler"] = headers_then_stall
    response = await rig.post({"stream": True})
    assert response.status == 504
    assert await rig.client.releases(1) == [PROMPT_TOKENS]


async def test_a_client_gone_before_the_answer_charges_its_prompt(rig: Rig) -> None:
    reached = asyncio.Event()

    async def noted_stall(request: web.Request) -> web.StreamResponse:
        reached.set()
        return await stall(request)

    rig.upstream["handler"] = noted_stall
    posting = asyncio.ensure_future(rig.post({}))
    async with asyncio.timeout(WAIT_S):
        await reached.wait()
    posting.cancel()  # the client closes its connection
    await asyncio.wait({posting})
    assert await rig.client.releases(1) == [PROMPT_TOKENS]


async def test_an_upstream_error_status_charges_nothing(rig: Rig) -> None:
    async def bad(request: web.Request) -> web.StreamResponse:
        await request.read()
        return web.json_response({"error": {"message": "no"}}, status=400)

    rig.upstream["handler"] = bad
    response = await rig.post({})
    assert response.status == 400
    assert await rig.client.releases(1) == [0.0]


async def test_an_answered_request_charges_its_usage(rig: Rig) -> None:
    async def fine(request: web.Request) -> web.StreamResponse:
        await request.read()
        usage = {"prompt_tokens": 7, "completion_tokens": 3, "total_tokens": 10}
        return web.json_response({"choices": [], "usage": usage})

    rig.upstream["handler"] = fine
    response = await rig.post({})
    assert response.status == 200
    assert await rig.client.releases(1) == [10.0]
    assert json.loads(await response.read())["usage"]["completion_tokens"] == 3


async def test_an_unreachable_upstream_charges_nothing() -> None:
    for unit in ("tokens", "seconds"):
        client = FakeClient()
        config = config_of((f"http://127.0.0.1:{free_port()}",))
        config = replace(config, cost=CostSettings(unit=unit))
        async with aiohttp.ClientSession() as session:
            proxy = Proxy(
                config,
                client=client,  # type: ignore[arg-type]
                session=session,
                keys=None,
                metrics=GatewayMetrics(),
            )
            app = web.Application()
            proxy.add_routes(app)
            runner, url = await serve(app)
            try:
                response = await session.post(
                    url + "/v1/chat/completions",
                    json={"model": "m", "messages": PROMPT},
                    headers={TEAM_HEADER: "team-a"},
                )
                assert response.status == 502
                assert await client.releases(1) == [0.0], unit
            finally:
                await runner.cleanup()
                await proxy.wait_releases()


async def test_listing_models_with_a_bad_class_is_a_bad_request(rig: Rig) -> None:
    url = rig.url + "/v1/models"
    async with rig.session.get(url, headers={TEAM_HEADER: "team-a"}) as response:
        assert response.status == 200
        assert [m["id"] for m in (await response.json())["data"]] == ["m"]
    bad = {TEAM_HEADER: "team-a", "x-fairshare-class": "urgent"}
    async with rig.session.get(url, headers=bad) as response:
        assert response.status == 400
        assert (await response.json())["error"]["code"] == "invalid_value"


BREAK = b"break-the-upstream-here"
"""A marker in an upstream event: reading it raises ``ClientOSError`` (see below)."""


def event(text: str) -> bytes:
    chunk = {"object": "chat.completion.chunk", "choices": [{"delta": {"content": text}}]}
    return b"data: " + json.dumps(chunk).encode() + b"\n\n"


async def test_a_stream_whose_upstream_connection_fails_ends_with_an_error_event(
    rig: Rig, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Not only a payload error: any client error of the upstream connection mid-stream
    (here an OS error while reading) ends the stream with an SSE error event."""
    readany = aiohttp.StreamReader.readany

    async def failing(self: aiohttp.StreamReader) -> bytes:
        data = await readany(self)
        if BREAK in data:
            raise aiohttp.ClientOSError(104, "reset by the upstream")
        return data

    monkeypatch.setattr(aiohttp.StreamReader, "readany", failing)

    async def one_then_break(request: web.Request) -> web.StreamResponse:
        await request.read()
        answer = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await answer.prepare(request)
        await answer.write(event("one"))
        await asyncio.sleep(0.05)  # two reads: the first event goes on alone
        await answer.write(event(BREAK.decode()))
        await asyncio.sleep(WAIT_S)
        return answer

    rig.upstream["handler"] = one_then_break
    response = await rig.post({"stream": True})
    body = await response.read()
    assert response.status == 200
    events = body.split(b"\n\n")
    assert events[0] + b"\n\n" == event("one")
    assert json.loads(events[1][len(b"data: ") :])["error"]["code"] == "upstream_error"
    assert await rig.client.releases(1) == [PROMPT_TOKENS + 1]


async def test_answers_reach_the_client_uncompressed(rig: Rig) -> None:
    """The gateway passes bodies on as they come (it never asks for them compressed): an
    upstream that compresses when asked must not be asked."""

    async def compressing(request: web.Request) -> web.StreamResponse:
        await request.read()
        answer = web.json_response({"choices": [], "usage": None})
        answer.enable_compression()  # when the request accepts gzip or deflate
        return answer

    rig.upstream["handler"] = compressing
    response = await rig.post({})
    assert response.status == 200
    assert "content-encoding" not in response.headers
    assert json.loads(await response.read()) == {"choices": [], "usage": None}


async def test_a_connection_closed_before_the_status_line_is_sent_again_once(rig: Rig) -> None:
    """What a pooled connection the upstream closes as idle looks like: closed after the
    request, without a status line. Sent again once; closed twice, the answer is 502."""
    attempts: list[int] = []

    async def closes(times: int, request: web.Request) -> web.StreamResponse:
        await request.read()
        attempts.append(1)
        if len(attempts) <= times:
            assert request.transport is not None
            request.transport.close()
            await asyncio.sleep(WAIT_S)  # cancelled: the connection is gone
        return web.json_response({"choices": [], "usage": None})

    rig.upstream["handler"] = lambda request: closes(1, request)
    response = await rig.post({})
    assert (response.status, len(attempts)) == (200, 2)
    attempts.clear()
    rig.upstream["handler"] = lambda request: closes(2, request)
    response = await rig.post({})
    assert (response.status, len(attempts)) == (502, 2)
    assert (await response.json())["error"]["code"] == "upstream_error"


async def test_a_redecided_request_ends_its_first_lease_and_takes_one_with_its_new_priority(
    rig: Rig,
) -> None:
    """A fail-open request (degraded, a borrowing priority) is aborted when an owner answers
    and sent again with its new grant: the upstream tally moves from one priority to the
    other, never holding both."""
    grants = iter([(21, True), (0, False)])
    acquire = rig.client.acquire

    async def degraded_first(
        pool: str, team: str, cls: Class, est: int, *, wait_s: float = 0.0
    ) -> ClientGrant:
        priority, degraded = next(grants)
        grant = await acquire(pool, team, cls, est)
        return replace(grant, priority=priority, borrowing=degraded, degraded=degraded)

    rig.client.acquire = degraded_first  # type: ignore[method-assign]
    seen: list[int] = []
    first_arrived = asyncio.Event()

    async def answer(request: web.Request) -> web.StreamResponse:
        seen.append(json.loads(await request.read())["priority"])
        if len(seen) == 1:
            first_arrived.set()
            await asyncio.sleep(WAIT_S)  # cancelled: the gateway closes this request
        return web.json_response({"choices": [], "usage": None})

    rig.upstream["handler"] = answer
    # Only the owner's answer may end the first attempt, however slow the machine.
    forwarder = rig.proxy.forwarder
    forwarder.limits = replace(forwarder.limits, upstream_first_byte_s=WAIT_S)
    upstreams = next(iter(rig.proxy.upstreams.values()))
    posted = asyncio.create_task(rig.post({}))
    async with asyncio.timeout(WAIT_S):
        await first_arrived.wait()
    assert upstreams.outstanding.at_most(0, 21) == 1  # the degraded attempt, at 21
    rig.proxy.redecider.owner_answered("gpu-a", 2)
    response = await posted
    assert (response.status, seen) == (200, [21, 0])
    assert response.headers["x-fairshare-priority"] == "0"
    assert response.headers["x-fairshare-standing"] == "within"  # the second decision's
    assert upstreams.in_flight(upstreams.urls[0]) == 0
    sent = rig.proxy.metrics.registry.get_sample_value
    labels = {"pool": "gpu-a", "upstream": upstreams.urls[0]}
    assert sent("fairshare_gateway_upstream_sent_total", {**labels, "standing": "degraded"}) == 1
    assert sent("fairshare_gateway_upstream_sent_total", {**labels, "standing": "within"}) == 1


async def test_the_headers_name_the_standing_in_one_word_and_as_flags() -> None:
    grant = await FakeClient().acquire("gpu-a", "team-a", Class.INTERACTIVE, 0)
    cases = [
        (grant, "within", "false", "false"),
        (replace(grant, priority=20, borrowing=True), "borrowing", "true", "false"),
        (replace(grant, priority=100, borrowing=True, degraded=True), "degraded", "true", "true"),
    ]
    for case, standing, borrowing, degraded in cases:
        headers = grant_headers(case, 0.0)
        assert headers["x-fairshare-standing"] == standing
        assert (headers["x-fairshare-borrowing"], headers["x-fairshare-degraded"]) == (
            borrowing,
            degraded,
        )
        assert headers["x-fairshare-priority"] == str(case.priority)
        assert headers["x-fairshare-pool"] == "gpu-a"
