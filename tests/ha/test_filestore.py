"""The embedded store's own rules: log, compaction, torn records, one writer, and the
watch history it keeps."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import threading
import zlib
from pathlib import Path

import pytest

from ha.store import file as filestore
from ha.store.contract import NO_LEASE, EventKind, KeyValue, Put, StoreUnavailable
from ha.store.file import FileStore
from ha.store.memory import MemoryStore

pytestmark = pytest.mark.timeout(20)


async def test_writes_survive_a_crash_through_the_log(tmp_path: Path) -> None:
    store = FileStore(tmp_path)
    for i in range(10):
        await store.put(f"/k/{i % 3}", str(i).encode())
    revision = (await store.get_prefix("/k/"))[1]
    # No close: a crash. The lock goes with the process; here we drop it by hand.
    os.close(store._lock_fd)
    again = FileStore(tmp_path)
    try:
        kvs, _ = await again.get_prefix("/k/")
        assert [kv.value for kv in kvs] == [b"9", b"7", b"8"]
        assert again._revision > revision  # epochs keep growing across restarts
    finally:
        await again.close()


async def test_a_torn_last_record_is_ignored(tmp_path: Path) -> None:
    store = FileStore(tmp_path)
    await store.put("/a", b"1")
    await store.close()
    with (tmp_path / FileStore.LOG_NAMES[0]).open("ab") as log:
        log.write(b'{"r":99,"k":"/a","v":"Mg')  # a crash in the middle of an append
    again = FileStore(tmp_path)
    try:
        kv = await again.get("/a")
        assert kv is not None and kv.value == b"1"
    finally:
        await again.close()


async def test_the_log_is_compacted_in_the_background_and_nothing_is_lost(
    tmp_path: Path,
) -> None:
    store = FileStore(tmp_path)
    store.COMPACT_BYTES = 200  # a switch of logs every few writes
    for i in range(40):
        await store.put(f"/x/{i % 4}", str(i).encode(), lease=NO_LEASE)
        if i == 20:
            # A crash would stop a compaction in flight; here its thread would go on
            # changing the files while they are read: let it end first.
            if store._compaction is not None:
                await store._compaction
            os.close(store._lock_fd)  # a crash in the middle: no close, no final compaction
            crashed = FileStore(tmp_path, read_only=True)
            kvs, _ = await crashed.get_prefix("/x/")
            assert [kv.value for kv in kvs] == [b"20", b"17", b"18", b"19"]
            await crashed.close()
            store._lock_fd = os.open(tmp_path / "lock", os.O_RDWR)
    # The last compaction runs on a thread; under load it may not have emptied its log
    # yet (and the active one grows past the threshold meanwhile): wait for it.
    if store._compaction is not None:
        await store._compaction
    sizes = [(tmp_path / name).stat().st_size for name in FileStore.LOG_NAMES]
    assert min(sizes) < 200 * 2  # one log was emptied by a compaction
    await store.close()
    again = FileStore(tmp_path, read_only=True)
    kvs, _ = await again.get_prefix("/x/")
    assert [kv.value for kv in kvs] == [b"36", b"37", b"38", b"39"]
    await again.close()


async def test_two_writers_on_one_state_dir_are_refused(tmp_path: Path) -> None:
    store = FileStore(tmp_path)
    try:
        with pytest.raises(StoreUnavailable, match="in use by another process"):
            FileStore(tmp_path)
        reader = FileStore(tmp_path, read_only=True)
        with pytest.raises(StoreUnavailable):
            await reader.put("/y", b"1")
        await reader.close()
    finally:
        await store.close()


async def test_watch_history_is_bounded_and_an_older_start_gets_a_reset() -> None:
    store = MemoryStore()
    try:
        start = (await store.get_prefix("/s/"))[1]
        big = b"x" * (1024 * 1024)
        for i in range(8):  # 8 MiB of values: more than the history keeps
            await store.put("/s/state", big + str(i).encode())
        assert len(store._history) < 8
        events = store.watch_prefix("/s/", start_revision=start)
        first = await asyncio.wait_for(anext(events), 5)
        assert first.kind is EventKind.RESET
        assert [kv.value[-1:] for kv in first.snapshot] == [b"7"]
        await events.aclose()  # type: ignore[attr-defined]

        recent = (await store.get_prefix("/s/"))[1]
        await store.put("/s/state", b"small")
        events = store.watch_prefix("/s/", start_revision=recent)
        event = await asyncio.wait_for(anext(events), 5)
        assert (event.kind, event.revision) == (EventKind.PUT, recent + 1)
        await events.aclose()  # type: ignore[attr-defined]
    finally:
        await store.close()


async def test_after_a_slow_append_appends_move_to_a_thread(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    real = filestore._append
    threads: list[int] = []
    # The store times its appends with time.monotonic. The disk's speed is the test's to
    # say, not the machine's: this clock moves only when an append says it stalled, so a
    # real fsync slowed by a busy machine cannot look like the stall.
    now = [0.0]

    class DiskClock:
        @staticmethod
        def monotonic() -> float:
            return now[0]

    def append(fd: int, data: bytes, size: int) -> None:
        threads.append(threading.get_ident())
        if len(threads) == 2:
            now[0] += FileStore.SLOW_APPEND_S * 2  # a stalling disk
        real(fd, data, size)

    monkeypatch.setattr(filestore, "time", DiskClock)
    monkeypatch.setattr(filestore, "_append", append)
    store = FileStore(tmp_path)
    try:
        for i in range(4):
            await store.put("/k", str(i).encode())
        loop = threading.get_ident()
        assert threads[:2] == [loop, loop]  # fast: on the event loop
        assert loop not in threads[2:]  # after the slow one: on a thread
        assert "appending on a thread" in caplog.text
        kv = await store.get("/k")
        assert kv is not None and kv.value == b"3"
    finally:
        await store.close()


@pytest.mark.parametrize(
    "changes",
    [
        [],
        [("/fairshare/pools/p/log/7", KeyValue("/fairshare/pools/p/log/7", b"{}", 3, 9))],
        [('/q"\\/é\u2028\x00😀', KeyValue('/q"\\/é\u2028\x00😀', bytes(range(256)), 1, 9))],
        [("/gone", None), ("/kept", KeyValue("/kept", b"", 9, 9))],
    ],
)
def test_a_log_line_is_its_record_as_compact_json_behind_its_checksum(
    changes: list[tuple[str, KeyValue | None]],
) -> None:
    # The lines are built without json.dumps; readers decode them with json.loads.
    record: dict[str, object] = {"r": 9}
    if changes:
        record["w"] = [
            [key, None, 0]
            if kv is None
            else [key, base64.b64encode(kv.value).decode("ascii"), kv.create_revision]
            for key, kv in changes
        ]
    body = json.dumps(record, separators=(",", ":")).encode()
    assert filestore._record_line(9, changes) == b"%08x %s\n" % (zlib.crc32(body), body)


async def test_a_fenced_put_is_stored_and_watched_as_any_commit(tmp_path: Path) -> None:
    # A commit of one Put: the owner's record of its pool, the write of every decision.
    store = FileStore(tmp_path)
    lease = await store.grant_lease(30.0)
    owner = await store.create("/owner", b"me", lease=lease)
    assert owner is not None
    start = (await store.get_prefix("/log/"))[1]
    events = store.watch_prefix("/log/", start_revision=start)
    fence = {"fence_key": "/owner", "fence_revision": owner.create_revision}
    assert await store.commit_fenced([Put("/log/1", b"a")], **fence)
    assert await store.commit_fenced([Put("/log/1", b"b")], **fence)
    assert not await store.commit_fenced(
        [Put("/log/2", b"c")], fence_key="/owner", fence_revision=owner.create_revision + 1
    )
    first, second = [await anext(events), await anext(events)]
    assert (first.kind, first.kv and first.kv.value) == (EventKind.PUT, b"a")
    assert second.kv is not None and second.kv.value == b"b"
    assert second.kv.create_revision == first.revision < second.revision
    assert second.kv.mod_revision == second.revision == (await store.get_prefix("/"))[1]
    await events.aclose()
    await store.close()
    again = FileStore(tmp_path)
    try:
        kv = await again.get("/log/1")
        assert kv is not None and (kv.value, kv.create_revision) == (b"b", first.revision)
        assert await again.get("/log/2") is None
    finally:
        await again.close()
