"""Saturation converges to shares: the core alone, under a tiny model of vLLM's scheduler.

The model is deliberately self-contained (it does not use ``sim``) so that it tests
``fairshare.Pool`` and nothing else:

- vLLM keeps waiting requests in a min-heap on ``(priority, arrival)`` and runs at most C;
  a waiting request never preempts a running one, so a slot goes to the head of the heap
  only when a running request ends;
- every request runs a fixed time and is charged that time (GPU-seconds) at release;
- a *flooding* team is a client with a fixed number of requests outstanding (more than C):
  when one ends it sends the next at once. Its requests are acquired when they are sent,
  so the priority a request carries is the team's standing at that moment.

With a half-life much longer than a request and much shorter than the horizon, decayed
usage follows recent service, borrowing slots go to the team with the highest level
fairshare, and the service each team receives converges to its share among the teams
that ask for service.

Why a flood is a client with requests outstanding rather than an open-loop arrival rate
above C: a request's priority is fixed when it is sent, and vLLM cannot re-prioritise its
queue. The feedback (charge at release -> new rank -> priority of the next requests) lags
by the time a request spends queued. With a bounded number outstanding that lag is a few
service times, far below the half-life, and the split converges (A gets 66.5 % here). An
open-loop flood above capacity grows the queue without bound, the lag grows with it, and
the service split then depends on stale priorities rather than on the shares: that is a
limit of priority scheduling with a fixed priority per request, not of the ranking.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Mapping

import pytest

from fairshare import Grant, Pool

CAPACITY = 10
SERVICE_S = 1.0  # each request runs this long and is charged this many GPU-seconds
HALF_LIFE_S = 200.0  # >> a request, << the horizon
HORIZON_S = 8_000.0
WARMUP_S = 1_000.0  # service before this is not counted (five half-lives)
OUTSTANDING = 3 * CAPACITY  # requests each flooding team keeps sent
SHARES = {"a": 0.5, "b": 0.25, "c": 0.25}


def _simulate(shares: Mapping[str, float], flooding: list[str]) -> dict[str, float]:
    """Runs the model and returns each team's GPU-seconds served after the warm-up."""
    now = 0.0
    pool = Pool("gpu", CAPACITY, shares, half_life_s=HALF_LIFE_S, clock=lambda: now)
    seq = itertools.count()
    waiting: list[tuple[int, float, int, Grant]] = []
    finishing: list[tuple[float, int, Grant]] = []  # (end time, seq, grant) of running ones
    served = dict.fromkeys(shares, 0.0)

    def send(team: str) -> None:
        grant = pool.acquire(team)
        heapq.heappush(waiting, (grant.priority, now, next(seq), grant))

    def schedule() -> None:
        while waiting and len(finishing) < CAPACITY:
            _, _, _, grant = heapq.heappop(waiting)
            heapq.heappush(finishing, (now + SERVICE_S, next(seq), grant))

    for team in flooding:
        for _ in range(OUTSTANDING):
            send(team)
    schedule()
    while finishing:
        end, _, grant = heapq.heappop(finishing)
        if end > HORIZON_S:
            break
        now = end
        grant.release(SERVICE_S)
        if now > WARMUP_S:
            served[grant.team] += SERVICE_S
        send(grant.team)
        schedule()
    return served


@pytest.mark.timeout(30)
def test_two_flooding_teams_converge_to_two_to_one() -> None:
    served = _simulate(SHARES, flooding=["a", "b"])
    total = sum(served.values())
    assert served["c"] == 0.0
    share_a = served["a"] / total
    assert share_a == pytest.approx(2 / 3, abs=0.02), f"a received {share_a:.2%} of the service"


@pytest.mark.timeout(30)
def test_three_flooding_teams_each_keep_their_reservation() -> None:
    # Every slot is reserved and every team keeps its reservation busy: nothing is idle
    # to borrow, so each team is served exactly its whole slots (2.5 + 2.5 slots of C = 10
    # apportion to 3 + 2), not a fractional share that ranks would have to approximate.
    served = _simulate(SHARES, flooding=["a", "b", "c"])
    total = sum(served.values())
    received = {team: served[team] / total for team in SHARES}
    reserved = Pool("gpu", CAPACITY, SHARES).reserved()
    for team in SHARES:
        expected = reserved[team] / CAPACITY
        assert received[team] == pytest.approx(expected, abs=0.005), f"received {received}"
