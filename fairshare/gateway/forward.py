"""One attempt at the upstream: connect, read the first bytes, pass a stream on, close.

``Forwarder`` does the HTTP side of the request path for ``fairshare.gateway.proxy``: it
sends a body to the upstream the route's router chooses for the grant's priority
(``fairshare.gateway.upstreams``), reads the answer's first bytes (the whole answer when it
is not a stream, or has an error status), passes a stream on to the client event by event
(``fairshare.gateway.body.StreamFilter``), and closes the upstream request. What the
attempt used, for the charge and the metrics, goes into an ``Outcome``.

Guaranteed:

- every upstream a request was sent to (``Upstreams.sent``) is ended (``Upstreams.ended``)
  once, whatever way the attempt ends, provided the caller ``close``-s what ``first``
  returned (``first`` ends it itself when it raises);
- a connection that cannot be opened goes to another upstream of the route, and one the
  upstream closed before its status line (a pooled connection closed as idle) is sent
  again once, to any; no other failure is retried;
- a ``prefer``-red upstream (the server holding the stored response a request continues)
  gets the first attempt unless it is ejected; the route's router chooses the others;
- ``relay`` passes a request that needs no grant (a stored response's retrieval or
  cancel) to one upstream, under the same timeouts, and its answer back, streamed or not;
- an upstream ejected by ``fairshare.gateway.health`` is not chosen; what each attempt
  saw (failed, answered) is told to it;
- the timeouts of ``limits``: ``upstream_connect_s`` to open a connection (then another
  upstream is tried), ``upstream_first_byte_s`` from sending the request to the first
  bytes the client may see (504; cut short when probes eject the upstream meanwhile),
  ``upstream_idle_s`` between two chunks of a stream (an error event ends it); none
  bounds a request's total time;
- a response not read to its end is closed, not returned to the pool, so the upstream
  aborts the request;
- a failure before the status line is ``UpstreamFailed``, whose ``refusal`` says how to
  answer; a failure mid-stream is an error event at the end of the stream; a client gone
  mid-stream ends the stream quietly.

Not guaranteed: the charge (the caller computes it from the ``Outcome``); anything about
the grant (the caller decides and releases it); thread safety (one event loop).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Mapping, MutableMapping
from dataclasses import dataclass, field

import aiohttp
from aiohttp import web

from fairshare.client import ClientGrant
from fairshare.cost import Usage
from fairshare.gateway.body import Request, StreamFilter
from fairshare.gateway.config import Limits, Route
from fairshare.gateway.errors import Refusal, error_response, sse_error_event
from fairshare.gateway.health import Health
from fairshare.gateway.metrics import GatewayMetrics
from fairshare.gateway.placement import Placement
from fairshare.gateway.upstreams import Upstreams
from fairshare.gateway.upstreams import standing as upstream_standing

logger = logging.getLogger(__name__)


class UpstreamFailed(Exception):
    """No upstream answered; ``refusal`` says how to answer the client."""

    def __init__(self, refusal: Refusal, message: str) -> None:
        super().__init__(message)
        self.refusal = refusal


@dataclass
class Outcome:
    """What one attempt at the upstream used: for the charge and the metrics."""

    status: int = 0
    usage: Usage | None = None
    sent: bool = False
    """The request went to an upstream that accepted its connection (it may have started
    on it, whatever happened next)."""
    upstream_s: float = 0.0
    started: float = field(default_factory=time.monotonic)
    first_chunk: float | None = None
    """When a streamed answer's first chunk came (monotonic); None when not streamed."""
    upstream: str = ""
    """The upstream of the last attempt ("" before one)."""
    response_id: str | None = None
    """The id of a Responses answer passed on whole, or of a stream (from its
    ``response.created``, else from the event with its usage)."""
    cut: str = ""
    """Why the attempt ended short (``fairshare.gateway.accesslog.ENDINGS``: a stream cut
    here, a failure or a 5xx answer in ``fairshare.gateway.proxy``); "" when it did not."""


def standing(grant: ClientGrant) -> str:
    """How ``grant`` stands with its pool (``fairshare.gateway.upstreams.STANDINGS``)."""
    return upstream_standing(borrowing=grant.borrowing, degraded=grant.degraded)


