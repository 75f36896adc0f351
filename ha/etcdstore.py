"""The store contract over etcd 3.4, with the ``aetcd`` asyncio client.

Guarantees (beyond those of ``ha.store``):

- Every call has one deadline, enforced both as the gRPC deadline and around the awaited
  call: ``rpc_timeout_s``, or the caller's ``timeout_s`` for ``put_fenced`` and
  ``delete_fenced``. A transaction that got no answer may or may not have been applied,
  so it raises ``StoreUnavailable`` and the caller re-reads (a blind retry of a lost
  ``create`` could report a race lost to itself). The one write sent again is
  ``put_fenced``: within its budget, after its endpoint failed (connection lost, no
  leader, or no answer to one attempt while other endpoints remain), since the same
  value under the same fence leaves the same state however often it is applied.
- etcd and gRPC errors are translated in one table (``_ERRORS_BY_STATUS``, with
  ``_ERRORS_BY_MESSAGE`` for answers that share a status): connection refused, no leader,
  deadline exceeded → ``StoreUnavailable``; NOSPACE ("database space exceeded") →
  ``StoreFull``; lease not found → ``LeaseNotFound``; a request etcd calls malformed →
  ``ValueError`` (a bug here).
- Every call requires a leader (etcd's ``hasleader`` metadata): a member cut off from its
  quorum refuses calls at once, and ends the watches open on it after three election
  timeouts without a leader; both move the store to the next endpoint.
- Endpoints are tried at ``connect`` in an order shuffled by the caller's seed, so
  replicas spread over the members. Later, a connection error, a deadline or "no leader"
  moves the store to the next endpoint for the calls that follow. Idempotent calls
  (reads, keepalive, revoke) try the next endpoint within the same deadline; writes
  raise (``put_fenced`` excepted, see above). With one endpoint gRPC reconnects the same
  channel, its backoff bounded at 1 s.
- A watch resumes by itself after its stream is lost: it watches again from the
  revision after the last event it delivered, so etcd replays what was missed. Only when
  that revision has been compacted does it emit a ``RESET`` with the prefix as listed at
  a fresh revision, then continue from there. Resumes back off from 50 ms to 1 s.
- Lease TTLs are whole seconds in etcd: ``grant_lease`` rounds up, minimum 1 s (etcd
  may raise it to its own minimum, 1.5 election timeouts).

Non-guarantees: no TLS or authentication yet (``http://`` endpoints only); a watch on a
member that is paused but keeps its TCP connection open notices only through gRPC
keepalive pings (every 10 s, the fastest etcd's default server policy accepts).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import random
import urllib.parse
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, TypeVar

import aetcd
import grpc
from aetcd import rpc, utils

from ha.store import (
    NO_LEASE,
    EventKind,
    KeyValue,
    LeaseId,
    LeaseNotFound,
    StoreFull,
    StoreUnavailable,
    WatchEvent,
)

__all__ = ["EtcdStore", "connect", "parse_endpoint"]

logger = logging.getLogger(__name__)

T = TypeVar("T")

DEFAULT_PORT: Final = 2379
_WATCH_BACKOFF_MIN_S: Final = 0.05
_WATCH_BACKOFF_MAX_S: Final = 1.0
_MIN_ATTEMPT_S: Final = 0.05
"""A budgeted write is not sent again with less time than this left."""
_KEEPALIVE_PING_MS: Final = 10_000
"""etcd refuses pings more often than every 5 s (``--grpc-keepalive-min-time``)."""
_MAX_MESSAGE_BYTES: Final = 32 * 1024 * 1024
_REQUIRE_LEADER: Final = (("hasleader", "true"),)
"""etcd's require-leader metadata (clientv3 ``WithRequireLeader``): a member without a
leader refuses the call at once, and cancels an open watch with "no leader" once it has
had none for three election timeouts, instead of keeping it open and silent."""


# -- errors: translated once, here ----------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Translation:
    """What an etcd or gRPC failure means to the caller.

    Attributes:
        error: the project exception to raise.
        reason: the words put in front of etcd's message.
        failover: the endpoint itself failed, so the next call goes to the next one.
    """

    error: type[Exception]
    reason: str
    failover: bool = False


_ERRORS_BY_STATUS: Final[Mapping[grpc.StatusCode, _Translation]] = {
    grpc.StatusCode.UNAVAILABLE: _Translation(
        StoreUnavailable, "etcd is unreachable or has no leader", failover=True
    ),
    grpc.StatusCode.DEADLINE_EXCEEDED: _Translation(
        StoreUnavailable, "etcd did not answer within the deadline", failover=True
    ),
    grpc.StatusCode.NOT_FOUND: _Translation(LeaseNotFound, "lease not found"),
    grpc.StatusCode.CANCELLED: _Translation(StoreUnavailable, "the etcd call was cancelled"),
    grpc.StatusCode.RESOURCE_EXHAUSTED: _Translation(
        StoreUnavailable, "etcd is out of space or overloaded"
    ),
    grpc.StatusCode.INVALID_ARGUMENT: _Translation(
        ValueError, "BUG: etcd refused a malformed request"
    ),
}
"""gRPC status → project exception. etcd 3.4 uses NOT_FOUND only for leases."""

_ERRORS_BY_MESSAGE: Final[tuple[tuple[str, _Translation], ...]] = (
    # etcd answers RESOURCE_EXHAUSTED both for NOSPACE and for "too many requests";
    # only the first is a refusal that lasts until an operator frees space.
    ("database space exceeded", _Translation(StoreFull, "etcd is out of space (NOSPACE alarm)")),
)
"""Failures told apart by etcd's message, checked before the status table."""

