"""Headers through the gateway, with the real SDK in front and a stand-in behind: what the
client sends reaches vLLM but for hop-by-hop headers, credentials and the deny list; every
answer carries an ``x-request-id`` (the client's, or one the gateway made and sent
upstream); the upstream's own headers come back, but never in the gateway's name."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from pathlib import Path

import openai
import pytest

from harness.standin import Standin

from .conftest import CLASS_HEADER, MODEL, TEAM_HEADER, Stack, keyed_auth, start_stack

pytestmark = pytest.mark.timeout(60)

MESSAGES = [{"role": "user", "content": "one two"}]
TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
SENT = {
    "traceparent": TRACEPARENT,
    "tracestate": "vendor=1",
    "x-client-note": "passes",
    "cookie": "session=secret",
    "x-api-key": "sk-also-secret",
    "x-internal-route": "denied",
    "x-fairshare-class": "batch",
}


@pytest.fixture
async def stack(tmp_path: Path) -> AsyncIterator[Stack]:
    def models(s: dict[str, Standin]) -> list[dict[str, object]]:
        return [{"name": MODEL, "pool": "gpu-a", "upstreams": [s["a"].url]}]

    async with start_stack(
        tmp_path,
        auth=keyed_auth(tmp_path, {"sk-team-b": {"team": "team-b"}}),
        pools={"gpu-a": {"capacity": 4}},
        standins={"a": {"tokens_per_s": 500.0}},
        models=models,
        headers={"deny": ["X-Internal-Route"]},
    ) as running:
        yield running


async def test_headers_pass_both_ways_but_hop_by_hop_credentials_and_denied(stack: Stack) -> None:
    client = stack.client("team-a", **SENT).with_options(api_key="sk-team-b")
    upstream_headers = {
        "x-upstream-note": "comes back",
        "keep-alive": "timeout=5",
        "x-fairshare-priority": "-1000",
        "x-internal-route": "not back either",
    }
    raw = await client.chat.completions.with_raw_response.create(
        model=MODEL,
        messages=MESSAGES,
        max_tokens=2,
        extra_body={"standin_headers": upstream_headers},
    )
    answer = raw.parse()
    # The gateway made an id, sent it upstream and returned it: the SDK reads it.
    assert re.fullmatch(r"[0-9a-f]{32}", raw.request_id or "")
    assert answer._request_id == raw.request_id
    [record] = await stack.records("a")
    received = record["headers"]
    assert isinstance(received, dict)
    assert received["x-request-id"] == raw.request_id
    assert received["traceparent"] == TRACEPARENT
    assert received["tracestate"] == "vendor=1"
    assert received["x-client-note"] == "passes"
    assert received["user-agent"].startswith("AsyncOpenAI/Python")
    assert any(name.startswith("x-stainless-") for name in received)
    for gone in ("authorization", "cookie", "x-api-key", TEAM_HEADER, CLASS_HEADER):
        assert gone not in received, gone
    assert "x-internal-route" not in received  # headers.deny
    assert "accept-encoding" not in received  # the gateway reads the answer uncompressed
    assert received["content-type"] == "application/json"
    # The key's team (team-b), not the header's, within its share; the key names no
    # class, so the class header's (batch) applies.
    assert raw.headers["x-fairshare-priority"] == "1"
    assert raw.headers["x-fairshare-standing"] == "within"
    assert raw.headers["x-upstream-note"] == "comes back"
    assert "keep-alive" not in raw.headers
    assert "x-internal-route" not in raw.headers


async def test_the_clients_request_id_goes_through_streams_and_errors(stack: Stack) -> None:
    client = stack.client("team-a")
    raw = await client.chat.completions.with_raw_response.create(
        model=MODEL,
        messages=MESSAGES,
        max_tokens=3,
        stream=True,
        extra_headers={"x-request-id": "client-chosen-1"},
    )
    assert raw.headers["x-request-id"] == "client-chosen-1"
    chunks = [chunk async for chunk in raw.parse()]
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "tok tok tok"
    [record] = await stack.records("a")
    assert record["headers"]["x-request-id"] == "client-chosen-1"  # type: ignore[index]
    # The gateway's own refusals carry one too, so a failed call can be looked up.
    with pytest.raises(openai.NotFoundError) as unknown:
        await client.chat.completions.create(
            model="nope", messages=MESSAGES, extra_headers={"x-request-id": "client-chosen-2"}
        )
    assert unknown.value.request_id == "client-chosen-2"
    with pytest.raises(openai.AuthenticationError) as refused:
        await stack.client(team=None).chat.completions.create(model=MODEL, messages=MESSAGES)
    assert re.fullmatch(r"[0-9a-f]{32}", refused.value.request_id or "")
    # An id that could not be logged safely is replaced.
    spaced = await client.chat.completions.with_raw_response.create(
        model=MODEL, messages=MESSAGES, max_tokens=1, extra_headers={"x-request-id": "a b"}
    )
    assert re.fullmatch(r"[0-9a-f]{32}", spaced.request_id or "")
