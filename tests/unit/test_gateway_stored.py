"""The stored responses a gateway remembers: by team, bounded, least recently used first."""

from __future__ import annotations

from fairshare.gateway.config import Route
from fairshare.gateway.stored import Stored, StoredResponses, valid_id

ROUTE = Route("gpu-a", ("http://a", "http://b"))


def made(url: str, team: str = "team-a") -> Stored:
    return Stored("m", ROUTE, url, team)


def test_an_id_is_found_only_for_its_team() -> None:
    stored = StoredResponses(10)
    stored.note("resp_1", made("http://a"))
    assert stored.find("resp_1", "team-a") == made("http://a")
    assert stored.find("resp_1", "team-b") is None
    assert stored.find("resp_2", "team-a") is None


def test_an_id_noted_for_a_second_team_is_forgotten_not_handed_over() -> None:
    # vLLM makes a client's request_id the answer's id: were one to reach it, a second
    # team could name the first's id; neither then finds it.
    stored = StoredResponses(10)
    stored.note("resp_1", made("http://a"))
    stored.note("resp_1", made("http://b", "team-b"))
    assert stored.find("resp_1", "team-a") is None
    assert stored.find("resp_1", "team-b") is None
    assert len(stored) == 0


def test_only_ids_that_cannot_change_a_path_are_kept() -> None:
    stored = StoredResponses(10)
    for bad in ("..", "a/b", "a%2Fb", "", "x" * 129, "resp_1?x=1"):
        stored.note(bad, made("http://a"))
    assert len(stored) == 0
    assert valid_id("resp_0123abcd-EF")


def test_the_least_recently_used_is_forgotten_first() -> None:
    stored = StoredResponses(2)
    stored.note("resp_1", made("http://a"))
    stored.note("resp_2", made("http://b"))
    assert stored.find("resp_1", "team-a") is not None  # now the most recently used
    stored.note("resp_3", made("http://a"))
    assert len(stored) == 2
    assert stored.find("resp_2", "team-a") is None
    assert stored.find("resp_1", "team-a") is not None
    stored.note("resp_1", made("http://b"))  # noted again for its team: the newest wins
    assert stored.find("resp_1", "team-a") == made("http://b")
