"""fairshare.gateway.body and fairshare.cost: the pure parts of the request path."""

from __future__ import annotations

import json

import pytest

from fairshare.cost import CostSettings, charge
from fairshare.gateway.body import (
    MAX_EVENT_BYTES,
    BadJson,
    BadRequest,
    StreamFilter,
    Usage,
    estimate_prompt_tokens,
    parse_request,
    response_id_of,
    upstream_body,
    usage_of,
)


def chat(**fields: object) -> bytes:
    return json.dumps(
        {"model": "m", "messages": [{"role": "user", "content": "x" * 40}], **fields}
    ).encode()


def test_parse_and_estimate() -> None:
    request = parse_request(chat(max_tokens=100), "chat")
    assert request.model == "m" and not request.stream
    assert request.prompt_tokens == 10 + 4  # 40 characters, and one message's template
    assert request.est_tokens == 114
    # max_completion_tokens wins over max_tokens.
    assert parse_request(chat(max_tokens=100, max_completion_tokens=7), "chat").max_tokens == 7
    assert parse_request(chat(), "chat").est_tokens == 14  # the prompt alone
    parts = {"role": "user", "content": [{"type": "text", "text": "y" * 8}]}
    assert estimate_prompt_tokens("chat", {"messages": [parts]}) == 2 + 4
    assert estimate_prompt_tokens("completions", {"prompt": "z" * 9}) == 3
    assert estimate_prompt_tokens("completions", {"prompt": [1, 2, 3]}) == 3
    assert estimate_prompt_tokens("completions", {"prompt": ["abcd", "ab"]}) == 2


@pytest.mark.parametrize(
    ("raw", "endpoint", "error"),
    [
        (b"{", "chat", BadJson),
        (b"[1]", "chat", BadJson),
        (b"\xff", "chat", BadJson),
        (b'{"messages": [{"role": "user", "content": "x"}]}', "chat", BadRequest),
        (b'{"model": "m"}', "chat", BadRequest),
        (b'{"model": "m", "messages": []}', "chat", BadRequest),
        (b'{"model": "m"}', "completions", BadRequest),
        (b'{"model": "m"}', "embeddings", BadRequest),
        (b'{"input": "x"}', "responses", BadRequest),
        (b'{"model": "m", "max_output_tokens": -1}', "responses", BadRequest),
        (b'{"model": "m", "previous_response_id": 7}', "responses", BadRequest),
        (b'{"model": "m", "previous_response_id": ""}', "responses", BadRequest),
        (chat(stream="yes"), "chat", BadRequest),
        (chat(stream_options=3), "chat", BadRequest),
        (chat(max_tokens=-1), "chat", BadRequest),
        (chat(max_tokens="ten"), "chat", BadRequest),
    ],
)
def test_bad_bodies(raw: bytes, endpoint: str, error: type[Exception]) -> None:
    with pytest.raises(error):
        parse_request(raw, endpoint)  # type: ignore[arg-type]


def test_priority_is_overwritten_and_usage_asked_for_on_streams() -> None:
    request = parse_request(chat(priority=-100, temperature=0.5, extra={"a": 1}), "chat")
    sent = json.loads(upstream_body(request, 21))
    assert sent["priority"] == 21 and sent["temperature"] == 0.5 and sent["extra"] == {"a": 1}
    assert "stream_options" not in sent  # not a stream
    streaming = parse_request(chat(stream=True, stream_options={"other": 1}), "chat")
    assert not streaming.client_wants_usage
    sent = json.loads(upstream_body(streaming, 0))
    assert sent["stream_options"] == {"other": 1, "include_usage": True}
    assert request.body.get("priority") == -100  # the parsed body is not changed
    asked = parse_request(chat(stream=True, stream_options={"include_usage": True}), "chat")
    assert asked.client_wants_usage


@pytest.mark.parametrize(
    ("raw", "kept"),
    [
        (b'{"model": "m", "messages": [{"content": "\xc3\xa9t\xc3\xa9"}], "n": 1} \r\n', True),
        (chat(priority=3), False),  # the client's priority is overwritten
        (chat(stream=True), False),  # include_usage is added
        (chat().decode().encode("utf-16"), False),  # only UTF-8 is appended to
        (b"\xef\xbb\xbf" + chat(), False),  # nor with a BOM
    ],
)
def test_the_body_sent_is_the_parsed_one_with_the_priority(raw: bytes, kept: bool) -> None:
    request = parse_request(raw, "chat")
    sent = upstream_body(request, -7)
    assert json.loads(sent)["priority"] == -7
    expected = dict(request.body, priority=-7)
    if request.stream:
        expected["stream_options"] = {"include_usage": True}
    assert json.loads(sent) == expected
    assert sent.startswith(raw.rstrip()[:-1]) is kept  # the client's bytes, unchanged


