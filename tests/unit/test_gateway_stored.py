"""The stored responses a gateway remembers: by team, bounded, least recently used first."""

from __future__ import annotations

from fairshare.gateway.config import Route
from fairshare.gateway.stored import Stored, StoredResponses

ROUTE = Route("gpu-a", ("http://a", "http://b"))


def made(url: str, team: str = "team-a") -> Stored:
    return Stored("m", ROUTE, url, team)


def test_an_id_is_found_only_for_its_team() -> None:
    stored = StoredResponses(10)
    stored.note("resp_1", made("http://a"))
    assert stored.find("resp_1", "team-a") == made("http://a")
    assert stored.find("resp_1", "team-b") is None
    assert stored.known_to_another("resp_1", "team-b")
    assert not stored.known_to_another("resp_1", "team-a")
    assert stored.find("resp_2", "team-a") is None
    assert not stored.known_to_another("resp_2", "team-a")


def test_the_least_recently_used_is_forgotten_first() -> None:
    stored = StoredResponses(2)
    stored.note("resp_1", made("http://a"))
    stored.note("resp_2", made("http://b"))
    assert stored.find("resp_1", "team-a") is not None  # now the most recently used
    stored.note("resp_3", made("http://a"))
    assert len(stored) == 2
    assert stored.find("resp_2", "team-a") is None
    assert stored.find("resp_1", "team-a") is not None
    stored.note("resp_1", made("http://b", "team-b"))  # noted again: the newest wins
    assert stored.find("resp_1", "team-b") == made("http://b", "team-b")
