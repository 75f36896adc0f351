"""The one table of the gateway's own error answers, in OpenAI's shape.

Every error the gateway makes itself (not one an upstream sent, which is passed on as it
is) is a ``Refusal`` kind here, answered as ``{"error": {"message", "type", "code"}}`` with
the status of this table, so clients built on the OpenAI SDK raise the matching exception
(``AuthenticationError`` for 401, ``NotFoundError`` for 404, ...).
"""

from __future__ import annotations

import enum
import json
from collections.abc import Mapping
from typing import NamedTuple

from aiohttp import web


class Answer(NamedTuple):
    """How one kind of refusal is answered."""

    status: int
    type: str
    code: str


class Refusal(enum.Enum):
    """Every error answer the gateway makes itself."""

    UNAUTHORIZED = Answer(401, "authentication_error", "invalid_api_key")
    UNKNOWN_MODEL = Answer(404, "invalid_request_error", "model_not_found")
    NOT_FOUND = Answer(404, "invalid_request_error", "not_found")
    METHOD_NOT_ALLOWED = Answer(405, "invalid_request_error", "method_not_allowed")
    BAD_JSON = Answer(400, "invalid_request_error", "invalid_json")
    BAD_FIELD = Answer(400, "invalid_request_error", "invalid_value")
    TOO_LARGE = Answer(413, "invalid_request_error", "request_too_large")
    REFUSED_BY_ALLOCATOR = Answer(429, "rate_limit_error", "allocator_refused")
    FORBIDDEN_BY_ALLOCATOR = Answer(403, "permission_error", "allocator_forbidden")
    ALLOCATOR_ERROR = Answer(502, "allocator_error", "allocator_error")
    NO_OWNER = Answer(503, "service_unavailable", "allocator_unavailable")
    SHUTTING_DOWN = Answer(503, "service_unavailable", "shutting_down")
    UPSTREAM_UNREACHABLE = Answer(502, "upstream_error", "upstream_unreachable")
    UPSTREAM_BROKEN = Answer(502, "upstream_error", "upstream_error")
    UPSTREAM_TIMEOUT = Answer(504, "upstream_error", "upstream_timeout")
    NO_HEALTHY_UPSTREAM = Answer(503, "service_unavailable", "no_healthy_upstream")
    UNKNOWN_POOL = Answer(500, "server_error", "pool_not_configured")


def error_body(refusal: Refusal, message: str) -> dict[str, object]:
    """The JSON object of an error answer."""
    return {"error": {"message": message, "type": refusal.value.type, "code": refusal.value.code}}


def error_response(
    refusal: Refusal, message: str, *, headers: Mapping[str, str] | None = None
) -> web.Response:
    """The HTTP answer of ``refusal``."""
    return web.Response(
        status=refusal.value.status,
        body=json.dumps(error_body(refusal, message)).encode(),
        content_type="application/json",
        headers=headers,
    )


def sse_error_event(refusal: Refusal, message: str) -> bytes:
    """An error sent inside a stream already begun (its status line is gone): one SSE
    event carrying the error object, as vLLM sends one."""
    return b"data: " + json.dumps(error_body(refusal, message)).encode() + b"\n\n"
