"""Metrics: team labels stay bounded by the configuration; the team gauges, the
within-share count among them."""

from __future__ import annotations

import dataclasses
import re

from prometheus_client import generate_latest

from fairshare import TeamStat
from ha.api import Epoch, NodeId, PoolName, PoolStatus
from server.metrics import UNCONFIGURED, Metrics, Outcome


def team(name: str, in_flight: int, usage: float) -> TeamStat:
    return TeamStat(name, 0.0, 0, in_flight, in_flight, 0, usage, 0.0, 1, 0)


def status(teams: list[TeamStat]) -> PoolStatus:
    return PoolStatus(
        pool=PoolName("p"),
        owned=True,
        owner=NodeId("n"),
        epoch=Epoch(1),
        transitions=1,
        fence_left_s=1.0,
        snapshot_age_s=0.1,
        teams=teams,
        degraded_decisions=0,
    )


def samples(metrics: Metrics, family: str) -> dict[str, float]:
    text = generate_latest(metrics.registry).decode()
    pattern = rf'^{family}{{(?:outcome="[a-z]+",)?pool="p",team="([^"]*)"}} (\S+)$'
    found: dict[str, float] = {}
    for label, value in re.findall(pattern, text, flags=re.MULTILINE):
        found[label] = found.get(label, 0.0) + float(value)
    return found


def test_teams_outside_the_configuration_share_one_label() -> None:
    teams = [team("a", 2, 1.0)] + [team(f"stray-{i}", 1, 0.5) for i in range(50)]
    metrics = Metrics(lambda: [status(teams)], teams={"p": ["a", "b"]})
    for stat in teams:
        metrics.count("p", stat.team, Outcome.BORROW, None)

    assert samples(metrics, "fairshare_in_flight") == {"a": 2.0, UNCONFIGURED: 50.0}
    assert samples(metrics, "fairshare_usage") == {"a": 1.0, UNCONFIGURED: 25.0}
    assert samples(metrics, "fairshare_decisions_total") == {"a": 1.0, UNCONFIGURED: 50.0}


def test_without_a_configuration_every_team_has_its_label() -> None:
    metrics = Metrics(lambda: [status([team("x", 1, 0.0)])])
    assert samples(metrics, "fairshare_in_flight") == {"x": 1.0}


def test_refused_ids_and_clamped_charges_are_counted_per_pool() -> None:
    view = dataclasses.replace(
        status([]), charges_clamped=3, grant_ids_refused=2, unproven_releases=5
    )
    text = generate_latest(Metrics(lambda: [view]).registry).decode()
    assert 'fairshare_charges_clamped_total{pool="p"} 3.0' in text
    assert 'fairshare_grant_ids_refused_total{pool="p"} 2.0' in text
    assert 'fairshare_unproven_releases_total{pool="p"} 5.0' in text


def test_granted_priorities_and_ranks_are_exported_per_pool() -> None:
    teams = [team("a", 1, 0.0), team("stray-1", 0, 0.0), team("stray-2", 0, 0.0)]
    teams[1] = dataclasses.replace(teams[1], rank=3)
    teams[2] = dataclasses.replace(teams[2], rank=2)
    metrics = Metrics(lambda: [status(teams)], teams={"p": ["a"]})
    metrics.count("p", "a", Outcome.WITHIN, None, 0)
    metrics.count("p", "a", Outcome.BORROW, None, 20)
    metrics.count("p", "a", Outcome.BORROW, None, 20)
    metrics.count("p", "a", Outcome.REFUSED, None)
    text = generate_latest(metrics.registry).decode()
    assert 'fairshare_decision_priorities_total{pool="p",priority="0"} 1.0' in text
    assert 'fairshare_decision_priorities_total{pool="p",priority="20"} 2.0' in text
    assert samples(metrics, "fairshare_rank") == {"a": 1.0, UNCONFIGURED: 2.0}


def test_the_within_share_count_is_a_team_gauge_summed_like_the_others() -> None:
    teams = [team("a", 6, 0.0), team("stray-1", 2, 0.0), team("stray-2", 1, 0.0)]
    teams[0] = dataclasses.replace(teams[0], reserved=4, borrowing=2)
    view = dataclasses.replace(status(teams), within={"a": 4, "stray-1": 0, "stray-2": 1})
    metrics = Metrics(lambda: [view], teams={"p": ["a"]})
    assert samples(metrics, "fairshare_within") == {"a": 4.0, UNCONFIGURED: 1.0}
    assert samples(metrics, "fairshare_reserved")["a"] == 4.0


def test_a_team_without_a_count_gets_no_within_sample() -> None:
    teams = [team("a", 1, 0.0), team("b", 1, 0.0), team("stray", 1, 0.0)]
    view = dataclasses.replace(status(teams), within={"a": 1, "stray": 1})
    metrics = Metrics(lambda: [view], teams={"p": ["a", "b"]})
    # b has no count: not a 0. The unconfigured label sums only teams that all have one.
    assert samples(metrics, "fairshare_within") == {"a": 1.0, UNCONFIGURED: 1.0}
    assert samples(metrics, "fairshare_in_flight") == {"a": 1.0, "b": 1.0, UNCONFIGURED: 1.0}
