"""The stand-in vLLM server (``fairshare.sim.standin``) as a real process: its scheduling order, its
answer shapes, what it records, its test controls and how it sees a client go away.

Waits are bounded polls of ``/standin/requests``; no test sleeps for a fixed time. Requests
that must hold the only slot ask for many tokens (minutes of work) and are ended by closing
their connection, which is itself what the disconnect tests check.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import aiohttp
import openai
import pytest

from harness.standin import Standin, wait_standin

POLL_S = 0.02
WAIT_S = 10.0
LONG = 10_000
"""Tokens of a request that holds its slot until its client goes (200 s at 50 tokens/s)."""


def _start(workdir: Any, policy: str, *, dev_mode: bool = False) -> Iterator[Standin]:
    standin = Standin(
        workdir, models=("standin", "other"), max_running=1, policy=policy, dev_mode=dev_mode
    )
    standin.start()
    try:
        asyncio.run(wait_standin(standin.url, process=standin))
        yield standin
    finally:
        standin.stop()


@pytest.fixture(scope="module")
def priority_standin(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Standin]:
    yield from _start(tmp_path_factory.mktemp("standin-priority"), "priority")


@pytest.fixture(scope="module")
def fcfs_standin(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Standin]:
    yield from _start(tmp_path_factory.mktemp("standin-fcfs"), "fcfs", dev_mode=True)


@pytest.fixture
async def http(priority_standin: Standin) -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=WAIT_S)) as session:
        await (await session.delete(f"{priority_standin.url}/standin/requests")).release()
        yield session


async def records(url: str) -> list[dict[str, Any]]:
    async with aiohttp.ClientSession() as session, session.get(f"{url}/standin/requests") as r:
        got: list[dict[str, Any]] = await r.json()
        return got


async def wait_records(
    url: str, ready: Callable[[list[dict[str, Any]]], bool], what: str
) -> list[dict[str, Any]]:
    """Polls the records until ``ready`` holds (at most ``WAIT_S``)."""
    deadline = time.monotonic() + WAIT_S
    while True:
        got = await records(url)
        if ready(got):
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {WAIT_S}s: {what}; records: {got}")
        await asyncio.sleep(POLL_S)


class Raw:
    """One request on its own TCP connection, which the test closes when it wants."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer

    @classmethod
    async def send(cls, standin: Standin, path: str, body: dict[str, Any]) -> Raw:
        host, _, port = standin.address.rpartition(":")
        reader, writer = await asyncio.open_connection(host, int(port))
        data = json.dumps(body).encode()
        head = (
            f"POST {path} HTTP/1.1\r\nHost: {standin.address}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(data)}\r\n\r\n"
        )
        writer.write(head.encode() + data)
        await writer.drain()
        return cls(reader, writer)

    async def read_until(self, marker: bytes) -> bytes:
        """Reads until ``marker`` has arrived (bounded by ``WAIT_S``)."""
        seen = b""
        async with asyncio.timeout(WAIT_S):
            while marker not in seen:
                chunk = await self.reader.read(4096)
                if not chunk:
                    break
                seen += chunk
        return seen

    async def close(self) -> None:
        self.writer.close()
        await self.writer.wait_closed()


def chat(max_tokens: int, **extra: Any) -> dict[str, Any]:
    messages = [{"role": "user", "content": "one two three"}]
    return {"model": "standin", "messages": messages, "max_tokens": max_tokens, **extra}


def sse_payloads(text: str) -> list[Any]:
    """The ``data:`` payloads of an SSE body, JSON-decoded but ``[DONE]``."""
    out: list[Any] = []
    for line in text.splitlines():
        if line.startswith("data: "):
            data = line.removeprefix("data: ")
            out.append(data if data == "[DONE]" else json.loads(data))
    return out


def _count_is(count: int) -> Callable[[list[dict[str, Any]]], bool]:
    return lambda got: len(got) == count


