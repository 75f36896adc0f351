"""Thread safety: many threads on one pool (docs/spec.md §14)."""

from __future__ import annotations

import random
import sys
import threading
from collections import deque
from collections.abc import Callable, Iterator

import pytest

from fairshare import Class, Grant, Pool

THREADS = 8
ATTEMPTS = 10_000


@pytest.fixture(autouse=True)
def switch_often() -> Iterator[None]:
    """Makes the interpreter switch threads far more often, so races get a chance."""
    before = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    yield
    sys.setswitchinterval(before)


def run_threads(n: int, target: Callable[[int], None]) -> None:
    """Runs ``target(i)`` in n threads started together; re-raises the first error."""
    barrier = threading.Barrier(n)
    errors: list[BaseException] = []

    def body(i: int) -> None:
        try:
            barrier.wait()
            target(i)
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=body, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]


@pytest.mark.parametrize("capacity", [pytest.param(1, id="C1"), pytest.param(5, id="C5")])
def test_try_acquire_never_puts_more_than_c_in_flight(capacity: int) -> None:
    pool = Pool("p", capacity, {"a": 0.5, "b": 0.25, "c": 0.25}, half_life_s=0)
    lock = threading.Lock()
    live = [0]  # grants held right now, across threads
    peak = [0]
    admitted = [0]
    teams = ["a", "b", "c", "x"]

    def worker(i: int) -> None:
        rng = random.Random(i)
        held: deque[Grant] = deque()
        for n in range(ATTEMPTS):
            # Each thread holds up to two grants, so 8 threads want up to 16 slots.
            grant = pool.try_acquire(rng.choice(teams), Class(n % 2))
            if grant is not None:
                with lock:
                    live[0] += 1
                    admitted[0] += 1
                    peak[0] = max(peak[0], live[0])
                    assert live[0] <= capacity, f"{live[0]} grants live, C = {capacity}"
                held.append(grant)
            if len(held) > 1 or (held and rng.random() < 0.3):
                old = held.popleft()
                with lock:
                    live[0] -= 1
                old.release(rng.random())
            if n % 500 == 0:
                total = sum(pool.usage()[1].values())
                assert total <= capacity, f"usage() shows {total} in flight, C = {capacity}"
        while held:
            grant = held.popleft()
            with lock:
                live[0] -= 1
            grant.release(1.0)

    run_threads(THREADS, worker)
    assert peak[0] == capacity  # the pool did fill up, so the bound was really tested
    assert 0 < admitted[0] < THREADS * ATTEMPTS  # and some attempts were refused
    assert pool.usage()[1] == {t: 0 for t in teams}
    assert all(s.in_flight == 0 and s.borrowing == 0 for s in pool.snapshot())


def test_acquire_and_release_from_many_threads_balance() -> None:
    pool = Pool("p", 4, {"a": 0.5, "b": 0.5}, half_life_s=0)
    per_thread = 2_000

    def worker(i: int) -> None:
        team = "ab"[i % 2]
        grants = [pool.acquire(team, est_tokens=3) for _ in range(per_thread)]
        for g in grants:
            g.release(1.0)
            g.release(1.0)  # the second call counts for nothing

    run_threads(THREADS, worker)
    stats = {s.team: s for s in pool.snapshot()}
    for team in "ab":
        s = stats[team]
        assert (s.in_flight, s.borrowing, s.in_flight_tokens) == (0, 0, 0)
        assert s.usage == THREADS // 2 * per_thread


def test_phantoms_and_grants_from_many_threads() -> None:
    now = [0.0]
    pool = Pool("p", 8, {"a": 1.0}, half_life_s=0, clock=lambda: now[0])

    def worker(i: int) -> None:
        for _ in range(500):
            pool.add_phantoms("a", 2, 100.0)
            grant = pool.acquire("a")
            assert pool.drop_phantom("a")
            grant.release(0.5)

    run_threads(THREADS, worker)
    s = pool.snapshot()[0]
    assert (s.in_flight, s.phantoms) == (0, THREADS * 500)
    now[0] = 100.0
    assert pool.usage()[1] == {"a": 0}
