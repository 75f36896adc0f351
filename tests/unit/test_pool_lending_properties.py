"""Hypothesis: the lending limit under random sequences of operations (docs/spec.md §17).

- Whenever ``acquire_lent`` grants a borrower, in flight + phantoms + kept back <= C
  after it; whenever it refuses, the request would have borrowed and the room was gone.
- The slots kept back, summed as they change, always equal the sum recomputed from every
  team's reservation, within-share count and lend fraction.
- With every team lending 1.0, ``acquire_lent`` decides the standing and priority
  ``acquire`` decides, and refuses exactly when ``acquire`` would report ``saturated``
  for a borrower.
"""

from __future__ import annotations

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from fairshare import Class, Grant, Pool
from fairshare.apportion import kept_back

TEAMS = ("a", "b", "c", "x")  # x never has a share
fractions = st.sampled_from([0.0, 0.25, 0.3, 0.5, 0.75, 1.0])
lend_maps = st.dictionaries(st.sampled_from(TEAMS), fractions, max_size=len(TEAMS))


class Clock:
    def __init__(self) -> None:
        self.now = 10_000.0

    def __call__(self) -> float:
        return self.now


def in_flight(pool: Pool) -> int:
    """Grants and live phantoms of every team."""
    return sum(pool.usage()[1].values())


class ClockedMachine(RuleBasedStateMachine):
    """A machine whose pools read one clock that a rule moves on."""

    def __init__(self) -> None:
        super().__init__()
        self.clock = Clock()

    @rule(dt=st.floats(0.0, 20.0))
    def advance(self, dt: float) -> None:
        self.clock.now += dt


class LendingMachine(ClockedMachine):
    """One pool with lend fractions; some callers wait (``acquire_lent``), some do not."""

    def __init__(self) -> None:
        super().__init__()
        self.grants: list[Grant] = []
        self.lend: dict[str, float] = {}
        self.pool = Pool("p", 0, {})

    @initialize(capacity=st.integers(0, 12), weights=st.tuples(*[st.integers(0, 4)] * 3))
    def setup(self, capacity: int, weights: tuple[int, int, int]) -> None:
        total = sum(weights) or 1
        shares = {t: w / total for t, w in zip("abc", weights, strict=True)}
        self.pool = Pool("p", capacity, shares, clock=self.clock, lend=None)

    @rule(team=st.sampled_from(TEAMS), cls=st.sampled_from(Class))
    def acquire_lent(self, team: str, cls: Class) -> None:
        within = self.pool.within_share_next(team)
        room = self.pool.lend_room()
        grant = self.pool.acquire_lent(team, cls)
        if grant is None:
            assert not within and room <= 0
            return
        self.grants.append(grant)
        assert grant.borrowing is not within
        if grant.borrowing:
            assert in_flight(self.pool) + self.pool.kept_back() <= self.pool.capacity

    @rule(team=st.sampled_from(TEAMS), cls=st.sampled_from(Class))
    def acquire(self, team: str, cls: Class) -> None:
        """A caller that does not wait: it may push the pool past C, as before."""
        self.grants.append(self.pool.acquire(team, cls))

    @precondition(lambda self: self.grants)
    @rule(data=st.data())
    def release(self, data: st.DataObject) -> None:
        i = data.draw(st.integers(0, len(self.grants) - 1))
        self.grants.pop(i).release(1.0)

    @rule(
        team=st.sampled_from(TEAMS),
        n=st.integers(1, 3),
        life=st.floats(1.0, 30.0),
        borrowing=st.booleans(),
    )
    def add_phantoms(self, team: str, n: int, life: float, borrowing: bool) -> None:
        self.pool.add_phantoms(team, n, self.clock.now + life, borrowing=borrowing)

    @rule(team=st.sampled_from(TEAMS), borrowing=st.booleans())
    def drop_phantom(self, team: str, borrowing: bool) -> None:
        self.pool.drop_phantom(team, borrowing=borrowing)

    @rule(c=st.integers(0, 12))
    def set_capacity(self, c: int) -> None:
        self.pool.set_capacity(c)

    @rule(lend=lend_maps)
    def set_lend(self, lend: dict[str, float]) -> None:
        self.pool.set_lend(lend)
        self.lend = lend

    @invariant()
    def kept_back_is_the_sum_of_every_team_s_kept_slots(self) -> None:
        reserved, within = self.pool.reserved(), self.pool.within()
        expected = sum(kept_back(reserved[t], within[t], self.lend.get(t, 1.0)) for t in reserved)
        assert self.pool.kept_back() == expected
        room = self.pool.capacity - in_flight(self.pool) - expected
        assert self.pool.lend_room() == room


class TwinMachine(ClockedMachine):
    """Two pools fed the same requests: one asked by ``acquire_lent`` with every team
    lending 1.0, the other by ``acquire``; the second only counts what the first did."""

    def __init__(self) -> None:
        super().__init__()
        self.pairs: list[tuple[Grant, Grant]] = []
        self.lent = Pool("p", 0, {})
        self.plain = Pool("p", 0, {})

    @initialize(capacity=st.integers(0, 10), weights=st.tuples(*[st.integers(0, 4)] * 3))
    def setup(self, capacity: int, weights: tuple[int, int, int]) -> None:
        total = sum(weights) or 1
        shares = {t: w / total for t, w in zip("abc", weights, strict=True)}
        lend = dict.fromkeys(TEAMS, 1.0)
        self.lent = Pool("p", capacity, shares, clock=self.clock, lend=lend)
        self.plain = Pool("p", capacity, shares, clock=self.clock)

    @rule(team=st.sampled_from(TEAMS), cls=st.sampled_from(Class))
    def request(self, team: str, cls: Class) -> None:
        saturated = in_flight(self.plain) >= self.plain.capacity
        borrows = not self.plain.within_share_next(team)
        lent = self.lent.acquire_lent(team, cls)
        if lent is None:
            assert borrows and saturated
            return
        plain = self.plain.acquire(team, cls)
        assert (lent.priority, lent.borrowing, lent.saturated) == (
            plain.priority,
            plain.borrowing,
            plain.saturated,
        )
        self.pairs.append((lent, plain))

    @precondition(lambda self: self.pairs)
    @rule(data=st.data(), consumed=st.floats(0.0, 10.0))
    def release(self, data: st.DataObject, consumed: float) -> None:
        lent, plain = self.pairs.pop(data.draw(st.integers(0, len(self.pairs) - 1)))
        lent.release(consumed)
        plain.release(consumed)

    @rule(team=st.sampled_from(TEAMS), n=st.integers(1, 3), borrowing=st.booleans())
    def add_phantoms(self, team: str, n: int, borrowing: bool) -> None:
        for pool in (self.lent, self.plain):
            pool.add_phantoms(team, n, self.clock.now + 15.0, borrowing=borrowing)

    @rule(c=st.integers(0, 10))
    def set_capacity(self, c: int) -> None:
        self.lent.set_capacity(c)
        self.plain.set_capacity(c)

    @invariant()
    def nothing_is_kept_back(self) -> None:
        assert self.lent.kept_back() == 0
        assert self.lent.snapshot() == self.plain.snapshot()


_settings = settings(max_examples=150, stateful_step_count=40, deadline=None)
TestLending = LendingMachine.TestCase
TestLending.settings = _settings
TestLendOneIsAcquire = TwinMachine.TestCase
TestLendOneIsAcquire.settings = _settings
