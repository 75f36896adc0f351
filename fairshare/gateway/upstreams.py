"""Which vLLM server of a route gets the next request, and what each one has in flight.

``Upstreams`` holds one ``fairshare.routing.Outstanding`` (the requests this gateway has
sent to each server and not ended, by the vLLM priority they were sent with) and the
route's router (``routing:`` in the configuration, ``fewest-ahead`` by default: the server
where the fewest requests of a priority at most this one's are outstanding, so a
within-share request goes where it starts soonest; see docs/simulation.md).

The request path chooses with the priority the allocator granted (``choose``), counts the
request with ``sent`` once it goes to the chosen server and ``ended`` when it ends,
whatever the way (answered, failed, the client gone, re-decided, the gateway stopping). A
caller that could not connect ends that attempt and asks again with the servers it tried
excluded: a refused connection goes to another server before the request has started
anywhere. A re-decided request ends its first attempt and is counted again, with its new
priority, when it is sent again.

Metrics (when given): ``fairshare_gateway_upstream_in_flight`` follows the tally;
``fairshare_gateway_upstream_sent`` counts every attempt by standing.

Guarantees: ``sent``/``ended`` pairs keep the tally and the gauge equal; ``lease`` counts
from its start to its end, whatever way the block ends. Not guaranteed: balance across
several gateways (each counts its own requests); thread safety (one event loop).
"""

from __future__ import annotations

import contextlib
import random
from collections.abc import Iterator, Sequence
from typing import Final

from fairshare.gateway.config import DEFAULT_ROUTING
from fairshare.gateway.metrics import GatewayMetrics
from fairshare.routing import Outstanding, make_router

STANDINGS: Final = ("within", "borrowing", "degraded")
"""How a request stood with its pool when it was sent (the label of the sent counter)."""


def standing(*, borrowing: bool, degraded: bool) -> str:
    """The standing of a grant: ``degraded`` (fail-open), ``borrowing`` or ``within``."""
    return "degraded" if degraded else "borrowing" if borrowing else "within"


class Upstreams:
    """The servers of one route, with the requests this gateway has outstanding on each."""

    def __init__(
        self,
        pool: str,
        urls: Sequence[str],
        *,
        routing: str = DEFAULT_ROUTING,
        rng: random.Random | None = None,
        metrics: GatewayMetrics | None = None,
    ) -> None:
        """
        Raises:
            ValueError: no URL, or an unknown ``routing`` name.
        """
        if not urls:
            raise ValueError("a route needs at least one upstream")
        self.pool = pool
        self.urls = list(urls)
        self.routing = routing
        self._index = {url: i for i, url in enumerate(self.urls)}
        self.outstanding = Outstanding(len(self.urls))
        rng = rng if rng is not None else random.Random()  # tie-breaks only
        # Each replica starts round-robin somewhere of its own, so replicas do not move alike.
        self._router = make_router(routing, rng=rng, start=rng.randrange(len(self.urls)))
        self._metrics = metrics

    def choose(self, priority: int, exclude: frozenset[str] | set[str] = frozenset()) -> str | None:
        """The server for a request the allocator gave ``priority``, or None when every one
        is excluded."""
        skipped = frozenset(self._index[u] for u in exclude if u in self._index)
        chosen = self._router.choose(priority, self.outstanding, skipped)
        return None if chosen is None else self.urls[chosen]

    def in_flight(self, url: str) -> int:
        """Requests this gateway has outstanding on ``url``."""
        return self.outstanding.total(self._index[url])

    def sent(self, url: str, priority: int, standing: str) -> None:
        """A request with ``priority`` goes to ``url`` (``standing``: one of ``STANDINGS``)."""
        self.outstanding.sent(self._index[url], priority)
        if self._metrics is not None:
            self._metrics.upstream_in_flight_by(self.pool, url).inc()
            self._metrics.upstream_sent_by(self.pool, url, standing).inc()

    def ended(self, url: str, priority: int) -> None:
        """A request ``sent`` to ``url`` with ``priority`` ended, whatever the way.

        Raises:
            ValueError: no such request outstanding (a ``sent`` without its pair).
        """
        self.outstanding.ended(self._index[url], priority)
        if self._metrics is not None:
            self._metrics.upstream_in_flight_by(self.pool, url).dec()

    @contextlib.contextmanager
    def lease(self, url: str, priority: int, standing: str = "within") -> Iterator[None]:
        """Counts one request outstanding on ``url`` while the block runs."""
        self.sent(url, priority, standing)
        try:
            yield
        finally:
            self.ended(url, priority)
