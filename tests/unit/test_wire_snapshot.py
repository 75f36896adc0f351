"""The Snapshot answer's optional ``snapshot_age_s`` crosses the wire both ways, and an
answer without it (an owner of an earlier version) reads as "not said", not as 0."""

from __future__ import annotations

from fairshare import TeamStat
from fairshare.ids import Epoch, NodeId, PoolName
from fairshare.records import PoolView
from wire.convert import pool_view, pool_view_pb
from wire.pb.fairshare.v1 import allocator_pb2 as pb

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
