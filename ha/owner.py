"""One pool as decided by its owner during one epoch.

Guarantees:
- Decisions are made only while ``can_decide()`` holds: the pool is not being handed
  over and the node's lease is within its self-fencing deadline.
- A within-share grant is returned only after a fenced write that covers it succeeded.
  A failed write loses the pool (``lost``): nothing more is decided from it.
- A retried Acquire (same holder and request id) returns the first answer.
- A release is counted once per grant id, whatever the epoch that issued it.
- On restore, the previous owner's in-flight requests count as phantoms until
  ``max_request_s``, attributed to their holders, so a holder's complete re-report
  closes its share of them at once.

Non-guarantees: borrowing grants and releases since the last snapshot are lost on a
crash; the successor is then more cautious (more phantoms), never less.
"""

from __future__ import annotations

import logging
import math
import secrets
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import TypeVar

from fairshare import Class, Grant, Pool
from ha.api import (
    AdoptResult,
    Decision,
    Epoch,
    GrantRef,
    HeldGrant,
    InvalidArgument,
    NodeId,
    PoolName,
    PoolView,
    WrongEpoch,
)
from ha.clock import Clock
from ha.commit import CommitFailed, GroupCommitter
from ha.settings import PoolConfig
from ha.snapshot import PoolSnapshot

logger = logging.getLogger(__name__)

_K = TypeVar("_K")
_REQUEST_MEMORY = 100_000  # answered request ids kept for retries


class NotDeciding(Exception):
    """The owner may not decide for the pool now (handover, fence, lost write)."""


@dataclass(slots=True)
class _Held:
    grant: Grant
    holder: str
    team: str
    wall: float  # when it was issued or adopted


