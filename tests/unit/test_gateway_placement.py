"""fairshare.gateway.placement and .redecide against a fake allocator client: fallbacks are
asked with try_only, in order, and only when the primary was saturated; re-decide signals
are bounded, oldest first, and at most once per request."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from fairshare import Class
from fairshare.client import ClientGrant
from fairshare.gateway.config import Model, RedecideSettings, Route
from fairshare.gateway.keys import Identity
from fairshare.gateway.placement import place
from fairshare.gateway.redecide import Redecider
from fairshare.gateway.releases import Releases


@dataclass
class FakeClient:
    """Pools with a capacity and what is in flight; acquire never refuses, try_only does."""

    capacity: dict[str, int]
    degraded: bool = False
    in_flight: dict[str, int] = field(default_factory=dict)
    calls: list[tuple[str, str]] = field(default_factory=list)
    try_gate: asyncio.Event = field(default_factory=asyncio.Event)
    release_gate: asyncio.Event = field(default_factory=asyncio.Event)

    def __post_init__(self) -> None:
        self.try_gate.set()
        self.release_gate.set()

    def _grant(self, pool: str, team: str) -> ClientGrant:
        saturated = self.in_flight.get(pool, 0) >= self.capacity[pool]
        self.in_flight[pool] = self.in_flight.get(pool, 0) + 1
        grant = ClientGrant(
            pool=pool,
            team=team,
            service_class=Class.INTERACTIVE,
            est_tokens=0,
            grant_id=f"{pool}-{len(self.calls)}",
            priority=100 if self.degraded else 10,
            borrowing=True,
            saturated=saturated and not self.degraded,
            degraded=self.degraded,
            owner="",
            epoch=0 if self.degraded else 1,
        )
        grant._client = self  # type: ignore[assignment]
        return grant

    async def acquire(
        self, pool: str, team: str, cls: Class, est: int, *, wait_s: float = 0.0
    ) -> ClientGrant:
        self.calls.append(("acquire", pool))
        return self._grant(pool, team)

    async def try_acquire(self, pool: str, team: str, cls: Class, est: int) -> ClientGrant | None:
        self.calls.append(("try", pool))
        await self.try_gate.wait()
        if self.in_flight.get(pool, 0) >= self.capacity[pool]:
            return None
        return self._grant(pool, team)

    async def _release(self, grant: ClientGrant, consumed: float) -> None:
        await self.release_gate.wait()
        self.in_flight[grant.pool] -= 1


M1 = Model("m1", Route("a", ("http://a",)), (Route("b", ("http://b",)), Route("c", ("http://c",))))
M2 = Model("m2", Route("b", ("http://b",)), (Route("a", ("http://a",)),))
WHO = Identity("team")


async def test_a_pool_with_room_keeps_its_requests() -> None:
    client = FakeClient({"a": 1, "b": 1, "c": 1})
    placed = await place(client, M1, WHO, 0, Releases())  # type: ignore[arg-type]
    assert (placed.route.pool, placed.fallback) == ("a", False)
    assert client.calls == [("acquire", "a")]


async def test_a_saturated_pool_hands_over_to_the_first_fallback_with_room() -> None:
    client = FakeClient({"a": 1, "b": 1, "c": 1}, in_flight={"a": 1, "b": 1})
    placed = await place(client, M1, WHO, 0, Releases())  # type: ignore[arg-type]
    assert (placed.route.pool, placed.fallback) == ("c", True)
    assert client.calls == [("acquire", "a"), ("try", "b"), ("try", "c")]
    assert client.in_flight == {"a": 1, "b": 1, "c": 1}  # the primary grant was released


async def test_two_saturated_pools_never_hand_requests_to_each_other() -> None:
    client = FakeClient({"a": 1, "b": 1}, in_flight={"a": 1, "b": 1})
    first = await place(client, M1.__class__("m1", M1.primary, M1.fallback[:1]), WHO, 0, Releases())  # type: ignore[arg-type]
    second = await place(client, M2, WHO, 0, Releases())  # type: ignore[arg-type]
    assert (first.route.pool, second.route.pool) == ("a", "b")
    assert not first.fallback and not second.fallback


async def test_a_degraded_grant_is_never_traded() -> None:
    client = FakeClient({"a": 1, "b": 1, "c": 1}, degraded=True, in_flight={"a": 5})
    placed = await place(client, M1, WHO, 0, Releases())  # type: ignore[arg-type]
    assert placed.route.pool == "a" and client.calls == [("acquire", "a")]


async def _cancelled_when(client: FakeClient, releases: Releases, calls: int) -> None:
    """Starts a placement of M1, cancels it once ``calls`` calls were made and it is
    blocked, and waits until every release it started has ended."""
    task = asyncio.ensure_future(place(client, M1, WHO, 0, releases))  # type: ignore[arg-type]
    for _ in range(20):  # the fake client blocks only on its gates
        await asyncio.sleep(0)
    assert len(client.calls) == calls and not task.done()
    task.cancel()
    await asyncio.wait({task})
    assert task.cancelled()
    client.try_gate.set()
    client.release_gate.set()
    await releases.wait()


async def test_a_cancel_while_a_fallback_is_asked_releases_the_primary_grant() -> None:
    client = FakeClient({"a": 1, "b": 1, "c": 1}, in_flight={"a": 1})
    client.try_gate.clear()
    await _cancelled_when(client, Releases(), calls=2)
    assert client.calls == [("acquire", "a"), ("try", "b")]
    assert client.in_flight == {"a": 1}  # the primary grant was given back


async def test_a_cancel_while_the_primary_is_traded_releases_both_grants() -> None:
    client = FakeClient({"a": 1, "b": 1, "c": 1}, in_flight={"a": 1})
    client.release_gate.clear()  # the primary's release is in flight when cancelled
    await _cancelled_when(client, Releases(), calls=2)
    assert client.in_flight == {"a": 1, "b": 0}


async def test_redecide_signals_oldest_first_bounded_once() -> None:
    redecider = Redecider(RedecideSettings(enabled=True, max_per_signal=2))
    watched = [redecider.watch("a") for _ in range(3)]
    other = redecider.watch("b")
    assert all(w is not None for w in watched) and other is not None
    redecider.owner_answered("a", 5)
    assert [w.signal.is_set() for w in watched if w is not None] == [True, True, False]
    assert redecider.watched("a") == 1 and not other.signal.is_set()
    started = watched[2]
    assert started is not None
    redecider.unwatch(started)  # its first byte went out: never signalled
    redecider.owner_answered("a", 5)
    assert not started.signal.is_set()
    assert Redecider(RedecideSettings(enabled=False)).watch("a") is None
    await asyncio.sleep(0)
