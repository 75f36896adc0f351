"""``fairshare status``'s table and JSON: the within-share count shown against the
reservation, and an owner that does not send the count shown as unknown, not as 0."""

from __future__ import annotations

import json

from fairshare.cli.client_commands import format_table, snapshot_dict, within_cell
from fairshare.wire.pb.fairshare.v1 import allocator_pb2 as pb

BUSY = pb.TeamStat(
    team="a", share=0.5, reserved=4, in_flight=12, borrowing=8, rank=1, usage=9.5, within=4
)
QUIET = pb.TeamStat(team="b", share=0.5, reserved=4, in_flight=1, within=1)


def snapshot(*teams: pb.TeamStat) -> pb.SnapshotResponse:
    return pb.SnapshotResponse(pool="p", capacity=8, owner="n", epoch=2, teams=teams)


def test_the_within_column_shows_the_count_of_the_reservation() -> None:
    lines = format_table(snapshot(BUSY, QUIET)).splitlines()
    assert lines[0] == "pool p  capacity 8  owner n  epoch 2"
    header = lines[1].split("  ")
    assert [h.strip() for h in header if h.strip()][:5] == [
        "team", "share", "reserved", "within", "in flight",
    ]  # fmt: skip
    assert lines[2].split()[:6] == ["a", "0.5", "4", "4/4", "12", "8"]
    assert lines[3].split()[:5] == ["b", "0.5", "4", "1/4", "1"]


def test_an_owner_without_the_count_shows_it_unknown() -> None:
    old = pb.TeamStat(team="a", share=0.5, reserved=4, in_flight=6, borrowing=2)
    assert within_cell(old) == "-/4"
    assert within_cell(pb.TeamStat(team="z", reserved=2, within=0)) == "0/2"
    (team,) = snapshot_dict(snapshot(old))["teams"]
    assert team["within"] is None


def test_the_json_carries_the_count() -> None:
    doc = snapshot_dict(snapshot(BUSY, QUIET))
    assert [(t["team"], t["reserved"], t["within"]) for t in doc["teams"]] == [
        ("a", 4, 4),
        ("b", 4, 1),
    ]
    json.dumps(doc, allow_nan=False)