class OwnedPool:
    """A pool this node owns at ``epoch``."""

    def __init__(
        self,
        *,
        config: PoolConfig,
        epoch: Epoch,
        node: NodeId,
        clock: Clock,
        fenced: Callable[[], bool],
        write: Callable[[bytes], Awaitable[None]],
        commit_window_s: float,
        release_memory_s: float,
    ) -> None:
        """Args:
        config: the pool's configuration.
        epoch: the create_revision of this node's owner key.
        node: this node's id.
        clock: wall time for the pool's decay and phantoms, monotonic for fencing.
        fenced: True while the node's lease is within its self-fencing deadline.
        write: coroutine function writing a snapshot, fenced on the epoch; raises
            on failure (the pool is then lost).
        commit_window_s: group commit window.
        release_memory_s: how long released ids of earlier epochs are remembered.
        """
        self.config = config
        self.name = PoolName(config.name)
        self.epoch = epoch
        self.node = node
        self._clock = clock
        self._fenced = fenced
        self.pool = Pool(
            config.name,
            config.capacity,
            config.shares,
            half_life_s=config.half_life_s,
            clock=clock.time,
        )
        self.deciding = True
        self._seq = 0
        self._grants: dict[int, _Held] = {}
        self._adopted: dict[str, _Held] = {}  # earlier epoch's grant id -> adopted grant
        self._settled: dict[str, float] = {}  # earlier epoch's grant ids released, at wall
        self._answers: OrderedDict[tuple[str, str], Decision] = OrderedDict()
        # holder -> team -> phantoms of the previous owner attributed to that holder
        self._attributed: dict[str, dict[str, int]] = {}
        self._release_memory_s = release_memory_s
        self._write = write
        self.last_snapshot_mono = -1.0
        self.committer = GroupCommitter(
            self._persist, window_s=commit_window_s, clock=clock, name=config.name
        )

    # -- lifecycle ------------------------------------------------------------------

    def restore(self, snapshot: PoolSnapshot | None) -> tuple[int, int]:
        """Takes over the state a previous owner persisted.

        Returns:
            (teams whose usage was restored, phantoms added).
        """
        if snapshot is None:
            return 0, 0
        now = self._clock.time()
        if snapshot.capacity != self.pool.capacity:
            self.pool.set_capacity(snapshot.capacity)
        decay = math.exp(-self.pool.decay_rate * max(0.0, now - snapshot.wall))
        for team, usage in snapshot.usage.items():
            self.pool.set_usage(team, usage * decay)
        until = now + self.config.max_request_s
        phantoms = 0
        for team, n in snapshot.in_flight.items():
            if n > 0:
                self.pool.add_phantoms(team, n, until)
                phantoms += n
        # Attribute phantoms to holders, never more than the team has.
        left = dict(snapshot.in_flight)
        for holder, teams in sorted(snapshot.holders.items()):
            for team, n in teams.items():
                take = min(n, left.get(team, 0))
                if take > 0:
                    self._attributed.setdefault(holder, {})[team] = take
                    left[team] -= take
        return len(snapshot.usage), phantoms

    def can_decide(self) -> bool:
        return self.deciding and not self.committer.failed and self._fenced()

    @property
    def lost(self) -> bool:
        """A fenced write failed: the pool must be given up."""
        return self.committer.failed

    # -- decisions ------------------------------------------------------------------

    async def acquire(
        self,
        *,
        team: str,
        cls: Class,
        est_tokens: int,
        holder: str,
        request_id: str,
        try_only: bool,
    ) -> Decision:
        """Decides one request; within-share grants are durable before they return.

        Raises:
            NotDeciding: the node may not decide for this pool now.
            InvalidArgument: bad team, class or tokens.
        """
        if not self.can_decide():
            raise NotDeciding(self.name)
        key = (holder, request_id)
        if request_id:
            answered = self._answers.get(key)
            if answered is not None:
                await self.durable()  # the first answer may still be in its commit
                return answered
        try:
            grant = (
                self.pool.try_acquire(team, cls, est_tokens)
                if try_only
                else self.pool.acquire(team, cls, est_tokens)
            )
        except ValueError as e:
            raise InvalidArgument(_field_of(e), str(e)) from e
        if grant is None:
            decision = Decision(False, "", 0, False, True, False, self.node, self.epoch)
        else:
            self._seq += 1
            ref = GrantRef(self.name, self.epoch, self._seq, team, holder)
            self._grants[self._seq] = _Held(grant, holder, team, self._clock.time())
            decision = Decision(
                True,
                ref.encode(),
                grant.priority,
                grant.borrowing,
                grant.saturated,
                False,
                self.node,
                self.epoch,
            )
        if request_id:
            self._answers[key] = decision
            if len(self._answers) > _REQUEST_MEMORY:
                self._answers.popitem(last=False)
        if grant is not None and not grant.borrowing:
            await self.durable()
        return decision

    def release(self, ref: GrantRef, grant_id: str, consumed: float) -> None:
        """Ends a grant of this epoch or an earlier one; idempotent.

        Raises:
            WrongEpoch: the grant is of a later epoch than this owner's (it is stale).
        """
        if ref.epoch == self.epoch:
            held = self._grants.pop(ref.seq, None)
            if held is not None:
                held.grant.release(consumed)
            return
        if ref.epoch > self.epoch:
            raise WrongEpoch(self.name, NodeId(""), "", ref.epoch)
        adopted = self._adopted.pop(grant_id, None)
        if adopted is not None:
            adopted.grant.release(consumed)
        elif grant_id not in self._settled:
            # A request this owner never counted: charge its team, and close the phantom
            # that stood for it when its holder had one.
            self.pool.charge(ref.team or "unknown", consumed)
            if ref.epoch > 0:
                self._drop_attributed(ref.holder, ref.team)
        self._settled[grant_id] = self._clock.time()
        self._forget_settled()

    def adopt(self, *, holder: str, grants: Sequence[HeldGrant], complete: bool) -> AdoptResult:
        """Counts a holder's live grants of earlier epochs again.

        Every grant adopted closes one phantom of its holder and team; a complete
        inventory closes every phantom still attributed to ``holder``.
        """
        adopted = 0
        dropped = 0
        for held in grants:
            ref = GrantRef.decode(held.grant_id)
            if ref.pool != self.name:
                raise InvalidArgument("grants", f"grant {held.grant_id} is of pool {ref.pool}")
            if (
                ref.epoch >= self.epoch
                or held.grant_id in self._adopted
                or held.grant_id in self._settled
            ):
                continue
            try:
                grant = self.pool.adopt(
                    held.team or ref.team, held.priority, held.borrowing, held.est_tokens
                )
            except ValueError as e:
                raise InvalidArgument(f"grants.{_field_of(e)}", str(e)) from e
            self._adopted[held.grant_id] = _Held(grant, ref.holder, grant.team, self._clock.time())
            adopted += 1
            if ref.epoch > 0 and self._drop_attributed(ref.holder, grant.team):
                dropped += 1
        if complete:
            for team, n in list(self._attributed.pop(holder, {}).items()):
                for _ in range(n):
                    if self.pool.drop_phantom(team):
                        dropped += 1
        return AdoptResult(adopted, dropped, self.node, self.epoch)

    def expire(self) -> int:
        """Ends grants older than ``max_request_s``; returns how many.

        No request lives longer than that, so such a grant belongs to a holder that died
        without releasing it. Without this a dead gateway would keep its team's slots for
        ever; with it, it keeps them no longer than a phantom would. Nothing is charged.
        """
        horizon = self._clock.time() - self.config.max_request_s
        expired = _expire(self._grants, horizon) + _expire(self._adopted, horizon)
        if expired:
            logger.warning(
                "pool %s at epoch %d: %d grants outlived max_request_s (%gs) unreleased; "
                "their holders are presumed dead",
                self.name,
                self.epoch,
                expired,
                self.config.max_request_s,
            )
            self.committer.nudge()
        return expired

    def set_capacity(self, capacity: int) -> int:
        try:
            return self.pool.set_capacity(capacity)
        except ValueError as e:
            raise InvalidArgument("capacity", str(e)) from e

    def view(self) -> PoolView:
        return PoolView(self.name, self.pool.capacity, self.node, self.epoch, self.pool.snapshot())

    # -- persistence ----------------------------------------------------------------

    def snapshot(self) -> PoolSnapshot:
        """The state to persist now."""
        usage, in_flight = self.pool.usage()
        holders: dict[str, dict[str, int]] = {}
        for held in (*self._grants.values(), *self._adopted.values()):
            teams = holders.setdefault(held.holder, {})
            teams[held.team] = teams.get(held.team, 0) + 1
        phantoms = {s.team: s.phantoms for s in self.pool.snapshot() if s.phantoms}
        for holder, teams in self._attributed.items():
            for team, n in teams.items():
                live = min(n, phantoms.get(team, 0))
                if live > 0:
                    mine = holders.setdefault(holder, {})
                    mine[team] = mine.get(team, 0) + live
                    phantoms[team] -= live
        return PoolSnapshot(
            pool=self.name,
            epoch=self.epoch,
            wall=self._clock.time(),
            capacity=self.pool.capacity,
            usage=usage,
            in_flight={t: n for t, n in in_flight.items() if n > 0},
            holders={h: t for h, t in holders.items() if t},
        )

    async def _persist(self) -> None:
        await self._write(self.snapshot().encode())
        self.last_snapshot_mono = self._clock.monotonic()

    async def durable(self) -> None:
        """Returns once a fenced write covers the state as of the call.

        Raises:
            NotDeciding: the write failed; the pool is lost.
        """
        try:
            await self.committer.sync()
        except CommitFailed as e:
            raise NotDeciding(f"{self.name}: durable write failed: {e}") from e

    # -- internals --------------------------------------------------------------------

    def _drop_attributed(self, holder: str, team: str) -> bool:
        teams = self._attributed.get(holder)
        if not teams or teams.get(team, 0) <= 0:
            return False
        teams[team] -= 1
        if teams[team] == 0:
            del teams[team]
        return self.pool.drop_phantom(team)

    def _forget_settled(self) -> None:
        if len(self._settled) < 1024:
            return
        horizon = self._clock.time() - self._release_memory_s
        oldest = next(iter(self._settled.values()))
        if oldest < horizon:
            self._settled = {g: t for g, t in self._settled.items() if t >= horizon}


def _expire(table: dict[_K, _Held], horizon: float) -> int:
    """Releases the grants of ``table`` issued before ``horizon``; the table is in issue
    order, so the scan stops at the first live one."""
    expired = 0
    for key in list(table):
        held = table[key]
        if held.wall > horizon:
            break
        del table[key]
        held.grant.release(0.0)
        expired += 1
    return expired


def degraded_grant_id(pool: str, team: str, holder: str) -> str:
    """A grant id for a degraded decision: epoch 0, a random sequence number."""
    return GrantRef(PoolName(pool), Epoch(0), secrets.randbits(62), team, holder).encode()


def _field_of(error: ValueError) -> str:
    text = str(error)
    names = {"class": "service_class"}
    for field in ("team", "est_tokens", "class", "priority", "capacity"):
        if text.startswith(field):
            return names.get(field, field)
    return "request"
