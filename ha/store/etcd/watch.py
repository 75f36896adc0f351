"""A watch of a key prefix that follows the connection from member to member.

Guarantees: a watch resumes by itself after its stream is lost (member restarted or cut
off from its quorum, connection reset, keepalive ping unanswered, etcd cancelled it): it
watches again, on the connection's current member, from the revision after the last
event it delivered (progress notifications move that revision forward too), so etcd
replays what was missed, in order. Only when that revision has been compacted does it
emit a ``RESET`` with the prefix as listed at a fresh revision, then continue from there.
Resumes back off from 50 ms to 1 s. The iterator ends when the consumer closes it or the
connection is closed.

Non-guarantees: a stream lost by a cause that is not an etcd failure (a bug) ends the
iterator with that exception.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

import grpc
from aetcd import rpc

from ha.store.contract import EventKind, KeyValue, StoreUnavailable, WatchEvent
from ha.store.etcd.connection import Connection, EndpointClient
from ha.store.etcd.errors import TRANSLATED, details_of, translate_reason
from ha.store.etcd.messages import event_of, prefix_range

__all__ = ["ListPrefix", "watch_prefix"]

logger = logging.getLogger(__name__)

ListPrefix = Callable[[str], Awaitable[tuple[list[KeyValue], int]]]
"""Lists a prefix and the revision it was read at (``Store.get_prefix``)."""


@dataclass(slots=True)
class _Progress:
    """Where one watch stands: what to ask etcd for when it opens its next stream."""

    next_revision: int
    failures: int = 0
    must_reset: bool = False


class _WatchCanceled(Exception):
    def __init__(self, compact_revision: int, reason: str) -> None:
        super().__init__(reason or f"compacted at {compact_revision}")
        self.compact_revision = int(compact_revision)
        self.reason = str(reason)


async def watch_prefix(
    connection: Connection, list_prefix: ListPrefix, prefix: str, *, start_revision: int
) -> AsyncIterator[WatchEvent]:
    """The events under ``prefix`` after ``start_revision``, as ``Store.watch_prefix``.

    ``list_prefix`` reads the prefix for a ``RESET`` (through the connection's failover).
    """
    start, end = prefix_range(prefix)
    progress = _Progress(next_revision=start_revision + 1)
    while not connection.closed:
        if progress.must_reset:
            reset = await _list_for_reset(connection, list_prefix, prefix, progress)
            if reset is not None:
                yield reset
            continue
        used = connection.current()
        call: Any = None
        sent: Any = None
        try:
            # Creates the channel (and, with a username, the auth token) on first use.
            async with asyncio.timeout(connection.rpc_timeout_s):
                await used.client.connect()
            sent = used.client.metadata
            call = rpc.WatchStub(used.client.channel).Watch(metadata=sent)
            connection.track(call)
            await _create(connection, call, start, end, progress.next_revision)
            progress.failures = 0
            while (raw_events := await _next_events(connection, call, progress)) is not None:
                for raw in raw_events:
                    event = event_of(raw)
                    progress.next_revision = event.revision + 1
                    yield event
            return  # the connection closed the stream
        except _WatchCanceled as e:
            refused = translate_reason(e.reason)
            if connection.reauthenticates(refused):
                # An expired token: etcd creates the watch only to cancel it.
                with contextlib.suppress(StoreUnavailable):
                    await connection.reauthenticate(used, sent, "watch", connection.rpc_timeout_s)
            await _canceled(connection, prefix, progress, e)
        except (*TRANSLATED, StoreUnavailable) as e:
            if connection.closed:
                return
            await _lost(connection, used, prefix, progress, e)
        finally:
            if call is not None:
                connection.untrack(call)
                call.cancel()


async def _list_for_reset(
    connection: Connection, list_prefix: ListPrefix, prefix: str, progress: _Progress
) -> WatchEvent | None:
    """The ``RESET`` after a compaction, or None (after a backoff) when etcd cannot list."""
    try:
        listing, revision = await list_prefix(prefix)
    except StoreUnavailable as e:
        progress.failures += 1
        logger.warning("watch of %s cannot list the prefix yet: %s", prefix, e)
        await connection.backoff(progress.failures)
        return None
    progress.must_reset = False
    progress.next_revision = revision + 1
    return WatchEvent(EventKind.RESET, "", None, revision, tuple(listing))


async def _create(
    connection: Connection, call: Any, start: bytes, end: bytes, revision: int
) -> None:
    """Asks etcd to watch ``[start, end)`` from ``revision`` on the stream ``call``."""
    create = rpc.WatchCreateRequest(
        key=start, range_end=end, start_revision=revision, progress_notify=True
    )
    async with asyncio.timeout(connection.rpc_timeout_s):
        await call.write(rpc.WatchRequest(create_request=create))
        response = await call.read()
    if response is grpc.aio.EOF:
        raise StoreUnavailable("etcd ended the watch stream before creating the watch")
    if response.canceled or not response.created:
        raise _WatchCanceled(response.compact_revision, response.cancel_reason)


async def _next_events(
    connection: Connection, call: Any, progress: _Progress
) -> Sequence[Any] | None:
    """The raw events of the stream's next response (none for a progress notification),
    or None when the connection was closed under the stream.

    Raises:
        StoreUnavailable: etcd ended the stream.
        _WatchCanceled: etcd cancelled the watch.
    """
    response = await _read_or_end(call)
    if response is None:
        if connection.closed:
            return None
        raise StoreUnavailable("etcd ended the watch stream")
    if response.canceled:
        raise _WatchCanceled(response.compact_revision, response.cancel_reason)
    if not response.events:
        # A progress notification: nothing up to this revision is pending.
        progress.next_revision = max(progress.next_revision, int(response.header.revision) + 1)
    events: Sequence[Any] = response.events
    return events


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


async def _canceled(
    connection: Connection, prefix: str, progress: _Progress, e: _WatchCanceled
) -> None:
    """etcd cancelled the watch: reset if its revision is compacted, else back off."""
    if e.compact_revision > 0:
        logger.warning(
            "watch of %s resets: revision %d was compacted (etcd keeps %d and up)",
            prefix,
            progress.next_revision,
            e.compact_revision,
        )
        progress.must_reset = True
        return
    progress.failures += 1
    logger.warning("etcd cancelled the watch of %s: %s", prefix, e.reason)
    await connection.backoff(progress.failures)


async def _lost(
    connection: Connection,
    used: EndpointClient,
    prefix: str,
    progress: _Progress,
    e: BaseException,
) -> None:
    """The stream on ``used`` failed: move off a failed member, then back off."""
    progress.failures += 1
    if not isinstance(e, StoreUnavailable):
        connection.failed(used, e)
    logger.warning(
        "watch of %s lost its stream at %s (%s); resuming from revision %d, attempt %d",
        prefix,
        used.endpoint,
        details_of(e),
        progress.next_revision,
        progress.failures,
    )
    await connection.backoff(progress.failures)
