"""What this node knows of the others: members, pool owners (routes), handovers and the
capacities the owners decide with.

Kept by watches on the store, which resume by themselves; a watch that fails is listed
again from scratch. Every change sets ``changed`` so the node reconciles at once.

Guarantee: the view converges to the store's state once the store answers. A member is
"seen since" the first time this view saw its current member key (a key of another
create_revision, even seen only through a re-listing, is a new membership), so how long
a member has been live without a break is known to each replica, on its own monotonic
clock. Non-guarantee: it may lag the store by a watch round trip; decisions never rely on
it for safety (the epoch carried by every forwarded call and the fenced writes do).
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import logging
from collections.abc import Callable, Iterable

from ha.api import MemberStatus, NodeId, PoolName
from ha.clock import Clock
from ha.store.contract import EventKind, KeyValue, Store, StoreUnavailable, WatchEvent
from ha.store.keys import (
    Handover,
    Keys,
    Route,
    decode_capacity,
    decode_handover,
    decode_member,
    decode_owner,
    pool_of,
)

logger = logging.getLogger(__name__)

_RETRY_S = 0.2
_WATCHES = 4
"""Members, owners, handovers, capacities: the view is ready once each was listed."""


def preferred_owner(pool: str, members: Iterable[str]) -> NodeId | None:
    """The rendezvous-hash winner for ``pool`` among ``members`` (None if no member).

    Every node computes the same answer from the same members, and when a member goes
    only its own pools move. Answers are remembered (the reconcile loop asks for every
    owned pool twenty times a second; membership rarely changes).
    """
    key = members if isinstance(members, tuple) else tuple(sorted(set(members)))
    return _preferred(pool, key)


@functools.lru_cache(maxsize=1 << 16)
def _preferred(pool: str, members: tuple[str, ...]) -> NodeId | None:
    best: tuple[bytes, str] | None = None
    for node in members:
        score = hashlib.sha256(f"{node}\x00{pool}".encode()).digest()
        if best is None or (score, node) > best:
            best = (score, node)
    return NodeId(best[1]) if best is not None else None


class ClusterView:
    """Members, routes and handovers under one prefix, kept current by watches."""

    def __init__(
        self,
        *,
        store: Store,
        keys: Keys,
        clock: Clock,
        on_owner_change: Callable[[PoolName, Route | None], None],
    ) -> None:
        self._store = store
        self._keys = keys
        self._clock = clock
        self._on_owner_change = on_owner_change
        self.members: dict[NodeId, tuple[str, float]] = {}  # node -> (address, seen since)
        self.member_revs: dict[NodeId, int] = {}  # node -> create_revision of its key
        self.routes: dict[PoolName, Route] = {}
        self.handovers: dict[PoolName, Handover] = {}
        self.capacities: dict[PoolName, int] = {}  # as the owners last published them
        self.changed = asyncio.Event()
        self.ready = asyncio.Event()
        self._ready_parts: set[str] = set()

    async def run(self) -> None:
        """Watches members, owners, handovers and capacities until cancelled."""
        async with asyncio.TaskGroup() as group:
            group.create_task(self._follow(self._keys.members, self._members), name="watch-members")
            group.create_task(self._follow(self._keys.owners, self._owners), name="watch-owners")
            group.create_task(
                self._follow(self._keys.handovers, self._handovers), name="watch-handovers"
            )
            group.create_task(
                self._follow(self._keys.capacities, self._capacities), name="watch-capacities"
            )

    def route(self, pool: str) -> Route | None:
        return self.routes.get(PoolName(pool))

    def capacity(self, pool: str) -> int | None:
        """The capacity the pool's owner last published; None if none was (it is then
        the configured one). It may lag the owner by a watch round trip."""
        return self.capacities.get(PoolName(pool))

    def pinned(self, pool: str) -> NodeId | None:
        """The node an operator's switchover pinned ``pool`` to, while that pin holds:
        the node is still the member it was (same member key) when the pin was made."""
        record = self.handovers.get(PoolName(pool))
        if record is None or not record.pinned or record.member == 0:
            return None
        if self.member_revs.get(record.node) != record.member:
            return None
        return record.node

    def settled(self, settle_s: float) -> list[NodeId]:
        """Members this view has seen live without a break for at least ``settle_s``."""
        now = self._clock.monotonic()
        return [node for node, (_, since) in self.members.items() if now - since >= settle_s]

    def member_status(self, node: NodeId, address: str, lease_left_s: float) -> list[MemberStatus]:
        """The replicas of the view, ``node`` (this one, at ``address``, ``lease_left_s``
        from self-fencing) first, listed even while it is no member, then by node id.
        Cheap; reads the view as it is (it may lag the store by a watch round trip)."""
        now = self._clock.monotonic()
        owned: dict[NodeId, list[PoolName]] = {}
        for pool, route in self.routes.items():
            owned.setdefault(route.node, []).append(pool)
        members = dict(self.members)
        mine = members.pop(node, None)
        result = [
            MemberStatus(
                node=node,
                address=address,
                member_for_s=now - mine[1] if mine is not None else -1.0,
                pools=sorted(owned.get(node, ())),
                lease_left_s=lease_left_s,
            )
        ]
        for other in sorted(members):
            other_address, since = members[other]
            result.append(
                MemberStatus(
                    node=other,
                    address=other_address,
                    member_for_s=now - since,
                    pools=sorted(owned.get(other, ())),
                )
            )
        return result

    # -- watch plumbing -----------------------------------------------------------------

    async def _follow(
        self,
        prefix: str,
        apply: Callable[[str, KeyValue | None, bool], None],
    ) -> None:
        while True:
            try:
                listing, revision = await self._store.get_prefix(prefix)
                self._replace(prefix, listing, apply)
                self._ready_parts.add(prefix)
                if len(self._ready_parts) == _WATCHES:
                    self.ready.set()
                async for event in self._store.watch_prefix(prefix, start_revision=revision):
                    self._event(prefix, event, apply)
                logger.warning("watch on %s ended; listing again", prefix)
            except StoreUnavailable as e:
                logger.warning("watch on %s failed (%s); listing again", prefix, e)
            except Exception:
                logger.exception("BUG: watch on %s failed unexpectedly; listing again", prefix)
            await self._clock.sleep(_RETRY_S)

    def _event(
        self, prefix: str, event: WatchEvent, apply: Callable[[str, KeyValue | None, bool], None]
    ) -> None:
        if event.kind is EventKind.RESET:
            self._replace(prefix, list(event.snapshot), apply)
            return
        apply(pool_of(event.key, prefix), event.kv, False)
        self.changed.set()

    def _replace(
        self,
        prefix: str,
        listing: list[KeyValue],
        apply: Callable[[str, KeyValue | None, bool], None],
    ) -> None:
        present = {pool_of(kv.key, prefix): kv for kv in listing}
        table: dict[PoolName, object] | dict[NodeId, object]
        if prefix == self._keys.members:
            table = dict.fromkeys(self.members)
        elif prefix == self._keys.owners:
            table = dict.fromkeys(self.routes)
        elif prefix == self._keys.capacities:
            table = dict.fromkeys(self.capacities)
        else:
            table = dict.fromkeys(self.handovers)
        for name in list(table):
            if name not in present:
                apply(name, None, True)
        for name, kv in present.items():
            apply(name, kv, True)
        self.changed.set()

    # -- tables ---------------------------------------------------------------------

    def _members(self, name: str, kv: KeyValue | None, _listing: bool) -> None:
        node = NodeId(name)
        if kv is None:
            self.member_revs.pop(node, None)
            if self.members.pop(node, None) is not None:
                logger.info("member %s left", node)
            return
        address = decode_member(kv.value)
        old = self.members.get(node)
        same = old is not None and self.member_revs.get(node) == kv.create_revision
        if old is None:
            logger.info("member %s joined at %s", node, address)
        elif not same:
            logger.info("member %s joined again at %s", node, address)
        since = old[1] if old is not None and same else self._clock.monotonic()
        self.members[node] = (address, since)
        self.member_revs[node] = kv.create_revision

    def _owners(self, name: str, kv: KeyValue | None, _listing: bool) -> None:
        pool = PoolName(name)
        route = decode_owner(kv.value, kv.create_revision) if kv is not None else None
        if route is None:
            if self.routes.pop(pool, None) is not None:
                self._on_owner_change(pool, None)
            return
        if self.routes.get(pool) != route:
            self.routes[pool] = route
            self._on_owner_change(pool, route)

    def _handovers(self, name: str, kv: KeyValue | None, _listing: bool) -> None:
        pool = PoolName(name)
        decoded = decode_handover(kv.value) if kv is not None else None
        if decoded is None:
            self.handovers.pop(pool, None)
            return
        self.handovers[pool] = decoded

    def _capacities(self, name: str, kv: KeyValue | None, _listing: bool) -> None:
        pool = PoolName(name)
        capacity = decode_capacity(kv.value) if kv is not None else None
        if capacity is None:
            self.capacities.pop(pool, None)
            return
        self.capacities[pool] = capacity
