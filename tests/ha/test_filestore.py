"""The embedded store's own rules: log, compaction, torn records, one writer, and the
watch history it keeps."""

from __future__ import annotations

import asyncio
import os
import threading
from pathlib import Path

import pytest

from ha.store import file as filestore
from ha.store.contract import NO_LEASE, EventKind, StoreUnavailable
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
