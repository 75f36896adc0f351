"""``EtcdStore``: the store contract (``ha.store.contract.Store``) over etcd, and ``connect``.

This module says what each operation sends to etcd; the connection (``ha.store.etcd.connection``)
sends it, with one deadline, and fails over; the watch (``ha.store.etcd.watch``) follows the
connection from member to member. The guarantees beyond ``ha.store.contract``'s are in the
package's docstring (``ha.store.etcd``).
"""

from __future__ import annotations

import contextlib
import math
import random
from collections.abc import AsyncIterator, Sequence
from typing import Any

from aetcd import rpc

from ha.store.contract import (
    NO_LEASE,
    DeleteRange,
    KeyValue,
    LeaseId,
    LeaseNotFound,
    Store,
    StoreUnavailable,
    WatchEvent,
    Write,
)
from ha.store.etcd.client import EtcdAccess
from ha.store.etcd.connection import Connection
from ha.store.etcd.messages import (
    compare_create,
    compare_exists,
    delete_range_op,
    key_value,
    prefix_range,
    put_op,
)
from ha.store.etcd.watch import watch_prefix

__all__ = ["EtcdStore", "connect"]


async def connect(
    endpoints: Sequence[str],
    *,
    rpc_timeout_s: float,
    seed: int | str | None = None,
    access: EtcdAccess | None = None,
    lazy: bool = False,
) -> EtcdStore:
    """Connects to the first endpoint that answers a linearizable read.

    Args:
        endpoints: ``host:port``, ``http://host:port`` or ``https://host:port``, tried
            in an order shuffled by ``seed`` (each replica passes its own, so replicas
            spread over the members instead of all starting on the first one);
            ``store.endpoints`` is that order.
        rpc_timeout_s: the deadline of every call, in seconds.
        seed: seeds the shuffle (None: a random order).
        access: TLS and auth (``https://`` endpoints need its CA); None: plaintext,
            no auth.
        lazy: return at once, connected to nothing: the first call goes to the first
            endpoint in that order and fails over from there (a store that etcd may
            join later).

    Raises:
        AccessRefused: no endpoint answered and one refused the TLS handshake, the
            password or a permission (a ``StoreUnavailable``).
        StoreUnavailable: no endpoint answered (each one's error is in the message:
            refused, TLS handshake failed, password refused...).
        ValueError: no endpoints, a malformed one, endpoints and ``access`` that do
            not agree on TLS, or a non-positive timeout.
    """
    order = list(endpoints)
    random.Random(seed).shuffle(order)
    store = EtcdStore(order, rpc_timeout_s=rpc_timeout_s, access=access)
    if not lazy:
        await store._connection.open_first()
    return store


