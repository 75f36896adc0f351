"""What every request of the API port goes through around its handler: its request id.

``install`` adds to the API application a middleware that gives each request its id
(``fairshare.gateway.headers.request_id``: the client's ``x-request-id``, or a new one)
before its handler runs, and a hook that puts that id on the answer's ``x-request-id``
when its status line goes out, whatever answers: the proxy, a refusal, a stream, or
aiohttp itself.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Final

from aiohttp import web

from fairshare.gateway.headers import REQUEST_ID, request_id

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

ID_KEY: Final = web.RequestKey("request_id", str)
"""Where a request keeps its id (aiohttp's request mapping)."""


def id_of(request: web.Request) -> str:
    """The request's id (given one on first use, for a request the middleware did not
    see)."""
    found = request.get(ID_KEY)
    if found is None:
        found = request[ID_KEY] = request_id(request.headers)
    return found


@web.middleware
async def _with_id(request: web.Request, handler: Handler) -> web.StreamResponse:
    request[ID_KEY] = request_id(request.headers)
    return await handler(request)


async def _id_on_answer(request: web.Request, response: web.StreamResponse) -> None:
    response.headers[REQUEST_ID] = id_of(request)


def install(app: web.Application) -> None:
    """Adds the middleware and the answer hook to ``app`` (before it starts)."""
    app.middlewares.append(_with_id)
    app.on_response_prepare.append(_id_on_answer)
