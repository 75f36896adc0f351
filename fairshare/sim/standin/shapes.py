"""What the stand-in reads from a request body and the JSON shapes it answers with.

The shapes follow vLLM's OpenAI-compatible server: completion objects and SSE chunks
(``chat.completion.chunk`` / ``text_completion``), the usage-only last chunk with
``choices: []``, and the error body ``{"error": {"message", "type", "param", "code"}}``.
One place for all of them, so the handlers only decide *when* to send what.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any

TOKEN = "tok"
"""The text of every generated token ("tok " but the last, "tok")."""

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

    chat: bool
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


def parse(body: Any, *, chat: bool, models: tuple[str, ...], max_tokens_default: int) -> Ask:
    """Reads a request body.

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
    if chat:
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise BadRequest(400, "messages is required")
        prompt_tokens = sum(_words(m.get("content")) for m in messages if isinstance(m, dict))
    else:
        if "prompt" not in body:
            raise BadRequest(400, "prompt is required")
        prompt_tokens = _words(body["prompt"])
    max_tokens = _int_field(body, "max_completion_tokens")
    if max_tokens is None:
        max_tokens = _int_field(body, "max_tokens")
    if max_tokens is None:
        max_tokens = max_tokens_default
    if max_tokens < 1:
        raise BadRequest(400, "max_tokens must be at least 1")
    options = body.get("stream_options")
    include_usage = isinstance(options, dict) and options.get("include_usage") is True
    return Ask(
        chat=chat,
        model=model,
        priority=_int_field(body, "priority") or 0,
        stream=body.get("stream") is True,
        include_usage=include_usage,
        max_tokens=max_tokens,
        prompt_tokens=prompt_tokens,
        status=_int_field(body, "standin_status"),
        hang=body.get("standin_hang") is True,
        fail_after=_int_field(body, "standin_fail_after"),
        headers=_headers_field(body),
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
        self.id = ("chatcmpl-" if ask.chat else "cmpl-") + request_id
        self.created = int(time.time())

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


def sse(payload: dict[str, Any] | str) -> bytes:
    """One Server-Sent Event: ``data: <json>`` (or ``data: [DONE]``) and a blank line."""
    data = payload if isinstance(payload, str) else json.dumps(payload, separators=(",", ":"))
    return f"data: {data}\n\n".encode()