async def _start_order(standin: Standin) -> list[int]:
    """Fills the only slot, queues priorities 5, 3, 1 in that arrival order, frees the slot
    and returns the priorities in the order they started."""
    async with aiohttp.ClientSession() as session:
        await (await session.delete(f"{standin.url}/standin/requests")).release()
        blocker = await Raw.send(standin, "/v1/chat/completions", chat(LONG, stream=True))
        await blocker.read_until(b"data: ")
        waiters = []
        for count, priority in enumerate((5, 3, 1), start=2):
            waiters.append(
                asyncio.create_task(
                    session.post(
                        f"{standin.url}/v1/chat/completions", json=chat(1, priority=priority)
                    )
                )
            )
            await wait_records(standin.url, _count_is(count), "arrival")
        await blocker.close()
        for reply in await asyncio.gather(*waiters):
            assert reply.status == 200
            reply.release()
    got = await wait_records(
        standin.url, lambda got: all(r["end_s"] is not None for r in got), "all ended"
    )
    assert got[0]["disconnected"] is True
    started = sorted(got[1:], key=lambda r: r["start_s"])
    return [r["priority"] for r in started]


async def test_priority_orders_waiters_by_priority_then_arrival(
    priority_standin: Standin,
) -> None:
    assert await _start_order(priority_standin) == [1, 3, 5]


async def test_fcfs_ignores_priority(fcfs_standin: Standin) -> None:
    assert await _start_order(fcfs_standin) == [5, 3, 1]


@pytest.mark.parametrize("include_usage", [False, True])
async def test_chat_stream_chunks(
    priority_standin: Standin, http: aiohttp.ClientSession, include_usage: bool
) -> None:
    body = chat(3, stream=True, stream_options={"include_usage": include_usage}, priority=7)
    async with http.post(f"{priority_standin.url}/v1/chat/completions", json=body) as reply:
        assert reply.status == 200
        assert reply.headers["content-type"].startswith("text/event-stream")
        payloads = sse_payloads(await reply.text())
    assert payloads[-1] == "[DONE]"
    chunks = payloads[:-1]
    assert {c["object"] for c in chunks} == {"chat.completion.chunk"}
    assert len({c["id"] for c in chunks}) == 1
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    tokens = [c["choices"][0]["delta"]["content"] for c in chunks[1:4]]
    assert tokens == ["tok ", "tok ", "tok"]
    assert [c["choices"][0]["finish_reason"] for c in chunks[1:4]] == [None, None, "length"]
    if include_usage:
        assert len(chunks) == 5
        assert chunks[4]["choices"] == []
        assert chunks[4]["usage"] == {
            "prompt_tokens": 3,
            "completion_tokens": 3,
            "total_tokens": 6,
        }
    else:
        assert len(chunks) == 4
        assert all("usage" not in c for c in chunks)
    (record,) = await records(priority_standin.url)
    assert record["priority"] == 7
    assert record["stream"] is True
    assert record["include_usage"] is include_usage
    assert record["completion_tokens"] == 3
    assert record["body"] == body
    assert record["arrival_s"] <= record["start_s"] <= record["first_token_s"] <= record["end_s"]


async def test_completions_stream_chunks(
    priority_standin: Standin, http: aiohttp.ClientSession
) -> None:
    body = {"model": "other", "prompt": "a b", "max_tokens": 2, "stream": True}
    body["stream_options"] = {"include_usage": True}
    async with http.post(f"{priority_standin.url}/v1/completions", json=body) as reply:
        payloads = sse_payloads(await reply.text())
    assert payloads[-1] == "[DONE]"
    assert [c["object"] for c in payloads[:-1]] == ["text_completion"] * 3
    assert [c["choices"][0]["text"] for c in payloads[:2]] == ["tok ", "tok"]
    assert payloads[2]["usage"] == {"prompt_tokens": 2, "completion_tokens": 2, "total_tokens": 4}


