"""The etcd store when its etcd goes away: restarted, stopped, paused.

Each test has a private etcd member (``etcd_disposable``) and one ``EtcdStore`` that
lives through the disruption: nothing is recreated by the test.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TypeVar

import pytest
from etcd_process import EtcdProcess, free_port

from ha.etcdstore import EtcdStore, connect
from ha.store import EventKind, StoreUnavailable, WatchEvent

pytestmark = [pytest.mark.etcd, pytest.mark.timeout(45)]

RPC_TIMEOUT_S = 1.0
PREFIX = "/fairshare-it/"
T = TypeVar("T")


@pytest.fixture
async def store(etcd_disposable: EtcdProcess) -> AsyncIterator[EtcdStore]:
    s = await connect(etcd_disposable.endpoints, rpc_timeout_s=RPC_TIMEOUT_S)
    try:
        yield s
    finally:
        await s.close()


async def until_available(op: Callable[[], Awaitable[T]], *, within_s: float = 10.0) -> T:
    """``op()`` retried on StoreUnavailable until it answers, with the last error on failure."""
    deadline = time.monotonic() + within_s
    while True:
        try:
            return await op()
        except StoreUnavailable as e:
            if time.monotonic() > deadline:
                raise AssertionError(f"store still unavailable after {within_s} s: {e}") from e
            await asyncio.sleep(0.1)


async def timed_failure(op: Callable[[], Awaitable[object]]) -> float:
    """Seconds until ``op()`` raised StoreUnavailable."""
    start = time.monotonic()
    with pytest.raises(StoreUnavailable):
        await op()
    return time.monotonic() - start


async def test_a_watch_resumes_after_etcd_restarts(
    etcd_disposable: EtcdProcess, store: EtcdStore, caplog: pytest.LogCaptureFixture
) -> None:
    before = await store.put(PREFIX + "a", b"1")
    events = store.watch_prefix(PREFIX, start_revision=before - 1)
    try:
        first = await asyncio.wait_for(anext(events), 5)
        assert (first.kind, first.key) == (EventKind.PUT, PREFIX + "a")
        waiting = asyncio.ensure_future(anext(events))

        await asyncio.to_thread(etcd_disposable.restart)

        written = await until_available(lambda: store.put(PREFIX + "b", b"2"))
        # Resumed either by a replay from the last delivered revision (what etcd allows
        # unless it compacted) or by a RESET listing; either way "b" must show up.
        event: WatchEvent = await asyncio.wait_for(waiting, 10)
        if event.kind is EventKind.RESET and PREFIX + "b" not in [k.key for k in event.snapshot]:
            event = await asyncio.wait_for(anext(events), 10)
        if event.kind is not EventKind.RESET:
            assert (event.kind, event.key, event.revision) == (EventKind.PUT, PREFIX + "b", written)
        assert "lost its stream" in caplog.text
        kv = await store.get(PREFIX + "b")
        assert kv is not None and kv.value == b"2"
    finally:
        await events.aclose()  # type: ignore[attr-defined]


async def test_a_call_while_etcd_is_stopped_fails_within_the_deadline(
    etcd_disposable: EtcdProcess, store: EtcdStore
) -> None:
    lease = await store.grant_lease(5)
    await asyncio.to_thread(etcd_disposable.stop)

    assert await timed_failure(lambda: store.get(PREFIX + "a")) < RPC_TIMEOUT_S + 0.5
    assert await timed_failure(lambda: store.keepalive(lease)) < RPC_TIMEOUT_S + 0.5
    assert (
        await timed_failure(lambda: store.create(PREFIX + "owner", b"x", lease=lease))
        < RPC_TIMEOUT_S + 0.5
    )

    await asyncio.to_thread(etcd_disposable.start)
    assert await until_available(lambda: store.keepalive(lease)) >= 5
    created = await store.create(PREFIX + "owner", b"x", lease=lease)
    assert created is not None
    await store.revoke(lease)


async def test_a_paused_etcd_fails_calls_at_the_deadline_and_serves_again_when_resumed(
    etcd_disposable: EtcdProcess, store: EtcdStore
) -> None:
    lease = await store.grant_lease(5)
    etcd_disposable.pause()
    try:
        took = await timed_failure(lambda: store.get(PREFIX + "a"))
        assert RPC_TIMEOUT_S - 0.1 < took < RPC_TIMEOUT_S + 0.5
        # A transaction without an answer has an unknown outcome: StoreUnavailable, and
        # the caller must read again rather than retry.
        took = await timed_failure(lambda: store.create(PREFIX + "owner", b"x", lease=lease))
        assert took < RPC_TIMEOUT_S + 0.5
    finally:
        etcd_disposable.resume()

    assert await until_available(lambda: store.keepalive(lease), within_s=5) >= 5
    owner = await store.get(PREFIX + "owner")  # created or not: either is a valid outcome
    if owner is None:
        owner = await store.create(PREFIX + "owner", b"x", lease=lease)
    assert owner is not None and owner.value == b"x"
    await store.revoke(lease)
    assert await store.get(PREFIX + "owner") is None


async def test_connect_fails_over_to_the_next_endpoint(etcd_disposable: EtcdProcess) -> None:
    dead = f"127.0.0.1:{free_port()}"
    store = await connect([dead, etcd_disposable.client_url], rpc_timeout_s=RPC_TIMEOUT_S)
    try:
        rev = await store.put(PREFIX + "x", b"1")
        listing, at = await store.get_prefix(PREFIX)
        assert [kv.key for kv in listing] == [PREFIX + "x"] and at == rev
    finally:
        await store.close()
    with pytest.raises(StoreUnavailable, match=dead):
        await connect([dead], rpc_timeout_s=RPC_TIMEOUT_S)
