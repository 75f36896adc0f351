"""``HeldQueue``: borrowers held back by the lending limit (docs/spec.md §18)."""

from __future__ import annotations

import math

import pytest

from fairshare import Class, Grant, Pool
from fairshare.holding import HeldQueue


def pool(capacity: int = 4, lend: dict[str, float] | None = None) -> Pool:
    return Pool("p", capacity, {"a": 0.5, "b": 0.5}, lend=lend, clock=lambda: 1_000.0)


def hold(
    queue: HeldQueue[str],
    payload: str,
    team: str,
    *,
    priority: int = 10,
    deadline: float = math.inf,
) -> None:
    assert queue.push(payload, team, priority=priority, deadline=deadline)


def admitted(pairs: list[tuple[str, Grant]]) -> list[str]:
    return [payload for payload, _ in pairs]


def test_admit_follows_priority_then_arrival() -> None:
    p = pool(capacity=8)
    blockers = [p.acquire("b") for _ in range(8)]
    queue: HeldQueue[str] = HeldQueue(10)
    hold(queue, "late-low", "x", priority=20)
    hold(queue, "first", "x", priority=10)
    hold(queue, "second", "x", priority=10)
    hold(queue, "batch", "x", priority=11)
    assert queue.admit(p) == []  # the pool is full
    assert len(queue) == 4
    blockers.pop().release()
    blockers.pop().release()
    assert admitted(queue.admit(p)) == ["first", "second"]
    for grant in blockers[:3]:
        grant.release()
    assert admitted(queue.admit(p)) == ["batch", "late-low"]
    assert len(queue) == 0


def test_admitted_requests_are_counted_with_the_standing_decided_now() -> None:
    p = pool()
    blockers = [p.acquire("b") for _ in range(4)]
    queue: HeldQueue[str] = HeldQueue(4)
    assert queue.push("r", "x", cls=Class.BATCH, est_tokens=7, priority=101)
    blockers[0].release()
    [(payload, grant)] = queue.admit(p)
    assert payload == "r"
    assert grant.borrowing and grant.priority == p.priority_next("x", Class.BATCH)
    assert grant.est_tokens == 7
    assert p.usage()[1]["x"] == 1


def test_push_past_the_bound_holds_nothing() -> None:
    queue: HeldQueue[str] = HeldQueue(2)
    hold(queue, "r1", "x")
    hold(queue, "r2", "x")
    assert not queue.push("r3", "x", priority=0)
    assert len(queue) == 2 and "r3" not in queue
    assert not HeldQueue[str](0).push("r", "x", priority=10)


def test_push_refuses_bad_entries() -> None:
    queue: HeldQueue[str] = HeldQueue(4)
    hold(queue, "r", "x")
    with pytest.raises(ValueError, match="held already"):
        queue.push("r", "x", priority=10)
    with pytest.raises(ValueError, match="team"):
        queue.push("s", "", priority=10)
    with pytest.raises(ValueError, match="class"):
        queue.push("s", "x", cls=2, priority=10)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="est_tokens"):
        queue.push("s", "x", est_tokens=-1, priority=10)
    with pytest.raises(ValueError, match="priority"):
        queue.push("s", "x", priority=1.5)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="deadline"):
        queue.push("s", "x", priority=10, deadline=math.nan)
    with pytest.raises(ValueError, match="limit"):
        HeldQueue(-1)
    assert len(queue) == 1


def test_remove_takes_a_request_out_once() -> None:
    p = pool()
    queue: HeldQueue[str] = HeldQueue(4)
    hold(queue, "gone", "x", deadline=5.0)
    hold(queue, "stays", "x")
    entry = queue.remove("gone")
    assert entry is not None and entry.team == "x" and entry.deadline == 5.0
    assert queue.remove("gone") is None
    assert queue.next_deadline() == math.inf
    assert queue.expired(10.0) == []
    assert admitted(queue.admit(p)) == ["stays"]


def test_a_team_within_share_is_admitted_past_a_refused_head() -> None:
    """b's held request behind a refused borrower goes once b is within share again."""
    p = pool(capacity=4, lend={"a": 0.0, "b": 0.0})
    b = [p.acquire("b") for _ in range(2)]  # b at its reservation; a keeps its 2 back
    queue: HeldQueue[str] = HeldQueue(8)
    hold(queue, "x-head", "x", priority=10)
    hold(queue, "b-1", "b", priority=20)
    hold(queue, "b-2", "b", priority=20)
    assert queue.admit(p) == []
    b[0].release()  # b keeps its free slot back: no room for x, but b-1 is within share
    pairs = queue.admit(p)
    assert admitted(pairs) == ["b-1"]
    assert not pairs[0][1].borrowing
    assert [e for e in ("x-head", "b-2") if e in queue] == ["x-head", "b-2"]
    assert p.lend_room() == 0


def test_the_head_goes_first_when_there_is_room() -> None:
    p = pool(capacity=4)
    b = [p.acquire("b") for _ in range(2)] + [p.acquire("a") for _ in range(2)]
    queue: HeldQueue[str] = HeldQueue(8)
    hold(queue, "x-head", "x", priority=10)
    hold(queue, "b-1", "b", priority=20)
    b[0].release()  # one slot: b within share again, and room for one borrower
    assert admitted(queue.admit(p)) == ["x-head", "b-1"]


def test_deadlines_end_waits_in_order() -> None:
    queue: HeldQueue[str] = HeldQueue(8)
    hold(queue, "r3", "x", deadline=30.0)
    hold(queue, "r1", "x", deadline=10.0)
    hold(queue, "r2", "x", deadline=10.0)
    hold(queue, "forever", "x")
    assert queue.next_deadline() == 10.0
    assert queue.expired(9.9) == []
    assert queue.expired(10.0) == ["r1", "r2"]
    assert queue.next_deadline() == 30.0
    assert queue.expired(1e9) == ["r3"]
    assert queue.next_deadline() == math.inf
    assert len(queue) == 1 and "forever" in queue
