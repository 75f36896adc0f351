"""``make demo``'s printout: each team's within-share count of its reservation, as the
allocator's status report gives it, and the summary of how often a team held its slots."""

from __future__ import annotations

import time

from harness.demo import Ended, TeamView, report, sample, summary

ROWS = {
    "a": {"reserved": 4, "within": 4, "in_flight": 12, "borrowing": 8},
    "b": {"reserved": 2, "within": 1, "in_flight": 2, "borrowing": 1},
    "c": {"reserved": 2, "within": None, "in_flight": 1, "borrowing": 0},
}


def views() -> dict[str, TeamView]:
    return {team: TeamView() for team in ("a", "b", "c")}


def test_each_line_shows_the_count_of_the_reservation_now() -> None:
    seen = views()
    now = time.monotonic()
    seen["a"].ended.extend([Ended(now, True, 0, 0.1), Ended(now, False, 30, 1.5)])
    lines = report(seen, ROWS, 9.0).splitlines()
    a, b, c = (line.split() for line in lines[3:])
    assert a[:7] == ["a", "0.5", "12", "4/4", "8", "1", "1"]
    assert a[-2:] == ["0×1", "30×1"]
    assert b[:5] == ["b", "0.3", "2", "1/2", "1"]
    assert c[:5] == ["c", "0.2", "1", "-/2", "0"]  # unknown, not 0
    assert report(views(), {}, 1.0).splitlines()[3].split()[:5] == ["a", "0.5", "-", "-", "-"]


def test_the_summary_counts_the_samples_that_held_min_reservation_in_flight() -> None:
    seen = views()
    sample(seen, ROWS)
    sample(seen, ROWS | {"a": ROWS["a"] | {"within": 3}})
    lines = summary(seen, ROWS).splitlines()[1:]
    held = "held min(reservation, in flight) in"
    assert lines[0].startswith(f"team a (reservation 4, 12 in flight): {held} 1 of 2")
    assert lines[0].endswith("(within-share counts seen: 3×1, 4×1)")
    assert lines[1].startswith(f"team b (reservation 2, 2 in flight): {held} 0 of 2")
    assert lines[2].startswith(f"team c (reservation 2, 1 in flight): {held} 0 of 0")
