"""What the stand-in reads from a request body and the JSON shapes it answers with.

The shapes follow vLLM's OpenAI-compatible server: completion objects and SSE chunks
(``chat.completion.chunk`` / ``text_completion``), the usage-only last chunk with
``choices: []``, Responses API objects and their typed events (``event: response.…``, the
usage in ``response.completed``), embeddings (floats, or base64 of little-endian float32
as the OpenAI SDK asks by default), and the error body
``{"error": {"message", "type", "param", "code"}}``. One place for all of them, so the
handlers only decide *when* to send what.
"""

from __future__ import annotations

import base64
import json
import struct
import time
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any, Literal

Kind = Literal["chat", "completions", "responses", "embeddings"]

TOKEN = "tok"
"""The text of every generated token ("tok " but the last, "tok")."""
EMBEDDING_DIMS = 4
"""The length of every embedding vector."""

ERROR_TYPES = {
    400: "BadRequestError",
    401: "AuthenticationError",
    403: "PermissionDeniedError",
    404: "NotFoundError",
    413: "RequestEntityTooLarge",
    422: "UnprocessableEntityError",
    429: "RateLimitError",
}


class BadRequest(Exception):
    """A body the stand-in refuses: ``status`` and a message for the error body."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class Ask:
    """One parsed request: what to generate and the test controls it carries."""

    kind: Kind
    model: str
    priority: int
    stream: bool
    include_usage: bool
    max_tokens: int
    prompt_tokens: int
    status: int | None
    hang: bool
    fail_after: int | None
    headers: tuple[tuple[str, str], ...] = ()
    """Headers the answer carries (``standin_headers``: {name: value}), to see what a
    proxy in front passes back."""
    inputs: tuple[int, ...] = ()
    """Embeddings: the tokens of each input."""
    base64: bool = False
    """Embeddings: ``encoding_format: base64``."""

    @property
    def chat(self) -> bool:
        return self.kind == "chat"


def error_body(status: int, message: str) -> dict[str, Any]:
    """vLLM's error object for an HTTP status."""
    server_side = status >= HTTPStatus.INTERNAL_SERVER_ERROR
    kind = ERROR_TYPES.get(status, "InternalServerError" if server_side else "BadRequestError")
    return {"error": {"message": message, "type": kind, "param": None, "code": status}}


def _int_field(body: dict[str, Any], name: str) -> int | None:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise BadRequest(400, f"{name} must be an integer")
    return value


def _words(value: Any) -> int:
    if isinstance(value, str):
        return len(value.split())
    if isinstance(value, list):  # content parts, or a list of prompts
        return sum(
            _words(part.get("text", "") if isinstance(part, dict) else part) for part in value
        )
    return 0


def _input_tokens(value: Any) -> tuple[int, ...]:
    """Embeddings: the tokens of each input (a string, strings, token ids, lists of ids)."""
    if isinstance(value, str):
        return (len(value.split()),)
    if isinstance(value, list) and value and all(isinstance(t, int) for t in value):
        return (len(value),)
    if isinstance(value, list) and value:
        return tuple(len(v) if isinstance(v, list) else _words(v) for v in value)
    raise BadRequest(400, "input is required")


def _prompt_tokens(body: dict[str, Any], kind: Kind) -> int:
    if kind == "chat":
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise BadRequest(400, "messages is required")
        return sum(_words(m.get("content")) for m in messages if isinstance(m, dict))
    if kind == "responses":
        items = body.get("input")
        if isinstance(items, list):
            words = sum(_words(i.get("content")) for i in items if isinstance(i, dict))
        else:
            words = _words(items)
        return words + _words(body.get("instructions"))
    if kind == "embeddings":
        return sum(_input_tokens(body.get("input")))
    if "prompt" not in body:
        raise BadRequest(400, "prompt is required")
    return _words(body["prompt"])


def _max_tokens(body: dict[str, Any], kind: Kind, default: int) -> int:
    names = (
        ("max_output_tokens",) if kind == "responses" else ("max_completion_tokens", "max_tokens")
    )
    for name in names:
        value = _int_field(body, name)
        if value is not None:
            if value < 1:
                raise BadRequest(400, f"{name} must be at least 1")
            return value
    return default


