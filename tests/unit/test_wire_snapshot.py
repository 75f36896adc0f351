"""The Snapshot answer's optional fields (``snapshot_age_s``, each team's within-share
count) cross the wire both ways, and an answer without them (an owner of an earlier
version) reads as "not said", not as 0."""

from __future__ import annotations

from fairshare import TeamStat
from fairshare.ids import Epoch, NodeId, PoolName
from fairshare.records import PoolView
from fairshare.wire.convert import pool_view, pool_view_pb
from fairshare.wire.pb.fairshare.v1 import allocator_pb2 as pb

TEAM = TeamStat("t", 0.5, 2, 1, 0, 10, 3.0, 0.25, 1, 0)


def test_the_age_of_the_stored_state_round_trips_including_zero() -> None:
    for age in (0.0, 2.5, -1.0):
        view = PoolView(PoolName("p"), 4, NodeId("n"), Epoch(3), [TEAM], age)
        wire = pb.SnapshotResponse.FromString(pool_view_pb(view).SerializeToString())
        assert pool_view(wire) == view


def test_an_answer_without_the_age_reads_as_unknown() -> None:
    old = pb.SnapshotResponse(pool="p", capacity=4, owner="n", epoch=3)
    assert not old.HasField("snapshot_age_s")
    assert pool_view(pb.SnapshotResponse.FromString(old.SerializeToString())).snapshot_age_s is None
    view = PoolView(PoolName("p"), 4, NodeId("n"), Epoch(3), [])
    assert not pool_view_pb(view).HasField("snapshot_age_s")


def test_each_teams_within_share_count_round_trips_including_zero() -> None:
    other = TeamStat("u", 0.5, 2, 3, 3, 0, 0.0, 1.0, 0, 0)
    view = PoolView(PoolName("p"), 4, NodeId("n"), Epoch(3), [TEAM, other], within={"t": 2, "u": 0})
    message = pool_view_pb(view)
    assert [(t.team, t.within) for t in message.teams] == [("t", 2), ("u", 0)]
    assert pool_view(pb.SnapshotResponse.FromString(message.SerializeToString())) == view


def test_a_team_without_a_count_is_sent_and_read_without_one() -> None:
    view = PoolView(PoolName("p"), 4, NodeId("n"), Epoch(3), [TEAM])
    (team,) = pool_view_pb(view).teams
    assert not team.HasField("within")
    old = pb.SnapshotResponse(pool="p", capacity=4, teams=[pb.TeamStat(team="t", reserved=2)])
    assert pool_view(pb.SnapshotResponse.FromString(old.SerializeToString())).within == {}


def test_a_count_beyond_int32_is_capped_not_refused() -> None:
    view = PoolView(PoolName("p"), 4, NodeId("n"), Epoch(3), [TEAM], within={"t": 2**40})
    assert pool_view_pb(view).teams[0].within == 2**31 - 1
