"""The client's holder session: sent with every call, kept alive while grants are live.

An ``AllocatorClient`` opens one session when it is made (``fairshare.sessions``: an id
and a secret only this client object knows) and sends it with every call (the metadata
``fairshare-session``; releases and ListPools ignore it). Each owner that decides or
re-counts one of its grants keeps the session and renews it at every such call; a grant
made in the session lives as long as the session does, however long its request runs,
and a complete re-report closes only this session's phantoms, whoever else uses the
same holder name. ``SessionKeeper`` keeps it: it is handed the session, the function the
client calls replicas with (``fairshare.client.calls``, whose calls carry the session) and
a test of which live grants an owner counted.

While grants are live, ``_keep_alive_loop`` renews the session with the owner of every
pool where it holds a grant an owner counted: one ``KeepAlive`` per third of the TTL the
owners last answered with (``ttl_s``), skipping the pools an answered Acquire or Adopt
renewed within the last half of that period (a busy client sends almost none). Until an
owner has said its TTL, a round runs every ``FIRST_PERIOD_S`` (the first at once), so a
server with a short TTL is not outlived by the client's guess.

Guarantees: at most one KeepAlive round runs at a time; a round sends at most
``MAX_BATCH_ITEMS`` pools per call; the loop ends when no grant is live or the client
closes (``close`` cancels it). Failed rounds are logged once per episode (a warning when
they start failing, one line when they are answered again), never per call. A pool whose
owner does not know the session (``unknown``: it lapsed there, so the grants held there
no longer count in flight, though their releases are still charged) is warned about once
until it is renewed again. The secret is never logged: at most the session's id.

Non-guarantees: a session lapses at an owner that no KeepAlive (nor Acquire, nor Adopt)
reached for its TTL, e.g. while no replica answers for that long; its grants there then
stop counting (the client keeps them, and their releases are charged as usual). A
KeepAlive refused as a whole because one pool is unknown (``NOT_FOUND``, a pool removed
from the configuration) is sent again pool by pool.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Final

import grpc
from grpc import aio

from fairshare.limits import MAX_BATCH_ITEMS
from fairshare.sessions import session_id
from fairshare.wire.pb.fairshare.v1 import allocator_pb2 as pb

if TYPE_CHECKING:
    from fairshare.client.calls import Call
    from fairshare.client.grants import ClientGrant
    from fairshare.client.state import ClientState

logger = logging.getLogger(__name__)

FIRST_PERIOD_S: Final = 1.0
"""The period of KeepAlive rounds until an owner has answered with its session TTL."""


class SessionKeeper:
    """Renews the client's holder session while it holds grants (see the module doc)."""

    def __init__(
        self,
        state: ClientState,
        call: Call,
        *,
        session: str,
        deadline_s: float,
        counted: Callable[[ClientGrant], bool],
    ) -> None:
        """Keeps ``session`` (the secret ``fairshare.sessions.new_session`` made, which
        ``call`` sends with every call) alive with the owners of the live grants of
        ``state`` that ``counted`` says an owner counted; a KeepAlive may wait at least
        ``deadline_s`` for its answer."""
        self._state = state
        self._call = call
        self._deadline_s = deadline_s
        self._counted = counted
        # Its text is a secret: never logged (its id may be).
        self._session = session
        self._task: asyncio.Task[None] | None = None
        self._ttl_s: float | None = None  # as the owners last said
        self._renewed: dict[str, float] = {}  # pool -> when an owner last renewed it there
        self._lapsed: set[str] = set()  # pools whose owner said it lapsed (warned once)
        self._failing = False
        logger.debug("holder %s: session %s", state.holder, self.session_id)

    @property
    def session_id(self) -> str:
        """The id of this client's holder session (what may be logged; not its secret)."""
        return session_id(self._session)

    def renewed_by_call(self, pool: str) -> None:
        """An owner of ``pool`` answered an Acquire or Adopt, which renewed the session."""
        self._renewed[pool] = time.monotonic()
        self._lapsed.discard(pool)

    def _keepalive_period(self) -> float:
        """Seconds between two rounds: a third of the TTL last learnt, else
        ``FIRST_PERIOD_S``."""
        ttl = self._ttl_s
        return FIRST_PERIOD_S if ttl is None else ttl / 3

    def keep(self) -> None:
        """Starts the KeepAlive loop unless it runs (it ends when no grant is live)."""
        self._task = self._state.background(self._task, self._keep_alive_loop, "keepalive")

    def tasks(self) -> list[asyncio.Task[None]]:
        """Its background loop, if it ever started (for the client's ``close``)."""
        return [] if self._task is None else [self._task]

    async def _keep_alive_loop(self) -> None:
        """Rounds of KeepAlive while grants are live (the first at once while the TTL is
        not known: the Acquire that started the loop opened the session just now)."""
        wait = self._ttl_s is not None
        while self._state.live and not self._state.closed:
            if wait:
                await asyncio.sleep(self._keepalive_period())
            wait = True
            try:
                await self._keep_alive_round()
            except asyncio.CancelledError:
                raise
            except Exception:
                logger.exception("holder session %s: a keepalive round failed", self.session_id)

    def _session_pools(self) -> set[str]:
        """The pools of live grants an owner counted (a grant no owner counted yet, such
        as a degraded one, is renewed by its re-report, not here)."""
        return {g.pool for g in self._state.live.values() if self._counted(g)}

    async def _keep_alive_round(self) -> None:
        """One KeepAlive per ``MAX_BATCH_ITEMS`` pools that are due (see the module doc)."""
        pools = self._session_pools()
        for pool in [p for p in self._renewed if p not in pools]:
            del self._renewed[pool]  # held no more: forgotten, so the table stays small
        now = time.monotonic()
        recent = self._keepalive_period() / 2
        due = sorted(
            p
            for p in pools
            if self._ttl_s is None or now - self._renewed.get(p, -math.inf) >= recent
        )
        for start in range(0, len(due), MAX_BATCH_ITEMS):
            await self._keep_alive(due[start : start + MAX_BATCH_ITEMS])

    async def _keep_alive(self, pools: Sequence[str]) -> None:
        """One KeepAlive of ``pools`` (to the owner when it is one pool and its owner is
        known); one refused ``NOT_FOUND`` (a pool the replica does not know) is sent again
        pool by pool."""
        request = pb.KeepAliveRequest(pools=pools)
        deadline_s = max(self._deadline_s, self._keepalive_period() / 2)
        try:
            r: pb.KeepAliveResponse = await self._call(
                "KeepAlive",
                request,
                deadline_s=deadline_s,
                pool=pools[0] if len(pools) == 1 else "",
            )
        except aio.AioRpcError as e:
            if e.code() is grpc.StatusCode.NOT_FOUND and len(pools) > 1:
                for pool in pools:  # one pool unknown to the replica must not stall the rest
                    await self._keep_alive([pool])
                return
            self._keepalive_failed(e)
            return
        self._keepalive_answered(r)

    def _keepalive_answered(self, r: pb.KeepAliveResponse) -> None:
        if self._failing:
            self._failing = False
            logger.info("holder session %s: keepalives are answered again", self.session_id)
        if r.ttl_s > 0:
            self._ttl_s = r.ttl_s
        now = time.monotonic()
        for pool in r.renewed:
            self._renewed[pool] = now
            self._lapsed.discard(pool)
        for pool in r.unknown:
            if pool in self._lapsed:
                continue
            self._lapsed.add(pool)
            held = sum(1 for g in self._state.live.values() if g.pool == pool)
            logger.warning(
                "pool %s: its owner does not know holder session %s (it lapsed): the %d "
                "grants held there no longer count in flight; their releases are still "
                "charged",
                pool,
                self.session_id,
                held,
            )

    def _keepalive_failed(self, error: aio.AioRpcError) -> None:
        if self._failing:
            return
        self._failing = True
        logger.warning(
            "holder session %s: keepalives fail (%s: %s); grants lapse at owners not "
            "reached within the session TTL (%s)",
            self.session_id,
            error.code().name,
            error.details(),
            f"{self._ttl_s:g}s" if self._ttl_s is not None else "not known yet",
        )
