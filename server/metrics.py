"""Prometheus metrics of one replica.

Counters and histograms are updated on the request path (the servicer counts decisions,
the peer transport times forwards). Everything that is state rather than an event
(in-flight, usage, ownership, fencing) is read from ``Allocator.status()`` at scrape time
by a custom collector, so the hot path pays nothing for it and a scrape never shows a
stale gauge.

Each ``Metrics`` has its own registry, so several servers can run in one process (tests).

Team labels are bounded by the configuration: a team that is not in its pool's ``shares``
(a pool accepts any team name a client sends, with share 0) is counted under the one
label ``UNCONFIGURED``, so clients cannot grow the number of series without bound.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import threading
import time
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from enum import Enum
from socketserver import ThreadingMixIn
from typing import Any, Final
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server
from wsgiref.types import StartResponse, WSGIEnvironment

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, make_wsgi_app
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from ha import Decision, PoolStatus

logger = logging.getLogger(__name__)

# Decisions take tens of microseconds locally and a few milliseconds with a durable write
# or a forward; the buckets cover 50 us .. 2.5 s.
LATENCY_BUCKETS: Final = (
    0.00005,
    0.0001,
    0.00025,
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
)


class Outcome(Enum):
    """How an Acquire ended, as counted in ``fairshare_decisions_total``."""

    WITHIN = "within"
    BORROW = "borrow"
    DEGRADED = "degraded"
    REFUSED = "refused"

    @classmethod
    def of(cls, decision: Decision) -> Outcome:
        """The outcome of a decision."""
        if not decision.granted:
            return cls.REFUSED
        if decision.degraded:
            return cls.DEGRADED
        return cls.BORROW if decision.borrowing else cls.WITHIN


Page = tuple[str, str, bytes]
"""An answer of an extra page on the metrics port: status line, content type, body."""

UNCONFIGURED: Final = "(unconfigured)"
"""The team label of every team that is not in its pool's configured shares."""


