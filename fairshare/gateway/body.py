"""What the gateway reads from request bodies and streamed answers, and what it writes.

Requests (``parse_request``): the JSON body must be an object with a string ``model``
and, by endpoint, ``messages`` (a list: ``/v1/chat/completions``), ``prompt``
(``/v1/completions``) or ``input`` (``/v1/embeddings``); ``/v1/responses`` needs nothing
more (a stored conversation may continue without ``input``). ``stream`` and
``stream_options`` are checked when present; an embeddings request never streams. The
rest of the body is forwarded as is (``upstream_body``) but for the fields the gateway
owns: ``priority`` (the grant's, overwriting any value the client sent), on a chat or
completions stream ``stream_options.include_usage: true`` (so the upstream reports what
to charge; a Responses stream always ends with its usage, in ``response.completed``), and
a Responses request's ``request_id``, left out (see below). When only ``priority`` is to
be added (no ``priority`` sent, a UTF-8 body, no usage to ask for, no Responses
``request_id``), it is appended to the client's bytes, which are not serialized again (a large
prompt would cost more to encode than to parse); otherwise the body is encoded anew from
the parsed object.

Token estimate, what ``est_tokens`` of an Acquire carries: the prompt's, estimated without
tokenizing (``estimate_prompt_tokens``, the core's ``fairshare.estimate``), plus the
completion's bound: ``max_completion_tokens`` or else ``max_tokens`` (``max_output_tokens``
for Responses, none for embeddings); when the body gives none, the prompt's alone.

Streams (``StreamFilter``): Server-Sent Events pass through chunk by chunk as they arrive,
with two exceptions: an event carrying a non-null ``usage`` is read (the charge), and, when
the client did not ask for usage itself, the usage-only chunk (``choices: []``) is dropped.
If the stream is cut before the usage chunk, the completion tokens counted are the content
events seen (vLLM sends one token per event unless it batches) and the prompt tokens are
the estimate. Lines may end with ``\n`` or ``\r\n`` (an event ends at an empty line);
they are passed on as they came. An event not ended within ``MAX_EVENT_BYTES`` is passed on
as it is, unread, so a stream that never frames its events still flows and the filter's
memory stays bounded. A Responses stream's events (``event: response.…`` then ``data:``)
are read the same way: the usage is the ``response.usage`` of ``response.completed``, and
every event counts toward the tokens seen (a few more than the text deltas).

Stored responses: a Responses request's ``previous_response_id`` (a string, or null) and
``store`` (a boolean, true when absent, as in OpenAI's API) are read, and its
``request_id`` is not sent upstream: vLLM makes it the answer's id, and a client choosing
ids could take another team's. The answer's ``id`` is read from a whole answer
(``response_id_of``), and from a stream's ``response.created`` event, or else the first
event that carries the response's usage (the filter's ``response_id``, with ``read_id``).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

from fairshare.cost import Usage
from fairshare.estimate import Endpoint, estimate_prompt_tokens

EVENT_END: Final = re.compile(rb"(\r?\n\r?\n)")
"""The end of an SSE event: an empty line, after a line ended with LF or CRLF."""
DONE_EVENT: Final = b"data: [DONE]"
EVENT_FIELD: Final = b"event:"
"""The line that names a typed event (the Responses API's), before its ``data:`` line."""
MAX_EVENT_BYTES: Final = 1024 * 1024
"""Bytes of one event kept for reading; a longer one is passed on unread."""
USAGE_FIELDS: Final = (
    ("prompt_tokens", "completion_tokens"),
    ("input_tokens", "output_tokens"),
)
"""The names of a usage's two counts: chat, completions and embeddings; Responses."""
CLIENT_ID_FIELD: Final = "request_id"
"""A Responses request's field that vLLM makes the answer's id: not sent upstream."""
CREATED_EVENT: Final = b"response.created"
"""The first event of a Responses stream, which names the response."""
KEPT_TAIL: Final = 3
"""Bytes kept back when an over-long event is passed on: a part of its end (``\r\n\r``)."""


class BadRequest(ValueError):
    """The body is not a valid request; the message says why (answer 400)."""


class BadJson(BadRequest):
    """The body is not a JSON object at all."""


@dataclass
class Request:
    """One parsed request body."""

    endpoint: Endpoint
    body: dict[str, object]
    model: str
    stream: bool
    client_wants_usage: bool
    prompt_tokens: int
    max_tokens: int
    raw: bytes = b""
    """The body as the client sent it (empty: unknown, ``upstream_body`` encodes anew)."""
    previous_response_id: str | None = None
    """A Responses request's stored response to continue (None: none, or not Responses)."""
    store: bool = False
    """Whether a Responses request asks its answer to be stored (see the module doc)."""

    @property
    def est_tokens(self) -> int:
        """Estimated prompt tokens plus the completion's bound (see the module doc)."""
        return self.prompt_tokens + self.max_tokens

    @property
    def asks_usage(self) -> bool:
        """Whether ``stream_options.include_usage`` is to be set (a chat or completions
        stream)."""
        return self.stream and self.endpoint in ("chat", "completions")


def _max_tokens(body: Mapping[str, object], endpoint: Endpoint) -> int:
    names: tuple[str, ...] = ("max_completion_tokens", "max_tokens")
    if endpoint == "responses":
        names = ("max_output_tokens",)
    elif endpoint == "embeddings":
        names = ()
    for name in names:
        value = body.get(name)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise BadRequest(f"{name} must be a non-negative integer, got {value!r}")
        return value
    return 0


def parse_request(raw: bytes, endpoint: Endpoint) -> Request:
    """Reads and checks a request body.

    Raises:
        BadJson: not a JSON object.
        BadRequest: a required field is missing or a field has the wrong type.
    """
    try:
        body = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise BadJson(f"the body is not valid JSON: {e}") from None
    if not isinstance(body, dict):
        raise BadJson("the body must be a JSON object")
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise BadRequest("'model' is required (a string)")
    if endpoint == "chat":
        if not isinstance(body.get("messages"), list) or not body["messages"]:
            raise BadRequest("'messages' is required (a non-empty list)")
    elif endpoint == "completions" and "prompt" not in body:
        raise BadRequest("'prompt' is required")
    elif endpoint == "embeddings" and "input" not in body:
        raise BadRequest("'input' is required")
    stream = body.get("stream", False)
    if stream is None or endpoint == "embeddings":
        stream = False
    if not isinstance(stream, bool):
        raise BadRequest(f"'stream' must be a boolean, got {stream!r}")
    options = body.get("stream_options")
    if options is not None and not isinstance(options, dict):
        raise BadRequest("'stream_options' must be an object")
    # A Responses stream carries its usage in an event the client reads as any other.
    wants_usage = endpoint == "responses" or bool(options and options.get("include_usage"))
    previous, store = None, False
    if endpoint == "responses":
        previous = body.get("previous_response_id")
        if previous is not None and (not isinstance(previous, str) or not previous):
            raise BadRequest(f"'previous_response_id' must be a string, got {previous!r}")
        store = body.get("store", True) is not False
    return Request(
        endpoint=endpoint,
        body=body,
        model=model,
        stream=stream,
        client_wants_usage=wants_usage,
        prompt_tokens=estimate_prompt_tokens(endpoint, body),
        max_tokens=_max_tokens(body, endpoint),
        raw=raw,
        previous_response_id=previous,
        store=store,
    )


def upstream_body(request: Request, priority: int) -> bytes:
    """The body sent upstream: the client's, with the grant's ``priority`` (overwriting the
    client's), on a chat or completions stream ``stream_options.include_usage: true``, and
    without a Responses request's ``request_id``.

    Guaranteed: it decodes to the parsed body with those fields set and that one left out
    (see the module doc for when the client's bytes are kept).
    """
    if _appendable(request):
        return request.raw.rstrip()[:-1] + b',"priority":%d}' % priority
    body = dict(request.body)
    body["priority"] = priority
    if request.endpoint == "responses":
        body.pop(CLIENT_ID_FIELD, None)
    if request.asks_usage:
        options = dict(body.get("stream_options") or {})  # type: ignore[call-overload]
        options["include_usage"] = True
        body["stream_options"] = options
    return json.dumps(body, separators=(",", ":")).encode()


def _appendable(request: Request) -> bool:
    """Whether ``priority`` may be appended to the client's bytes: nothing else changes and
    they are UTF-8 (``json.loads`` also takes UTF-16 and UTF-32, and a BOM). The parse
    checked that they are one JSON object with a member (``model``), so they end with
    ``}`` after JSON whitespace, which ``bytes.rstrip`` removes."""
    return (
        bool(request.raw)
        and not request.asks_usage
        and "priority" not in request.body
        and not (request.endpoint == "responses" and CLIENT_ID_FIELD in request.body)
        and json.detect_encoding(request.raw) == "utf-8"
    )


def usage_of(answer: object) -> Usage | None:
    """The ``usage`` of a decoded answer or chunk, or None when it has none.

    Read: ``prompt_tokens`` and ``completion_tokens`` (0 when absent: an embeddings answer
    has none), or a Responses object's ``input_tokens`` and ``output_tokens``, at the top
    or under ``response`` (a Responses stream's ``response.completed`` event).
    """
    if not isinstance(answer, Mapping):
        return None
    usage = answer.get("usage")
    if usage is None and isinstance(answer.get("response"), Mapping):
        usage = answer["response"].get("usage")
    if not isinstance(usage, Mapping):
        return None
    for prompt_name, completion_name in USAGE_FIELDS:
        prompt, completion = usage.get(prompt_name), usage.get(completion_name, 0)
        if isinstance(prompt, int) and isinstance(completion, int):
            return Usage(prompt_tokens=prompt, completion_tokens=completion)
    return None


def usage_of_body(raw: bytes) -> Usage | None:
    """The ``usage`` of a non-streaming answer's body, or None (not JSON, or none)."""
    try:
        return usage_of(json.loads(raw))
    except (UnicodeDecodeError, json.JSONDecodeError):
        return None


def response_id_of(raw: bytes) -> str | None:
    """The ``id`` of a whole Responses answer, or None (not JSON, or none)."""
    try:
        answer = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError):
        return None
    return _id_of(answer)


