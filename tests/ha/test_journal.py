"""The persisted form (``ha.owned.journal``, ``ha.owned.poolstate``): a crash between any two writes
restores a state an owner really had, and every release is charged exactly once.

The owner under test is itself a successor (it restores phantoms from a snapshot of the
earlier layout, adopts some, closes others), so its writes cover every kind of change:
grants counted and dropped, usage, capacity, settled and uncounted entries. Parts and
the record size are made tiny, so checkpoints come in many parts and some commits are too
large for a record and become checkpoints.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from owned_pool import owned_pool

import ha.owned.journal
from fairshare import Class
from fairshare.limits import MAX_NAME_BYTES
from ha.api import Decision, Epoch, GrantRef, HeldGrant, PoolName
from ha.clock import FakeClock
from ha.grantkeys import ephemeral_keys
from ha.owned.journal import MemoryLog, encode_checkpoint, replay
from ha.owned.pool import OwnedPool
from ha.owned.poolstate import PoolLog, load
from ha.owned.settled import MEMORY_CAP
from ha.owned.snapshot import GrantKey, LiveGrant, PoolSnapshot, live_row
from ha.settings import PoolConfig
from ha.store.contract import KeyValue, Put, Write
from ha.store.keys import Keys
from ha.store.memory import MemoryStore

pytestmark = pytest.mark.timeout(60)

POOL = PoolName("p")
KEYS = Keys("/t")
# No decay: usage is then a plain sum, and "charged exactly once" an equality.
CONFIG = PoolConfig(POOL, 8, {"a": 0.5, "b": 0.5}, max_request_s=600.0, half_life_s=0.0)


class CrashStore(MemoryStore):
    """Keeps, after every commit, a copy of what a crash right then would leave."""

    def __init__(self, clock: FakeClock) -> None:
        super().__init__(clock)
        self.copies: list[dict[str, KeyValue]] = []

    async def commit_fenced(
        self,
        writes: Sequence[Write],
        *,
        fence_key: str,
        fence_revision: int,
        timeout_s: float | None = None,
    ) -> bool:
        done = await super().commit_fenced(
            writes, fence_key=fence_key, fence_revision=fence_revision, timeout_s=timeout_s
        )
        assert done
        self.copies.append(dict(self._keys))
        return done

    def as_of(self, copy: int, clock: FakeClock) -> MemoryStore:
        restored = MemoryStore(clock)
        restored._keys.update(self.copies[copy])
        return restored


class WatchedLog(PoolLog):
    """A ``PoolLog`` that notes, for every write, the owner's state it encodes and the
    commit after which it is whole in the store."""

    def __init__(self, store: CrashStore, epoch: Epoch) -> None:
        super().__init__(store, KEYS, POOL, epoch, budget_s=lambda: 5.0)
        self.crash_store = store
        self.owner: OwnedPool | None = None
        self.whole: list[tuple[int, PoolSnapshot]] = []  # (copy index, state)

    async def append(self, record: bytes) -> None:
        assert self.owner is not None
        state = self.owner.snapshot()  # the owner encoded this, with no pause since
        await super().append(record)
        self.whole.append((len(self.crash_store.copies) - 1, state))

    async def checkpoint(self, checkpoint: ha.owned.journal.Checkpoint) -> None:
        assert self.owner is not None
        state = self.owner.snapshot()
        await super().checkpoint(checkpoint)
        self.whole.append((len(self.crash_store.copies) - 1, state))


def owner(epoch: int, clock: FakeClock, log: ha.owned.journal.StateWriter) -> OwnedPool:
    return owned_pool(CONFIG, epoch, clock, log)


async def grant(
    pool: OwnedPool, team: str, holder: str, cls: Class = Class.INTERACTIVE
) -> Decision:
    decision = await pool.acquire(
        team=team, cls=cls, est_tokens=1, holder=holder, request_id="", try_only=False
    )
    assert decision.granted
    return decision


def normal(state: PoolSnapshot) -> dict[str, Any]:
    """What a restore reads of a state: the requests still running, the rest as is."""
    return {
        "epoch": state.epoch,
        "wall": state.wall,
        "capacity": state.capacity,
        "issued": state.issued,
        "usage": {t: pytest.approx(u, abs=1e-9) for t, u in state.usage.items()},
        "live": sorted((g.key, g.team, g.until) for g in state.live if g.until > state.wall),
        "unknown_after": dict(state.unknown_after),
        "unknown_between": sorted(state.unknown_between),
        "uncounted": dict(state.uncounted),
        "settled": dict(state.settled),
    }


async def run_owner(
    clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> tuple[CrashStore, WatchedLog, list[tuple[str, float, str]]]:
    """The owner under test, from a predecessor's state to its last write; returns its
    store, its log and every release of the story as (grant id, consumed, team)."""
    monkeypatch.setattr(ha.owned.journal, "PART_BYTES", 400)
    monkeypatch.setattr(ha.owned.journal, "LOG_FLOOR_BYTES", 1500)
    releases: list[tuple[str, float, str]] = []

    # The predecessor (epoch 3): grants to two gateways, one released.
    before = MemoryLog()
    old = owner(3, clock, before)
    gw1 = [await grant(old, "a", "gw1") for _ in range(3)]
    gw2 = [await grant(old, "b", "gw2") for _ in range(3)]
    await grant(old, "c", "gw2", Class.BATCH)  # a borrower
    old.release(GrantRef.decode(gw1[0].grant_id), 5.0)
    releases.append((gw1[0].grant_id, 5.0, "a"))
    await old.durable()
    earlier = before.snapshot()
    assert earlier is not None

    store = CrashStore(clock)
    for _ in range(5):  # revisions above the predecessor's epoch
        await store.put("/elsewhere", b"")
    lease = await store.grant_lease(600.0)
    key = await store.create(KEYS.owner(POOL), b"n", lease=lease)
    assert key is not None
    # What the predecessor left, as the earlier layout kept it: one whole snapshot.
    await store.put(KEYS.state(POOL), earlier.encode())
    store.copies.append(dict(store._keys))
    log = WatchedLog(store, Epoch(key.create_revision))
    pool = owner(key.create_revision, clock, log)
    log.owner = pool
    loaded = await load(store, KEYS, POOL, decay_rate=0.0, timeout_s=1.0)
    log.resume(loaded.position)
    pool.restore(loaded.snapshot)

    mine = [await grant(pool, "a", "gw1") for _ in range(2)]  # the first write: a checkpoint
    borrowed = [await grant(pool, "c", "gw3", Class.BATCH) for _ in range(3)]
    clock_step = 1.0
    await clock.advance(clock_step)
    pool.release(GrantRef.decode(gw1[1].grant_id), 2.0)  # a phantom of the predecessor
    releases.append((gw1[1].grant_id, 2.0, "a"))
    pool.release(GrantRef.decode(borrowed[0].grant_id), 1.5)
    releases.append((borrowed[0].grant_id, 1.5, "c"))
    await pool.durable(lazy=True)
    # gw2 re-reports one grant, completely: its other phantoms close (uncounted).
    kept = gw2[0]
    pool.adopt(
        holder="gw2",
        grants=[HeldGrant(kept.grant_id, "b", kept.priority, kept.borrowing, 1)],
        complete=True,
    )
    await pool.durable()
    pool.release(GrantRef.decode(gw2[1].grant_id), 4.0)  # closed: uncounted, charged
    releases.append((gw2[1].grant_id, 4.0, "b"))
    pool.release(GrantRef.decode(kept.grant_id), 3.0)  # adopted
    releases.append((kept.grant_id, 3.0, "b"))
    pool.set_capacity(10)
    await pool.durable()
    # Many grants in one commit: their record is too large, so it is a checkpoint.
    many = [await grant(pool, f"t{i}", "gw4", Class.BATCH) for i in range(12)]
    await clock.advance(clock_step)
    for d in many[:6]:
        pool.release(GrantRef.decode(d.grant_id), 0.5)
        releases.append((d.grant_id, 0.5, GrantRef.decode(d.grant_id).team))
        await pool.durable(lazy=True)
    pool.release(GrantRef.decode(mine[0].grant_id), 7.0)
    releases.append((mine[0].grant_id, 7.0, "a"))
    for d in borrowed[1:]:
        pool.release(GrantRef.decode(d.grant_id), 1.0)
        releases.append((d.grant_id, 1.0, "c"))
    await grant(pool, "b", "gw1")  # its commit covers the releases before it
    # Records until they outweigh the last checkpoint: the next write is a checkpoint.
    for _ in range(14):
        d = await grant(pool, "a", "gw5")
        pool.release(GrantRef.decode(d.grant_id), 0.25)
        releases.append((d.grant_id, 0.25, "a"))
        await pool.durable(lazy=True)
    await pool.close()
    return store, log, releases


async def test_a_crash_between_any_two_writes_restores_a_state_the_owner_had(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    clock = FakeClock()
    store, log, _ = await run_owner(clock, monkeypatch)
    commits = [at for at, _ in log.whole]
    steps = [b - a for a, b in zip([0, *commits], commits, strict=False)]
    assert sum(1 for step in steps if step >= 3) >= 3  # checkpoints of two parts or more
    first = log.whole[0][0]
    for copy in range(len(store.copies)):
        crashed = store.as_of(copy, clock)
        loaded = await load(crashed, KEYS, POOL, decay_rate=0.0, timeout_s=1.0)
        assert not loaded.unreadable, copy
        assert loaded.snapshot is not None, copy
        done = [state for at, state in log.whole if at <= copy]
        if not done:
            # Before the owner's first checkpoint is whole: its predecessor's snapshot.
            assert copy < first and loaded.snapshot.epoch == 3, copy
            continue
        assert normal(loaded.snapshot) == normal(done[-1]), copy
    # Every value and every commit stayed small, whatever the state's size.
    sizes = [len(kv.value) for kvs in store.copies for kv in kvs.values()]
    assert max(sizes) <= max(400, len(store.copies[1][KEYS.state(POOL)].value))


async def test_every_release_is_charged_once_whatever_the_crash_and_the_retries(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    clock = FakeClock()
    store, _, releases = await run_owner(clock, monkeypatch)
    charged: dict[str, float] = {}
    for _, consumed, team in releases:
        charged[team] = charged.get(team, 0.0) + consumed
    for copy in range(len(store.copies)):
        crashed = store.as_of(copy, clock)
        loaded = await load(crashed, KEYS, POOL, decay_rate=0.0, timeout_s=1.0)
        successor = owner(10_000, clock, MemoryLog())
        successor.restore(loaded.snapshot)
        # Every holder sends (again) every release of the story: acknowledged or not,
        # before the crash or after it.
        for grant_id, consumed, _ in releases:
            for _ in range(2):
                successor.release(GrantRef.decode(grant_id), consumed)
        usage, _ = successor.pool.usage()
        got = {t: u for t, u in usage.items() if u > 0}
        assert got == pytest.approx(charged, abs=1e-9), copy


# -- the format alone ------------------------------------------------------------------------

names = st.text(min_size=0, max_size=12)
walls = st.floats(min_value=0.0, max_value=2e9, allow_nan=False)
grant_keys = st.builds(GrantKey, st.integers(-1, 2**40), st.integers(0, 2**62), names)
live = st.builds(LiveGrant, grant_keys, names, st.one_of(walls, st.just(math.inf)))


@settings(max_examples=60, deadline=None)
@given(
    st.lists(live, max_size=40, unique_by=lambda g: g.key),
    st.dictionaries(names, st.floats(min_value=0.0, max_value=1e12), max_size=8),
    st.dictionaries(grant_keys, walls, max_size=10),
    st.dictionaries(grant_keys, walls, max_size=10),
    st.sampled_from([200, 700, 128 * 1024]),
)
def test_a_checkpoint_replays_to_its_state_in_any_number_of_parts(
    grants: list[LiveGrant],
    usage: dict[str, float],
    uncounted: dict[GrantKey, float],
    settled: dict[GrantKey, float],
    part_bytes: int,
) -> None:
    state = PoolSnapshot(
        pool="p",
        epoch=7,
        wall=1.5e9,
        capacity=10,
        usage=usage,
        issued=42,
        live=grants,
        unknown_after={3: (5, 1.4e9)},
        unknown_between=[(3, 7, 1.4e9)],
        uncounted=uncounted,
        settled=settled,
    )
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(ha.owned.journal, "PART_BYTES", part_bytes)
        checkpoint = encode_checkpoint(state, [live_row(g) for g in grants])
    longest = max((len(live_row(g)) for g in grants), default=0) + 40
    assert all(len(p) <= max(part_bytes, longest) for p in checkpoint.parts)
    head = dict(checkpoint.head, position=1, parts=len(checkpoint.parts))
    assert replay(head, checkpoint.parts, [], decay_rate=0.0) == state


@pytest.mark.parametrize("configured", [pytest.param(12, id="kept"), pytest.param(None, id="none")])
def test_the_configured_capacity_replays_from_the_head_and_older_heads_have_none(
    configured: int | None,
) -> None:
    state = PoolSnapshot(
        pool="p",
        epoch=7,
        wall=1.5e9,
        capacity=10,
        live=[],
        unknown_between=[],
        configured=configured,
    )
    checkpoint = encode_checkpoint(state, [])
    head = dict(checkpoint.head, position=1, parts=len(checkpoint.parts))
    assert replay(head, checkpoint.parts, [], decay_rate=0.0) == state
    # A head written before the field was kept: the stored capacity stands.
    del head["configured"]
    older = replay(head, checkpoint.parts, [], decay_rate=0.0)
    assert older is not None and older.configured is None and older.capacity == 10


def test_a_state_written_before_rows_carried_a_standing_replays_it_as_unknown() -> None:
    """Version 3 wrote live rows of five entries: a successor of a newer version reads
    them with the standing unknown (counted as within share), and reads newer rows of a
    record written after them."""
    key = GrantKey(3, 1, "h")
    state = PoolSnapshot(pool="p", epoch=3, wall=10.0, capacity=4)
    checkpoint = encode_checkpoint(state, ['[3,1,"h","a",610.0]'])
    head = dict(checkpoint.head, version=3, position=1, parts=len(checkpoint.parts))
    assert ha.owned.journal.decode_head(json.dumps(head).encode()) is not None
    record = (
        b'{"epoch":3,"wall":11.0,"capacity":4,"issued":2,"usage":{},"drop":[],'
        b'"settled":[],"uncounted":[],"live":[[3,2,"h","a",611.0,1]]}'
    )
    replayed = replay(head, checkpoint.parts, [record], decay_rate=0.0)
    assert replayed is not None
    assert replayed.live == [
        LiveGrant(key, "a", 610.0, None),
        LiveGrant(GrantKey(3, 2, "h"), "a", 611.0, True),
    ]
    bad = record.replace(b"611.0,1]", b"611.0,7]")
    assert replay(head, checkpoint.parts, [bad], decay_rate=0.0) is None


def test_an_unreadable_record_makes_the_state_unreadable() -> None:
    state = PoolSnapshot(pool="p", epoch=7, wall=10.0, capacity=3)
    checkpoint = encode_checkpoint(state, [])
    head = dict(checkpoint.head, position=1, parts=len(checkpoint.parts))
    assert replay(head, checkpoint.parts, [b"{not json"], decay_rate=0.0) is None


class SizedStore(MemoryStore):
    """Records the size of every commit: its values and keys, and its operations."""

    def __init__(self, clock: FakeClock) -> None:
        super().__init__(clock)
        self.commits: list[tuple[int, int]] = []  # (bytes, operations)

    async def commit_fenced(
        self,
        writes: Sequence[Write],
        *,
        fence_key: str,
        fence_revision: int,
        timeout_s: float | None = None,
    ) -> bool:
        size = sum(
            len(w.key) + len(w.value) if isinstance(w, Put) else len(w.start) + len(w.end)
            for w in writes
        )
        self.commits.append((size, len(writes)))
        return await super().commit_fenced(
            writes, fence_key=fence_key, fence_revision=fence_revision, timeout_s=timeout_s
        )


async def test_no_commit_is_near_etcds_limits_at_any_size() -> None:
    """25,000 requests in flight, both accounting tables full, the most teams with the
    longest names, and the largest Adopt: every commit stays under 256 KiB and 128
    operations (etcd's defaults: 1.5 MiB, 128)."""
    clock = FakeClock()
    store = SizedStore(clock)
    for _ in range(5):
        await store.put("/elsewhere", b"")
    lease = await store.grant_lease(3600.0)
    key = await store.create(KEYS.owner(POOL), b"n", lease=lease)
    assert key is not None
    long = "x" * (MAX_NAME_BYTES - 8)
    config = PoolConfig(POOL, 40_000, {"a": 0.5, "b": 0.5}, max_request_s=600.0, max_teams=4096)
    now = clock.time()
    earlier = PoolSnapshot(
        pool=POOL,
        epoch=3,
        wall=now,
        capacity=40_000,
        usage={f"{long}{i:06d}": float(i) for i in range(4094)} | {"a": 1.0, "b": 2.0},
        issued=30_000,
        live=[LiveGrant(GrantKey(3, i, f"{long}gw"), "a", now + 500.0) for i in range(25_000)],
        uncounted={GrantKey(2, i, f"{long}u"): now for i in range(MEMORY_CAP)},
        settled={GrantKey(2, i, f"{long}s"): now for i in range(MEMORY_CAP)},
    )
    log = PoolLog(store, KEYS, POOL, Epoch(key.create_revision), budget_s=lambda: 5.0)
    pool = owned_pool(config, key.create_revision, clock, log)
    pool.restore(earlier)
    await pool.durable()  # the first write: a checkpoint of it all
    # Its holder re-reports one grant, completely: 25,000 phantoms close at once, a
    # change too large for one record.
    kept = ephemeral_keys().sign(GrantRef(POOL, Epoch(3), 0, "a", f"{long}gw"))
    pool.adopt(holder=f"{long}gw", grants=[HeldGrant(kept, "a", 1, False, 1)], complete=True)
    await pool.durable()
    # Many new grants in one commit, then all of them expire at once.
    for i in range(3000):
        await pool.acquire(
            team=f"{long}{i:06d}",
            cls=Class.BATCH,
            est_tokens=1,
            holder=f"{long}h",
            request_id="",
            try_only=False,
        )
    await pool.durable()
    await clock.advance(700.0, step=100.0)
    assert pool.expire() == 3001
    await pool.durable()
    assert len(store.commits) > 40  # checkpoints of many parts
    assert max(size for size, _ in store.commits) <= 256 * 1024
    assert max(ops for _, ops in store.commits) <= 4
    loaded = await load(store, KEYS, POOL, decay_rate=0.0, timeout_s=1.0)
    assert loaded.snapshot is not None
    assert normal(loaded.snapshot) == normal(pool.snapshot())


async def test_a_snapshot_an_older_replica_wrote_after_a_checkpoint_is_restored() -> None:
    """A rolling update may move a pool from a replica of this layout to one of the earlier
    layout and back: the older one writes the whole snapshot after the last checkpoint, and
    that newer state is the one to restore."""
    clock = FakeClock()
    store = CrashStore(clock)
    for _ in range(5):
        await store.put("/elsewhere", b"")
    lease = await store.grant_lease(600.0)
    key = await store.create(KEYS.owner(POOL), b"n", lease=lease)
    assert key is not None
    log = WatchedLog(store, Epoch(key.create_revision))
    pool = owner(key.create_revision, clock, log)
    log.owner = pool
    pool.restore(None)
    await grant(pool, "a", "gw1")
    await grant(pool, "a", "gw1")  # a checkpoint, then a record
    assert len(log.whole) == 2
    older = PoolSnapshot(
        pool=POOL, epoch=key.create_revision + 7, wall=clock.time(), capacity=8, issued=3
    )
    await store.put(KEYS.state(POOL), older.encode())
    loaded = await load(store, KEYS, POOL, decay_rate=0.0, timeout_s=1.0)
    assert loaded.snapshot is not None and not loaded.unreadable
    assert normal(loaded.snapshot) == normal(older)
    assert loaded.position >= 2  # a successor still writes above every position found
