"""The store contract (``ha.store.contract``), one suite run on every store.

The in-memory store runs on a fake clock; the file store on the real clock in a
temporary dir; the etcd store against the real etcd of the ``etcd_server`` fixture
(those cases are marked ``etcd``). Each case works under its own key prefix and leaves
it empty.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from store_contract import (
    REAL_WAIT_S,
    StoreHarness,
    etcd_harness,
    file_harness,
    memory_harness,
    next_event,
)

from ha.store.contract import (
    DeleteRange,
    EventKind,
    LeaseId,
    LeaseNotFound,
    Put,
    StoreUnavailable,
    WatchEvent,
)

pytestmark = pytest.mark.timeout(30)


@pytest.fixture(
    params=[
        pytest.param("memory", id="memory"),
        pytest.param("file", id="file"),
        pytest.param("etcd", id="etcd", marks=pytest.mark.etcd),
    ]
)
async def h(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[StoreHarness]:
    if request.param == "memory":
        harness = await memory_harness()
    elif request.param == "file":
        harness = await file_harness(tmp_path / "state")
    else:
        harness = await etcd_harness(request.getfixturevalue("etcd_endpoints"))
    try:
        yield harness
    finally:
        await harness.finish()


@contextlib.asynccontextmanager
async def watching(
    h: StoreHarness, *, start_revision: int
) -> AsyncIterator[AsyncIterator[WatchEvent]]:
    events = h.store.watch_prefix(h.prefix, start_revision=start_revision)
    try:
        yield events
    finally:
        await events.aclose()  # type: ignore[attr-defined]


async def revision(h: StoreHarness) -> int:
    _, rev = await h.store.get_prefix(h.prefix)
    return rev


async def test_every_write_increments_the_revision_by_one(h: StoreHarness) -> None:
    lease = await h.grant(30)
    start = await revision(h)
    assert await h.store.put(h.key("a"), b"1") == start + 1
    assert await h.store.put(h.key("a"), b"2") == start + 2
    owner = await h.store.create(h.key("owner"), b"me", lease=lease)
    assert owner is not None and owner.create_revision == start + 3
    assert await h.store.put_fenced(
        h.key("state"), b"s", fence_key=owner.key, fence_revision=owner.create_revision
    )
    assert await revision(h) == start + 4
    assert await h.store.delete_fenced(owner.key, create_revision=owner.create_revision)
    assert await revision(h) == start + 5


async def test_create_succeeds_once_and_names_the_epoch(h: StoreHarness) -> None:
    lease = await h.grant(30)
    key = h.key("owner")
    assert await h.store.get(key) is None
    created = await h.store.create(key, b"node-a", lease=lease)
    assert created is not None
    assert created.key == key and created.value == b"node-a" and created.lease == lease
    assert created.create_revision == created.mod_revision == await revision(h)
    assert await h.store.get(key) == created

    assert await h.store.create(key, b"node-b", lease=lease) is None
    assert await h.store.get(key) == created


async def test_epoch_grows_when_the_key_is_deleted_and_created_again(h: StoreHarness) -> None:
    lease = await h.grant(30)
    key = h.key("owner")
    first = await h.store.create(key, b"node-a", lease=lease)
    assert first is not None
    assert await h.store.delete_fenced(key, create_revision=first.create_revision)
    second = await h.store.create(key, b"node-b", lease=lease)
    assert second is not None
    assert second.create_revision > first.create_revision
    # The deposed epoch can no longer delete its successor's key.
    assert not await h.store.delete_fenced(key, create_revision=first.create_revision)
    assert await h.store.get(key) == second


async def test_put_fenced_writes_only_under_the_right_fence(h: StoreHarness) -> None:
    lease = await h.grant(30)
    owner = await h.store.create(h.key("owner"), b"node-a", lease=lease)
    assert owner is not None
    state = h.key("state")

    assert await h.store.put_fenced(
        state, b"v1", fence_key=owner.key, fence_revision=owner.create_revision
    )
    wrong = owner.create_revision + 1
    assert not await h.store.put_fenced(state, b"v2", fence_key=owner.key, fence_revision=wrong)
    absent = h.key("nobody")
    for fence_revision in (owner.create_revision, 0):
        assert not await h.store.put_fenced(
            state, b"v3", fence_key=absent, fence_revision=fence_revision
        )
    kv = await h.store.get(state)
    assert kv is not None and kv.value == b"v1" and kv.lease == 0


async def test_commit_fenced_applies_puts_and_range_deletes_at_one_revision(
    h: StoreHarness,
) -> None:
    lease = await h.grant(30)
    owner = await h.store.create(h.key("owner"), b"node-a", lease=lease)
    assert owner is not None
    for i in range(4):
        assert await h.store.commit_fenced(
            [Put(h.key(f"log/{i:02d}"), b"r%d" % i)],
            fence_key=owner.key,
            fence_revision=owner.create_revision,
        )
    _, before = await h.store.get_prefix(h.prefix)
    assert await h.store.commit_fenced(
        [Put(h.key("head"), b"h"), DeleteRange(h.key("log/"), h.key("log/03"))],
        fence_key=owner.key,
        fence_revision=owner.create_revision,
    )
    kvs, after = await h.store.get_prefix(h.prefix)
    assert after == before + 1  # one transaction, one revision
    assert [(kv.key, kv.value) for kv in kvs] == [
        (h.key("head"), b"h"),
        (h.key("log/03"), b"r3"),
        (h.key("owner"), b"node-a"),
    ]
    assert next(kv for kv in kvs if kv.key == h.key("head")).mod_revision == after


async def test_commit_fenced_writes_nothing_under_another_fence(h: StoreHarness) -> None:
    lease = await h.grant(30)
    owner = await h.store.create(h.key("owner"), b"node-a", lease=lease)
    assert owner is not None
    assert await h.store.commit_fenced(
        [Put(h.key("log/1"), b"r")], fence_key=owner.key, fence_revision=owner.create_revision
    )
    for fence_key, revision in (
        (owner.key, owner.create_revision + 1),
        (h.key("nobody"), owner.create_revision),
        (h.key("nobody"), 0),
    ):
        assert not await h.store.commit_fenced(
            [Put(h.key("head"), b"h"), DeleteRange(h.key("log/"), h.key("log0"))],
            fence_key=fence_key,
            fence_revision=revision,
        )
    kvs, _ = await h.store.get_prefix(h.key("log/"))
    assert [kv.value for kv in kvs] == [b"r"]
    assert await h.store.get(h.key("head")) is None


async def test_delete_fenced_deletes_only_the_named_generation(h: StoreHarness) -> None:
    lease = await h.grant(30)
    owner = await h.store.create(h.key("owner"), b"node-a", lease=lease)
    assert owner is not None
    assert not await h.store.delete_fenced(owner.key, create_revision=owner.create_revision + 1)
    assert await h.store.get(owner.key) == owner
    assert not await h.store.delete_fenced(h.key("absent"), create_revision=0)
    assert await h.store.delete_fenced(owner.key, create_revision=owner.create_revision)
    assert await h.store.get(owner.key) is None
    assert not await h.store.delete_fenced(owner.key, create_revision=owner.create_revision)


async def test_an_expired_lease_deletes_its_keys_and_watches_see_it(h: StoreHarness) -> None:
    lease = await h.grant()
    owner = await h.store.create(h.key("owner"), b"node-a", lease=lease)
    assert owner is not None
    async with watching(h, start_revision=owner.mod_revision) as events:
        await h.expire(h.short_ttl_s)
        event = await next_event(events, REAL_WAIT_S)
    assert (event.kind, event.key) == (EventKind.DELETE, owner.key)
    assert event.revision > owner.mod_revision
    assert await h.store.get(owner.key) is None
    with pytest.raises(LeaseNotFound):
        await h.store.keepalive(lease)


async def test_keepalive_keeps_a_lease_alive_beyond_its_ttl(h: StoreHarness) -> None:
    lease = await h.grant()
    owner = await h.store.create(h.key("owner"), b"node-a", lease=lease)
    assert owner is not None
    for _ in range(9):  # three TTLs
        await h.pass_time(h.short_ttl_s / 3)
        assert await h.store.keepalive(lease) >= h.short_ttl_s
    assert await h.store.get(owner.key) == owner


async def test_a_revoked_lease_is_gone_with_its_keys(h: StoreHarness) -> None:
    lease = await h.grant(30)
    owner = await h.store.create(h.key("owner"), b"node-a", lease=lease)
    assert owner is not None
    await h.store.revoke(lease)
    assert await h.store.get(owner.key) is None
    with pytest.raises(LeaseNotFound):
        await h.store.keepalive(lease)
    await h.store.revoke(lease)  # revoking a gone lease is not an error


async def test_writes_on_a_dead_lease_raise_lease_not_found(h: StoreHarness) -> None:
    lease = await h.grant(30)
    await h.store.revoke(lease)
    before = await revision(h)
    with pytest.raises(LeaseNotFound):
        await h.store.put(h.key("member"), b"x", lease=lease)
    with pytest.raises(LeaseNotFound):
        await h.store.create(h.key("owner"), b"x", lease=lease)
    never = LeaseId(0x7EADBEEF)
    with pytest.raises(LeaseNotFound):
        await h.store.put(h.key("member"), b"x", lease=never)
    assert await revision(h) == before
    assert await h.store.get(h.key("member")) is None


async def test_get_prefix_is_sorted_by_key_with_the_read_revision(h: StoreHarness) -> None:
    for name in ("list/b", "list/a", "list/c/1", "listx", "list/"):
        last = await h.store.put(h.key(name), name.encode())
    listing, rev = await h.store.get_prefix(h.key("list/"))
    assert [kv.key for kv in listing] == [
        h.key(n) for n in ("list/", "list/a", "list/b", "list/c/1")
    ]
    assert [kv.value for kv in listing] == [b"list/", b"list/a", b"list/b", b"list/c/1"]
    assert rev == last
    assert await h.store.get_prefix(h.key("nothing/")) == ([], last)


async def test_a_watch_from_an_older_revision_replays_changes_in_order(h: StoreHarness) -> None:
    lease = await h.grant(30)
    start = await revision(h)
    a = await h.store.create(h.key("a"), b"1", lease=lease)
    assert a is not None
    await h.store.put(h.key("b"), b"2")
    await h.store.put(h.key("a"), b"3", lease=lease)
    assert await h.store.delete_fenced(h.key("a"), create_revision=a.create_revision)
    await h.store.put("/outside-the-prefix-" + h.prefix.strip("/"), b"x")
    try:
        async with watching(h, start_revision=start) as events:
            seen = [await next_event(events) for _ in range(4)]
            live = await h.store.put(h.key("c"), b"4")
            tail = await next_event(events)
    finally:
        outside = await h.store.get("/outside-the-prefix-" + h.prefix.strip("/"))
        if outside is not None:
            await h.store.delete_fenced(outside.key, create_revision=outside.create_revision)
    assert [(e.kind, e.key, e.revision) for e in seen] == [
        (EventKind.PUT, h.key("a"), start + 1),
        (EventKind.PUT, h.key("b"), start + 2),
        (EventKind.PUT, h.key("a"), start + 3),
        (EventKind.DELETE, h.key("a"), start + 4),
    ]
    assert seen[0].kv is not None and seen[0].kv.value == b"1"
    assert seen[2].kv is not None and seen[2].kv.create_revision == start + 1
    assert seen[3].kv is None
    assert (tail.kind, tail.key, tail.revision) == (EventKind.PUT, h.key("c"), live)


async def test_a_watch_ends_when_the_store_is_closed(h: StoreHarness) -> None:
    events = h.store.watch_prefix(h.prefix, start_revision=await revision(h))
    waiter = asyncio.ensure_future(anext(events))
    await asyncio.sleep(0.05)
    await h.close()
    async with asyncio.timeout(REAL_WAIT_S):
        with pytest.raises(StopAsyncIteration):
            await waiter


async def test_fenced_writes_take_the_callers_budget(h: StoreHarness) -> None:
    lease = await h.grant(30)
    owner = await h.store.create(h.key("owner"), b"node-a", lease=lease)
    assert owner is not None
    state, epoch = h.key("state"), owner.create_revision

    assert await h.store.put_fenced(
        state, b"v1", fence_key=owner.key, fence_revision=epoch, timeout_s=3.0
    )
    assert not await h.store.put_fenced(
        state, b"v2", fence_key=owner.key, fence_revision=epoch + 1, timeout_s=3.0
    )
    kv = await h.store.get(state)
    assert kv is not None and kv.value == b"v1"
    assert not await h.store.delete_fenced(
        state, create_revision=kv.create_revision + 1, timeout_s=3.0
    )
    assert await h.store.delete_fenced(state, create_revision=kv.create_revision, timeout_s=3.0)
    if h.kind == "etcd":
        return  # a stalled etcd is tested for real in tests/integration/test_etcd_store.py

    # A store busy beyond the budget answers StoreUnavailable at the budget, not later.
    busy: asyncio.Lock = h.store._lock  # type: ignore[attr-defined]
    async with busy:
        with pytest.raises(StoreUnavailable, match=r"within 0\.05s"):
            await h.store.put_fenced(
                state, b"v3", fence_key=owner.key, fence_revision=epoch, timeout_s=0.05
            )
        with pytest.raises(StoreUnavailable, match=r"within 0\.05s"):
            await h.store.delete_fenced(owner.key, create_revision=epoch, timeout_s=0.05)
    assert await h.store.get(state) is None
    assert await h.store.get(owner.key) == owner