_ERRORS_BY_TYPE: Final[tuple[tuple[type[BaseException], _Translation], ...]] = (
    (TimeoutError, _Translation(StoreUnavailable, "no answer within the deadline", True)),
    (aetcd.WatchTimeoutError, _Translation(StoreUnavailable, "watch not created in time", True)),
    (aetcd.InvalidArgumentError, _ERRORS_BY_STATUS[grpc.StatusCode.INVALID_ARGUMENT]),
    (aetcd.ClientError, _Translation(StoreUnavailable, "etcd failed the call")),
    (grpc.RpcError, _Translation(StoreUnavailable, "etcd failed the call")),
)
"""Failures that carry no gRPC status, first match wins."""

_TRANSLATED: Final = (TimeoutError, aetcd.ClientError, grpc.RpcError)


def _translate(e: BaseException) -> _Translation | None:
    """The translation of a failure, or None when it is not an etcd failure."""
    status = _status_of(e)
    if status is not None:
        details = _details_of(e)
        for words, translation in _ERRORS_BY_MESSAGE:
            if words in details:
                return translation
    if status is not None and status in _ERRORS_BY_STATUS:
        return _ERRORS_BY_STATUS[status]
    for kind, translation in _ERRORS_BY_TYPE:
        if isinstance(e, kind):
            return translation
    return None


def _status_of(e: BaseException) -> grpc.StatusCode | None:
    # aetcd wraps the grpc.aio.AioRpcError (``raise ClientError(...) from error``).
    for candidate in (e, e.__cause__):
        if isinstance(candidate, grpc.aio.AioRpcError):
            code: grpc.StatusCode = candidate.code()
            return code
    return None


def _details_of(e: BaseException) -> str:
    for candidate in (e, e.__cause__):
        if isinstance(candidate, grpc.aio.AioRpcError):
            return str(candidate.details())
    return str(e) or type(e).__name__


# -- endpoints ----------------------------------------------------------------------------


def parse_endpoint(text: str) -> tuple[str, int]:
    """``host:port``, ``http://host:port`` or ``[v6]:port`` → (gRPC host, port).

    Raises:
        ValueError: not an endpoint, or a scheme other than http.
    """
    raw = text.strip()
    scheme, sep, rest = raw.partition("://")
    if not sep:
        rest = raw
    elif scheme.lower() != "http":
        raise ValueError(f"etcd endpoint {text!r}: only http:// is supported (no TLS yet)")
    parts = urllib.parse.urlsplit("//" + rest.rstrip("/"))
    try:
        port = parts.port or DEFAULT_PORT
    except ValueError as e:
        raise ValueError(f"etcd endpoint {text!r}: bad port") from e
    host = parts.hostname
    if not host or parts.path:
        raise ValueError(f"etcd endpoint {text!r}: expected host:port")
    return (f"[{host}]" if ":" in host else host), port


