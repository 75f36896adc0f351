"""The gateway's Prometheus metrics, served on ``metrics_listen`` (``/metrics``).

Labels are bounded by the configuration (models, pools, upstreams) or by fixed sets; no
label carries a team or a request id.
"""

from __future__ import annotations

from typing import Generic, TypeVar

from aiohttp import web
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest

# A grant comes in milliseconds; a borrower held by its pool's lending limit waits up to
# limits.borrow_wait_s (60 s by default).
ACQUIRE_BUCKETS = (
    0.0005,
    0.001,
    0.002,
    0.005,
    0.01,
    0.02,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.0,
    5.0,
    15.0,
    30.0,
    60.0,
)
# A first token comes in tens of milliseconds on an idle server and minutes behind a queue.
FIRST_TOKEN_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0)

M = TypeVar("M", Counter, Gauge, Histogram)


class Children(Generic[M]):
    """The children of one labelled metric, each looked up once per label values.

    ``metric.labels(...)`` checks its values and takes a lock on every call; the request
    path calls it several times a request. Guaranteed: ``children(*values)`` is the child
    ``metric.labels(*values)`` gave (nothing in the gateway removes a child, so it stays
    the one exposed). A child appears in ``/metrics`` at its first use, as with
    ``labels``. Bounded as the labels are (by the configuration or fixed sets).
    """

    def __init__(self, metric: M) -> None:
        self._metric: M = metric
        self._children: dict[tuple[str, ...], M] = {}

    def __call__(self, *values: str) -> M:
        child = self._children.get(values)
        if child is None:
            child = self._children[values] = self._metric.labels(*values)
        return child


class GatewayMetrics:
    """Every metric of one gateway, in its own registry."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter(
            "fairshare_gateway_requests",
            "Requests answered, by model, pool served from and HTTP status.",
            ["model", "pool", "status"],
            registry=r,
        )
        self.in_flight = Gauge(
            "fairshare_gateway_in_flight",
            "Requests holding a grant now, by pool.",
            ["pool"],
            registry=r,
        )
        self.acquiring = Gauge(
            "fairshare_gateway_acquiring",
            "Requests waiting for a grant now, by pool: a borrower the allocator holds by "
            "its pool's lending limit waits here, with no upstream slot.",
            ["pool"],
            registry=r,
        )
        self.grants = Counter(
            "fairshare_gateway_grants",
            "Grants used, by pool and kind (within, borrowing, degraded).",
            ["pool", "kind"],
            registry=r,
        )
        self.fallbacks = Counter(
            "fairshare_gateway_fallbacks",
            "Requests sent to a fallback pool because the primary was saturated.",
            ["model", "pool"],
            registry=r,
        )
        self.redecided = Counter(
            "fairshare_gateway_redecided",
            "Fail-open requests aborted before their first byte and sent again with a "
            "fresh decision once an owner answered.",
            ["pool"],
            registry=r,
        )
        self.upstream_errors = Counter(
            "fairshare_gateway_upstream_errors",
            "Upstream failures, by upstream and kind (refused, disconnected, timeout, status, "
            "broken).",
            ["upstream", "kind"],
            registry=r,
        )
        self.disconnects = Counter(
            "fairshare_gateway_client_disconnects",
            "Requests whose client went away before the answer ended.",
            registry=r,
        )
        self.acquire_seconds = Histogram(
            "fairshare_gateway_acquire_seconds",
            "Time to obtain a grant, by the model's pool (fallbacks included; a borrower "
            "held by the pool's lending limit waits here).",
            ["pool"],
            buckets=ACQUIRE_BUCKETS,
            registry=r,
        )
        self.priority_scheduling = Gauge(
            "fairshare_gateway_upstream_priority_scheduling",
            "Whether the upstream said at startup that it schedules by priority: 1 yes, "
            "0 no (priorities are ignored there), -1 unknown (see docs/gateway.md).",
            ["upstream"],
            registry=r,
        )
        self.upstream_healthy = Gauge(
            "fairshare_gateway_upstream_healthy",
            "Whether the upstream gets requests: 1 healthy (its last probe answered), "
            "0 ejected (failed probes or requests), -1 not probed yet.",
            ["upstream"],
            registry=r,
        )
        self.upstream_ejections = Counter(
            "fairshare_gateway_upstream_ejections",
            "Upstreams ejected, by upstream and reason (probe: its /health stopped "
            "answering; requests: consecutive connection errors or 5xx).",
            ["upstream", "reason"],
            registry=r,
        )
        self.client_connections = Gauge(
            "fairshare_gateway_client_connections",
            "Client connections open now.",
            registry=r,
        )
        self.connections_closed = Counter(
            "fairshare_gateway_client_connections_closed",
            "Client connections the gateway closed on its own, by reason (over_limit: "
            "limits.max_client_connections were open; header_timeout: no whole request "
            "head within limits.header_timeout_s).",
            ["reason"],
            registry=r,
        )
        self.upstream_in_flight = Gauge(
            "fairshare_gateway_upstream_in_flight",
            "Requests this gateway has outstanding on an upstream now, by pool and upstream.",
            ["pool", "upstream"],
            registry=r,
        )
        self.upstream_sent = Counter(
            "fairshare_gateway_upstream_sent",
            "Requests sent to an upstream, by pool, upstream and standing (within, "
            "borrowing, degraded); an attempt whose connection was refused counts too.",
            ["pool", "upstream", "standing"],
            registry=r,
        )
        self.first_token = Histogram(
            "fairshare_gateway_time_to_first_token_seconds",
            "Streamed requests: seconds from their arrival to the first chunk of the answer, "
            "by pool and kind of grant (within, borrowing, degraded).",
            ["pool", "kind"],
            buckets=FIRST_TOKEN_BUCKETS,
            registry=r,
        )
        self.pending_releases = Gauge(
            "fairshare_gateway_pending_releases",
            "Releases no owner has acknowledged yet, kept and retried by the client library.",
            registry=r,
        )
        self.charged = Counter(
            "fairshare_gateway_charged",
            "Consumption released, in the configured cost unit, by pool.",
            ["pool"],
            registry=r,
        )
        # The children the request path uses, by label values (see ``Children``).
        self.requests_by = Children(self.requests)
        self.in_flight_by = Children(self.in_flight)
        self.acquiring_by = Children(self.acquiring)
        self.acquire_seconds_by = Children(self.acquire_seconds)
        self.grants_by = Children(self.grants)
        self.fallbacks_by = Children(self.fallbacks)
        self.upstream_in_flight_by = Children(self.upstream_in_flight)
        self.upstream_sent_by = Children(self.upstream_sent)
        self.first_token_by = Children(self.first_token)
        self.charged_by = Children(self.charged)

    def app(self) -> web.Application:
        """The metrics port's application: ``/metrics`` and ``/healthz``."""

        async def metrics(_: web.Request) -> web.Response:
            body = generate_latest(self.registry)
            return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

        async def healthz(_: web.Request) -> web.Response:
            return web.Response(text="ok\n")

        app = web.Application()
        app.router.add_get("/metrics", metrics)
        app.router.add_get("/healthz", healthz)
        return app
