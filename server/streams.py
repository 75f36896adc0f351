"""Open streams of the gRPC server, bounded per client and in total.

A streaming call (``grpc.health.v1.Health/Watch``; server reflection; ``AcquireStream``,
which a gateway keeps open) stays open as long as its client likes, and each costs the
server memory (12 to 23 KiB for an idle health Watch, measured) and a task. The
per-client call limit (``server.intake``) leaves them out: a Watch would hold one of the
client's turns for ever. ``StreamLimit`` is a server interceptor that counts them
instead:

- a client has at most ``max_per_client`` streams open at once; a new one past that is
  refused ``RESOURCE_EXHAUSTED`` with ``fairshare-limit: max_streams_per_client``;
- the server has at most ``max_total`` open, whoever opened them; past that a new one is
  refused the same way with ``fairshare-limit: max_streams``.

A client is what the per-client call limit calls one (``server.intake``): the peer's host
address without its port, with the request's ``holder`` when it has one (no streaming
request of this server has one, so here it is the host). A refused stream ends at once
and keeps nothing. Unary calls, the health ``Check`` included (what probes use), are never
refused here.

Guarantees: at most ``max_total`` streams of wrapped methods run at once, at most
``max_per_client`` of them for one client; a stream counts from its admission until the
call ends (its done callback, whichever way it ends: the client cancels, the handler
returns or raises, the server stops); the interceptor keeps nothing for a client without
open streams, so its own memory is bounded by the streams open. Not guaranteed: handlers
that are neither coroutine nor async generator functions (a synchronous handler run in a
thread) are passed through uncounted; this server registers none.
"""

from __future__ import annotations

import inspect
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, Final

import grpc
from grpc import aio

from fairshare.errors import LimitExceeded
from fairshare.wire.errors import abort
from server.intake import client_of
from server.wrapping import Wrapping

DEFAULT_MAX_STREAMS_PER_CLIENT: Final = 64
"""Streams one client may have open at once."""
DEFAULT_MAX_STREAMS: Final = 1024
"""Streams the server keeps open at once, all clients together (at most about 23 MiB of
idle health Watch streams)."""

_Behavior = Callable[..., Any]
_FACTORIES: Final[dict[str, Callable[..., grpc.RpcMethodHandler]]] = {
    "unary_stream": grpc.unary_stream_rpc_method_handler,
    "stream_unary": grpc.stream_unary_rpc_method_handler,
    "stream_stream": grpc.stream_stream_rpc_method_handler,
}
"""The streaming kinds of handler, by the attribute of ``RpcMethodHandler`` holding it."""


class StreamLimit(Wrapping):
    """See the module doc."""

    def __init__(
        self,
        *,
        max_per_client: int = DEFAULT_MAX_STREAMS_PER_CLIENT,
        max_total: int = DEFAULT_MAX_STREAMS,
        on_refused: Callable[[str], None] | None = None,
    ) -> None:
        """Args:
        max_per_client: streams one client may have open (>= 1).
        max_total: streams open at once in all (>= 1).
        on_refused: called with the limit's name for each stream refused (metrics).
        """
        if max_per_client < 1 or max_total < 1:
            raise ValueError("max_per_client and max_total must be >= 1")
        super().__init__()
        self._max_per_client = max_per_client
        self._max_total = max_total
        self._on_refused = on_refused
        self._open: dict[tuple[str, str], int] = {}
        self._total = 0

    def open_streams(self) -> int:
        """Streams open now (admitted and not ended)."""
        return self._total

    def clients(self) -> int:
        """Clients with streams open now."""
        return len(self._open)

    def takes(self, handler: grpc.RpcMethodHandler) -> bool:
        """Every streaming handler (``Wrapping.takes``)."""
        return bool(handler.request_streaming or handler.response_streaming)

    def wrap(self, method: str, handler: grpc.RpcMethodHandler) -> grpc.RpcMethodHandler:
        """``handler`` with the stream counted or refused before its behavior runs;
        unchanged when its behavior is synchronous (see the module doc)."""
        return _wrap(handler, self._admit)

    async def _admit(self, request: object, context: aio.ServicerContext) -> None:
        """Counts a new stream until its call ends, or refuses it (see the module doc)."""
        client = client_of(context, request)
        mine = self._open.get(client, 0)
        if mine >= self._max_per_client:
            await self._refuse(
                context,
                "max_streams_per_client",
                f"this client already has {mine} streams open, at most {self._max_per_client}",
            )
        if self._total >= self._max_total:
            await self._refuse(
                context,
                "max_streams",
                f"the server already has {self._total} streams open, at most {self._max_total}",
            )
        self._open[client] = mine + 1
        self._total += 1
        context.add_done_callback(lambda _: self._end(client))

    async def _refuse(self, context: aio.ServicerContext, limit: str, message: str) -> None:
        if self._on_refused is not None:
            self._on_refused(limit)
        await abort(context, LimitExceeded(limit, message))

    def _end(self, client: tuple[str, str]) -> None:
        self._total -= 1
        left = self._open[client] - 1
        if left:
            self._open[client] = left
        else:
            del self._open[client]


def _wrap(
    handler: grpc.RpcMethodHandler,
    admit: Callable[[object, aio.ServicerContext], Awaitable[None]],
) -> grpc.RpcMethodHandler:
    """``handler`` with ``admit`` awaited before its behavior runs; unchanged when its
    behavior is synchronous (see the module doc)."""
    for kind, factory in _FACTORIES.items():
        inner: _Behavior | None = getattr(handler, kind)
        if inner is None:
            continue
        if inspect.isasyncgenfunction(inner):
            behavior = _admitted_generator(inner, admit)
        elif inspect.iscoroutinefunction(inner):
            behavior = _admitted_coroutine(inner, admit)
        else:
            return handler
        return factory(
            behavior,
            request_deserializer=handler.request_deserializer,
            response_serializer=handler.response_serializer,
        )
    return handler


def _admitted_coroutine(
    inner: _Behavior, admit: Callable[[object, aio.ServicerContext], Awaitable[None]]
) -> _Behavior:
    # grpc.aio tells a handler that writes with context.write (a coroutine function) from
    # one that yields (an async generator function) by its kind: the wrapper keeps it.
    async def behavior(request: object, context: aio.ServicerContext) -> Any:
        await admit(request, context)
        return await inner(request, context)

    return behavior


def _admitted_generator(
    inner: _Behavior, admit: Callable[[object, aio.ServicerContext], Awaitable[None]]
) -> _Behavior:
    async def behavior(request: object, context: aio.ServicerContext) -> AsyncIterator[Any]:
        await admit(request, context)
        async for response in inner(request, context):
            yield response

    return behavior
