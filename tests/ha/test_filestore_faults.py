"""The embedded store under a failing disk and damaged files: a refused write changes
nothing, a full disk is StoreFull, records are checked at load, old state dirs still load."""

from __future__ import annotations

import asyncio
import base64
import errno
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from ha.store import file as filestore
from ha.store.contract import NO_LEASE, EventKind, KeyValue, StoreFull, StoreUnavailable
from ha.store.file import FileStore

pytestmark = pytest.mark.timeout(20)

FIXTURES = Path(__file__).parent / "fixtures"


class Disk:
    """The store's writer with a switch: when full, it writes part of the record, then
    fails with ENOSPC, as a real disk that fills in the middle of an append does."""

    def __init__(self) -> None:
        self.full = False
        self.refused = 0
        self._real = filestore._write_all

    def write_all(self, fd: int, data: bytes) -> None:
        if self.full:
            self.refused += 1
            os.write(fd, data[: len(data) // 2])
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        self._real(fd, data)


@pytest.fixture
def disk(monkeypatch: pytest.MonkeyPatch) -> Iterator[Disk]:
    disk = Disk()
    monkeypatch.setattr(filestore, "_write_all", disk.write_all)
    yield disk


async def test_a_write_refused_for_lack_of_space_changes_nothing(
    tmp_path: Path, disk: Disk
) -> None:
    store = FileStore(tmp_path)
    try:
        await store.put("/s/state", b"before")
        await store.put("/s/gone", b"x")
        gone = await store.get("/s/gone")
        assert gone is not None
        keys, revision = await store.get_prefix("/s/")
        events = store.watch_prefix("/s/", start_revision=revision)

        disk.full = True
        with pytest.raises(StoreFull, match="no space left"):
            await store.put("/s/state", b"after")
        with pytest.raises(StoreFull):
            await store.delete_fenced("/s/gone", create_revision=gone.create_revision)
        assert disk.refused == 2
        assert await store.get_prefix("/s/") == (keys, revision)  # nothing changed

        disk.full = False  # space is back: the next write succeeds, no restart
        await store.put("/s/state", b"after")
        event = await asyncio.wait_for(anext(events), 5)
        assert (event.kind, event.revision) == (EventKind.PUT, revision + 1)  # no gap
        await events.aclose()  # type: ignore[attr-defined]
    finally:
        await store.close()
    # The half records the full disk took were cut off again: the log loads whole.
    again = FileStore(tmp_path, read_only=True)
    try:
        kvs, _ = await again.get_prefix("/s/")
        assert [(kv.key, kv.value) for kv in kvs] == [("/s/gone", b"x"), ("/s/state", b"after")]
    finally:
        await again.close()


async def test_keys_on_leases_expire_and_resign_on_a_full_disk(tmp_path: Path, disk: Disk) -> None:
    store = FileStore(tmp_path)
    try:
        lease = await store.grant_lease(5.0)
        owner = await store.create("/o/pool", b"me", lease=lease)
        assert owner is not None
        disk.full = True
        # An owner key was never on disk: letting go of it needs no space.
        assert await store.delete_fenced("/o/pool", create_revision=owner.create_revision)
        # A new epoch must be logged before it is handed out: refused, and not handed out.
        with pytest.raises(StoreFull):
            await store.create("/o/pool", b"me", lease=lease)
        assert await store.get("/o/pool") is None
    finally:
        await store.close()


async def test_corruption_in_the_middle_of_a_log_is_refused_naming_file_and_offset(
    tmp_path: Path,
) -> None:
    store = FileStore(tmp_path)
    for i in range(3):
        await store.put(f"/k/{i}", b"value-%d" % i)
    await store.close()
    log = tmp_path / FileStore.LOG_NAMES[0]
    data = log.read_bytes()
    second = data.index(b"\n") + 1
    # One byte of the second record's value flipped: still valid JSON, still base64.
    at = data.index(base64.b64encode(b"value-1"), second) + 1
    log.write_bytes(data[:at] + bytes([data[at] ^ 0x01]) + data[at + 1 :])
    with pytest.raises(StoreUnavailable) as err:
        FileStore(tmp_path)
    assert f"{log}: corrupt record at byte offset {second}" in str(err.value)


async def test_a_torn_last_record_is_dropped_and_reported(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    store = FileStore(tmp_path)
    await store.put("/a", b"1")
    await store.put("/a", b"2")
    await store.close()
    log = tmp_path / FileStore.LOG_NAMES[0]
    size = log.stat().st_size
    line = filestore._record_line(99, [("/a", KeyValue("/a", b"3", 1, 99))])
    with log.open("ab") as f:
        f.write(line[:-6])  # a crash in the middle of the append: never acknowledged
    again = FileStore(tmp_path)
    try:
        kv = await again.get("/a")
        assert kv is not None and kv.value == b"2"
    finally:
        await again.close()
    assert f"{log}: dropped a torn last record at byte offset {size}" in caplog.text


async def test_a_state_dir_of_the_previous_format_loads(tmp_path: Path) -> None:
    # Written by the version before checksums (records are bare JSON lines) and left
    # by a crash: a lease key's revision, a delete, a value put twice.
    state = tmp_path / "state"
    shutil.copytree(FIXTURES / "filestore-v1", state)
    store = FileStore(state)
    try:
        kvs, revision = await store.get_prefix("/fairshare/")
        assert [(kv.key, kv.value, kv.create_revision) for kv in kvs] == [
            ("/fairshare/state/gpu-a", b"snapshot-2", 2)
        ]
        assert revision > 6  # above every revision the old log holds: epochs keep growing
        await store.put("/fairshare/state/gpu-a", b"snapshot-3", lease=NO_LEASE)
    finally:
        await store.close()
    again = FileStore(state, read_only=True)
    kv = await again.get("/fairshare/state/gpu-a")
    assert kv is not None and kv.value == b"snapshot-3"
    await again.close()


@pytest.mark.parametrize(
    ("make", "says"),
    [
        pytest.param(lambda d: d.write_text("x"), "not a directory", id="state-dir-a-file"),
        pytest.param(
            lambda d: (d.mkdir(), (d / "store.json").write_bytes(b"\xff{")),
            "store.json: unreadable",
            id="unreadable-state-file",
        ),
    ],
)
def test_an_unusable_state_dir_is_refused_naming_it(
    tmp_path: Path, make: object, says: str
) -> None:
    state = tmp_path / "state"
    make(state)  # type: ignore[operator]
    with pytest.raises(StoreUnavailable, match=says) as err:
        FileStore(state)
    assert str(state) in str(err.value)


async def test_a_compaction_that_fails_for_lack_of_space_loses_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def atomic_write(path: Path, data: bytes) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))  # store.json cannot grow

    store = FileStore(tmp_path)
    monkeypatch.setattr(filestore, "_atomic_write", atomic_write)
    store.COMPACT_BYTES = 200  # a compaction every few writes: all of them fail
    for i in range(40):
        await store.put(f"/x/{i}", b"%d" % i)
        if store._compaction is not None:
            await store._compaction
    os.close(store._lock_fd)  # a crash: no close
    store._lock_fd = -1
    again = FileStore(tmp_path, read_only=True)
    kvs, _ = await again.get_prefix("/x/")
    assert sorted(int(kv.value) for kv in kvs) == list(range(40))
    await again.close()
    await store.close()