def _channel_options(rpc_timeout_s: float) -> dict[str, int]:
    return {
        # A restarted etcd is found again within a second (the default backoff grows
        # to two minutes, during which every call would fail at once).
        "grpc.initial_reconnect_backoff_ms": 100,
        "grpc.min_reconnect_backoff_ms": 1000,
        "grpc.max_reconnect_backoff_ms": 1000,
        # Pings find a member that stopped answering on an open connection (paused,
        # partitioned) even when the only call is an idle watch.
        "grpc.keepalive_time_ms": _KEEPALIVE_PING_MS,
        "grpc.keepalive_timeout_ms": max(1000, math.ceil(rpc_timeout_s * 1000)),
        "grpc.http2.max_pings_without_data": 0,
        # Without this one, grpcio 1.85 waits a minute for an unanswered ping.
        "grpc.http2.ping_timeout_ms": max(1000, math.ceil(rpc_timeout_s * 1000)),
        "grpc.keepalive_permit_without_calls": 0,
        "grpc.max_receive_message_length": _MAX_MESSAGE_BYTES,
    }


@dataclass(frozen=True, slots=True)
class _Conn:
    """One endpoint's client; replaced as a whole on failover."""

    client: Any  # aetcd.Client (untyped)
    endpoint: str
    index: int


# -- the store ----------------------------------------------------------------------------


async def connect(
    endpoints: Sequence[str], *, rpc_timeout_s: float, seed: int | str | None = None
) -> EtcdStore:
    """Connects to the first endpoint that answers a linearizable read.

    Args:
        endpoints: ``host:port`` or ``http://host:port``, tried in an order shuffled
            by ``seed`` (each replica passes its own, so replicas spread over the
            members instead of all starting on the first one); ``store.endpoints`` is
            that order.
        rpc_timeout_s: the deadline of every call, in seconds.
        seed: seeds the shuffle (None: a random order).

    Raises:
        StoreUnavailable: no endpoint answered (each one's error is in the message).
        ValueError: no endpoints, a malformed one, or a non-positive timeout.
    """
    order = list(endpoints)
    random.Random(seed).shuffle(order)
    store = EtcdStore(order, rpc_timeout_s=rpc_timeout_s)
    failures: list[str] = []
    for index in range(len(store.endpoints)):
        conn = store._open(index)
        try:
            async with asyncio.timeout(rpc_timeout_s):
                await conn.client.get(b"/")
        except asyncio.CancelledError:
            await _close_client(conn)
            raise
        except _TRANSLATED as e:
            failures.append(f"{conn.endpoint}: {_details_of(e)}")
            await _close_client(conn)
            continue
        store._conn = conn
        logger.info("connected to etcd at %s", conn.endpoint)
        return store
    raise StoreUnavailable("no etcd endpoint answered: " + "; ".join(failures))


