"""Harnesses that run the store contract (``ha.store.contract``) on every implementation.

A ``StoreHarness`` gives a test one store, a key prefix of its own, and the way time
passes for that store: the in-memory store runs on a fake clock (``pass_time`` advances
it), the file and etcd stores on the real one (``pass_time`` is a no-op and the test
waits with a real deadline). After the test, ``finish`` revokes the leases the test
granted, deletes what it left under its prefix with the contract's own calls, and checks
that the prefix is empty.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

from ha.clock import FakeClock, SystemClock
from ha.store.contract import LeaseId, Store, WatchEvent
from ha.store.etcd import EtcdStore, connect
from ha.store.file import FileStore
from ha.store.memory import MemoryStore

ETCD_RPC_TIMEOUT_S = 2.0
REAL_WAIT_S = 3.0
"""How long a test on a real clock waits for something the store does by itself."""


@dataclass
class StoreHarness:
    """One store under test and what the contract tests need around it.

    Attributes:
        kind: ``memory``, ``file`` or ``etcd``.
        store: the store under test.
        prefix: a key prefix no other test uses (ends with ``/``).
        short_ttl_s: a lease TTL short enough to wait for its expiry.
        clock: the fake clock of the in-memory store, None for real time.
    """

    kind: str
    store: Store
    prefix: str
    short_ttl_s: float
    clock: FakeClock | None = None
    reopen: Callable[[], Awaitable[Store]] | None = None
    leases: list[LeaseId] = field(default_factory=list)
    closed: bool = False

    def key(self, name: str) -> str:
        return self.prefix + name

    async def grant(self, ttl_s: float | None = None) -> LeaseId:
        """A lease revoked after the test."""
        lease = await self.store.grant_lease(self.short_ttl_s if ttl_s is None else ttl_s)
        self.leases.append(lease)
        return lease

    async def pass_time(self, seconds: float) -> None:
        """Lets ``seconds`` pass: advances the fake clock, or sleeps for real."""
        if self.clock is not None:
            await self.clock.advance(seconds)
        else:
            await asyncio.sleep(seconds)

    async def expire(self, ttl_s: float) -> None:
        """Moves a fake clock past ``ttl_s``; real stores expire leases on their own."""
        if self.clock is not None:
            await self.clock.advance(ttl_s + 0.2)

    async def close(self) -> None:
        self.closed = True
        await self.store.close()

    async def finish(self) -> None:
        """Removes what the test left and checks that its prefix is empty."""
        store = self.store
        if self.closed:
            if self.reopen is None:
                return
            store = await self.reopen()
        try:
            for lease in self.leases:
                await store.revoke(lease)
            listing, _ = await store.get_prefix(self.prefix)
            for kv in listing:
                await store.delete_fenced(kv.key, create_revision=kv.create_revision)
            left, _ = await store.get_prefix(self.prefix)
            assert left == [], f"keys left under {self.prefix}: {[kv.key for kv in left]}"
        finally:
            await store.close()


def unique_prefix() -> str:
    return f"/fairshare-test/{uuid.uuid4().hex[:12]}/"


async def memory_harness() -> StoreHarness:
    clock = FakeClock()
    return StoreHarness("memory", MemoryStore(clock), unique_prefix(), 1.0, clock=clock)


async def file_harness(state_dir: Path) -> StoreHarness:
    store = FileStore(state_dir, SystemClock())
    return StoreHarness("file", store, unique_prefix(), 0.3)


async def etcd_harness(endpoints: list[str]) -> StoreHarness:
    async def reopen() -> Store:
        return await connect(endpoints, rpc_timeout_s=ETCD_RPC_TIMEOUT_S)

    store: EtcdStore = await connect(endpoints, rpc_timeout_s=ETCD_RPC_TIMEOUT_S)
    # etcd lease TTLs are whole seconds; the fixture's etcd accepts 1 s.
    return StoreHarness("etcd", store, unique_prefix(), 1.0, reopen=reopen)


async def next_event(
    events: AsyncIterator[WatchEvent], timeout_s: float = REAL_WAIT_S
) -> WatchEvent:
    """The next watch event, failing the test after ``timeout_s`` of real time."""
    try:
        async with asyncio.timeout(timeout_s):
            return await anext(events)
    except TimeoutError:
        raise AssertionError(f"no watch event within {timeout_s} s") from None
