"""The store contract in memory, on an injected clock.

``MemoryStore`` honours the contract of ``ha.store.contract.Store`` exactly: one revision counter,
atomic conditional writes, leases that expire on the injected clock and take their keys
with them, watches that replay from a revision. Unit tests run whole clusters on it; the
local file store of embedded mode (``ha.store.file.FileStore``) is one that also persists
its writes (through the ``_persist`` and ``_applied`` hooks).

Non-guarantees: nothing survives the process.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from collections.abc import AsyncIterator, Sequence

from ha.clock import Clock, SystemClock
from ha.store.contract import (
    NO_LEASE,
    DeleteRange,
    EventKind,
    KeyValue,
    LeaseId,
    LeaseNotFound,
    Store,
    StoreUnavailable,
    WatchEvent,
    Write,
    within,
)

logger = logging.getLogger(__name__)

# Events kept for watches that start from an older revision; an older start gets a RESET,
# as from etcd after a compaction. Watches here start from a revision just read, so a short
# history is enough, and a short one keeps state writes (hundreds a second, each with the
# pool's whole snapshot) from piling up in memory and in the garbage collector's scans.
_HISTORY = 1_000
_HISTORY_BYTES = 4 * 1024 * 1024
_EXPIRY_TICK_S = 0.05


class MemoryStore(Store):
    """The store contract in memory, on an injected clock."""

    def __init__(self, clock: Clock | None = None) -> None:
        self._clock: Clock = clock if clock is not None else SystemClock()
        self._revision = 0
        self._keys: dict[str, KeyValue] = {}
        self._leases: dict[LeaseId, tuple[float, float]] = {}  # id -> (ttl, expires_at)
        self._next_lease = 0x1000
        self._history: deque[WatchEvent] = deque()
        self._history_bytes = 0
        self._watchers: list[tuple[str, asyncio.Queue[WatchEvent | None]]] = []
        self._expirer: asyncio.Task[None] | None = None
        self._closed = False
        self._lock = asyncio.Lock()

    # -- leases ---------------------------------------------------------------------

    async def grant_lease(self, ttl_s: float) -> LeaseId:
        async with self._op():
            self._next_lease += 1
            lease = LeaseId(self._next_lease)
            self._leases[lease] = (ttl_s, self._clock.monotonic() + ttl_s)
            if self._expirer is None:
                self._expirer = asyncio.create_task(self._expire_loop(), name="store-expirer")
            return lease

    async def keepalive(self, lease: LeaseId, *, timeout_s: float | None = None) -> float:
        async with within(timeout_s), self._op():
            entry = self._leases.get(lease)
            if entry is None:
                raise LeaseNotFound(f"lease {lease:x} not found")
            ttl = entry[0]
            self._leases[lease] = (ttl, self._clock.monotonic() + ttl)
            return ttl

    async def revoke(self, lease: LeaseId) -> None:
        async with self._op():
            if self._leases.pop(lease, None) is not None:
                await self._drop_lease_keys(lease)

    # -- reads ----------------------------------------------------------------------

    async def get(self, key: str) -> KeyValue | None:
        async with self._op():
            return self._keys.get(key)

    async def get_prefix(self, prefix: str) -> tuple[list[KeyValue], int]:
        async with self._op():
            return self._listing(prefix), self._revision

    # -- writes ---------------------------------------------------------------------

    async def put(self, key: str, value: bytes, *, lease: LeaseId = NO_LEASE) -> int:
        async with self._op():
            self._check_lease(lease)
            await self._write(key, value, lease)
            return self._revision

    async def create(self, key: str, value: bytes, *, lease: LeaseId) -> KeyValue | None:
        async with self._op():
            if key in self._keys:  # as etcd: the compare fails before the lease is looked at
                return None
            self._check_lease(lease)
            return await self._write(key, value, lease)

    async def commit_fenced(
        self,
        writes: Sequence[Write],
        *,
        fence_key: str,
        fence_revision: int,
        timeout_s: float | None = None,
    ) -> bool:
        async with within(timeout_s), self._op():
            fence = self._keys.get(fence_key)
            if fence is None or fence.create_revision != fence_revision:
                return False
            await self._commit(writes)
            return True

    async def delete_fenced(
        self, key: str, *, create_revision: int, timeout_s: float | None = None
    ) -> bool:
        async with within(timeout_s), self._op():
            kv = self._keys.get(key)
            if kv is None or kv.create_revision != create_revision:
                return False
            await self._delete(key)
            return True

    # -- watches ----------------------------------------------------------------------

    async def watch_prefix(self, prefix: str, *, start_revision: int) -> AsyncIterator[WatchEvent]:
        if self._closed:
            return
        queue: asyncio.Queue[WatchEvent | None] = asyncio.Queue()
        oldest = self._history[0].revision if self._history else self._revision + 1
        if start_revision + 1 < oldest and start_revision < self._revision:
            queue.put_nowait(
                WatchEvent(
                    EventKind.RESET,
                    "",
                    None,
                    self._revision,
                    tuple(self._listing(prefix)),
                )
            )
        else:
            for event in self._history:
                if event.revision > start_revision and event.key.startswith(prefix):
                    queue.put_nowait(event)
        entry = (prefix, queue)
        self._watchers.append(entry)
        try:
            while True:
                item = await queue.get()
                if item is None:
                    return
                yield item
        finally:
            with contextlib.suppress(ValueError):
                self._watchers.remove(entry)

    async def close(self) -> None:
        self._closed = True
        if self._expirer is not None:
            self._expirer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._expirer
        for _, queue in self._watchers:
            queue.put_nowait(None)

    # -- internals --------------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def _op(self) -> AsyncIterator[None]:
        # Every call yields to the loop once, as a call to a remote store does: callers
        # must not come to depend on a store call that completes without a pause.
        await asyncio.sleep(0)
        if self._closed:
            raise StoreUnavailable("store is closed")
        async with self._lock:
            await self._expire()
            yield

    def _listing(self, prefix: str) -> list[KeyValue]:
        return sorted(
            (kv for k, kv in self._keys.items() if k.startswith(prefix)), key=lambda kv: kv.key
        )

    def _check_lease(self, lease: LeaseId) -> None:
        if lease and lease not in self._leases:
            raise LeaseNotFound(f"lease {lease:x} not found")

    async def _write(self, key: str, value: bytes, lease: LeaseId) -> KeyValue:
        revision = self._revision + 1
        old = self._keys.get(key)
        created = old.create_revision if old is not None else revision
        kv = KeyValue(key, bytes(value), created, revision, lease)
        await self._apply(revision, {key: kv})
        return kv

    async def _delete(self, key: str) -> None:
        await self._apply(self._revision + 1, {key: None})

    async def _commit(self, writes: Sequence[Write]) -> None:
        """Applies a transaction's writes at one revision.

        Raises:
            ValueError: two writes touch the same key (etcd refuses such a transaction).
        """
        revision = self._revision + 1
        changes: dict[str, KeyValue | None] = {}
        for write in writes:
            if isinstance(write, DeleteRange):
                doomed = [k for k in self._keys if write.start <= k < write.end]
                if any(k in changes for k in doomed):
                    raise ValueError(f"a transaction deletes {write} and writes a key in it")
                changes.update(dict.fromkeys(doomed))
                continue
            if write.key in changes:
                raise ValueError(f"a transaction writes {write.key!r} twice")
            old = self._keys.get(write.key)
            created = old.create_revision if old is not None else revision
            changes[write.key] = KeyValue(write.key, bytes(write.value), created, revision)
        if not changes:
            return  # etcd applies an empty transaction without a new revision
        await self._apply(revision, changes)

    async def _apply(self, revision: int, changes: dict[str, KeyValue | None]) -> None:
        """Makes ``changes`` (key -> new value, None to delete) durable, then applies them
        at ``revision``. A write that fails to persist changes nothing, neither the keys
        nor the revision, and publishes no event."""
        persisted: list[tuple[str, KeyValue | None]] = []
        logged = False
        for key, kv in changes.items():
            old = self._keys.get(key)
            if kv is None and old is None:
                continue
            # A key on a lease is never on disk: its write keeps only the revision, and
            # its delete nothing (a restart skips a revision for these deletes), so a
            # lease's expiry and a resignation cannot fail for lack of disk space.
            if (kv is not None and kv.lease == 0) or (old is not None and old.lease == 0):
                persisted.append((key, kv if kv is None or kv.lease == 0 else None))
            elif kv is not None:
                logged = True
        if persisted or logged:
            await self._persist(revision, persisted)
        self._revision = revision
        for key, kv in changes.items():
            if kv is None:
                if self._keys.pop(key, None) is not None:
                    self._publish(WatchEvent(EventKind.DELETE, key, None, revision))
            else:
                self._keys[key] = kv
                self._publish(WatchEvent(EventKind.PUT, key, kv, revision))
        self._applied()

    def _publish(self, event: WatchEvent) -> None:
        self._history.append(event)
        self._history_bytes += _size(event)
        while len(self._history) > _HISTORY or self._history_bytes > _HISTORY_BYTES:
            self._history_bytes -= _size(self._history.popleft())
        for prefix, queue in self._watchers:
            if event.key.startswith(prefix):
                queue.put_nowait(event)

    async def _drop_lease_keys(self, lease: LeaseId) -> None:
        for key in [k for k, kv in self._keys.items() if kv.lease == lease]:
            await self._delete(key)

    async def _expire(self) -> None:
        now = self._clock.monotonic()
        for lease in [lid for lid, (_, at) in self._leases.items() if at <= now]:
            del self._leases[lease]
            await self._drop_lease_keys(lease)

    async def _expire_loop(self) -> None:
        while not self._closed:
            await self._clock.sleep(_EXPIRY_TICK_S)
            async with self._lock:
                await self._expire()

    async def _persist(self, revision: int, changes: list[tuple[str, KeyValue | None]]) -> None:
        """Hook for FileStore: makes a write durable before memory changes.

        Args:
            revision: the revision the write will get.
            changes: the keys whose value must be kept, with the new value (None: the
                key is deleted, or now lives on a lease); empty when only the revision
                must be kept (a key put on a lease).

        Raises:
            StoreUnavailable: the write is not durable; the caller changes nothing.
        """

    def _applied(self) -> None:
        """Hook for FileStore: a persisted write is now in memory."""


def _size(event: WatchEvent) -> int:
    return 0 if event.kv is None else len(event.kv.value)
