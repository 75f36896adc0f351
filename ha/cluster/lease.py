"""This node's lease: its membership in the cluster and the basis of self-fencing.

Guarantees:
- ``fenced()`` (may decide) holds only while ``boottime() < t_sent + T - margin``, where
  ``t_sent`` is when the last renewal that the store acknowledged was *sent*. The store
  expires the lease no earlier than T after it received that renewal, which came after
  ``t_sent``, so an owner stops deciding at least ``margin`` before anyone else can own
  its pools, however long this process was paused, and even if its machine was
  suspended: boot time counts a suspend, where the monotonic clock stops.
- A failed renewal is retried until that deadline; one failure is not a loss.
- When the store says the lease is gone, every key on it is gone: the node gets a new
  lease and re-registers as a member, and ``on_lost`` tells the owner of the loss.
- ``join`` (a node that could not join at start) tries again until it joins or is told
  to stop, waiting ``JOIN_FIRST_S`` after the first failure, doubling up to ``JOIN_MAX_S``,
  jittered down to half.

Non-guarantee: clocks are not compared across machines; only this node's boot-time
clock and the store's TTL are trusted. The renewal interval is measured on the monotonic
clock (``Clock.sleep``), so after a suspend the next renewal may come late: the node is
then fenced until it comes, which is the safe side.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Callable

from ha.clock import Clock
from ha.settings import Timing
from ha.store.contract import LeaseId, LeaseNotFound, Store, StoreUnavailable, bounded
from ha.store.keys import Keys, encode_member

logger = logging.getLogger(__name__)

JOIN_FIRST_S = 0.2
"""After a failed attempt to join the cluster, the next waits this, doubling each time..."""
JOIN_MAX_S = 5.0
"""...up to this, jittered down to half (replicas restarted together do not retry in step)."""
JOIN_LOG_EVERY_S = 10.0
"""A streak of failed joins logs its first failure, then one line per this."""


class NodeLease:
    """Keeps one lease alive and tells how long this node may still decide."""

    def __init__(
        self,
        *,
        store: Store,
        clock: Clock,
        timing: Timing,
        keys: Keys,
        node: str,
        address: str,
        on_lost: Callable[[], None],
    ) -> None:
        self._store = store
        self._clock = clock
        self._timing = timing
        self._keys = keys
        self._node = node
        self._address = address
        self._on_lost = on_lost
        self.lease = LeaseId(0)
        self.valid_until = float("-inf")
        self.renewals = 0

    def fenced(self) -> bool:
        """True while this node may decide (its lease is surely live)."""
        return self._clock.boottime() < self.valid_until

    def seconds_left(self) -> float:
        """Seconds this node may still decide, on the boot-time clock (``valid_until``
        is a boot-time instant too); 0 once fenced."""
        return max(0.0, self.valid_until - self._clock.boottime())

    async def acquire(self) -> None:
        """Grants a new lease and registers this node as a member on it.

        Raises:
            StoreUnavailable: the store did not answer.
        """
        t_sent = self._clock.boottime()
        lease = await bounded(
            self._store.grant_lease(self._timing.lease_ttl_s), self._timing.rpc_timeout_s
        )
        await bounded(
            self._store.put(
                self._keys.member(self._node), encode_member(self._address), lease=lease
            ),
            self._timing.rpc_timeout_s,
        )
        self.lease = lease
        self.valid_until = t_sent + self._timing.lease_ttl_s - self._timing.fence_margin_s
        logger.info("node %s joined with lease %x", self._node, lease)

    async def join(self, stopping: Callable[[], bool]) -> bool:
        """Calls ``acquire`` until it succeeds or ``stopping()``, backing off (see module);
        returns whether this node joined and is not stopping (when it is, the lease it
        may have got is left to whoever stops it)."""
        attempt = 1
        logged_at = self._clock.monotonic()
        while not stopping():
            delay = min(JOIN_MAX_S, JOIN_FIRST_S * 2 ** min(attempt - 1, 10))
            await self._clock.sleep(delay * random.uniform(0.5, 1.0))
            attempt += 1
            try:
                await self.acquire()
            except StoreUnavailable as e:
                now = self._clock.monotonic()
                if now - logged_at >= JOIN_LOG_EVERY_S:
                    logged_at = now
                    logger.warning(
                        "node %s still cannot reach the store (attempt %d): %s",
                        self._node,
                        attempt,
                        e,
                    )
                continue
            if stopping():
                return False
            logger.info("node %s joined the cluster at attempt %d", self._node, attempt)
            return True
        return False

    def _note_late(self, fenced_for_s: float) -> None:
        """Logs a renewal acknowledged after the fencing deadline: the node decided nothing
        for that long although no renewal failed (an etcd stall, or this process starved
        of CPU), which is otherwise seen only as degraded answers."""
        if fenced_for_s > 0:
            logger.warning(
                "node %s: a lease renewal was acknowledged %.2fs after the fencing "
                "deadline; its pools were not decided meanwhile",
                self._node,
                fenced_for_s,
            )

    async def run(self) -> None:
        """Renews the lease every keepalive interval, for ever."""
        interval = self._timing.keepalive_interval_s
        failures = 0
        while True:
            await self._clock.sleep(interval if failures == 0 else interval / 3)
            t_sent = self._clock.boottime()
            try:
                if self.lease == 0:
                    await self.acquire()
                else:
                    # A renewal may wait as long as this node may still decide: one
                    # answered late (an etcd stall, a leader election) still moves the
                    # deadline from when it was sent, so a stall that ends before the
                    # deadline costs no pool (docs/ha.md, "Stall budget").
                    budget = max(self._timing.rpc_timeout_s, self.seconds_left())
                    await self._store.keepalive(self.lease, timeout_s=budget)
                    self._note_late(self._clock.boottime() - self.valid_until)
                    self.valid_until = (
                        t_sent + self._timing.lease_ttl_s - self._timing.fence_margin_s
                    )
                self.renewals += 1
                if failures:
                    logger.info("node %s renewed its lease after %d failures", self._node, failures)
                failures = 0
            except LeaseNotFound:
                logger.warning(
                    "node %s lost its lease %x: its keys are gone; joining again",
                    self._node,
                    self.lease,
                )
                self.lease = LeaseId(0)
                self.valid_until = float("-inf")
                self._on_lost()
                failures = 1
            except StoreUnavailable as e:
                failures += 1
                logger.warning(
                    "node %s: lease renewal failed (attempt %d, %.2fs left before fencing): %s",
                    self._node,
                    failures,
                    self.seconds_left(),
                    e,
                )

    async def revoke(self) -> None:
        """Ends the lease now: its member and owner keys go at once."""
        if self.lease:
            lease, self.lease = self.lease, LeaseId(0)
            self.valid_until = float("-inf")
            await bounded(self._store.revoke(lease), self._timing.rpc_timeout_s)