class Metrics:
    """The metrics of one replica, in a registry of their own."""

    def __init__(
        self,
        status: Callable[[], Sequence[PoolStatus]] | None = None,
        *,
        teams: Mapping[str, Collection[str]] | None = None,
    ) -> None:
        """Creates the metrics.

        Args:
            status: returns the replica's pool states (``Allocator.status``); read at
                every scrape. None: no state gauges (until ``watch`` is called).
            teams: pool -> its configured teams, which get a label each; any other team
                is labelled ``UNCONFIGURED``. None: every team gets its own label.
        """
        self._teams = None if teams is None else {p: frozenset(t) for p, t in teams.items()}
        self.registry = CollectorRegistry(auto_describe=True)
        self.decisions = Counter(
            "fairshare_decisions",
            "Acquire decisions by pool, team and outcome (within, borrow, degraded, refused).",
            ["pool", "team", "outcome"],
            registry=self.registry,
        )
        self.priorities = Counter(
            "fairshare_decision_priorities",
            "Granted Acquire decisions by pool and the vLLM priority they carry.",
            ["pool", "priority"],
            registry=self.registry,
        )
        self.decision_latency = Histogram(
            "fairshare_decision_latency_seconds",
            "Time to answer an Acquire, as the serving replica measures it.",
            ["pool"],
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.forward_latency = Histogram(
            "fairshare_forward_latency_seconds",
            "Time of one call forwarded to a peer replica, by method.",
            ["method"],
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.malformed = Counter(
            "fairshare_malformed_requests",
            "Requests refused because their body does not parse, by method.",
            ["method"],
            registry=self.registry,
        )
        self.limited = Counter(
            "fairshare_limit_refusals",
            "Requests refused with RESOURCE_EXHAUSTED, by the limit they met "
            "(max_teams, max_in_flight, max_in_flight_per_holder, max_adopt_grants, "
            "max_calls_per_client, max_streams_per_client, max_streams).",
            ["limit"],
            registry=self.registry,
        )
        self.open_streams = Gauge(
            "fairshare_open_streams",
            "Streaming calls open now (health Watch, reflection, AcquireStream), at most "
            "max_streams.",
            registry=self.registry,
        )
        # The labelled children of the two metrics every Acquire updates, kept so that a
        # decision costs a dictionary look-up, not a label resolution. They hold no more
        # than the registry itself does (one entry per label set ever used).
        self._decided: dict[tuple[str, str, Outcome], Any] = {}
        self._prioritised: dict[tuple[str, int], Any] = {}
        self._latency: dict[str, Any] = {}
        self._collector = _StatusCollector(self.team_label)
        self.registry.register(self._collector)
        if status is not None:
            self.watch(status)

    def watch(self, status: Callable[[], Sequence[PoolStatus]]) -> None:
        """Reads the state gauges from ``status`` at every scrape from now on."""
        self._collector.status = status

    def team_label(self, pool: str, team: str) -> str:
        """The label ``team`` is counted under in ``pool``."""
        if self._teams is None or team in self._teams.get(pool, ()):
            return team
        return UNCONFIGURED

    def count(
        self,
        pool: str,
        team: str,
        outcome: Outcome,
        seconds: float | None,
        priority: int | None = None,
    ) -> None:
        """Counts one decision, its latency and the priority it grants if given.

        Priorities are few (``fairshare.priority``: two per rank up to ``MAX_RANK``), so
        their label stays bounded."""
        key = (pool, self.team_label(pool, team), outcome)
        counter = self._decided.get(key)
        if counter is None:
            counter = self._decided[key] = self.decisions.labels(pool, key[1], outcome.value)
        counter.inc()
        if priority is not None:
            given = self._prioritised.get((pool, priority))
            if given is None:
                given = self._prioritised[pool, priority] = self.priorities.labels(
                    pool, str(priority)
                )
            given.inc()
        if seconds is not None:
            latency = self._latency.get(pool)
            if latency is None:
                latency = self._latency[pool] = self.decision_latency.labels(pool)
            latency.observe(seconds)

    def count_malformed(self, method: str) -> None:
        """Counts one request whose body did not parse."""
        self.malformed.labels(method).inc()

    def count_limited(self, limit: str) -> None:
        """Counts one request refused at ``limit``."""
        self.limited.labels(limit).inc()

    def watch_streams(self, open_streams: Callable[[], int]) -> None:
        """Reads ``fairshare_open_streams`` from ``open_streams`` at every scrape."""
        self.open_streams.set_function(open_streams)

    def observe_forward(self, method: str, seconds: float) -> None:
        """Records the latency of one forwarded call."""
        self.forward_latency.labels(method).observe(seconds)

    def serve(
        self,
        address: str,
        *,
        alive: Callable[[], bool] | None = None,
        pages: Mapping[str, Callable[[], Page]] | None = None,
    ) -> Callable[[], None]:
        """Serves ``/metrics`` and ``/healthz`` on ``host:port`` in background threads.

        ``/healthz`` (liveness) answers 200 when ``alive()`` is true (always, without
        it), 503 otherwise; a path of ``pages`` (the status page) answers what its
        function returns, called in the request's thread (to GET and HEAD only); every
        other path is the metrics.

        Returns:
            A function that stops the HTTP server.

        Raises:
            OSError: the address cannot be bound.
        """
        host, _, port = address.rpartition(":")
        host = host.strip("[]")
        metrics_app = make_wsgi_app(self.registry)

        extra = dict(pages or {})

        def app(environ: WSGIEnvironment, start_response: StartResponse) -> Iterable[bytes]:
            page = extra.get(environ.get("PATH_INFO", ""))
            if page is not None:
                method = environ.get("REQUEST_METHOD")
                if method not in ("GET", "HEAD"):
                    start_response("405 Method Not Allowed", [("Allow", "GET, HEAD")])
                    return [b""]
                status, content_type, body = page()
                start_response(
                    status,
                    [
                        ("Content-Type", content_type),
                        ("Content-Length", str(len(body))),
                        ("Cache-Control", "no-store"),
                    ],
                )
                return [] if method == "HEAD" else [body]
            if environ.get("PATH_INFO") != HEALTHZ_PATH:
                answer: Iterable[bytes] = metrics_app(environ, start_response)
                return answer
            ok = alive is None or alive()
            body = b"ok\n" if ok else b"the event loop did not answer\n"
            start_response(
                "200 OK" if ok else "503 Service Unavailable",
                [("Content-Type", "text/plain; charset=utf-8"), ("Content-Length", str(len(body)))],
            )
            return [body]

        class Server(_ThreadingServer):
            address_family = socket.AF_INET6 if ":" in host else socket.AF_INET

        server = make_server(host, int(port), app, Server, handler_class=_QuietHandler)
        thread = threading.Thread(target=server.serve_forever, name="metrics-http", daemon=True)
        thread.start()
        logger.info("metrics on http://%s/metrics, liveness on %s", address, HEALTHZ_PATH)

        def stop() -> None:
            server.shutdown()
            server.server_close()
            thread.join(timeout=5)

        return stop


HEALTHZ_PATH: Final = "/healthz"
"""The liveness endpoint on the metrics port."""
LIVENESS_TIMEOUT_S: Final = 2.0
"""How long ``/healthz`` waits for the event loop to run a callback before it answers 503."""


def event_loop_alive(
    loop: asyncio.AbstractEventLoop, timeout_s: float = LIVENESS_TIMEOUT_S
) -> Callable[[], bool]:
    """A check, callable from any thread, that ``loop`` runs: it schedules a callback on
    the loop and waits up to ``timeout_s`` for it to run. False for a loop that is
    closed, stopped, or blocked (a hung process) for that long."""

    def alive() -> bool:
        ran = threading.Event()
        try:
            loop.call_soon_threadsafe(ran.set)
        except RuntimeError:  # the loop is closed
            return False
        return ran.wait(timeout_s)

    return alive


class _ThreadingServer(ThreadingMixIn, WSGIServer):
    """One thread per request: a slow scrape does not hold a liveness probe."""

    daemon_threads = True


class _QuietHandler(WSGIRequestHandler):
    """No line per request on stderr (probes come every few seconds)."""

    def log_message(self, format: str, *args: Any) -> None:
        pass


SCRAPE_CACHE_S: Final = 1.0
"""A scrape within this many seconds of the previous one is answered from its gauges:
reading every team of every pool is O(T), and several scrapers (or one in a loop) must
not make the owner pay it more than once a second."""

_Family = GaugeMetricFamily | CounterMetricFamily

_TEAM_GAUGES: Final = (
    ("fairshare_in_flight", "Grants in flight (phantoms excluded)."),
    ("fairshare_borrowing", "Grants in flight above the reservation."),
    ("fairshare_phantoms", "Requests of a previous owner still counted."),
    ("fairshare_usage", "Decayed usage (cost units)."),
    ("fairshare_reserved", "Within-share slots."),
    (
        "fairshare_rank",
        "Dense rank of the team's level fairshare, 0 = least served (teams sharing a "
        "label: the lowest); a borrower's priority grows with it.",
    ),
    (
        "fairshare_within",
        "Within-share count: grants admitted within share plus phantoms counted as "
        "within. A new request is within share while it is below fairshare_reserved.",
    ),
    ("fairshare_held", "Borrowers held back by the pool's lending limit, waiting for a slot."),
)
"""The per-team gauges (labels pool, team): name and help, in ``_by_label``'s order."""


class _StatusCollector(Collector):
    """Turns ``Allocator.status()`` into gauges at scrape time (at most once a second)."""

    def __init__(self, team_label: Callable[[str, str], str]) -> None:
        self.status: Callable[[], Sequence[PoolStatus]] | None = None
        self._team_label = team_label
        self._lock = threading.Lock()  # scrapes come from the HTTP server's threads
        self._cached: tuple[float, list[_Family]] | None = None

    def describe(self) -> list[GaugeMetricFamily]:
        # Described lazily: the families depend on the status read at scrape time.
        return []

    def collect(self) -> Iterator[_Family]:
        with self._lock:
            now = time.monotonic()
            if self._cached is None or now - self._cached[0] >= SCRAPE_CACHE_S:
                self._cached = (now, list(self._collect()))
            families = self._cached[1]
        yield from families

    def _team_families(self, pools: Sequence[PoolStatus]) -> list[GaugeMetricFamily]:
        """The gauges of ``_TEAM_GAUGES``, one sample per pool and team label."""
        families = [
            GaugeMetricFamily(name, doc, labels=["pool", "team"]) for name, doc in _TEAM_GAUGES
        ]
        for view in pools:
            for label, values in self._by_label(view):
                for family, value in zip(families, values, strict=True):
                    if value is not None:
                        family.add_metric([str(view.pool), label], value)
        return families

    def _by_label(self, view: PoolStatus) -> Iterator[tuple[str, list[float | None]]]:
        """(team label, its values in the order of ``_TEAM_GAUGES``) of a pool's teams:
        teams that share a label (the unconfigured ones) are summed under it and their rank
        is the lowest of theirs. The within-share count is None (no sample) when a team of
        the label has none (``PoolStatus.within`` does not name it)."""
        rows: dict[str, list[float]] = {}
        counts: dict[str, float | None] = {}
        held: dict[str, float] = {}
        for team in view.teams:
            label = self._team_label(str(view.pool), team.team)
            row = rows.get(label)
            if row is None:
                row = rows[label] = [0.0] * 5 + [float(team.rank)]
                counts[label] = 0.0
            for i, value in enumerate(
                (team.in_flight, team.borrowing, team.phantoms, team.usage, team.reserved)
            ):
                row[i] += value
            row[5] = min(row[5], team.rank)
            count, so_far = view.within.get(team.team), counts[label]
            counts[label] = None if count is None or so_far is None else so_far + count
            held[label] = held.get(label, 0.0) + view.held.get(team.team, 0)
        for label, row in rows.items():
            yield label, [*row, counts[label], held[label]]

    def _collect(self) -> Iterator[_Family]:
        status = self.status
        if status is None:
            return
        try:
            pools = list(status())
        except Exception:
            # A scrape must never take the process down; say why the gauges are missing.
            logger.exception("metrics: reading the allocator status failed")
            return
        owner = GaugeMetricFamily(
            "fairshare_owner", "1 when this replica owns the pool.", labels=["pool"]
        )
        epoch = GaugeMetricFamily(
            "fairshare_epoch", "Epoch of the pool's owner as seen here.", labels=["pool"]
        )
        transitions = CounterMetricFamily(
            "fairshare_ownership_transitions",
            "Epochs of the pool this replica started (an ownership change counts once, here).",
            labels=["pool"],
        )
        snapshot_age = GaugeMetricFamily(
            "fairshare_snapshot_age_seconds",
            "Seconds since the owner last wrote the pool's snapshot (-1: never).",
            labels=["pool"],
        )
        fence_left = GaugeMetricFamily(
            "fairshare_fence_left_seconds",
            "Seconds this owner may still decide before it self-fences (0: not owner).",
            labels=["pool"],
        )
        teams_known = GaugeMetricFamily(
            "fairshare_teams",
            "Teams the owner keeps state for (at most the pool's max_teams).",
            labels=["pool"],
        )
        degraded = CounterMetricFamily(
            "fairshare_degraded_decisions",
            "Decisions made by this replica with no owner reachable.",
            labels=["pool"],
        )
        store_full = GaugeMetricFamily(
            "fairshare_store_full",
            "1 while the store refuses this replica's writes for the pool for lack of space.",
            labels=["pool"],
        )
        store_refused = CounterMetricFamily(
            "fairshare_store_refused_writes",
            "Writes for the pool the store refused for lack of space, since start.",
            labels=["pool"],
        )
        clamped = CounterMetricFamily(
            "fairshare_charges_clamped",
            "Releases charged at the pool's bound (max_charge_per_s x max_request_s) "
            "instead of the larger amount claimed.",
            labels=["pool"],
        )
        refused = CounterMetricFamily(
            "fairshare_grant_ids_refused",
            "Releases and adopted grants refused as not genuine grant ids.",
            labels=["pool"],
        )
        unproven = CounterMetricFamily(
            "fairshare_unproven_releases",
            "Releases of client-made degraded grant ids no owner counted first: not charged.",
            labels=["pool"],
        )
        for view in pools:
            name = str(view.pool)
            unproven.add_metric([name], float(view.unproven_releases))
            store_full.add_metric([name], 1.0 if view.store_full else 0.0)
            store_refused.add_metric([name], float(view.store_refused_writes))
            clamped.add_metric([name], float(view.charges_clamped))
            refused.add_metric([name], float(view.grant_ids_refused))
            owner.add_metric([name], 1.0 if view.owned else 0.0)
            epoch.add_metric([name], float(view.epoch))
            transitions.add_metric([name], float(view.transitions))
            snapshot_age.add_metric([name], view.snapshot_age_s)
            fence_left.add_metric([name], view.fence_left_s)
            degraded.add_metric([name], float(view.degraded_decisions))
            if view.owned:
                teams_known.add_metric([name], float(len(view.teams)))
        yield from self._team_families(pools)
        yield from (owner, epoch)
        yield from (transitions, snapshot_age, fence_left, degraded, clamped, refused, unproven)
        yield from (store_full, store_refused)
        yield teams_known
