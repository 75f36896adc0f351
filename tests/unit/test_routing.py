"""The routers a gateway chooses an upstream with (``fairshare.routing``)."""

from __future__ import annotations

import random

import pytest

from fairshare.routing import ROUTERS, FewestAhead, Outstanding, make_router

pytestmark = pytest.mark.timeout(30)


def _tally(per_upstream: list[dict[int, int]]) -> Outstanding:
    """A tally with ``per_upstream[i][priority]`` requests outstanding on upstream i."""
    tally = Outstanding(len(per_upstream))
    for upstream, counts in enumerate(per_upstream):
        for priority, n in counts.items():
            for _ in range(n):
                tally.sent(upstream, priority)
    return tally


def test_the_tally_counts_by_priority_and_forgets_ended_requests() -> None:
    tally = _tally([{0: 2, 21: 5}, {11: 1}])
    assert (tally.total(0), tally.total(1)) == (7, 1)
    assert tally.at_most(0, 0) == 2
    assert tally.at_most(0, 20) == 2
    assert tally.at_most(0, 21) == 7
    tally.ended(0, 0)
    tally.ended(0, 0)
    assert tally.at_most(0, 0) == 0 and tally.total(0) == 5
    with pytest.raises(ValueError, match="no request of priority 0"):
        tally.ended(0, 0)


def test_a_pool_needs_an_upstream() -> None:
    with pytest.raises(ValueError):
        Outstanding(0)


@pytest.mark.parametrize(
    ("counts", "priority", "expected"),
    [
        pytest.param(
            [{21: 10, 0: 2}, {21: 12}, {21: 11, 0: 1}],
            0,
            1,
            id="within-share-goes-where-no-within-share-is-ahead-despite-more-borrowers",
        ),
        pytest.param(
            [{21: 10, 0: 1}, {21: 12, 0: 1}, {21: 11, 0: 1}],
            0,
            0,
            id="equal-within-share-ahead-then-fewest-outstanding",
        ),
        pytest.param(
            [{0: 3, 21: 4}, {21: 8}, {0: 1, 11: 2, 21: 5}],
            21,
            0,
            id="a-borrower-counts-every-request-ranked-at-or-above-it",
        ),
        pytest.param(
            [{0: 3, 31: 1}, {11: 2, 31: 9}, {0: 1, 11: 2}],
            11,
            1,
            id="a-better-ranked-borrower-ignores-worse-ranked-ones",
        ),
    ],
)
def test_fewest_ahead(counts: list[dict[int, int]], priority: int, expected: int) -> None:
    assert FewestAhead(random.Random(0)).choose(priority, _tally(counts)) == expected


def test_least_outstanding_ignores_priorities() -> None:
    router = make_router("least-outstanding", rng=random.Random(0))
    assert router.choose(0, _tally([{0: 2}, {21: 1}, {21: 3}])) == 1


def test_round_robin_starts_where_told_and_cycles() -> None:
    router = make_router("round-robin", rng=random.Random(0), start=2)
    tally = Outstanding(3)
    assert [router.choose(0, tally) for _ in range(4)] == [2, 0, 1, 2]


def test_ties_are_broken_at_random_and_deterministically_for_a_seed() -> None:
    tally = Outstanding(4)
    picks = [make_router("fewest-ahead", rng=random.Random(s)).choose(0, tally) for s in range(40)]
    assert set(picks) == {0, 1, 2, 3}
    again = [make_router("fewest-ahead", rng=random.Random(s)).choose(0, tally) for s in range(40)]
    assert picks == again


@pytest.mark.parametrize("name", ROUTERS)
def test_every_router_returns_an_upstream(name: str) -> None:
    router = make_router(name, rng=random.Random(1))
    tally = Outstanding(5)
    for i in range(50):
        upstream = router.choose(i % 3, tally)
        assert 0 <= upstream < 5
        tally.sent(upstream, i % 3)


@pytest.mark.parametrize("name", ROUTERS)
def test_excluded_upstreams_are_never_chosen(name: str) -> None:
    router = make_router(name, rng=random.Random(3))
    tally = _tally([{}, {0: 5}, {}, {0: 9}])
    picks = {router.choose(0, tally, frozenset({0, 2})) for _ in range(20)}
    assert picks <= {1, 3}
    assert router.choose(0, tally, frozenset(range(4))) is None


def test_an_unknown_router_is_refused_with_the_known_names() -> None:
    with pytest.raises(ValueError, match="round-robin"):
        make_router("power-of-two", rng=random.Random(0))
