"""Which upstreams get requests: active probes of ``/health`` and passive ejection.

Each upstream (a base URL, wherever the configuration lists it) is in one state:

- ``unknown``: not probed successfully yet (at start): it gets requests, but does not
  count as healthy for ``/readyz``;
- ``healthy``: its last probe answered 200 within ``health.timeout_s``;
- ``ejected``: ``health.unhealthy_after`` probes in a row failed (no answer in time, a
  refused connection, another status), or ``health.eject_after`` requests in a row failed
  (a connection that could not be opened or broke before the status line, or a 5xx
  answer). An ejected upstream is left out of every route's choice until a probe
  succeeds again (readmission; after an ejection by requests, a probe at least
  ``health.interval_s`` after it, so that a probe already on its way does not undo it at
  once); a route whose upstreams are all ejected answers 503.

``Health.watch`` probes every upstream every ``health.interval_s``, over a session of its
own: a full pool of request connections does not delay a probe into a failure. When
probes eject an upstream (it stopped answering: a crashed, paused or partitioned server),
the requests still waiting there for their first byte are ended at once, as if their
``limits.upstream_first_byte_s`` had run out (504, the grant released): a request queued
at a live server legitimately waits long for its first byte, so the first-byte timeout
is long, and the probes are what tell a dead server from a busy one. A stream under way
is left to ``limits.upstream_idle_s``: its chunks say better than a probe whether it runs.

Metrics: ``fairshare_gateway_upstream_healthy{upstream}`` (1 healthy, 0 ejected, -1 not
probed yet) and ``fairshare_gateway_upstream_ejections_total{upstream,reason}`` (``probe``,
``requests``).

Guarantees: a request is sent to an ejected upstream only if it was chosen before the
ejection; readmission needs a probe that succeeded. Not guaranteed: that a healthy
upstream answers the next request (a probe only shows that it answered the probe); that
gateway replicas agree (each probes and counts on its own). One event loop; not
thread-safe.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Final

import aiohttp

from fairshare.gateway.config import HealthSettings
from fairshare.gateway.metrics import GatewayMetrics

logger = logging.getLogger(__name__)

PROBE_PATH: Final = "/health"
"""vLLM's health endpoint: 200 while its engine runs."""


class State(enum.Enum):
    UNKNOWN = -1
    EJECTED = 0
    HEALTHY = 1


@dataclass(eq=False)
class _Upstream:
    state: State = State.UNKNOWN
    failed_probes: int = 0
    failed_requests: int = 0
    ejected_by_probe: bool = False
    ejected_at: float = 0.0
    """When it was ejected (monotonic)."""
    waiting: set[asyncio.Timeout] = field(default_factory=set)
    """First-byte deadlines of the requests waiting on it (ended when probes eject it)."""


