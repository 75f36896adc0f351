"""fairshare.gateway.upstreams: the choice of a route's upstream, its tally and its metrics."""

from __future__ import annotations

import random

import pytest

from fairshare.gateway.metrics import GatewayMetrics
from fairshare.gateway.upstreams import Upstreams, standing
from fairshare.routing import ROUTERS

pytestmark = pytest.mark.timeout(30)

WITHIN, BORROWING = 0, 21


def _upstreams(routing: str = "fewest-ahead", metrics: GatewayMetrics | None = None) -> Upstreams:
    return Upstreams("p", ["a", "b", "c"], routing=routing, rng=random.Random(7), metrics=metrics)


def test_a_within_share_request_goes_where_no_within_share_request_is_ahead() -> None:
    ups = _upstreams()
    # a and b hold one within-share request each, c holds three borrowers.
    ups.sent("a", WITHIN, "within")
    ups.sent("b", WITHIN, "within")
    for _ in range(3):
        ups.sent("c", BORROWING, "borrowing")
    assert ups.choose(WITHIN) == "c"
    # A borrower waits behind every one of them: it goes where the fewest are outstanding.
    assert ups.choose(BORROWING) in ("a", "b")


def test_a_refused_upstream_is_excluded() -> None:
    ups = _upstreams()
    for _ in range(2):
        ups.sent("a", BORROWING, "borrowing")
    assert ups.choose(WITHIN, exclude={"b", "c"}) == "a"
    assert ups.choose(WITHIN, exclude={"a", "b", "c"}) is None
    assert ups.choose(WITHIN, exclude={"elsewhere"}) in ("b", "c")


def test_ended_requests_are_forgotten_and_leases_end_whatever_way() -> None:
    ups = _upstreams()
    with pytest.raises(RuntimeError), ups.lease("a", WITHIN), ups.lease("a", BORROWING):
        assert ups.in_flight("a") == 2
        raise RuntimeError
    assert [ups.in_flight(u) for u in ups.urls] == [0, 0, 0]
    ups.sent("b", WITHIN, "within")
    with pytest.raises(ValueError, match="no request of priority"):
        ups.ended("b", BORROWING)  # ended with another priority than it was sent with
    ups.ended("b", WITHIN)
    assert ups.in_flight("b") == 0


def test_a_redecided_request_is_counted_with_its_new_priority() -> None:
    ups = _upstreams()
    ups.sent("a", BORROWING, "degraded")  # fail-open, then decided again within its share
    ups.ended("a", BORROWING)
    ups.sent("a", WITHIN, "within")
    assert ups.outstanding.at_most(0, WITHIN) == 1
    assert ups.outstanding.at_most(0, BORROWING - 1) == 1


@pytest.mark.parametrize("routing", ROUTERS)
def test_every_router_can_be_used(routing: str) -> None:
    ups = _upstreams(routing)
    chosen = [ups.choose(WITHIN) for _ in range(6)]
    assert set(chosen) <= {"a", "b", "c"}
    assert ups.routing == routing


def test_round_robin_goes_in_turn() -> None:
    ups = _upstreams("round-robin")
    first = ups.choose(WITHIN)
    assert first is not None
    start = ups.urls.index(first)
    rest = [ups.choose(WITHIN) for _ in range(5)]
    assert rest == [ups.urls[(start + i) % 3] for i in range(1, 6)]


def test_unknown_routing_and_no_upstream_are_errors() -> None:
    with pytest.raises(ValueError, match="unknown router"):
        Upstreams("p", ["a"], routing="smart")
    with pytest.raises(ValueError, match="at least one upstream"):
        Upstreams("p", [])


def test_metrics_follow_the_tally_and_count_by_standing() -> None:
    metrics = GatewayMetrics()
    ups = _upstreams(metrics=metrics)
    ups.sent("a", WITHIN, "within")
    ups.sent("a", BORROWING, "borrowing")
    ups.sent("b", BORROWING, "degraded")
    ups.ended("a", BORROWING)

    def value(name: str, **labels: str) -> float | None:
        return metrics.registry.get_sample_value(name, {"pool": "p", **labels})

    assert value("fairshare_gateway_upstream_in_flight", upstream="a") == 1
    assert value("fairshare_gateway_upstream_in_flight", upstream="b") == 1
    sent = "fairshare_gateway_upstream_sent_total"
    assert value(sent, upstream="a", standing="within") == 1
    assert value(sent, upstream="a", standing="borrowing") == 1
    assert value(sent, upstream="b", standing="degraded") == 1


def test_standing_of_a_grant() -> None:
    assert standing(borrowing=False, degraded=False) == "within"
    assert standing(borrowing=True, degraded=False) == "borrowing"
    assert standing(borrowing=True, degraded=True) == "degraded"