def parse(body: Any, *, kind: Kind, models: tuple[str, ...], max_tokens_default: int) -> Ask:
    """Reads a request body of endpoint ``kind``.

    Raises:
        BadRequest: 400 for a body that is not an object or misses its fields, 404 for a model
            the stand-in does not serve.
    """
    if not isinstance(body, dict):
        raise BadRequest(400, "the body must be a JSON object")
    model = body.get("model")
    if not isinstance(model, str):
        raise BadRequest(400, "model is required")
    if model not in models:
        raise BadRequest(404, f"The model `{model}` does not exist.")
    prompt_tokens = _prompt_tokens(body, kind)
    embeddings = kind == "embeddings"
    max_tokens = 0 if embeddings else _max_tokens(body, kind, max_tokens_default)
    options = body.get("stream_options")
    include_usage = isinstance(options, dict) and options.get("include_usage") is True
    return Ask(
        kind=kind,
        model=model,
        priority=_int_field(body, "priority") or 0,
        stream=body.get("stream") is True and not embeddings,
        include_usage=include_usage,
        max_tokens=max_tokens,
        prompt_tokens=prompt_tokens,
        status=_int_field(body, "standin_status"),
        hang=body.get("standin_hang") is True,
        fail_after=_int_field(body, "standin_fail_after"),
        headers=_headers_field(body),
        inputs=_input_tokens(body.get("input")) if embeddings else (),
        base64=body.get("encoding_format") == "base64",
    )


def _headers_field(body: dict[str, Any]) -> tuple[tuple[str, str], ...]:
    value = body.get("standin_headers")
    if value is None:
        return ()
    if not isinstance(value, dict) or not all(isinstance(v, str) for v in value.values()):
        raise BadRequest(400, "standin_headers must be an object of strings")
    return tuple((str(k), v) for k, v in value.items())


def token_text(index: int, count: int) -> str:
    """The text of token ``index`` of ``count``."""
    return TOKEN if index == count - 1 else TOKEN + " "


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {
        "prompt_tokens": prompt_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "completion_tokens": completion_tokens,
    }


class Shapes:
    """The objects of one answer (one id, one creation time)."""

    def __init__(self, ask: Ask, request_id: str) -> None:
        self.ask = ask
        prefix = {"chat": "chatcmpl-", "completions": "cmpl-", "responses": "resp_"}
        self.id = prefix.get(ask.kind, "embd-") + request_id
        self.created = int(time.time())
        self._sequence = 0

    def _head(self, obj: str) -> dict[str, Any]:
        return {"id": self.id, "object": obj, "created": self.created, "model": self.ask.model}

    def _chunk(self, choices: list[dict[str, Any]]) -> dict[str, Any]:
        return self._head("chat.completion.chunk" if self.ask.chat else "text_completion") | {
            "choices": choices
        }

    def role_chunk(self) -> dict[str, Any]:
        """The first chunk of a chat stream: the role, empty content (vLLM sends it first)."""
        choice = {
            "index": 0,
            "delta": {"role": "assistant", "content": ""},
            "logprobs": None,
            "finish_reason": None,
        }
        return self._chunk([choice])

    def token_chunk(self, index: int) -> dict[str, Any]:
        """The chunk carrying token ``index``; the last one has ``finish_reason: length``."""
        text = token_text(index, self.ask.max_tokens)
        finish = "length" if index == self.ask.max_tokens - 1 else None
        if self.ask.chat:
            choice: dict[str, Any] = {"index": 0, "delta": {"content": text}}
            choice |= {"logprobs": None, "finish_reason": finish}
        else:
            choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish}
            choice["stop_reason"] = None
        return self._chunk([choice])

    def usage_chunk(self, completion_tokens: int) -> dict[str, Any]:
        """The last chunk when the client asked for usage: no choices, only usage."""
        return self._chunk([]) | {"usage": usage(self.ask.prompt_tokens, completion_tokens)}

    def completion(self) -> dict[str, Any]:
        """The whole answer of a non-streaming request."""
        text = "".join(token_text(i, self.ask.max_tokens) for i in range(self.ask.max_tokens))
        if self.ask.chat:
            choice: dict[str, Any] = {
                "index": 0,
                "message": {"role": "assistant", "content": text},
                "logprobs": None,
                "finish_reason": "length",
            }
            obj = "chat.completion"
        else:
            choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": "length"}
            obj = "text_completion"
        ask = self.ask
        return self._head(obj) | {
            "choices": [choice],
            "usage": usage(ask.prompt_tokens, ask.max_tokens),
        }

    def whole(self) -> dict[str, Any]:
        """The whole answer of a non-streaming request of any kind."""
        if self.ask.kind == "responses":
            return self.response(self.ask.max_tokens)
        if self.ask.kind == "embeddings":
            return self.embeddings()
        return self.completion()

    def _text(self, count: int) -> str:
        return "".join(token_text(i, self.ask.max_tokens) for i in range(count))

    @staticmethod
    def _text_part(text: str) -> dict[str, Any]:
        return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}

    def _item(self, text: str, done: bool) -> dict[str, Any]:
        return {
            "type": "message",
            "id": "msg_" + self.id,
            "status": "completed" if done else "in_progress",
            "role": "assistant",
            "content": [self._text_part(text)] if done else [],
        }

    def response(self, completion_tokens: int | None) -> dict[str, Any]:
        """A Responses API object: in progress (``None``: no output, no usage yet) or
        completed with ``completion_tokens`` of text."""
        done = completion_tokens is not None
        usage = None
        if completion_tokens is not None:
            prompt = self.ask.prompt_tokens
            usage = {
                "input_tokens": prompt,
                "input_tokens_details": {"cached_tokens": 0},
                "output_tokens": completion_tokens,
                "output_tokens_details": {"reasoning_tokens": 0},
                "total_tokens": prompt + completion_tokens,
            }
        return {
            "id": self.id,
            "object": "response",
            "created_at": self.created,
            "model": self.ask.model,
            "status": "completed" if done else "in_progress",
            "output": [self._item(self._text(completion_tokens or 0), True)] if done else [],
            "parallel_tool_calls": True,
            "tool_choice": "auto",
            "tools": [],
            "usage": usage,
        }

    def embeddings(self) -> dict[str, Any]:
        """An embeddings answer: one vector per input (its index and tokens in it), as
        floats or as base64 of little-endian float32."""
        data = []
        for index, tokens in enumerate(self.ask.inputs):
            vector = [float(index), float(tokens)] + [0.5] * (EMBEDDING_DIMS - 2)
            encoded: object = vector
            if self.ask.base64:
                packed = struct.pack(f"<{len(vector)}f", *vector)
                encoded = base64.b64encode(packed).decode()
            data.append({"index": index, "object": "embedding", "embedding": encoded})
        prompt = self.ask.prompt_tokens
        return {
            "id": self.id,
            "object": "list",
            "created": self.created,
            "model": self.ask.model,
            "data": data,
            "usage": {"prompt_tokens": prompt, "total_tokens": prompt, "completion_tokens": 0},
        }