async def test_non_streaming_usage(priority_standin: Standin, http: aiohttp.ClientSession) -> None:
    body = chat(4, max_completion_tokens=5, priority=-2)
    headers = {"X-Probe": "yes"}
    url = f"{priority_standin.url}/v1/chat/completions"
    async with http.post(url, json=body, headers=headers) as reply:
        answer = await reply.json()
    assert answer["object"] == "chat.completion"
    assert answer["choices"][0]["message"] == {"role": "assistant", "content": "tok " * 4 + "tok"}
    assert answer["usage"] == {"prompt_tokens": 3, "completion_tokens": 5, "total_tokens": 8}
    async with http.post(
        f"{priority_standin.url}/v1/completions", json={"model": "standin", "prompt": "x"}
    ) as reply:
        answer = await reply.json()
    assert answer["object"] == "text_completion"
    assert answer["usage"] == {"prompt_tokens": 1, "completion_tokens": 16, "total_tokens": 17}
    first, second = await records(priority_standin.url)
    assert (first["max_tokens"], first["priority"], first["headers"]["x-probe"]) == (5, -2, "yes")
    assert (second["max_tokens"], second["priority"], second["stream"]) == (16, 0, False)


@pytest.mark.parametrize("stream", [False, True])
async def test_disconnect_frees_the_slot_and_is_recorded(
    priority_standin: Standin, http: aiohttp.ClientSession, stream: bool
) -> None:
    url = priority_standin.url
    running = await Raw.send(priority_standin, "/v1/chat/completions", chat(LONG, stream=stream))
    await wait_records(url, lambda got: bool(got) and got[0]["start_s"] is not None, "running")
    waiting = await Raw.send(priority_standin, "/v1/chat/completions", chat(LONG, stream=stream))
    await wait_records(url, lambda got: len(got) == 2, "second arrived")
    await waiting.close()  # leaves the queue: never starts
    got = await wait_records(url, lambda got: got[1]["disconnected"], "waiter gone")
    assert got[1]["start_s"] is None and got[1]["end_s"] is not None
    await running.close()
    got = await wait_records(url, lambda got: got[0]["disconnected"], "runner gone")
    assert got[0]["end_s"] is not None
    assert got[0]["completion_tokens"] < LONG
    async with http.post(f"{url}/v1/chat/completions", json=chat(1)) as reply:
        assert reply.status == 200  # the only slot is free again
    got = await records(url)
    assert [r["disconnected"] for r in got] == [True, True, False]


async def test_status_control(priority_standin: Standin, http: aiohttp.ClientSession) -> None:
    body = chat(1, standin_status=503)
    async with http.post(f"{priority_standin.url}/v1/chat/completions", json=body) as reply:
        assert reply.status == 503
        error = (await reply.json())["error"]
    assert error["code"] == 503
    assert isinstance(error["message"], str) and isinstance(error["type"], str)


async def test_hang_control(priority_standin: Standin, http: aiohttp.ClientSession) -> None:
    url = priority_standin.url
    hung = await Raw.send(priority_standin, "/v1/chat/completions", chat(1, standin_hang=True))
    await wait_records(url, lambda got: len(got) == 1, "hang arrived")
    async with http.post(f"{url}/v1/chat/completions", json=chat(1)) as reply:
        assert reply.status == 200  # a hung request holds no slot
    assert await records(url) and (await records(url))[0]["end_s"] is None
    await hung.close()
    got = await wait_records(url, lambda got: got[0]["disconnected"], "hang gone")
    assert got[0]["start_s"] is None


async def test_fail_after_control(priority_standin: Standin, http: aiohttp.ClientSession) -> None:
    body = chat(10, stream=True, standin_fail_after=2)
    seen = b""
    with pytest.raises(aiohttp.ClientPayloadError):
        async with http.post(f"{priority_standin.url}/v1/chat/completions", json=body) as reply:
            assert reply.status == 200
            async for chunk in reply.content.iter_any():
                seen += chunk
    payloads = sse_payloads(seen.decode())
    assert [c["choices"][0]["delta"].get("content") for c in payloads] == ["", "tok ", "tok "]
    (record,) = await records(priority_standin.url)
    assert record["completion_tokens"] == 2
    assert record["end_s"] is not None