class EtcdStore:
    """``ha.store.Store`` over etcd. Create it with ``connect``."""

    def __init__(self, endpoints: Sequence[str], *, rpc_timeout_s: float) -> None:
        if not endpoints:
            raise ValueError("no etcd endpoints given")
        if not rpc_timeout_s > 0:
            raise ValueError(f"rpc_timeout_s must be positive, got {rpc_timeout_s}")
        self.endpoints: tuple[str, ...] = tuple(endpoints)
        self._addresses = [parse_endpoint(e) for e in self.endpoints]
        self.rpc_timeout_s = rpc_timeout_s
        self._conn: _Conn | None = None
        self._closed = False
        self._closed_event = asyncio.Event()
        self._retiring: set[asyncio.Task[None]] = set()
        self._watch_calls: set[Any] = set()

    # -- leases ---------------------------------------------------------------------------

    async def grant_lease(self, ttl_s: float) -> LeaseId:
        ttl = max(1, math.ceil(ttl_s))
        lease = await self._call("grant a lease", lambda c, _: c.lease(ttl))
        return LeaseId(int(lease.id))

    async def keepalive(self, lease: LeaseId, *, timeout_s: float | None = None) -> float:
        reply = await self._call(
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
            await self._call(
                "revoke a lease", lambda c, _: c.revoke_lease(int(lease)), idempotent=True
            )

    # -- reads ------------------------------------------------------------------------------

    async def get(self, key: str) -> KeyValue | None:
        raw = await self._call("get a key", lambda c, _: c.get(key.encode()), idempotent=True)
        return None if raw is None else _kv(raw)

    async def get_prefix(self, prefix: str) -> tuple[list[KeyValue], int]:
        start, end = _prefix_range(prefix)
        found = await self._call(
            "list a prefix",
            lambda c, _: c.get_range(start, end, sort_order="ascend", sort_target="key"),
            idempotent=True,
        )
        return [_kv(raw) for raw in found.kvs], int(found.header.revision)

    # -- writes -----------------------------------------------------------------------------

    async def put(self, key: str, value: bytes, *, lease: LeaseId = NO_LEASE) -> int:
        done = await self._call("put a key", lambda c, _: c.put(key.encode(), value, int(lease)))
        return int(done.header.revision)

    async def create(self, key: str, value: bytes, *, lease: LeaseId) -> KeyValue | None:
        raw_key = key.encode()
        succeeded, revision = await self._txn(
            "create a key",
            compare=[_compare_create(raw_key, 0)],
            success=[_put_op(raw_key, value, lease)],
        )
        if not succeeded:
            return None
        return KeyValue(key, bytes(value), revision, revision, lease)

    async def put_fenced(
        self,
        key: str,
        value: bytes,
        *,
        fence_key: str,
        fence_revision: int,
        timeout_s: float | None = None,
    ) -> bool:
        fence = fence_key.encode()
        succeeded, _ = await self._txn(
            "write under a fence",
            compare=[_compare_create(fence, fence_revision), _compare_exists(fence)],
            success=[_put_op(key.encode(), value, NO_LEASE)],
            budget_s=timeout_s,
            repeat=True,
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
            compare=[_compare_create(raw_key, create_revision), _compare_exists(raw_key)],
            success=[rpc.RequestOp(request_delete_range=rpc.DeleteRangeRequest(key=raw_key))],
            budget_s=timeout_s,
        )
        return succeeded

    # -- watches ----------------------------------------------------------------------------

    async def watch_prefix(self, prefix: str, *, start_revision: int) -> AsyncIterator[WatchEvent]:
        start, end = _prefix_range(prefix)
        next_revision = start_revision + 1
        must_reset = False
        failures = 0
        while not self._closed:
            if must_reset:
                try:
                    listing, revision = await self.get_prefix(prefix)
                except StoreUnavailable as e:
                    failures += 1
                    logger.warning("watch of %s cannot list the prefix yet: %s", prefix, e)
                    await self._backoff(failures)
                    continue
                must_reset = False
                next_revision = revision + 1
                yield WatchEvent(EventKind.RESET, "", None, revision, tuple(listing))
                continue
            conn = self._current()
            await conn.client.connect()  # creates the channel; no network round trip
            call = rpc.WatchStub(conn.client.channel).Watch(metadata=conn.client.metadata)
            self._watch_calls.add(call)
            try:
                await self._open_watch(call, start, end, next_revision)
                failures = 0
                while True:
                    response = await _read_or_end(call)
                    if response is None:
                        if self._closed:
                            return
                        raise StoreUnavailable("etcd ended the watch stream")
                    if response.canceled:
                        raise _WatchCanceled(response.compact_revision, response.cancel_reason)
                    if not response.events:
                        # A progress notification: nothing up to this revision is pending.
                        next_revision = max(next_revision, int(response.header.revision) + 1)
                        continue
                    for raw in response.events:
                        event = _event(raw)
                        next_revision = event.revision + 1
                        yield event
            except _WatchCanceled as e:
                if e.compact_revision > 0:
                    logger.warning(
                        "watch of %s resets: revision %d was compacted (etcd keeps %d and up)",
                        prefix,
                        next_revision,
                        e.compact_revision,
                    )
                    must_reset = True
                else:
                    failures += 1
                    logger.warning("etcd cancelled the watch of %s: %s", prefix, e.reason)
                    await self._backoff(failures)
            except (*_TRANSLATED, StoreUnavailable) as e:
                if self._closed:
                    return
                failures += 1
                if not isinstance(e, StoreUnavailable):
                    self._failed(conn, e)
                logger.warning(
                    "watch of %s lost its stream at %s (%s); resuming from revision %d, attempt %d",
                    prefix,
                    conn.endpoint,
                    _details_of(e),
                    next_revision,
                    failures,
                )
                await self._backoff(failures)
            finally:
                self._watch_calls.discard(call)
                call.cancel()

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._closed_event.set()
        for call in list(self._watch_calls):
            call.cancel()
        for task in list(self._retiring):
            task.cancel()
        await asyncio.gather(*self._retiring, return_exceptions=True)
        if self._conn is not None:
            await _close_client(self._conn)
            self._conn = None

    # -- internals --------------------------------------------------------------------------

    def _open(self, index: int) -> _Conn:
        host, port = self._addresses[index]
        client = aetcd.Client(
            host=host,
            port=port,
            timeout=self.rpc_timeout_s,
            options=_channel_options(self.rpc_timeout_s),
        )
        # aetcd sends ``client.metadata`` with every call; it sets it only for
        # authentication, which this store does not use.
        client.metadata = _REQUIRE_LEADER
        return _Conn(client, self.endpoints[index], index)

    def _current(self) -> _Conn:
        if self._closed or self._conn is None:
            raise StoreUnavailable("the etcd store is closed")
        return self._conn

    async def _call(
        self,
        what: str,
        op: Callable[[Any, float], Awaitable[T]],
        *,
        idempotent: bool = False,
        budget_s: float | None = None,
        repeat: bool = False,
    ) -> T:
        """Runs one etcd call, translating its failure. ``op(client, seconds)`` sends it
        with that gRPC deadline.

        The call has one deadline, ``budget_s`` (default ``rpc_timeout_s``). An
        idempotent call (a read, a keepalive, a revoke) that fails because its endpoint
        failed is tried on the next endpoint within it; any other call raises at once,
        whatever it may have done.

        A ``repeat`` call (a write that may be sent twice: the same value under the same
        fence) is sent again after every failure of its endpoint until the budget is
        spent, pausing 50 ms to 1 s between attempts. With several endpoints
        one attempt takes at most half of what is left (never less than
        ``rpc_timeout_s``), so a member that stopped answering is left while there is
        time to try another.
        """
        loop = asyncio.get_running_loop()
        total = self.rpc_timeout_s if budget_s is None else budget_s
        deadline = loop.time() + total
        conn = self._current()
        attempt = 0
        while True:
            attempt += 1
            conn = self._current()
            left = deadline - loop.time()
            cap = left
            if repeat and len(self.endpoints) > 1:
                cap = min(left, max(self.rpc_timeout_s, left / 2))
            try:
                async with asyncio.timeout(cap):
                    await conn.client.connect()
                    return await op(conn.client, cap)
            except _TRANSLATED as e:
                translation = _translate(e)
                failover = translation is not None and translation.failover
                left = deadline - loop.time()
                if repeat:
                    again = failover and left > _MIN_ATTEMPT_S
                else:
                    again = idempotent and failover and attempt < len(self.endpoints) and left > 0
                if not again:
                    raise self._failed(conn, e, what) from e
                logger.info(
                    "%s at %s failed (%s); attempt %d, %.2fs left",
                    what,
                    conn.endpoint,
                    _details_of(e),
                    attempt,
                    left,
                )
                self._failed(conn, e, what)
            if repeat:
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(max(0.0, deadline - loop.time() - _MIN_ATTEMPT_S)):
                        await self._backoff(attempt)

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
        (default ``rpc_timeout_s``); sent again only if ``repeat`` (see ``_call``)."""
        request = rpc.TxnRequest(compare=compare, success=success, failure=[])

        async def send(client: Any, timeout_s: float) -> Any:
            return await client.kvstub.Txn(request, timeout=timeout_s, metadata=client.metadata)

        response = await self._call(what, send, budget_s=budget_s, repeat=repeat)
        return bool(response.succeeded), int(response.header.revision)

    def _failed(self, conn: _Conn, e: BaseException, what: str = "watch") -> Exception:
        """The project exception for ``e``; moves to the next endpoint if this one failed."""
        translation = _translate(e) or _Translation(StoreUnavailable, "etcd failed the call")
        if translation.failover:
            self._failover(conn)
        return translation.error(
            f"{what} at {conn.endpoint}: {translation.reason}: {_details_of(e)}"
        )

    def _failover(self, failed: _Conn) -> None:
        if len(self.endpoints) == 1 or self._closed or self._conn is not failed:
            return
        self._conn = self._open((failed.index + 1) % len(self.endpoints))
        logger.warning(
            "etcd endpoint %s failed; the next calls go to %s",
            failed.endpoint,
            self._conn.endpoint,
        )
        # Calls still running on the old channel get their own deadline to finish.
        task = asyncio.create_task(
            _close_client(failed, after_s=self.rpc_timeout_s), name=f"retire {failed.endpoint}"
        )
        self._retiring.add(task)
        task.add_done_callback(self._retiring.discard)

    async def _open_watch(self, call: Any, start: bytes, end: bytes, revision: int) -> None:
        create = rpc.WatchCreateRequest(
            key=start, range_end=end, start_revision=revision, progress_notify=True
        )
        async with asyncio.timeout(self.rpc_timeout_s):
            await call.write(rpc.WatchRequest(create_request=create))
            response = await call.read()
        if response is grpc.aio.EOF:
            raise StoreUnavailable("etcd ended the watch stream before creating the watch")
        if response.canceled or not response.created:
            raise _WatchCanceled(response.compact_revision, response.cancel_reason)

    async def _backoff(self, attempt: int) -> None:
        delay = min(_WATCH_BACKOFF_MAX_S, _WATCH_BACKOFF_MIN_S * 2 ** min(attempt - 1, 10))
        delay *= random.uniform(0.5, 1.0)
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(delay):
                await self._closed_event.wait()


class _WatchCanceled(Exception):
    def __init__(self, compact_revision: int, reason: str) -> None:
        super().__init__(reason or f"compacted at {compact_revision}")
        self.compact_revision = int(compact_revision)
        self.reason = str(reason)


async def _read_or_end(call: Any) -> Any:
    """The next watch response, or None when the stream ended or the store closed it."""
    try:
        response = await call.read()
    except asyncio.CancelledError:
        task = asyncio.current_task()
        if task is not None and task.cancelling() == 0 and call.cancelled():
            # The call was cancelled under us (store closed, channel retired), not the task.
            return None
        raise
    return None if response is grpc.aio.EOF else response


async def _close_client(conn: _Conn, *, after_s: float = 0.0) -> None:
    if after_s > 0:
        await asyncio.sleep(after_s)
    try:
        await conn.client.close()
    except _TRANSLATED as e:
        logger.debug("closing the etcd client of %s: %s", conn.endpoint, e)


# -- conversions ------------------------------------------------------------------------------


def _prefix_range(prefix: str) -> tuple[bytes, bytes]:
    if not prefix:
        return b"\0", b"\0"  # etcd's spelling of "every key"
    start = prefix.encode()
    return start, utils.prefix_range_end(start)


def _kv(raw: Any) -> KeyValue:
    return KeyValue(
        bytes(raw.key).decode(),
        bytes(raw.value),
        int(raw.create_revision),
        int(raw.mod_revision),
        LeaseId(int(raw.lease)),
    )


def _event(raw: Any) -> WatchEvent:
    key = bytes(raw.kv.key).decode()
    revision = int(raw.kv.mod_revision)
    if raw.type == rpc.Event.DELETE:
        return WatchEvent(EventKind.DELETE, key, None, revision)
    return WatchEvent(EventKind.PUT, key, _kv(raw.kv), revision)


def _compare_create(key: bytes, revision: int) -> Any:
    return rpc.Compare(
        key=key,
        target=rpc.Compare.CREATE,
        result=rpc.Compare.EQUAL,
        create_revision=revision,
    )


def _compare_exists(key: bytes) -> Any:
    # create_revision == r alone also holds for an absent key when r == 0.
    return rpc.Compare(key=key, target=rpc.Compare.VERSION, result=rpc.Compare.GREATER, version=0)


def _put_op(key: bytes, value: bytes, lease: LeaseId) -> Any:
    return rpc.RequestOp(request_put=rpc.PutRequest(key=key, value=value, lease=int(lease)))