class EtcdStore(Store):
    """``ha.store.contract.Store`` over etcd. Create it with ``connect``."""

    def __init__(
        self,
        endpoints: Sequence[str],
        *,
        rpc_timeout_s: float,
        access: EtcdAccess | None = None,
    ) -> None:
        """Raises ValueError: as ``ha.store.etcd.connection.Connection``."""
        self._connection = Connection(endpoints, rpc_timeout_s=rpc_timeout_s, access=access)
        self.endpoints: tuple[str, ...] = self._connection.endpoints
        self.rpc_timeout_s = rpc_timeout_s

    # -- leases ---------------------------------------------------------------------------

    async def grant_lease(self, ttl_s: float) -> LeaseId:
        ttl = max(1, math.ceil(ttl_s))
        lease = await self._connection.call("grant a lease", lambda c, _: c.lease(ttl))
        return LeaseId(int(lease.id))

    async def keepalive(self, lease: LeaseId, *, timeout_s: float | None = None) -> float:
        reply = await self._connection.call(
            "renew a lease",
            lambda c, _: c.refresh_lease(int(lease)),
            idempotent=True,
            budget_s=timeout_s,
            repeat=True,  # a renewal sent twice renews twice: harmless
        )
        if reply is None:
            raise StoreUnavailable(f"etcd closed the keepalive of lease {lease:x} unanswered")
        if reply.TTL <= 0:
            raise LeaseNotFound(f"lease {lease:x} not found")
        return float(reply.TTL)

    async def revoke(self, lease: LeaseId) -> None:
        with contextlib.suppress(LeaseNotFound):
            await self._connection.call(
                "revoke a lease", lambda c, _: c.revoke_lease(int(lease)), idempotent=True
            )

    # -- reads ------------------------------------------------------------------------------

    async def get(self, key: str) -> KeyValue | None:
        raw = await self._connection.call(
            "get a key", lambda c, _: c.get(key.encode()), idempotent=True
        )
        return None if raw is None else key_value(raw)

    async def get_prefix(self, prefix: str) -> tuple[list[KeyValue], int]:
        start, end = prefix_range(prefix)
        found = await self._connection.call(
            "list a prefix",
            lambda c, _: c.get_range(start, end, sort_order="ascend", sort_target="key"),
            idempotent=True,
        )
        return [key_value(raw) for raw in found.kvs], int(found.header.revision)

    # -- writes -----------------------------------------------------------------------------

    async def put(self, key: str, value: bytes, *, lease: LeaseId = NO_LEASE) -> int:
        done = await self._connection.call(
            "put a key", lambda c, _: c.put(key.encode(), value, int(lease))
        )
        return int(done.header.revision)

    async def create(self, key: str, value: bytes, *, lease: LeaseId) -> KeyValue | None:
        raw_key = key.encode()
        succeeded, revision = await self._txn(
            "create a key",
            compare=[compare_create(raw_key, 0)],
            success=[put_op(raw_key, value, lease)],
        )
        if not succeeded:
            return None
        return KeyValue(key, bytes(value), revision, revision, lease)

    async def commit_fenced(
        self,
        writes: Sequence[Write],
        *,
        fence_key: str,
        fence_revision: int,
        timeout_s: float | None = None,
    ) -> bool:
        fence = fence_key.encode()
        succeeded, _ = await self._txn(
            "commit under a fence",
            compare=[compare_create(fence, fence_revision), compare_exists(fence)],
            success=[
                delete_range_op(w.start.encode(), w.end.encode())
                if isinstance(w, DeleteRange)
                else put_op(w.key.encode(), w.value, NO_LEASE)
                for w in writes
            ],
            budget_s=timeout_s,
            repeat=True,  # the same puts and deletes under the same fence: same state
        )
        return succeeded

    async def delete_fenced(
        self, key: str, *, create_revision: int, timeout_s: float | None = None
    ) -> bool:
        raw_key = key.encode()
        # Sent once, however long the budget: a second delete could answer False for
        # the key the first one deleted.
        succeeded, _ = await self._txn(
            "delete under a fence",
            compare=[compare_create(raw_key, create_revision), compare_exists(raw_key)],
            success=[rpc.RequestOp(request_delete_range=rpc.DeleteRangeRequest(key=raw_key))],
            budget_s=timeout_s,
        )
        return succeeded

    # -- watches and closing ----------------------------------------------------------------

    def watch_prefix(self, prefix: str, *, start_revision: int) -> AsyncIterator[WatchEvent]:
        return watch_prefix(
            self._connection, self.get_prefix, prefix, start_revision=start_revision
        )

    async def close(self) -> None:
        await self._connection.close()

    # -- internals --------------------------------------------------------------------------

    async def _txn(
        self,
        what: str,
        *,
        compare: list[Any],
        success: list[Any],
        budget_s: float | None = None,
        repeat: bool = False,
    ) -> tuple[bool, int]:
        """One transaction: (compare held, revision after it), within ``budget_s``
        (default ``rpc_timeout_s``); sent again only if ``repeat`` (see
        ``Connection.call``)."""
        request = rpc.TxnRequest(compare=compare, success=success, failure=[])

        async def send(client: Any, timeout_s: float) -> Any:
            return await client.kvstub.Txn(request, timeout=timeout_s, metadata=client.metadata)

        response = await self._connection.call(what, send, budget_s=budget_s, repeat=repeat)
        return bool(response.succeeded), int(response.header.revision)
