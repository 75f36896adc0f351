"""How an owner gives a pool up: a graceful handover, a resignation, a stale key let go.

Guarantees:
- A handover stops deciding, writes the final snapshot, then deletes the owner key, so
  the successor restores everything this owner decided. A pin (``Mark.PIN``) is written
  before anything stops: if it cannot be written the switchover fails (StoreUnavailable)
  and the owner keeps deciding.
- At most one handover of a pool is under way at a time (``under_way``).
- Every store call is bounded by ``rpc_timeout_s``; a failed delete is retried with
  backoff, never in a spin.

Non-guarantees: a resignation that fails three times leaves the key to expire with the
lease.
"""

from __future__ import annotations

import logging
from enum import Enum

from ha.api import Epoch, NodeId, PoolName, StoreUnavailable, UnknownNode
from ha.clock import Clock
from ha.cluster.view import ClusterView
from ha.owned.pool import OwnedPool
from ha.settings import Timing
from ha.store.contract import Store, bounded
from ha.store.keys import Keys, encode_handover

logger = logging.getLogger(__name__)

TICK_S = 0.05
"""The reconcile loop's period; a delete that finds the key gone waits this long."""
_LET_GO_MAX_S = 5.0


class Mark(Enum):
    """What a handover records in the handover key about the successor."""

    PIN = "pin"
    """An operator's switchover: the pool stays on the successor while it is a member."""
    HINT = "hint"
    """Rebalancing: the successor campaigns at once, the others wait (for a short while)."""
    KEEP = "keep"
    """Write nothing: the key already pins the pool to the successor."""


class Handovers:
    """Gives up the pools of one node (see module).

    ``owned`` is the node's table of owned pools, shared with ``ha.cluster.ownership``: a
    handover takes its pool out of it just before deleting the owner key.
    """

    def __init__(
        self,
        *,
        owned: dict[PoolName, OwnedPool],
        store: Store,
        keys: Keys,
        view: ClusterView,
        clock: Clock,
        timing: Timing,
    ) -> None:
        self._owned = owned
        self._store = store
        self._keys = keys
        self._view = view
        self._clock = clock
        self._timing = timing
        self._handing_over: set[PoolName] = set()  # owned, being handed over: not lost
        self._let_go_failures: dict[PoolName, tuple[Epoch, int]] = {}

    def under_way(self, name: PoolName) -> bool:
        """True while a handover of ``name`` is under way (or about to start)."""
        return name in self._handing_over

    @property
    def count(self) -> int:
        """Handovers under way (or about to start)."""
        return len(self._handing_over)

    def begin(self, name: PoolName) -> None:
        """Marks ``name`` as being handed over before the handover task starts; the task
        is then started with ``started=True``."""
        self._handing_over.add(name)

    async def handover(
        self,
        owned: OwnedPool,
        to: NodeId,
        *,
        why: str,
        mark: Mark,
        started: bool = False,
    ) -> None:
        """Stops deciding, writes the final snapshot, names the successor, lets go.

        The pool stays in ``owned`` (marked as being handed over, so the reconcile loop
        does not take the closed committer for a failed write) until its owner key is
        deleted.

        Args:
            started: the caller already marked the pool as being handed over (``begin``).

        Raises:
            StoreUnavailable: a pin could not be written (nothing stopped).
            UnknownNode: a pin names a node that is no member now.
        """
        name = owned.name
        if name in self._handing_over and not started:
            return  # another handover of it is under way
        if self._owned.get(name) is not owned:
            if started:
                self._handing_over.discard(name)
            return
        self._handing_over.add(name)
        try:
            if mark is Mark.PIN:
                await self.mark_successor(name, to, mark)
            owned.stop()
            await owned.close()
            if mark is Mark.HINT:
                try:
                    await self.mark_successor(name, to, mark)
                except StoreUnavailable as e:
                    logger.warning("pool %s: could not name successor %s: %s", name, to, e)
            if self._owned.get(name) is not owned:
                return  # lost meanwhile (lease, owner key): that loss was logged
            # Out of the table before the delete, so its watch event is no loss; still
            # marked, so the reconcile loop does not let go of the key meanwhile.
            del self._owned[name]
            await self.resign(owned)
            logger.info("handed pool %s over to %s at epoch %d (%s)", name, to, owned.epoch, why)
        finally:
            self._handing_over.discard(name)

    async def mark_successor(self, name: PoolName, to: NodeId, mark: Mark) -> None:
        """Writes the handover key: a pin on ``to``'s current member key, or a hint.

        Raises:
            StoreUnavailable: the store did not answer.
            UnknownNode: a pin names a node that is no member now.
        """
        if mark is Mark.KEEP:
            return
        member = 0
        if mark is Mark.PIN:
            member = self._view.member_revs.get(to, 0)
            if member == 0:
                raise UnknownNode(to)
        await bounded(
            self._store.put(
                self._keys.handover(name),
                encode_handover(to, self._clock.time(), member=member, pinned=mark is Mark.PIN),
            ),
            self._timing.rpc_timeout_s,
        )

    async def let_go(self, name: PoolName, epoch: Epoch) -> None:
        """Deletes our stale owner key of ``name`` at ``epoch``; never spins.

        A failed delete is retried with backoff: the next try waits ``rpc_timeout_s``,
        doubled per consecutive failure at this epoch, up to ``_LET_GO_MAX_S``. A
        delete that finds the key gone (the watch has yet to say so) waits one tick.
        """
        rpc = self._timing.rpc_timeout_s
        last_epoch, failures = self._let_go_failures.get(name, (epoch, 0))
        if last_epoch != epoch:
            failures = 0
        pause = 0.0
        try:
            deleted = await bounded(
                self._store.delete_fenced(self._keys.owner(name), create_revision=epoch), rpc
            )
        except StoreUnavailable as e:
            failures += 1
            pause = min(rpc * 2 ** min(failures - 1, 10), _LET_GO_MAX_S)
            logger.warning(
                "pool %s: letting go of epoch %d failed (attempt %d, next in %.1fs): %s",
                name,
                epoch,
                failures,
                pause,
                e,
            )
        else:
            failures = 0
            if deleted:
                logger.info("let go of stale owner key of pool %s at epoch %d", name, epoch)
            else:
                pause = TICK_S
                logger.debug("pool %s: owner key at epoch %d already gone", name, epoch)
        if failures:
            self._let_go_failures[name] = (epoch, failures)
        else:
            self._let_go_failures.pop(name, None)
        if pause:
            await self._clock.sleep(pause)

    async def resign(self, owned: OwnedPool) -> None:
        """Deletes our owner key (if it is still ours) so a successor can campaign."""
        for attempt in range(1, 4):
            try:
                await bounded(
                    self._store.delete_fenced(
                        self._keys.owner(owned.name), create_revision=owned.epoch
                    ),
                    self._timing.rpc_timeout_s,
                )
                return
            except StoreUnavailable as e:
                logger.warning(
                    "pool %s: resigning epoch %d failed (attempt %d of 3): %s",
                    owned.name,
                    owned.epoch,
                    attempt,
                    e,
                )
                await self._clock.sleep(self._timing.rpc_timeout_s)
