"""Hypothesis: random operation sequences on one pool, checked against a plain model.

The model keeps what the pool must agree with (grants in flight, live phantoms with their
standing, usage); the invariants come from docs/spec.md (§4, §8): in-flight counts are
never negative, a request is within share iff the team's within-share count (within-share
grants plus phantoms counted as within) is below its reservation, within-share grants
never exceed a team's reservation (unless capacity changes or a request is adopted within
share), every priority is an allowed value, and ``usage()`` counts grants plus live
phantoms.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from fairshare import (
    BORROW_BASE,
    MAX_RANK,
    RANK_STEP,
    WITHIN_SHARE_BASE,
    Class,
    Grant,
    Pool,
    apportion,
)

ALLOWED_PRIORITIES = frozenset(
    {WITHIN_SHARE_BASE + k for k in Class}
    | {BORROW_BASE + RANK_STEP * r + k for r in range(MAX_RANK + 1) for k in Class}
)
TEAMS = ("a", "b", "c", "x")  # x never has a share
HALF_LIFE_S = 100.0


class Clock:
    def __init__(self) -> None:
        self.now = 10_000.0

    def __call__(self) -> float:
        return self.now


@dataclass
class Model:
    """What the pool must agree with, kept the simple way."""

    shares: dict[str, float]
    capacity: int
    grants: list[Grant] = field(default_factory=list)
    # team -> (expiry time, known to borrow) of each phantom
    phantoms: dict[str, list[tuple[float, bool]]] = field(default_factory=dict)
    usage: dict[str, float] = field(default_factory=dict)
    known: set[str] = field(default_factory=set)

    def live_phantoms(self, team: str, now: float) -> int:
        return sum(1 for until, _ in self.phantoms.get(team, []) if until > now)

    def within(self, team: str, now: float) -> int:
        """Within-share grants plus live phantoms not known to borrow."""
        grants = sum(1 for g in self.grants if g.team == team and not g.borrowing)
        phantoms = self.phantoms.get(team, [])
        return grants + sum(1 for until, b in phantoms if until > now and not b)

    def in_flight(self, team: str, now: float) -> int:
        grants = sum(1 for g in self.grants if g.team == team)
        return grants + self.live_phantoms(team, now)

    def total(self, now: float) -> int:
        return sum(self.in_flight(t, now) for t in self.known)

    def level_fairshare(self) -> dict[str, float]:
        share_total = sum(self.shares.get(t, 0.0) for t in self.known)
        usage_total = sum(self.usage.get(t, 0.0) for t in self.known)
        lf = {}
        for t in self.known:
            s = self.shares.get(t, 0.0) / share_total if share_total > 0 else 0.0
            u = self.usage.get(t, 0.0) / usage_total if usage_total > 0 else 0.0
            lf[t] = 0.0 if s == 0 else (math.inf if u == 0 else s / u)
        return lf


consumption = st.one_of(
    st.floats(min_value=0.0, max_value=100.0, allow_subnormal=False),
    st.sampled_from([math.nan, math.inf, -1.0, 0.0]),
)


class PoolMachine(RuleBasedStateMachine):
    """Operations that never break the reservation bound."""

    check_reservation = True

    def __init__(self) -> None:
        super().__init__()
        self.clock = Clock()
        self.pool: Pool
        self.model: Model

    @initialize(
        capacity=st.integers(min_value=0, max_value=8),
        weights=st.tuples(*(st.integers(min_value=0, max_value=4) for _ in range(3))),
    )
    def setup(self, capacity: int, weights: tuple[int, int, int]) -> None:
        shares = {t: w / 4 for t, w in zip("abc", weights, strict=True)}
        self.pool = Pool("p", capacity, shares, half_life_s=HALF_LIFE_S, clock=self.clock)
        self.model = Model(shares=shares, capacity=capacity, known=set(shares))

    # -- operations ---------------------------------------------------------------------

    def _check_decision(self, grant: Grant, team: str, cls: Class, before: int, total: int) -> None:
        reserved = self.pool.reserved().get(team, 0)
        assert grant.borrowing == (before >= reserved), (team, before, reserved)
        assert grant.saturated == (total >= self.model.capacity)
        assert grant.priority in ALLOWED_PRIORITIES
        assert grant.priority % 10 == cls
        assert (grant.priority >= BORROW_BASE) == grant.borrowing

    @rule(team=st.sampled_from(TEAMS), cls=st.sampled_from(Class), tokens=st.integers(0, 50))
    def acquire(self, team: str, cls: Class, tokens: int) -> None:
        now = self.clock.now
        before, total = self.model.within(team, now), self.model.total(now)
        ranks = {s.team: s.rank for s in self.pool.snapshot()}
        foreseen = self.pool.within_share_next(team)
        grant = self.pool.acquire(team, cls, tokens)
        self.model.known.add(team)
        self._check_decision(grant, team, cls, before, total)
        assert foreseen == (not grant.borrowing)
        if grant.borrowing and team in ranks:
            expected = BORROW_BASE + RANK_STEP * min(ranks[team], MAX_RANK) + cls
            assert grant.priority == expected
        self.model.grants.append(grant)

    @rule(team=st.sampled_from(TEAMS), cls=st.sampled_from(Class))
    def try_acquire(self, team: str, cls: Class) -> None:
        now = self.clock.now
        before, total = self.model.within(team, now), self.model.total(now)
        grant = self.pool.try_acquire(team, cls)
        if total >= self.model.capacity:
            assert grant is None
            return
        assert grant is not None
        self.model.known.add(team)
        self._check_decision(grant, team, cls, before, total)
        self.model.grants.append(grant)

    @precondition(lambda self: self.model.grants)
    @rule(data=st.data(), consumed=consumption, twice=st.booleans())
    def release(self, data: st.DataObject, consumed: float, twice: bool) -> None:
        index = data.draw(st.integers(0, len(self.model.grants) - 1))
        grant = self.model.grants.pop(index)
        grant.release(consumed)
        if twice:
            grant.release(consumed)
        self._charge_model(grant.team, consumed)

    @rule(
        team=st.sampled_from(TEAMS),
        n=st.integers(-1, 3),
        delta=st.floats(min_value=-5.0, max_value=30.0),
        borrowing=st.booleans(),
    )
    def add_phantoms(self, team: str, n: int, delta: float, borrowing: bool) -> None:
        until = self.clock.now + delta
        self.pool.add_phantoms(team, n, until, borrowing=borrowing)
        if n > 0 and until > self.clock.now:
            self.model.phantoms.setdefault(team, []).extend([(until, borrowing)] * n)
            self.model.known.add(team)

    @rule(team=st.sampled_from(TEAMS), borrowing=st.booleans())
    def drop_phantom(self, team: str, borrowing: bool) -> None:
        now = self.clock.now
        live = sorted(p for p in self.model.phantoms.get(team, []) if p[0] > now)
        kind = [p for p in live if p[1] == borrowing]
        assert self.pool.drop_phantom(team, borrowing=borrowing) == bool(kind)
        if kind:
            live.remove(kind[-1])  # the longest lasting of that standing
        self.model.phantoms[team] = live

    @rule(team=st.sampled_from(TEAMS), consumed=consumption)
    def charge(self, team: str, consumed: float) -> None:
        self.pool.charge(team, consumed)
        self.model.known.add(team)
        self._charge_model(team, consumed)

    @rule(
        team=st.sampled_from(TEAMS),
        # Subnormal usage would overflow share / usage; nothing real is charged 1e-320.
        value=st.one_of(
            st.floats(min_value=0.0, max_value=1000.0, allow_subnormal=False),
            st.sampled_from([math.nan, math.inf, -math.inf, -3.0]),
        ),
    )
    def set_usage(self, team: str, value: float) -> None:
        self.pool.set_usage(team, value)
        self.model.known.add(team)
        self.model.usage[team] = value if math.isfinite(value) and value > 0 else 0.0

    @rule(dt=st.one_of(st.floats(min_value=0.0, max_value=60.0), st.just(HALF_LIFE_S)))
    def advance(self, dt: float) -> None:
        self.clock.now += dt
        factor = math.exp(-math.log(2) / HALF_LIFE_S * dt)
        for team in self.model.usage:
            self.model.usage[team] *= factor

    def _charge_model(self, team: str, consumed: float) -> None:
        if math.isfinite(consumed) and consumed > 0:
            self.model.usage[team] = self.model.usage.get(team, 0.0) + consumed

    # -- invariants ---------------------------------------------------------------------

    @invariant()
    def counts_are_never_negative_and_match_the_model(self) -> None:
        now = self.clock.now
        _, in_flight = self.pool.usage()
        assert set(in_flight) == self.model.known
        for s in self.pool.snapshot():
            assert s.in_flight >= 0
            assert s.phantoms >= 0
            assert s.in_flight_tokens >= 0
            assert 0 <= s.borrowing <= s.in_flight
            grants = [g for g in self.model.grants if g.team == s.team]
            assert s.in_flight == len(grants)
            assert s.borrowing == sum(g.borrowing for g in grants)
            assert s.in_flight_tokens == sum(g.est_tokens for g in grants)
            assert s.phantoms == self.model.live_phantoms(s.team, now)
            # usage() in flight = grants + live phantoms
            assert in_flight[s.team] == s.in_flight + s.phantoms
            assert in_flight[s.team] == self.model.in_flight(s.team, now)
        assert self.pool.within() == {t: self.model.within(t, now) for t in self.model.known}

    @invariant()
    def usage_matches_the_model(self) -> None:
        usage, _ = self.pool.usage()
        for team, value in usage.items():
            expected = self.model.usage.get(team, 0.0)
            assert math.isclose(value, expected, rel_tol=1e-9, abs_tol=1e-12), (team, value)

    @invariant()
    def ranks_follow_level_fairshare(self) -> None:
        lf = self.model.level_fairshare()
        stats = {s.team: s for s in self.pool.snapshot()}
        assert min((s.rank for s in stats.values()), default=0) == 0
        for a, sa in stats.items():
            for b, sb in stats.items():
                if lf[a] > lf[b] * (1 + 1e-9) or (math.isinf(lf[a]) and not math.isinf(lf[b])):
                    assert sa.rank < sb.rank, (a, b, lf)
                if lf[a] == lf[b]:
                    # Equal in the model's arithmetic: equal ranks, except in the rare case
                    # where the pool's rounding of its own (differently computed) keys
                    # falls on either side of a rounding boundary.
                    assert abs(sa.rank - sb.rank) <= 1, (a, b, lf)

    @invariant()
    def reservations_fit_in_capacity(self) -> None:
        reserved = self.pool.reserved()
        assert sum(reserved.values()) <= self.model.capacity
        assert reserved == apportion(self.model.capacity, reserved, self.model.shares)

    @invariant()
    def within_share_grants_fit_in_reservation(self) -> None:
        if not self.check_reservation:
            return
        reserved = self.pool.reserved()
        for s in self.pool.snapshot():
            assert s.in_flight - s.borrowing <= reserved[s.team]


class PoolMachineWithCapacityChanges(PoolMachine):
    """Adds set_capacity and adopt, which may leave more within share than reserved."""

    check_reservation = False

    @rule(c=st.integers(min_value=0, max_value=8))
    def set_capacity(self, c: int) -> None:
        assert self.pool.set_capacity(c) == self.model.capacity
        self.model.capacity = c

    @rule(
        team=st.sampled_from(TEAMS),
        priority=st.sampled_from(sorted(ALLOWED_PRIORITIES)),
        tokens=st.integers(0, 50),
    )
    def adopt(self, team: str, priority: int, tokens: int) -> None:
        borrowing = priority >= BORROW_BASE
        grant = self.pool.adopt(team, priority, borrowing, tokens)
        assert (grant.priority, grant.borrowing, grant.est_tokens) == (priority, borrowing, tokens)
        self.model.known.add(team)
        self.model.grants.append(grant)


class PoolMachineWithBorrowingAdopt(PoolMachine):
    """adopt(borrowing=True) never takes a within-share slot, so the bound still holds."""

    @rule(team=st.sampled_from(TEAMS), rank=st.integers(0, MAX_RANK), cls=st.sampled_from(Class))
    def adopt_borrower(self, team: str, rank: int, cls: Class) -> None:
        grant = self.pool.adopt(team, BORROW_BASE + RANK_STEP * rank + cls, True)
        self.model.known.add(team)
        self.model.grants.append(grant)


_settings = settings(max_examples=150, stateful_step_count=40, deadline=None)
TestPool = PoolMachine.TestCase
TestPool.settings = _settings
TestPoolWithCapacityChanges = PoolMachineWithCapacityChanges.TestCase
TestPoolWithCapacityChanges.settings = _settings
TestPoolWithBorrowingAdopt = PoolMachineWithBorrowingAdopt.TestCase
TestPoolWithBorrowingAdopt.settings = _settings
