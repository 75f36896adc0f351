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

import logging
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from enum import Enum
from typing import Final

from prometheus_client import CollectorRegistry, Counter, Histogram, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from ha.api import Decision, PoolStatus

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

    def count(self, pool: str, team: str, outcome: Outcome, seconds: float | None) -> None:
        """Counts one decision, and its latency if given."""
        self.decisions.labels(pool, self.team_label(pool, team), outcome.value).inc()
        if seconds is not None:
            self.decision_latency.labels(pool).observe(seconds)

    def observe_forward(self, method: str, seconds: float) -> None:
        """Records the latency of one forwarded call."""
        self.forward_latency.labels(method).observe(seconds)

    def serve(self, address: str) -> Callable[[], None]:
        """Serves ``/metrics`` on ``host:port`` in a background thread.

        Returns:
            A function that stops the HTTP server.
        """
        host, _, port = address.rpartition(":")
        server, thread = start_http_server(int(port), addr=host.strip("[]"), registry=self.registry)
        logger.info("metrics on http://%s/metrics", address)

        def stop() -> None:
            server.shutdown()
            server.server_close()
            thread.join(timeout=5)

        return stop


class _StatusCollector(Collector):
    """Turns ``Allocator.status()`` into gauges at scrape time."""

    def __init__(self, team_label: Callable[[str, str], str]) -> None:
        self.status: Callable[[], Sequence[PoolStatus]] | None = None
        self._team_label = team_label

    def describe(self) -> list[GaugeMetricFamily]:
        # Described lazily: the families depend on the status read at scrape time.
        return []

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        status = self.status
        if status is None:
            return
        try:
            pools = list(status())
        except Exception:
            # A scrape must never take the process down; say why the gauges are missing.
            logger.exception("metrics: reading the allocator status failed")
            return
        team_labels = ["pool", "team"]
        in_flight = GaugeMetricFamily(
            "fairshare_in_flight", "Grants in flight (phantoms excluded).", labels=team_labels
        )
        borrowing = GaugeMetricFamily(
            "fairshare_borrowing", "Grants in flight above the reservation.", labels=team_labels
        )
        phantoms = GaugeMetricFamily(
            "fairshare_phantoms", "Requests of a previous owner still counted.", labels=team_labels
        )
        usage = GaugeMetricFamily(
            "fairshare_usage", "Decayed usage (cost units).", labels=team_labels
        )
        reserved = GaugeMetricFamily(
            "fairshare_reserved", "Within-share slots.", labels=team_labels
        )
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
        degraded = CounterMetricFamily(
            "fairshare_degraded_decisions",
            "Decisions made by this replica with no owner reachable.",
            labels=["pool"],
        )
        for view in pools:
            name = str(view.pool)
            owner.add_metric([name], 1.0 if view.owned else 0.0)
            epoch.add_metric([name], float(view.epoch))
            transitions.add_metric([name], float(view.transitions))
            snapshot_age.add_metric([name], view.snapshot_age_s)
            fence_left.add_metric([name], view.fence_left_s)
            degraded.add_metric([name], float(view.degraded_decisions))
            # Teams that share a label (the unconfigured ones) are summed under it.
            sums: dict[str, list[float]] = {}
            for team in view.teams:
                values = (team.in_flight, team.borrowing, team.phantoms, team.usage, team.reserved)
                total = sums.setdefault(self._team_label(name, team.team), [0.0] * 5)
                for i, value in enumerate(values):
                    total[i] += value
            for label, (n, borrowed, phantom, used, slots) in sums.items():
                labels = [name, label]
                in_flight.add_metric(labels, n)
                borrowing.add_metric(labels, borrowed)
                phantoms.add_metric(labels, phantom)
                usage.add_metric(labels, used)
                reserved.add_metric(labels, slots)
        yield from (in_flight, borrowing, phantoms, usage, reserved, owner, epoch)
        yield from (transitions, snapshot_age, fence_left, degraded)