def sse(chunk: object) -> bytes:
    return b"data: " + json.dumps(chunk).encode() + b"\n\n"


TOKEN = {"object": "chat.completion.chunk", "choices": [{"delta": {"content": "tok "}}]}
USAGE = {
    "object": "chat.completion.chunk",
    "choices": [],
    "usage": {"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7},
}
STREAM = sse(TOKEN) + sse(TOKEN) + sse(USAGE) + b"data: [DONE]\n\n"


@pytest.mark.parametrize("size", [1, 3, 7, 1000])
def test_the_usage_chunk_is_read_and_dropped_unless_asked_for(size: int) -> None:
    for keep in (False, True):
        filtered = StreamFilter(keep_usage=keep)
        out = (
            b"".join(filtered.feed(STREAM[i : i + size]) for i in range(0, len(STREAM), size))
            + filtered.finish()
        )
        expected = STREAM if keep else sse(TOKEN) + sse(TOKEN) + b"data: [DONE]\n\n"
        assert out == expected
        assert filtered.usage == Usage(5, 2)


def crlf(event: bytes) -> bytes:
    return event.replace(b"\n", b"\r\n")


@pytest.mark.parametrize("size", [1, 2, 3, 7, 1000])
def test_crlf_framed_events_pass_one_by_one_and_the_usage_is_read(size: int) -> None:
    stream = crlf(sse(TOKEN) + sse(TOKEN)) + crlf(sse(USAGE)) + b"data: [DONE]\r\n\r\n"
    filtered = StreamFilter(keep_usage=False)
    outs = [filtered.feed(stream[i : i + size]) for i in range(0, len(stream), size)]
    out = b"".join(outs) + filtered.finish()
    assert out == crlf(sse(TOKEN) + sse(TOKEN)) + b"data: [DONE]\r\n\r\n"
    assert filtered.usage == Usage(5, 2) and filtered.events == 2
    # The first event goes on as soon as it ended, not at the end of the stream.
    first = len(crlf(sse(TOKEN)))
    passed_by = b"".join(outs[: (first + size - 1) // size])
    assert passed_by.startswith(crlf(sse(TOKEN)))


def test_an_event_never_ended_is_passed_on_within_the_bound() -> None:
    filtered = StreamFilter(keep_usage=False)
    blob = b"data: " + b"x" * (MAX_EVENT_BYTES // 4)
    out = b""
    for _ in range(8):  # twice the bound, in pieces, without an event end
        out += filtered.feed(blob)
        assert len(filtered._partial) <= MAX_EVENT_BYTES + len(blob)
    assert len(out) >= 8 * len(blob) - MAX_EVENT_BYTES - len(blob)
    # Its end, then the usage chunk: read and dropped as usual.
    out += filtered.feed(b"\n\n" + sse(USAGE) + b"data: [DONE]\n\n") + filtered.finish()
    assert out == blob * 8 + b"\n\n" + b"data: [DONE]\n\n"
    assert filtered.usage == Usage(5, 2) and filtered.events == 1


def test_a_cut_stream_counts_the_tokens_seen() -> None:
    request = parse_request(chat(stream=True), "chat")
    filtered = StreamFilter(keep_usage=False)
    assert filtered.feed(sse(TOKEN) + sse(TOKEN) + sse(TOKEN)[:10]) == sse(TOKEN) * 2
    assert filtered.counted(request) == Usage(request.prompt_tokens, 2)
    # Chunks with "usage": null are content, passed as they are.
    nulls = {**TOKEN, "usage": None}
    assert filtered.feed(sse(TOKEN)[10:] + sse(nulls)) == sse(TOKEN) + sse(nulls)
    assert filtered.counted(request) == Usage(request.prompt_tokens, 4)


def test_cost() -> None:
    tokens = CostSettings(unit="tokens", prompt_weight=0.5, completion_weight=2.0)
    assert charge(tokens, usage=Usage(10, 3), upstream_s=9.0) == 11.0
    assert charge(tokens, usage=None, upstream_s=9.0) == 0.0
    seconds = CostSettings(unit="seconds")
    assert charge(seconds, usage=Usage(10, 3), upstream_s=1.5) == 1.5
    assert charge(seconds, usage=None, upstream_s=-1.0) == 0.0


def test_embeddings_and_responses_bodies() -> None:
    embed = parse_request(b'{"model": "m", "input": ["abcd", "ab"], "stream": true}', "embeddings")
    assert (embed.stream, embed.prompt_tokens, embed.est_tokens) == (False, 2, 2)
    assert json.loads(upstream_body(embed, 3)) == {
        "model": "m",
        "input": ["abcd", "ab"],
        "stream": True,
        "priority": 3,
    }
    assert estimate_prompt_tokens("embeddings", {"input": [[1, 2], [3]]}) == 3
    raw = json.dumps(
        {
            "model": "m",
            "instructions": "x" * 8,
            "input": [{"role": "user", "content": [{"type": "input_text", "text": "y" * 4}]}],
            "max_output_tokens": 10,
            "stream": True,
        }
    ).encode()
    responses = parse_request(raw, "responses")
    assert responses.prompt_tokens == 2 + (1 + 4)  # instructions, one item and its template
    assert responses.est_tokens == 7 + 10
    assert responses.client_wants_usage  # every event goes to the client
    sent = upstream_body(responses, 5)
    assert sent.startswith(raw[:-1])  # no stream_options: the Responses stream has its usage
    assert json.loads(sent) == dict(json.loads(raw), priority=5)
    assert parse_request(b'{"model": "m", "input": "zzzz"}', "responses").prompt_tokens == 1
    continued = parse_request(b'{"model": "m", "previous_response_id": "r"}', "responses")
    assert (continued.est_tokens, continued.previous_response_id, continued.store) == (0, "r", True)
    unstored = parse_request(b'{"model": "m", "input": "x", "store": false}', "responses")
    assert (unstored.previous_response_id, unstored.store) == (None, False)
    assert not parse_request(chat(), "chat").store  # only a Responses request is stored


def test_the_id_of_a_responses_answer() -> None:
    assert response_id_of(b'{"id": "resp_1", "object": "response"}') == "resp_1"
    assert response_id_of(b'{"id": 3}') is None
    assert response_id_of(b"not json") is None
    assert response_id_of(b"[1]") is None


def test_the_usage_of_every_answer() -> None:
    assert usage_of({"usage": {"prompt_tokens": 4, "total_tokens": 4}}) == Usage(4, 0)
    responses = {"input_tokens": 3, "output_tokens": 2, "total_tokens": 5}
    assert usage_of({"object": "response", "usage": responses}) == Usage(3, 2)
    completed = {"type": "response.completed", "response": {"usage": responses}}
    assert usage_of(completed) == Usage(3, 2)
    assert usage_of({"type": "response.created", "response": {"usage": None}}) is None
    assert usage_of({"usage": {"total_tokens": 4}}) is None


def typed(kind: str, **fields: object) -> bytes:
    return f"event: {kind}\n".encode() + sse({"type": kind, **fields})


def test_a_responses_stream_passes_whole_and_its_usage_is_read() -> None:
    usage = {"input_tokens": 3, "output_tokens": 2, "total_tokens": 5}
    stream = (
        typed("response.created", response={"usage": None})
        + typed("response.output_text.delta", delta="tok ")
        + typed("response.output_text.delta", delta="tok")
        + crlf(typed("response.completed", response={"usage": usage}))
    )
    filtered = StreamFilter(keep_usage=True)
    out = b"".join(filtered.feed(stream[i : i + 5]) for i in range(0, len(stream), 5))
    assert out + filtered.finish() == stream
    assert filtered.usage == Usage(3, 2)
    assert filtered.response_id is None  # the events above carry no id


def test_a_responses_streams_id_is_read_from_its_first_event() -> None:
    usage = {"input_tokens": 1, "output_tokens": 1, "total_tokens": 2}
    stream = (
        typed("response.created", response={"id": "resp_9", "status": "in_progress"})
        + typed("response.output_text.delta", delta="tok")
        + typed("response.completed", response={"id": "resp_9", "usage": usage})
    )
    filtered = StreamFilter(keep_usage=True, read_id=True)
    assert filtered.feed(stream[:40]) + filtered.feed(stream[40:]) == stream
    assert (filtered.response_id, filtered.usage) == ("resp_9", Usage(1, 1))
    # Without its first event (too long to read, say), from the one with the usage.
    late = StreamFilter(keep_usage=True, read_id=True)
    late.feed(typed("response.completed", response={"id": "resp_8", "usage": usage}))
    assert late.response_id == "resp_8"
    assert StreamFilter(keep_usage=True).feed(stream) == stream  # read_id off: not read


def test_a_clients_request_id_is_not_sent_with_a_responses_request() -> None:
    raw = b'{"model": "m", "input": "x", "request_id": "resp_theirs"}'
    sent = json.loads(upstream_body(parse_request(raw, "responses"), 2))
    assert sent == {"model": "m", "input": "x", "priority": 2}
    chat_raw = chat(request_id="r")  # vLLM's chat request_id makes no stored id: kept
    assert json.loads(upstream_body(parse_request(chat_raw, "chat"), 2))["request_id"] == "r"
