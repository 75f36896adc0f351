"""The owner's bounds: teams restored within max_teams, remembered answers within bytes."""

from __future__ import annotations

import time

import pytest

import ha.owned.answers
from fairshare import Class
from ha.api import Epoch, GrantRef, LimitExceeded, NodeId
from ha.clock import FakeClock
from ha.owned.journal import MemoryLog
from ha.owned.pool import OwnedPool
from ha.owned.snapshot import PoolSnapshot
from ha.settings import PoolConfig, Timing

pytestmark = pytest.mark.timeout(30)


def owner(config: PoolConfig, clock: FakeClock) -> OwnedPool:
    return OwnedPool(
        config=config,
        epoch=Epoch(5),
        node=NodeId("n"),
        clock=clock,
        fenced=lambda: True,
        log=MemoryLog(),
        commit_window_s=0.0,
        release_commit_s=0.0,
        release_memory_s=600.0,
    )


async def test_a_state_with_205k_teams_restores_within_the_cap_and_the_lease() -> None:
    """A state written before the cap (the issue's 205k teams) restores in well under
    the 5 s lease, keeping the configured teams and the largest users."""
    clock = FakeClock()
    config = PoolConfig("p", 10, {"a": 0.5, "b": 0.5}, max_teams=1024)
    usage = {f"t{i}": float(i) for i in range(205_000)}
    usage["a"] = 0.5
    state = PoolSnapshot(pool="p", epoch=3, wall=clock.time(), capacity=10, usage=usage)
    decoded = PoolSnapshot.decode(state.encode())
    assert decoded is not None
    started = time.perf_counter()
    owned = owner(config, clock)
    owned.restore(decoded)
    elapsed = time.perf_counter() - started
    teams = {t.team: t for t in owned.pool.snapshot()}
    assert len(teams) == 1024
    assert {"a", "b", "t204999", "t203978"} <= teams.keys() and "t203977" not in teams
    # The requirement is the lease; 0.35 s on an idle machine, 3.8 s seen on a 2-core
    # machine running five test suites at once.
    assert elapsed < Timing().lease_ttl_s, elapsed


async def test_the_owner_refuses_a_new_team_at_the_cap_and_admits_after_pruning() -> None:
    clock = FakeClock()
    owned = owner(PoolConfig("p", 10, {"a": 1.0}, max_teams=3), clock)

    async def acquire(team: str) -> str:
        d = await owned.acquire(
            team=team, cls=Class.BATCH, est_tokens=0, holder="h", request_id="", try_only=False
        )
        return d.grant_id

    held = [await acquire("x"), await acquire("y")]
    with pytest.raises(LimitExceeded) as info:
        await acquire("z")
    assert info.value.limit == "max_teams"
    owned.release(GrantRef.decode(held[0]), 0.0)  # x is idle with no usage now
    await acquire("z")
    assert {t.team for t in owned.pool.snapshot()} == {"a", "y", "z"}


async def test_remembered_answers_are_bounded_in_bytes(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ha.owned.answers, "MAX_ANSWER_BYTES", 200_000)
    clock = FakeClock()
    owned = owner(PoolConfig("p", 10, {"a": 1.0}), clock)
    for i in range(400):
        d = await owned.acquire(
            team="a",
            cls=Class.BATCH,
            est_tokens=0,
            holder="h" * 256,
            request_id=f"{i:0256d}",
            try_only=False,
        )
        owned.release(GrantRef.decode(d.grant_id), 0.0)
    assert owned._answers.bytes <= 200_000
    assert 100 < len(owned._answers) < 400