class Health:
    """The health of every upstream of one gateway (see the module doc)."""

    def __init__(
        self,
        settings: HealthSettings,
        urls: Iterable[str] = (),
        *,
        metrics: GatewayMetrics | None = None,
    ) -> None:
        self.settings = settings
        self._metrics = metrics
        self._upstreams: dict[str, _Upstream] = {}
        self.ejected: frozenset[str] = frozenset()
        """The upstreams that get no request now."""
        for url in urls:
            self._get(url)

    def _get(self, url: str) -> _Upstream:
        upstream = self._upstreams.get(url)
        if upstream is None:
            upstream = self._upstreams[url] = _Upstream()
            self._show(url, upstream)
        return upstream

    def _show(self, url: str, upstream: _Upstream) -> None:
        if self._metrics is not None:
            self._metrics.upstream_healthy.labels(url).set(upstream.state.value)

    @property
    def urls(self) -> list[str]:
        return list(self._upstreams)

    def state(self, url: str) -> State:
        upstream = self._upstreams.get(url)
        return State.UNKNOWN if upstream is None else upstream.state

    def healthy(self, url: str) -> bool:
        """Its last probe succeeded and it is not ejected."""
        return self.state(url) is State.HEALTHY

    def ejected_by_probe(self, url: str) -> bool:
        """Ejected because it stopped answering its probes."""
        upstream = self._upstreams.get(url)
        return upstream is not None and upstream.ejected_by_probe

    # -- passive: what requests saw ----------------------------------------------------------

    def request_failed(self, url: str) -> None:
        """A request to ``url`` could not connect, broke before its status, or got a 5xx."""
        upstream = self._get(url)
        upstream.failed_requests += 1
        if upstream.state is not State.EJECTED and (
            upstream.failed_requests >= self.settings.eject_after
        ):
            self._eject(url, upstream, "requests", f"{upstream.failed_requests} requests failed")

    def request_answered(self, url: str) -> None:
        """A request to ``url`` was answered with a status below 500."""
        self._get(url).failed_requests = 0

    # -- first-byte waits --------------------------------------------------------------------

    def waiting(self, url: str, deadline: asyncio.Timeout) -> None:
        """A request waits on ``url`` for its first byte until ``deadline``."""
        self._get(url).waiting.add(deadline)

    def done_waiting(self, url: str, deadline: asyncio.Timeout) -> None:
        """That wait ended, whatever the way (idempotent; ``url`` may be "", none)."""
        upstream = self._upstreams.get(url)
        if upstream is not None:
            upstream.waiting.discard(deadline)

    # -- active: the probes ------------------------------------------------------------------

    def probed(self, url: str, failure: str | None) -> None:
        """The outcome of one probe of ``url``: None when it answered 200 in time."""
        upstream = self._get(url)
        if failure is None:
            upstream.failed_probes = 0
            held = time.monotonic() - upstream.ejected_at < self.settings.interval_s
            if upstream.state is State.EJECTED and not upstream.ejected_by_probe and held:
                return  # ejected by its requests a moment ago
            if upstream.state is not State.HEALTHY:
                if upstream.state is State.EJECTED:
                    logger.info("upstream %s answers its probe again: readmitted", url)
                    upstream.failed_requests = 0
                upstream.state = State.HEALTHY
                upstream.ejected_by_probe = False
                self.ejected = self.ejected - {url}
                self._show(url, upstream)
            return
        upstream.failed_probes += 1
        if upstream.failed_probes < self.settings.unhealthy_after:
            logger.info("upstream %s: probe failed (%s)", url, failure)
            return
        if upstream.ejected_by_probe:
            return
        why = f"{upstream.failed_probes} probes failed, the last: {failure}"
        if upstream.state is State.EJECTED:  # already, by its requests
            upstream.ejected_by_probe = True
            logger.warning("upstream %s: %s", url, why)
        else:
            self._eject(url, upstream, "probe", why)
        now = asyncio.get_running_loop().time()
        for deadline in list(upstream.waiting):
            if not deadline.expired():  # one that just ran out is ending anyway
                deadline.reschedule(now)

    def _eject(self, url: str, upstream: _Upstream, reason: str, why: str) -> None:
        upstream.state = State.EJECTED
        upstream.ejected_by_probe = reason == "probe"
        upstream.ejected_at = time.monotonic()
        self.ejected = self.ejected | {url}
        self._show(url, upstream)
        if self._metrics is not None:
            self._metrics.upstream_ejections.labels(url, reason).inc()
        logger.warning(
            "upstream %s ejected (%s): no request goes there until a probe succeeds", url, why
        )

    async def probe(self, session: aiohttp.ClientSession, url: str) -> str | None:
        """One probe of ``url``: None when it answered 200 within ``timeout_s``, else why
        not."""
        try:
            async with session.get(
                url + PROBE_PATH, timeout=aiohttp.ClientTimeout(total=self.settings.timeout_s)
            ) as reply:
                await reply.read()
                return None if reply.status == 200 else f"status {reply.status}"  # noqa: PLR2004
        except TimeoutError:
            return f"no answer within {self.settings.timeout_s:g}s"
        except (aiohttp.ClientError, OSError) as e:
            return repr(e)

    async def watch(self, session: aiohttp.ClientSession) -> None:
        """Probes every upstream every ``interval_s`` until cancelled, the first round at
        once."""
        await asyncio.gather(*(self._watch_one(session, url) for url in self.urls))

    async def _watch_one(self, session: aiohttp.ClientSession, url: str) -> None:
        while True:
            try:
                self.probed(url, await self.probe(session, url))
            except Exception:  # a bug here must not end the probes of this upstream
                logger.exception("upstream %s: the probe failed unexpectedly", url)
            await asyncio.sleep(self.settings.interval_s)
