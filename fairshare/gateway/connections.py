"""Client connections: how many may be open, and how long a request head may take.

aiohttp's server bounds neither: a connection that sends part of a request head is kept
until its keep-alive timeout (an hour by default), and connections are accepted as long as
the process has file descriptors. ``ConnectionGuard`` adds both bounds around the API
server's protocol (``GuardedSite`` serves it in place of ``web.TCPSite``):

- **the cap**: a connection accepted while ``limits.max_client_connections`` are open is
  closed at once, before a byte of it is read;
- **the head timeout**: a connection must send a whole request head within
  ``limits.header_timeout_s``, counted from its opening for its first request and from the
  first byte of each later one; past it, the connection is closed before anything of the
  request runs (no authentication, no handler, no allocator call). A keep-alive connection
  idle between two requests is not timed by it (aiohttp's keep-alive timeout is).

How the guard knows a head was whole: the handler started. ``ConnectionGuard.middleware``
(installed first on the application) marks the connection busy when a request's handler
starts and idle when it ends; a byte that arrives on an idle connection starts the clock.

Guarantees: a connection the cap refuses never reaches aiohttp; every connection that
reached aiohttp is counted open until aiohttp's ``connection_lost``. Not guaranteed: a
second request head pipelined behind a first, and not whole, is timed by the keep-alive
timeout only (the guard sees no byte of it arrive while idle); a head that became whole
an instant before its timeout, whose handler had not started yet, is closed all the
same. One event loop; not thread-safe.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import resource
import socket
from collections.abc import Awaitable, Callable

from aiohttp import web
from aiohttp.web_protocol import RequestHandler

from fairshare.gateway.metrics import GatewayMetrics

logger = logging.getLogger(__name__)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
SPARE_FILES = 64
"""Open files the process needs besides its connections (logs, the allocator's channels,
the probes)."""


def raise_file_limit(needed: int) -> int:
    """Raises the process's soft limit of open files to ``needed`` where its hard limit
    allows (a default soft limit of 1024 would refuse connections long before the cap);
    returns the soft limit in force."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or soft >= needed:
        return needed
    target = needed if hard == resource.RLIM_INFINITY else min(needed, hard)
    with contextlib.suppress(ValueError, OSError):
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        soft = target
    return soft


class _Guarded(asyncio.Protocol):
    """One client connection: aiohttp's ``RequestHandler`` inside the guard's bounds."""

    def __init__(self, guard: ConnectionGuard, inner: RequestHandler) -> None:
        self._guard = guard
        self._inner = inner
        self._transport: asyncio.Transport | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._busy = 0
        self._admitted = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self._transport = transport
        if not self._guard.admit(self):
            transport.abort()
            return
        self._admitted = True
        self._arm()
        self._inner.connection_made(transport)

    def data_received(self, data: bytes) -> None:
        if self._timer is None and not self._busy:
            self._arm()  # the first byte of a later request
        self._inner.data_received(data)

    def eof_received(self) -> bool | None:
        if self._admitted:
            self._inner.eof_received()  # aiohttp's: nothing (the transport then closes)
        return None

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        self._transport = None
        if self._admitted:
            self._admitted = False
            self._guard.lost(self)
            self._inner.connection_lost(exc)

    @property
    def inner(self) -> RequestHandler:
        return self._inner

    def pause_writing(self) -> None:
        self._inner.pause_writing()

    def resume_writing(self) -> None:
        self._inner.resume_writing()

    def request_started(self) -> None:
        self._busy += 1
        self._disarm()

    def request_ended(self) -> None:
        self._busy -= 1

    def _arm(self) -> None:
        self._timer = asyncio.get_running_loop().call_later(
            self._guard.header_timeout_s, self._expired
        )

    def _disarm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _expired(self) -> None:
        self._timer = None
        if self._busy or self._transport is None:
            return
        self._guard.timed_out()
        self._transport.close()


class ConnectionGuard:
    """The bounds of the API port's client connections (see the module doc)."""

    def __init__(
        self, *, max_connections: int, header_timeout_s: float, metrics: GatewayMetrics
    ) -> None:
        self.max_connections = max_connections
        self.header_timeout_s = header_timeout_s
        self._metrics = metrics
        self._open: dict[RequestHandler, _Guarded] = {}
        self._over_limit_logged = False

    @property
    def open(self) -> int:
        """Client connections open now."""
        return len(self._open)

    def protocol(self, inner: RequestHandler) -> asyncio.Protocol:
        """The protocol of one accepted connection, around aiohttp's ``inner``."""
        return _Guarded(self, inner)

    def admit(self, guarded: _Guarded) -> bool:
        if len(self._open) >= self.max_connections:
            self._metrics.connections_closed.labels("over_limit").inc()
            if not self._over_limit_logged:
                self._over_limit_logged = True
                logger.warning(
                    "%d client connections open (limits.max_client_connections): "
                    "closing new ones at once",
                    len(self._open),
                )
            return False
        self._over_limit_logged = False
        self._open[guarded.inner] = guarded
        self._metrics.client_connections.set(len(self._open))
        return True

    def lost(self, guarded: _Guarded) -> None:
        self._open.pop(guarded.inner, None)
        self._metrics.client_connections.set(len(self._open))

    def timed_out(self) -> None:
        self._metrics.connections_closed.labels("header_timeout").inc()

    @web.middleware
    async def middleware(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        """Marks the request's connection busy while its handler runs."""
        guarded = self._open.get(request.protocol)
        if guarded is None:  # not a guarded connection (or already lost)
            return await handler(request)
        guarded.request_started()
        try:
            return await handler(request)
        finally:
            guarded.request_ended()


class GuardedSite(web.BaseSite):
    """``web.TCPSite`` with every accepted connection under a ``ConnectionGuard``."""

    def __init__(
        self,
        runner: web.BaseRunner,
        host: str,
        port: int,
        *,
        guard: ConnectionGuard,
        backlog: int = 128,
    ) -> None:
        super().__init__(runner, backlog=backlog)
        self._host = host
        self._port = port
        self._guard = guard

    @property
    def name(self) -> str:
        return f"http://{self._host}:{self._port}"

    async def start(self) -> None:
        await super().start()
        server = self._runner.server
        assert server is not None
        guard = self._guard
        self._server = await asyncio.get_running_loop().create_server(
            lambda: guard.protocol(server()),
            self._host or None,
            self._port,
            backlog=self._backlog,
            family=socket.AF_UNSPEC,
        )