def sse(payload: dict[str, Any] | str) -> bytes:
    """One Server-Sent Event: ``data: <json>`` (or ``data: [DONE]``) and a blank line."""
    data = payload if isinstance(payload, str) else json.dumps(payload, separators=(",", ":"))
    return f"data: {data}\n\n".encode()


class StreamShapes(Shapes):
    """The events of a stream, as bytes to send: its head, one event per token, its tail.

    Chat and completions: the role chunk (chat), token chunks, the usage chunk when asked
    for, ``[DONE]``. Responses: ``response.created``, ``response.in_progress``, the output
    item and content part added, one ``response.output_text.delta`` per token, the text,
    part and item done, and ``response.completed`` with the usage.
    """

    def head(self) -> list[bytes]:
        if self.ask.kind != "responses":
            return [sse(self.role_chunk())] if self.ask.chat else []
        return [
            self._typed("response.created", response=self.response(None)),
            self._typed("response.in_progress", response=self.response(None)),
            self._typed("response.output_item.added", output_index=0, item=self._item("", False)),
            self._typed("response.content_part.added", **self._at(), part=self._text_part("")),
        ]

    def token(self, index: int) -> bytes:
        if self.ask.kind != "responses":
            return sse(self.token_chunk(index))
        delta = token_text(index, self.ask.max_tokens)
        return self._typed("response.output_text.delta", **self._at(), delta=delta)

    def tail(self, completion_tokens: int) -> list[bytes]:
        if self.ask.kind != "responses":
            usage_chunk = (
                [sse(self.usage_chunk(completion_tokens))] if self.ask.include_usage else []
            )
            return [*usage_chunk, sse("[DONE]")]
        text = self._text(completion_tokens)
        return [
            self._typed("response.output_text.done", **self._at(), text=text),
            self._typed("response.content_part.done", **self._at(), part=self._text_part(text)),
            self._typed("response.output_item.done", output_index=0, item=self._item(text, True)),
            self._typed("response.completed", response=self.response(completion_tokens)),
        ]

    def _at(self) -> dict[str, Any]:
        return {"item_id": "msg_" + self.id, "output_index": 0, "content_index": 0}

    def _typed(self, kind: str, **fields: Any) -> bytes:
        """One Responses API event: ``event: <type>`` and its data, numbered."""
        data = {"type": kind, "sequence_number": self._sequence, **fields}
        self._sequence += 1
        return f"event: {kind}\n".encode() + sse(data)
