"""The door of the gRPC server: malformed messages and per-client fairness, in one place.

``Intake`` is a server interceptor that wraps every unary-unary handler:

- Its request deserializer never raises. A body that does not parse (bad UTF-8 in a
  string field, a truncated or garbled message) is answered ``INVALID_ARGUMENT`` with the
  field ``request``, before authentication and before any handler runs, and logged as one
  warning line, at most one per ``warn_every_s`` (the lines in between are counted and
  the count is said in the next one). Without this, grpc.aio answers UNKNOWN and logs a
  traceback per request, which any client can turn into a log flood.
- Calls of one client run at most ``max_calls`` at a time; further calls of that client
  wait their turn (FIFO), up to ``max_waiting`` of them, and beyond that are refused with
  ``RESOURCE_EXHAUSTED`` (limit ``max_calls_per_client``). A flooding client therefore
  sees its own calls queue and then refused, while another client's calls keep running
  beside at most ``max_calls`` of the flood's.

A client is the peer's host address (the port is dropped: one gateway may open several
connections) with the request's ``holder`` when it has one, so gateways behind one
address (or replicas forwarding for many holders) get a budget each. This is fairness
between honest clients, not a defence against one that invents holder names: that needs
authenticated identities (mutual TLS) and a limit at the network's edge.

Health checks are outside the per-client limit (see ``UNLIMITED_PREFIXES``).

Guarantees: the interceptor keeps no state for a client without calls in flight, so its
memory is bounded by the calls in flight. Streaming handlers (health watch, reflection)
are passed through unchanged, but for the deserializer of ``CHECKED_STREAMS``
(``AcquireStream``), which never raises either: ``server.streams`` bounds them, per
client as ``client_of`` says and in total.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Final, NoReturn

import grpc
from grpc import aio

from fairshare.errors import InvalidArgument, LimitExceeded
from fairshare.wire.errors import abort
from server.wrapping import Wrapping

logger = logging.getLogger(__name__)

DEFAULT_MAX_CALLS: Final = 32
"""Calls of one client that run at once."""
DEFAULT_MAX_WAITING: Final = 1024
"""Calls of one client that may wait for their turn; beyond, RESOURCE_EXHAUSTED."""
DEFAULT_WARN_EVERY_S: Final = 10.0
"""Least time between two warnings about malformed messages."""

ACQUIRE_STREAM: Final = "/fairshare.v1.Allocator/AcquireStream"
CHECKED_STREAMS: Final = (ACQUIRE_STREAM,)
"""The stream-stream methods whose messages the intake parses without raising; their
handlers meet each ``Malformed`` message themselves. Others (reflection) are left as
they are."""
UNLIMITED_PREFIXES: Final = ("/grpc.health.v1.Health/",)
"""Methods outside the per-client limit: a health check is cheap, and a probe that waited
behind a flood from its host would get the replica restarted."""


@dataclass(frozen=True, slots=True)
class Malformed:
    """What the deserializer returns for a body that does not parse."""

    reason: str


@dataclass(slots=True)
class _Client:
    turns: asyncio.Semaphore  # one permit per call that may run
    running: int = 0
    waiting: int = 0


_Behavior = Callable[[Any, aio.ServicerContext], Awaitable[Any]]


def _safe(deserializer: Callable[[bytes], Any] | None) -> Callable[[bytes], Any]:
    def parse(data: bytes) -> Any:
        try:
            return deserializer(data) if deserializer is not None else data
        except Exception as e:  # DecodeError, and anything a parser may raise
            return Malformed(f"{type(e).__name__}: {e}"[:200])

    return parse


def peer_host(peer: str) -> str:
    """``ipv4:10.0.0.7:51234`` -> ``ipv4:10.0.0.7``; ``ipv6:[::1]:5`` -> ``ipv6:[::1]``."""
    host, sep, port = peer.rpartition(":")
    return host if sep and port.isdigit() and host not in ("ipv4", "ipv6", "unix") else peer


class Intake(Wrapping):
    """See the module doc."""

    def __init__(
        self,
        *,
        max_calls: int = DEFAULT_MAX_CALLS,
        max_waiting: int = DEFAULT_MAX_WAITING,
        warn_every_s: float = DEFAULT_WARN_EVERY_S,
        on_malformed: Callable[[str], None] | None = None,
        on_refused: Callable[[str], None] | None = None,
    ) -> None:
        """Args:
        max_calls: calls of one client that run at once (>= 1).
        max_waiting: calls of one client that may wait (>= 0).
        warn_every_s: least time between two malformed-message warnings.
        on_malformed: called with the method of each malformed message (metrics).
        on_refused: called with the method of each call refused by the client limit.
        """
        if max_calls < 1 or max_waiting < 0:
            raise ValueError("max_calls must be >= 1 and max_waiting >= 0")
        super().__init__()
        self._max_calls = max_calls
        self._max_waiting = max_waiting
        self._warn_every_s = warn_every_s
        self._on_malformed = on_malformed
        self._on_refused = on_refused
        self._clients: dict[tuple[str, str], _Client] = {}
        self._warned_at = -float("inf")
        self._unwarned = 0

    def clients(self) -> int:
        """Clients with calls running or waiting now."""
        return len(self._clients)

    def takes(self, handler: grpc.RpcMethodHandler) -> bool:
        """Every unary-unary handler, and the stream-stream ones (``Wrapping.takes``; only
        ``CHECKED_STREAMS`` are changed)."""
        return handler.unary_unary is not None or handler.stream_stream is not None

    def wrap(self, method: str, handler: grpc.RpcMethodHandler) -> grpc.RpcMethodHandler:
        """``handler`` with the malformed-message check and the per-client limit; a
        stream-stream handler with a deserializer that never raises (its behavior meets
        each ``Malformed`` message itself: ``refuse_malformed``)."""
        if handler.unary_unary is None:
            if method not in CHECKED_STREAMS:
                return handler
            return grpc.stream_stream_rpc_method_handler(
                handler.stream_stream,
                request_deserializer=_safe(handler.request_deserializer),
                response_serializer=handler.response_serializer,
            )
        inner: _Behavior = handler.unary_unary
        limited = not method.startswith(UNLIMITED_PREFIXES)

        async def behavior(request: Any, context: aio.ServicerContext) -> Any:
            if isinstance(request, Malformed):
                await self.refuse_malformed(method, request, context)
            if not limited:
                return await inner(request, context)
            key = client_of(context, request)
            client = await self._enter(key, method, context)
            try:
                return await inner(request, context)
            finally:
                self._leave(key, client)

        return grpc.unary_unary_rpc_method_handler(
            behavior,
            request_deserializer=_safe(handler.request_deserializer),
            response_serializer=handler.response_serializer,
        )

    async def refuse_malformed(
        self, method: str, request: Malformed, context: aio.ServicerContext
    ) -> NoReturn:
        """Ends the call ``INVALID_ARGUMENT`` (field ``request``), counted and logged as the
        module doc says."""
        if self._on_malformed is not None:
            self._on_malformed(method)
        now = time.monotonic()
        if now - self._warned_at >= self._warn_every_s:
            more = f" ({self._unwarned} more since the last warning)" if self._unwarned else ""
            logger.warning(
                "malformed %s message from %s refused: %s%s",
                method,
                context.peer(),
                request.reason,
                more,
            )
            self._warned_at = now
            self._unwarned = 0
        else:
            self._unwarned += 1
        await abort(
            context,
            InvalidArgument(
                "request", "malformed message (it does not parse as the method's request)"
            ),
        )

    async def _enter(
        self, key: tuple[str, str], method: str, context: aio.ServicerContext
    ) -> _Client:
        client = self._clients.get(key)
        if client is None:
            client = self._clients[key] = _Client(asyncio.Semaphore(self._max_calls))
        if client.turns.locked() and client.waiting >= self._max_waiting:
            if self._on_refused is not None:
                self._on_refused(method)
            await abort(
                context,
                LimitExceeded(
                    "max_calls_per_client",
                    f"this client already has {self._max_calls} calls running and "
                    f"{self._max_waiting} waiting",
                ),
            )
        client.waiting += 1
        try:
            await client.turns.acquire()
        except BaseException:
            client.waiting -= 1
            self._forget_if_idle(key, client)
            raise
        client.waiting -= 1
        client.running += 1
        return client

    def _leave(self, key: tuple[str, str], client: _Client) -> None:
        client.running -= 1
        client.turns.release()
        self._forget_if_idle(key, client)

    def _forget_if_idle(self, key: tuple[str, str], client: _Client) -> None:
        if client.running == 0 and client.waiting == 0 and self._clients.get(key) is client:
            del self._clients[key]


def client_of(context: aio.ServicerContext, request: object) -> tuple[str, str]:
    """The client a call counts against: its peer's host (``peer_host``) and the request's
    ``holder`` ('' when it has none: then the host alone)."""
    holder = getattr(request, "holder", "")
    return peer_host(context.peer() or ""), holder if isinstance(holder, str) else ""
