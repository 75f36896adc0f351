"""The embedded store's own durability rules: log, compaction, torn records, one writer."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from ha.memstore import FileStore
from ha.store import NO_LEASE, StoreUnavailable

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
    with (tmp_path / FileStore.LOG_NAME).open("ab") as log:
        log.write(b'{"r":99,"k":"/a","v":"Mg')  # a crash in the middle of an append
    again = FileStore(tmp_path)
    try:
        kv = await again.get("/a")
        assert kv is not None and kv.value == b"1"
    finally:
        await again.close()


async def test_the_log_is_compacted_into_the_state_file(tmp_path: Path) -> None:
    store = FileStore(tmp_path)
    store.COMPACT_AFTER = 5
    for i in range(12):
        await store.put("/x", str(i).encode(), lease=NO_LEASE)
    assert store._records < 5
    await store.close()
    again = FileStore(tmp_path, read_only=True)
    kv = await again.get("/x")
    assert kv is not None and kv.value == b"11"
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