class Forwarder:
    """Attempts at the upstreams of every route, over one ``ClientSession``."""

    def __init__(
        self,
        upstreams: Mapping[Route, Upstreams],
        *,
        session: aiohttp.ClientSession,
        limits: Limits,
        health: Health,
        metrics: GatewayMetrics,
    ) -> None:
        self.upstreams = upstreams
        self.session = session
        self.health = health
        self.metrics = metrics
        self.limits = limits
        # The connect timeout bounds the socket's connect only: waiting for a free
        # connection of a full pool is no fault of the upstream (it is bounded by the
        # first-byte timeout). The reads are bounded here, not by aiohttp: its read
        # timeout would bound the wait for the status line by the idle timeout.
        self._timeout = aiohttp.ClientTimeout(
            total=None, sock_connect=limits.upstream_connect_s, sock_read=None
        )

    async def first(
        self,
        placement: Placement,
        path: str,
        data: bytes,
        headers: Mapping[str, str],
        parsed: Request,
        outcome: Outcome,
        prefer: str | None = None,
    ) -> tuple[tuple[str, aiohttp.ClientResponse], bytes]:
        """Everything up to the first byte the client may see: the whole answer when not
        streaming (or on an error status), else the first chunk of the stream, within
        ``limits.upstream_first_byte_s``. ``headers`` go with the request
        (``fairshare.gateway.headers.HeaderPolicy.to_upstream``).

        Returns:
            The upstream's URL and response, which the caller ends with ``close``, and
            those bytes.

        Raises:
            UpstreamFailed: as ``_open``, or the answer failed or timed out before its
                first bytes (the upstream request is then closed).
        """
        opened: tuple[str, aiohttp.ClientResponse] | None = None
        deadline = asyncio.timeout(self.limits.upstream_first_byte_s)
        try:
            async with deadline:
                opened = await self._open(placement, path, data, headers, outcome, deadline, prefer)
                upstream = opened[1]
                if parsed.stream and upstream.status == 200:  # noqa: PLR2004 (HTTP OK)
                    head = await upstream.content.readany()
                else:
                    head = await upstream.read()
        except TimeoutError as e:
            url = outcome.upstream
            if opened is not None:
                self.close(placement, *opened)
            self.metrics.upstream_errors.labels(url, "timeout").inc()
            if self.health.ejected_by_probe(url):
                why = "the upstream stopped answering its health probes"
            else:
                why = f"the upstream sent nothing within {self.limits.upstream_first_byte_s:g}s"
            logger.warning("upstream %s: %s", url, why)
            raise UpstreamFailed(Refusal.UPSTREAM_TIMEOUT, why) from e
        except (aiohttp.ClientError, OSError) as e:
            assert opened is not None  # ``_open`` raises only ``UpstreamFailed``
            self.close(placement, *opened)
            self.metrics.upstream_errors.labels(opened[0], "broken").inc()
            self.health.request_failed(opened[0])
            raise UpstreamFailed(Refusal.UPSTREAM_BROKEN, f"the upstream failed: {e!r}") from e
        except BaseException:
            if opened is not None:
                self.close(placement, *opened)
            raise
        finally:
            self.health.done_waiting(outcome.upstream, deadline)
        url, upstream = opened
        if upstream.status >= 500:  # noqa: PLR2004 (server errors)
            self.metrics.upstream_errors.labels(url, "status").inc()
            self.health.request_failed(url)
        else:
            self.health.request_answered(url)
        return opened, head

    def close(self, placement: Placement, url: str, response: aiohttp.ClientResponse) -> None:
        """Ends an upstream request: a response not read to its end closes its connection,
        so the upstream aborts the request."""
        if not response.content.is_eof():
            response.close()
        else:
            response.release()
        self.upstreams[placement.route].ended(url, placement.grant.priority)

    async def stream(
        self,
        request: web.Request,
        parsed: Request,
        upstream: aiohttp.ClientResponse,
        head: bytes,
        headers: MutableMapping[str, str],
        outcome: Outcome,
    ) -> web.StreamResponse:
        """Passes a stream on event by event, from its first chunk ``head``."""
        filtered = StreamFilter(
            keep_usage=parsed.client_wants_usage, read_id=parsed.endpoint == "responses"
        )
        headers["Content-Type"] = "text/event-stream"
        headers["Cache-Control"] = "no-cache"
        answer = web.StreamResponse(status=200, headers=headers)
        try:
            await answer.prepare(request)
            chunk = head
            idle_s = self.limits.upstream_idle_s
            while chunk:
                out = filtered.feed(chunk)
                if out:
                    await answer.write(out)
                async with asyncio.timeout(idle_s):
                    chunk = await upstream.content.readany()
            rest = filtered.finish()
            if rest:
                await answer.write(rest)
        except TimeoutError:
            outcome.cut = "timeout"
            self.metrics.upstream_errors.labels(str(upstream.url.origin()), "timeout").inc()
            stalled = f"the upstream sent nothing for {self.limits.upstream_idle_s:g}s"
            logger.warning("upstream %s: %s", upstream.url.origin(), stalled)
            await _write_quietly(answer, sse_error_event(Refusal.UPSTREAM_TIMEOUT, stalled))
        except aiohttp.ClientPayloadError as e:
            outcome.cut = "upstream_error"
            self.metrics.upstream_errors.labels(str(upstream.url.origin()), "broken").inc()
            await _write_quietly(answer, sse_error_event(Refusal.UPSTREAM_BROKEN, repr(e)))
        except ConnectionResetError:
            # The client went away: end here. Before ``aiohttp.ClientError``, which the
            # writer's ``ClientConnectionResetError`` also is.
            outcome.cut = "client_gone"
            self.metrics.disconnects.inc()
            return answer
        except aiohttp.ClientError as e:  # the upstream connection failed otherwise
            outcome.cut = "upstream_error"
            self.metrics.upstream_errors.labels(str(upstream.url.origin()), "broken").inc()
            await _write_quietly(answer, sse_error_event(Refusal.UPSTREAM_BROKEN, repr(e)))
        finally:
            outcome.usage = filtered.counted(parsed)
            outcome.response_id = filtered.response_id
        with contextlib.suppress(ConnectionResetError):
            await answer.write_eof()
        return answer

    async def _open(
        self,
        placement: Placement,
        path: str,
        data: bytes,
        headers: Mapping[str, str],
        outcome: Outcome,
        deadline: asyncio.Timeout,
        prefer: str | None = None,
    ) -> tuple[str, aiohttp.ClientResponse]:
        """Sends the request to the upstream the route's router chooses for the grant's
        priority, among those not ejected that accept a connection.

        The caller ends the upstream's lease (``Upstreams.sent``) with ``close``. The
        request waits on ``outcome.upstream`` under ``deadline`` (``Health.waiting``); the
        caller ends that wait.

        A connection closed before the status line (``ServerDisconnectedError``: a pooled
        connection the upstream closed as idle) is tried again once, like a refused one but
        on any upstream.

        Raises:
            UpstreamFailed: every upstream is ejected, none accepted a connection, or the
                one that did failed before its status line (a second closed connection
                included).
        """
        route, grant = placement.route, placement.grant
        upstreams = self.upstreams[route]
        health = self.health
        tried: set[str] = set()
        disconnected = False
        while True:
            url = _choose(upstreams, grant.priority, tried | health.ejected, prefer)
            if url is None:
                if not tried:
                    raise UpstreamFailed(
                        Refusal.NO_HEALTHY_UPSTREAM,
                        f"no upstream of pool {route.pool} is healthy now",
                    )
                raise UpstreamFailed(
                    Refusal.UPSTREAM_UNREACHABLE,
                    f"no upstream of pool {route.pool} accepted a connection",
                )
            health.done_waiting(outcome.upstream, deadline)
            outcome.upstream = url
            health.waiting(url, deadline)
            upstreams.sent(url, grant.priority, standing(grant))
            outcome.upstream = url
            outcome.started = time.monotonic()
            outcome.sent = True
            try:
                response = await self.session.post(
                    url + path,
                    data=data,
                    headers=headers,
                    timeout=self._timeout,
                )
            except (aiohttp.ClientConnectorError, aiohttp.ConnectionTimeoutError) as e:
                upstreams.ended(url, grant.priority)
                outcome.sent = False
                self.metrics.upstream_errors.labels(url, "refused").inc()
                health.request_failed(url)
                logger.warning("upstream %s refused: %s; trying another", url, e)
                tried.add(url)
                continue
            except aiohttp.ServerDisconnectedError as e:
                # Closed before its status line: most likely a pooled connection the
                # upstream was closing as idle when the request went out. Sent again,
                # once, to the upstream the router chooses (this one included).
                upstreams.ended(url, grant.priority)
                self.metrics.upstream_errors.labels(url, "disconnected").inc()
                if disconnected:
                    health.request_failed(url)
                    raise UpstreamFailed(
                        Refusal.UPSTREAM_BROKEN, f"the upstream failed: {e!r}"
                    ) from e
                disconnected = True
                logger.info("upstream %s closed the connection: %r; sending again", url, e)
                continue
            except (aiohttp.ClientError, OSError) as e:
                upstreams.ended(url, grant.priority)
                self.metrics.upstream_errors.labels(url, "broken").inc()
                health.request_failed(url)
                raise UpstreamFailed(Refusal.UPSTREAM_BROKEN, f"the upstream failed: {e!r}") from e
            except BaseException:
                upstreams.ended(url, grant.priority)
                raise
            return url, response

    async def relay(
        self,
        request: web.Request,
        url: str,
        headers: Mapping[str, str],
        answer_headers: Callable[[Mapping[str, str]], Mapping[str, str]],
        outcome: Outcome,
    ) -> web.StreamResponse:
        """Sends ``request`` (its method and query, with no body) to ``url`` (the
        upstream's URL with its path) with ``headers``, and its answer back with ``answer_headers``
        of the upstream's: a Server-Sent Events answer event by event, any other whole.
        A failure before the status line is the OpenAI error of
        ``fairshare.gateway.errors``; one mid-stream is an error event. ``outcome`` gets
        the status, the upstream and why it ended short. The upstream's answer is closed
        on every path, the handler's cancellation (the client gone) included."""
        upstream = outcome.upstream
        opened: aiohttp.ClientResponse | None = None
        try:
            try:
                async with asyncio.timeout(self.limits.upstream_first_byte_s):
                    opened = await self.session.request(
                        request.method,
                        url,
                        params=request.query,
                        headers=headers,
                        timeout=self._timeout,
                    )
                    streamed = opened.content_type == "text/event-stream"
                    head = await (opened.content.readany() if streamed else opened.read())
            except TimeoutError:
                outcome.cut = "timeout"
                self.metrics.upstream_errors.labels(upstream, "timeout").inc()
                why = f"the upstream sent nothing within {self.limits.upstream_first_byte_s:g}s"
                return error_response(Refusal.UPSTREAM_TIMEOUT, why)
            except (aiohttp.ClientError, OSError) as e:
                outcome.cut = "upstream_error"
                self.metrics.upstream_errors.labels(upstream, "broken").inc()
                return error_response(Refusal.UPSTREAM_BROKEN, f"the upstream failed: {e!r}")
            outcome.status = opened.status
            passed = answer_headers(opened.headers)
            if not streamed:
                return web.Response(status=opened.status, body=head, headers=passed)
            return await self._relay_stream(request, opened, head, passed, outcome)
        finally:
            if opened is not None:
                if opened.content.is_eof():
                    opened.release()
                else:
                    opened.close()

    async def _relay_stream(
        self,
        request: web.Request,
        opened: aiohttp.ClientResponse,
        head: bytes,
        headers: Mapping[str, str],
        outcome: Outcome,
    ) -> web.StreamResponse:
        answer = web.StreamResponse(status=opened.status, headers=headers)
        await answer.prepare(request)
        try:
            chunk = head
            while chunk:
                await answer.write(chunk)
                async with asyncio.timeout(self.limits.upstream_idle_s):
                    chunk = await opened.content.readany()
        except TimeoutError:
            outcome.cut = "timeout"
            self.metrics.upstream_errors.labels(outcome.upstream, "timeout").inc()
            stalled = f"the upstream sent nothing for {self.limits.upstream_idle_s:g}s"
            await _write_quietly(answer, sse_error_event(Refusal.UPSTREAM_TIMEOUT, stalled))
        except ConnectionResetError:
            outcome.cut = "client_gone"
            self.metrics.disconnects.inc()
            return answer
        except aiohttp.ClientError as e:
            outcome.cut = "upstream_error"
            self.metrics.upstream_errors.labels(outcome.upstream, "broken").inc()
            await _write_quietly(answer, sse_error_event(Refusal.UPSTREAM_BROKEN, repr(e)))
        with contextlib.suppress(ConnectionResetError):
            await answer.write_eof()
        return answer


def _choose(
    upstreams: Upstreams, priority: int, excluded: set[str], prefer: str | None
) -> str | None:
    """``prefer`` unless it is excluded (or not of the route), else the router's choice."""
    if prefer is not None and prefer not in excluded and prefer in upstreams.urls:
        return prefer
    return upstreams.choose(priority, excluded)


async def _write_quietly(answer: web.StreamResponse, data: bytes) -> None:
    with contextlib.suppress(ConnectionResetError):
        await answer.write(data)