async def test_models_and_health(priority_standin: Standin, http: aiohttp.ClientSession) -> None:
    async with http.get(f"{priority_standin.url}/v1/models") as reply:
        listing = await reply.json()
    assert listing["object"] == "list"
    assert [(m["id"], m["object"]) for m in listing["data"]] == [
        ("standin", "model"),
        ("other", "model"),
    ]
    async with http.get(f"{priority_standin.url}/health") as reply:
        assert (reply.status, await reply.text()) == (200, "ok")


@pytest.mark.parametrize(
    ("data", "status"),
    [
        (b"{not json", 400),
        (b"[1, 2]", 400),
        (json.dumps({"model": "standin"}).encode(), 400),
        (json.dumps(chat(1) | {"model": "missing"}).encode(), 404),
        (json.dumps(chat(1) | {"priority": "high"}).encode(), 400),
    ],
)
async def test_bad_input(
    priority_standin: Standin, http: aiohttp.ClientSession, data: bytes, status: int
) -> None:
    url = f"{priority_standin.url}/v1/chat/completions"
    async with http.post(url, data=data, headers={"content-type": "application/json"}) as reply:
        assert reply.status == status
        error = (await reply.json())["error"]
    assert error["code"] == status
    assert set(error) >= {"message", "type", "code"}


async def test_server_info_tells_the_policy_only_in_dev_mode(
    priority_standin: Standin, fcfs_standin: Standin
) -> None:
    async with aiohttp.ClientSession() as session:
        url = f"{fcfs_standin.url}/server_info?config_format=json"
        async with session.get(url) as reply:
            info = await reply.json()
        assert info["vllm_config"]["scheduler_config"]["policy"] == "fcfs"
        assert info["vllm_config"]["scheduler_config"]["max_num_seqs"] == 1
        async with session.get(f"{fcfs_standin.url}/server_info") as reply:
            assert isinstance((await reply.json())["vllm_config"], str)
        async with session.get(f"{priority_standin.url}/server_info") as reply:
            assert reply.status == 404  # vLLM without VLLM_SERVER_DEV_MODE=1


async def test_responses_and_embeddings_as_the_openai_sdk_reads_them(
    priority_standin: Standin, http: aiohttp.ClientSession
) -> None:
    client = openai.AsyncOpenAI(
        base_url=priority_standin.url + "/v1", api_key="unused", max_retries=0
    )
    async with client:
        answer = await client.responses.create(
            model="standin", input="one two three", max_output_tokens=3, extra_body={"priority": 4}
        )
        assert answer.output_text == "tok tok tok"
        assert answer.usage is not None
        assert (answer.usage.input_tokens, answer.usage.output_tokens) == (3, 3)
        events = [
            e
            async for e in await client.responses.create(
                model="standin",
                input=[{"role": "user", "content": "one two"}],
                instructions="be brief",
                max_output_tokens=2,
                stream=True,
            )
        ]
        assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == (
            "tok tok"
        )
        assert events[-1].type == "response.completed"
        assert events[-1].response.usage is not None
        assert events[-1].response.usage.input_tokens == 4
        assert [e.sequence_number for e in events] == list(range(len(events)))
        # The SDK asks for base64 unless told otherwise, and decodes it.
        for encoding in ("base64", "float"):
            embedded = await client.embeddings.create(
                model="standin",
                input=["one two", "three"],
                extra_body={"priority": 2},
                **({"encoding_format": "float"} if encoding == "float" else {}),  # type: ignore[arg-type]
            )
            assert [d.embedding for d in embedded.data] == [
                [0.0, 2.0, 0.5, 0.5],
                [1.0, 1.0, 0.5, 0.5],
            ]
            assert embedded.usage.prompt_tokens == 3
    got = await records(priority_standin.url)
    assert [(r["path"], r["priority"], r["status"]) for r in got] == [
        ("/v1/responses", 4, 200),
        ("/v1/responses", 0, 200),
        ("/v1/embeddings", 2, 200),
        ("/v1/embeddings", 2, 200),
    ]