def _id_of(response: object) -> str | None:
    value = response.get("id") if isinstance(response, Mapping) else None
    return value if isinstance(value, str) and value else None


class StreamFilter:
    """Passes a stream's SSE events through, reading and maybe dropping the usage chunk.

    ``feed`` takes the bytes as they come from the upstream and returns those to send on
    now (whole events only: a partial event waits for its end); ``finish`` returns what is
    left at the end of the stream.
    """

    def __init__(self, *, keep_usage: bool, read_id: bool = False) -> None:
        self.keep_usage = keep_usage
        self.read_id = read_id
        self.usage: Usage | None = None
        self.response_id: str | None = None
        """With ``read_id``: a Responses stream's response id (see the module doc)."""
        self.events = 0  # content events passed (an estimate of completion tokens)
        self._partial = b""
        self._unread = False  # passing on the rest of an over-long event

    def feed(self, data: bytes) -> bytes:
        """The bytes to send on for ``data`` (see the class doc)."""
        if self._partial:
            data = self._partial + data
            self._partial = b""
        passed = b""
        if self._unread:
            found = EVENT_END.search(data)
            if found is None:
                return self._pass_unread(data)
            passed, data = data[: found.end()], data[found.end() :]
            self._unread = False
        parts = EVENT_END.split(data)  # event, its end, event, its end, ..., the rest
        rest = parts[-1]
        self._partial = rest
        tail = self._pass_unread(rest) if len(rest) > MAX_EVENT_BYTES else b""
        whole = data[: len(data) - len(rest)]
        if b'"usage"' not in whole and not self._id_in(whole):  # the common case
            self.events += len(parts) // 2 - whole.count(DONE_EVENT)
            return passed + whole + tail
        out = [self._event(parts[i], parts[i + 1]) for i in range(0, len(parts) - 1, 2)]
        return passed + b"".join(out) + tail

    def _id_in(self, data: bytes) -> bool:
        """Whether ``data`` may hold the response id still to be read."""
        return self.read_id and self.response_id is None and CREATED_EVENT in data

    def _pass_unread(self, data: bytes) -> bytes:
        """Passes on an event too long to keep, but for its last bytes (they may begin its
        end); the rest of it, up to its end, is passed on as it comes."""
        if not self._unread:
            self._unread = True
            self.events += 1
        self._partial = data[-KEPT_TAIL:]
        return data[:-KEPT_TAIL]

    def finish(self) -> bytes:
        """What is left (an event the upstream did not end)."""
        rest, self._partial = self._partial, b""
        return rest

    def _event(self, event: bytes, end: bytes) -> bytes:
        kept = event + end
        event = event.lstrip(b"\r\n")  # after an extra empty line
        if event.startswith(DONE_EVENT):
            return kept
        if event.startswith(EVENT_FIELD):  # a typed event: its data on the next line
            event = event[event.find(b"\n") + 1 :] if b"\n" in event else b""
        readable = b'"usage"' in event or self._id_in(event)
        if not event.startswith(b"data:") or not readable:
            self.events += 1
            return kept
        try:
            chunk = json.loads(event[5:])
        except (UnicodeDecodeError, json.JSONDecodeError):
            self.events += 1
            return kept
        if self.read_id and self.response_id is None and isinstance(chunk, Mapping):
            self.response_id = _id_of(chunk.get("response"))
        usage = usage_of(chunk)
        if usage is None:
            self.events += 1
            return kept
        self.usage = usage
        usage_only = isinstance(chunk, Mapping) and not chunk.get("choices")
        if usage_only and not self.keep_usage:
            return b""
        return kept

    def counted(self, request: Request) -> Usage:
        """The usage to charge: the upstream's when it sent it, else what was seen."""
        if self.usage is not None:
            return self.usage
        return Usage(prompt_tokens=request.prompt_tokens, completion_tokens=self.events)
