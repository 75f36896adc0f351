"""The store contract: leases, conditional writes and watches, as etcd offers them.

Three implementations honour it: ``ha.store.etcd.EtcdStore`` (replicated mode),
``ha.store.file.FileStore`` (embedded single-node mode) and ``ha.store.memory.MemoryStore``
(fast tests under a fake clock).

Guarantees every implementation gives:

- One revision counter for the whole store. Every successful write (put, delete,
  transaction) increments it by one; a key's ``create_revision`` is the revision of the
  write that created it, so a key deleted and created again gets a larger one. That is
  what makes ``create_revision`` usable as an epoch (fencing token).
- Conditional writes are atomic: the condition is evaluated and the write applied with
  no other write in between.
- A key attached to a lease is deleted when the lease expires or is revoked, and watches
  see that delete.
- Watches deliver every change of their prefix after ``start_revision`` in revision order,
  or a ``reset`` event carrying the whole prefix when they had to resume and cannot
  prove that nothing was missed (after a reconnection or a compaction).

Two kinds of failure:

- ``False`` (or ``None``) from a conditional call means the condition did not hold: a
  race was lost and nothing was written. It is an answer, never a guess.
- ``StoreUnavailable`` means the outcome cannot be known (no answer in time, connection
  lost). The caller must fail safe: an owner stops deciding for the pool.
- ``StoreFull`` (a ``StoreUnavailable``) means the store refuses writes for lack of space
  (etcd's NOSPACE alarm, ENOSPC on the embedded store's disk): a write that raised it was
  not applied.
- ``LeaseNotFound`` means the lease has expired or was revoked (keys on it are gone).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import Final, NewType, Protocol, TypeVar

from ha.api import StoreFull, StoreUnavailable

LeaseId = NewType("LeaseId", int)
NO_LEASE: Final = LeaseId(0)
"""The lease of keys that live until deleted."""

__all__ = [
    "NO_LEASE",
    "DeleteRange",
    "EventKind",
    "KeyValue",
    "LeaseId",
    "LeaseNotFound",
    "Put",
    "Store",
    "StoreFull",
    "StoreUnavailable",
    "WatchEvent",
    "Write",
    "bounded",
    "within",
]


_T = TypeVar("_T")


async def bounded(call: Awaitable[_T], timeout_s: float) -> _T:
    """Awaits a store call for at most ``timeout_s``; no answer is StoreUnavailable.

    A cancellation of the caller always propagates: the call is awaited in the caller's
    own task under ``asyncio.timeout``. (``asyncio.wait_for`` on Python 3.11 runs it in a
    task of its own and returns its result when the caller is cancelled just as the call
    finishes: the cancellation is lost, and a shutdown that cancelled the caller waits for
    ever.)
    """
    try:
        async with asyncio.timeout(timeout_s):
            return await call
    except TimeoutError as e:
        raise StoreUnavailable(f"no answer from the store within {timeout_s:g}s") from e


@contextlib.asynccontextmanager
async def within(timeout_s: float | None) -> AsyncIterator[None]:
    """Bounds the body by a caller's budget (None: unbounded); running out of it is
    StoreUnavailable, for stores that implement ``timeout_s`` arguments with it."""
    if timeout_s is None:
        yield
        return
    try:
        async with asyncio.timeout(timeout_s):
            yield
    except TimeoutError as e:
        raise StoreUnavailable(f"no answer from the store within {timeout_s:g}s") from e


class LeaseNotFound(Exception):
    """The lease expired or was revoked; every key attached to it is gone."""


@dataclass(frozen=True, slots=True)
class KeyValue:
    """One key as stored."""

    key: str
    value: bytes
    create_revision: int
    mod_revision: int
    lease: LeaseId = NO_LEASE


@dataclass(frozen=True, slots=True)
class Put:
    """A write of a fenced commit: ``value`` at ``key``, on no lease."""

    key: str
    value: bytes


@dataclass(frozen=True, slots=True)
class DeleteRange:
    """A write of a fenced commit: deletes every key ``k`` with ``start <= k < end`` (one
    operation however many keys it deletes)."""

    start: str
    end: str


Write = Put | DeleteRange


class EventKind(Enum):
    """What a watch event reports."""

    PUT = "put"
    DELETE = "delete"
    RESET = "reset"
    """The watch resumed: ``snapshot`` holds every key of the prefix as of ``revision``."""


@dataclass(frozen=True, slots=True)
class WatchEvent:
    """A change seen by a watch.

    Attributes:
        kind: put, delete or reset.
        key: the key (empty for reset).
        kv: the new value for put; None for delete and reset.
        revision: the store revision of the change (of the listing, for reset).
        snapshot: every key of the watched prefix, for reset only.
    """

    kind: EventKind
    key: str
    kv: KeyValue | None
    revision: int
    snapshot: tuple[KeyValue, ...] = field(default=())


class Store(Protocol):
    """A strongly consistent key-value store with leases (etcd's data model).

    Keys are ``str`` paths such as ``/fairshare/owners/gpu-a``; values are bytes.
    Every method may raise StoreUnavailable; it says so only where it may also raise
    something else.

    A store subclasses it for ``put_fenced``, written here once for all (the fenced commit
    of one ``Put``); a wrapper (``ha.store.writes.WatchedStore``) forwards it as any call.
    """

    async def grant_lease(self, ttl_s: float) -> LeaseId:
        """Creates a lease that expires ``ttl_s`` seconds after its last renewal."""
        ...

    async def keepalive(self, lease: LeaseId, *, timeout_s: float | None = None) -> float:
        """Renews the lease once; returns its TTL in seconds as renewed.

        ``timeout_s`` is the caller's whole budget for the renewal (None: the store's own
        per-call deadline); a renewal sent once and answered late still renews from when
        the store received it, so waiting long is safe.

        Raises:
            LeaseNotFound: the lease already expired or was revoked.
            StoreUnavailable: no answer within the budget.
        """
        ...

    async def revoke(self, lease: LeaseId) -> None:
        """Ends the lease at once and deletes its keys. Revoking a lease that is gone is
        not an error."""
        ...

    async def get(self, key: str) -> KeyValue | None:
        """The key, or None when absent."""
        ...

    async def get_prefix(self, prefix: str) -> tuple[list[KeyValue], int]:
        """Every key under ``prefix`` sorted by key, and the store revision of the read."""
        ...

    async def put(self, key: str, value: bytes, *, lease: LeaseId = NO_LEASE) -> int:
        """Writes unconditionally; returns the new revision.

        Raises:
            LeaseNotFound: ``lease`` is not live.
        """
        ...

    async def create(self, key: str, value: bytes, *, lease: LeaseId) -> KeyValue | None:
        """Creates ``key`` only if it is absent (create_revision == 0), on ``lease``.

        Returns:
            The created key (its create_revision is the new epoch), or None when the key
            already exists (the race was lost).

        Raises:
            LeaseNotFound: ``lease`` is not live.
        """
        ...

    async def put_fenced(
        self,
        key: str,
        value: bytes,
        *,
        fence_key: str,
        fence_revision: int,
        timeout_s: float | None = None,
    ) -> bool:
        """Writes ``key`` only if ``fence_key`` exists with create_revision ``fence_revision``:
        ``commit_fenced`` of one ``Put``.

        An owner writes under its owner key (whose create_revision is its epoch), so a
        deposed owner can never overwrite what its successor wrote.

        Args:
            timeout_s: how long the call may take in all (the caller's budget, e.g. the
                time its owner may still decide); None means the store's own deadline of
                one call. Within it the store may send the same write again (to another
                endpoint, after a lost connection): writing the same value under the same
                fence twice leaves the same state.

        Returns:
            False when the fence did not hold (nothing was written by this attempt).

        Raises:
            StoreUnavailable: no answer within ``timeout_s``; the write may or may not
                have been applied.
        """
        return await self.commit_fenced(
            [Put(key, value)],
            fence_key=fence_key,
            fence_revision=fence_revision,
            timeout_s=timeout_s,
        )

    async def commit_fenced(
        self,
        writes: Sequence[Write],
        *,
        fence_key: str,
        fence_revision: int,
        timeout_s: float | None = None,
    ) -> bool:
        """Applies ``writes`` in order, all or none, only if ``fence_key`` exists with
        create_revision ``fence_revision``: one transaction, one revision.

        What a commit may hold is bounded by the store (etcd: 128 operations, 1.5 MiB by
        default); ``ha.owned.poolstate`` keeps every commit far below both.

        Returns:
            False when the fence did not hold (nothing was written by this attempt).

        Raises:
            StoreUnavailable: no answer within ``timeout_s``; the writes may or may not
                have been applied (all or none). Within the budget the store may send the
                same commit again: puts of the same values and deletes of the same ranges
                under the same fence leave the same state.
        """
        ...

    async def delete_fenced(
        self, key: str, *, create_revision: int, timeout_s: float | None = None
    ) -> bool:
        """Deletes ``key`` only if its create_revision is ``create_revision``.

        Args:
            timeout_s: how long the call may take in all; None means the store's own
                deadline of one call. A delete is sent once (a second one could answer
                False for a key the first one deleted).

        Returns:
            False when the key is absent or was created again since.

        Raises:
            StoreUnavailable: no answer within ``timeout_s``; the key may or may not be
                gone.
        """
        ...

    def watch_prefix(self, prefix: str, *, start_revision: int) -> AsyncIterator[WatchEvent]:
        """Every change under ``prefix`` after ``start_revision``, until the iterator is
        closed (``aclose``) or the store is closed. Resumes by itself after a lost
        connection, emitting a RESET event when it cannot replay what it missed."""
        ...

    async def close(self) -> None:
        """Releases connections; leases are left to expire (the caller revokes first if
        it wants them gone)."""
        ...
