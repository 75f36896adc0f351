"""Whether the store accepts this node's writes: the one place a full store is noticed.

A node's every store call goes through ``WatchedStore``, whatever the store (etcd's
NOSPACE alarm and the file store's ENOSPC both arrive as ``StoreFull``).

Guarantees:
- A write refused with ``StoreFull`` marks the pool its key belongs to (owner, state or
  handover key) as refused, or every pool for a write of the node itself (lease, member
  key), and is counted for that pool.
- The next write that needs space and succeeds for a pool (a put or create; a delete
  proves nothing) clears its mark, and one of the node clears the node's: recovery needs
  no restart.
- Logs are rate limited: one error line when the store starts refusing, then at most one
  every ``LOG_EVERY_S`` while it keeps refusing (with the count), and one line at the
  first write accepted ``SETTLE_S`` after the last refusal. A nearly full disk takes some
  writes and refuses others (a small record fits, a snapshot does not): all of that is one
  episode in the log, while each pool's mark follows every write.

Non-guarantees: a mark is only as fresh as the last write tried; a pool this node no
longer writes to keeps its mark until ``clear`` (the node calls it when another node's
owner key for the pool appears).
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Collection, Sequence
from typing import Final, TypeVar

from ha.api import PoolName
from ha.store.contract import NO_LEASE, KeyValue, LeaseId, Store, StoreFull, WatchEvent, Write
from ha.store.keys import Keys

logger = logging.getLogger(__name__)

LOG_EVERY_S: Final = 60.0
"""At most one "still full" line per this many seconds."""

SETTLE_S: Final = 2.0
"""A store that has refused nothing for this long, and takes a write, is said to recover."""

_T = TypeVar("_T")


class WatchedStore:
    """A ``Store`` that remembers, per pool, whether its last write was refused as full."""

    def __init__(
        self,
        store: Store,
        *,
        keys: Keys,
        pools: Collection[PoolName],
        monotonic: Callable[[], float],
        node: str,
    ) -> None:
        self._store = store
        self._keys = keys
        self._pools = tuple(pools)
        self._monotonic = monotonic
        self._node = node
        self._refused: set[PoolName] = set()
        self._node_refused = False
        self._counts: dict[PoolName, int] = dict.fromkeys(self._pools, 0)
        self._refused_since_log = 0
        self._logged_at: float | None = None  # when the last "full" line was logged
        self._refused_at: float | None = None  # the last refusal of this episode

    # -- what the node reads -----------------------------------------------------------

    def full(self, pool: PoolName) -> bool:
        """True when the store refused this node's last write for ``pool`` as full."""
        return self._node_refused or pool in self._refused

    def refused_writes(self, pool: PoolName) -> int:
        """Writes for ``pool`` (or of the node itself) refused as full since start."""
        return self._counts.get(pool, 0)

    def clear(self, pool: PoolName) -> None:
        """Forgets the pool's mark: someone else's write for it has succeeded."""
        self._refused.discard(pool)

    # -- the store contract, observed ----------------------------------------------------

    async def grant_lease(self, ttl_s: float) -> LeaseId:
        return await self._observe(None, self._store.grant_lease(ttl_s))

    async def keepalive(self, lease: LeaseId, *, timeout_s: float | None = None) -> float:
        # Not a write that needs space (etcd and the file store renew a full store's
        # leases): its success says nothing about writes.
        return await self._store.keepalive(lease, timeout_s=timeout_s)

    async def revoke(self, lease: LeaseId) -> None:
        await self._store.revoke(lease)

    async def get(self, key: str) -> KeyValue | None:
        return await self._store.get(key)

    async def get_prefix(self, prefix: str) -> tuple[list[KeyValue], int]:
        return await self._store.get_prefix(prefix)

    async def put(self, key: str, value: bytes, *, lease: LeaseId = NO_LEASE) -> int:
        return await self._observe(key, self._store.put(key, value, lease=lease))

    async def create(self, key: str, value: bytes, *, lease: LeaseId) -> KeyValue | None:
        return await self._observe(key, self._store.create(key, value, lease=lease))

    async def put_fenced(
        self,
        key: str,
        value: bytes,
        *,
        fence_key: str,
        fence_revision: int,
        timeout_s: float | None = None,
    ) -> bool:
        return await self._observe(
            key,
            self._store.put_fenced(
                key,
                value,
                fence_key=fence_key,
                fence_revision=fence_revision,
                timeout_s=timeout_s,
            ),
        )

    async def commit_fenced(
        self,
        writes: Sequence[Write],
        *,
        fence_key: str,
        fence_revision: int,
        timeout_s: float | None = None,
    ) -> bool:
        # Every fenced commit is of the fence's pool (its state, under its owner key).
        return await self._observe(
            fence_key,
            self._store.commit_fenced(
                writes, fence_key=fence_key, fence_revision=fence_revision, timeout_s=timeout_s
            ),
        )

    async def delete_fenced(
        self, key: str, *, create_revision: int, timeout_s: float | None = None
    ) -> bool:
        # A delete needs no space (etcd takes deletes under its NOSPACE alarm; the file
        # store does not log deletes of keys on leases): its success proves nothing.
        return await self._observe(
            key,
            self._store.delete_fenced(key, create_revision=create_revision, timeout_s=timeout_s),
            proves=False,
        )

    def watch_prefix(self, prefix: str, *, start_revision: int) -> AsyncIterator[WatchEvent]:
        return self._store.watch_prefix(prefix, start_revision=start_revision)

    async def close(self) -> None:
        await self._store.close()

    # -- internals -----------------------------------------------------------------------

    def _pool_of(self, key: str) -> PoolName | None:
        for under in (
            self._keys.owners,
            self._keys.states,
            self._keys.handovers,
            self._keys.capacities,
        ):
            if key.startswith(under):
                return PoolName(key[len(under) :])
        return None

    async def _observe(self, key: str | None, call: Awaitable[_T], *, proves: bool = True) -> _T:
        pool = None if key is None else self._pool_of(key)
        try:
            result = await call
        except StoreFull as e:
            self._refuse(pool, e)
            raise
        if not proves:
            return result
        if pool is not None:
            self._refused.discard(pool)
        else:
            self._node_refused = False
        self._recovered()
        return result

    def _refuse(self, pool: PoolName | None, error: StoreFull) -> None:
        for name in self._pools if pool is None else (pool,):
            self._counts[name] = self._counts.get(name, 0) + 1
        if pool is None:
            self._node_refused = True
        else:
            self._refused.add(pool)
        self._refused_since_log += 1
        now = self._monotonic()
        self._refused_at = now
        if self._logged_at is None:
            logger.error(
                "node %s: the store is full and refuses writes; pools that need a write "
                "report NOT_SERVING until space is freed: %s",
                self._node,
                error,
            )
        elif now - self._logged_at >= LOG_EVERY_S:
            logger.error(
                "node %s: the store is still full (%d writes refused in %.0fs): %s",
                self._node,
                self._refused_since_log,
                now - self._logged_at,
                error,
            )
        else:
            return
        self._logged_at = now
        self._refused_since_log = 0

    def _recovered(self) -> None:
        if self._refused_at is None or self._node_refused or self._refused:
            return
        if self._monotonic() - self._refused_at < SETTLE_S:
            return  # still the same episode: a nearly full disk takes some writes
        logger.info("node %s: the store accepts writes again", self._node)
        self._logged_at = self._refused_at = None
        self._refused_since_log = 0
