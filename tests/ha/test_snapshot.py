"""The persisted snapshot: its encoding, and that what an owner writes is its state."""

from __future__ import annotations

import json
import math

import pytest
from hypothesis import given
from hypothesis import strategies as st
from owned_pool import owned_pool

from fairshare import Class
from ha.api import Epoch, GrantRef, HeldGrant, NodeId
from ha.clock import FakeClock
from ha.owned.journal import MemoryLog
from ha.owned.pool import OwnedPool
from ha.owned.snapshot import GrantKey, LiveGrant, PoolSnapshot, decode_live, live_row
from ha.settings import PoolConfig

pytestmark = pytest.mark.timeout(30)

names = st.text(min_size=0, max_size=8)  # any text: quotes, backslashes, non-ASCII
walls = st.floats(min_value=0.0, max_value=2e9, allow_nan=False)
keys = st.builds(GrantKey, st.integers(-1, 2**40), st.integers(0, 2**62), names)
live = st.builds(
    LiveGrant,
    keys,
    names,
    st.one_of(walls, st.just(math.inf)),
    st.one_of(st.none(), st.booleans()),
    st.one_of(st.just(""), names),
)


@given(
    st.lists(live, max_size=20),
    st.dictionaries(names, st.floats(min_value=0.0, max_value=1e12), max_size=5),
    st.dictionaries(keys, walls, max_size=5),
    st.dictionaries(keys, walls, max_size=5),
)
def test_encode_round_trips_and_kept_rows_encode_the_same(
    grants: list[LiveGrant],
    usage: dict[str, float],
    uncounted: dict[GrantKey, float],
    settled: dict[GrantKey, float],
) -> None:
    snapshot = PoolSnapshot(
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
    data = snapshot.encode()
    assert PoolSnapshot.decode(data) == snapshot
    assert snapshot.encode(live_rows=[live_row(g) for g in grants]) == data


@given(live)
def test_a_live_row_is_the_compact_json_of_its_fields(grant: LiveGrant) -> None:
    k = grant.key
    fields: list[object] = [k.epoch, k.seq, k.holder, grant.team, grant.until]
    if grant.borrowing is not None or grant.session:
        fields.append(None if grant.borrowing is None else int(grant.borrowing))
    if grant.session:
        fields.append(grant.session)
    assert live_row(grant) == json.dumps(fields, separators=(",", ":"))
    assert decode_live(json.loads(live_row(grant))) == grant


async def test_what_an_owner_writes_is_its_snapshot() -> None:
    clock = FakeClock()
    disk = MemoryLog()
    config = PoolConfig("p", 10, {"a": 0.5, "b": 0.5}, max_request_s=600.0)

    def owner(epoch: int) -> OwnedPool:
        return owned_pool(config, epoch, clock, disk)

    old = owner(3)
    held = []
    for i in range(4):
        d = await old.acquire(
            team="a",
            cls=Class.INTERACTIVE,
            est_tokens=1,
            holder='gw "1"',
            request_id=str(i),
            try_only=False,
        )
        held.append(d)
    old.release(GrantRef.decode(held[0].grant_id), 2.0)
    await old.durable()
    new = owner(5)
    new.restore(disk.snapshot())
    kept = held[1]
    new.adopt(
        holder='gw "1"',
        grants=[HeldGrant(kept.grant_id, "a", kept.priority, kept.borrowing, 1)],
        complete=False,
    )
    await new.acquire(
        team="b", cls=Class.BATCH, est_tokens=1, holder="gw2", request_id="", try_only=False
    )
    await new.durable()
    written = disk.snapshot()
    assert written == new.snapshot()
    assert written is not None and len(written.live) == 4  # 1 new, 1 adopted, 2 phantoms


async def test_a_write_that_sweeps_expired_phantoms_succeeds_and_drops_them() -> None:
    clock = FakeClock()
    disk = MemoryLog()
    config = PoolConfig("p", 10, {"a": 1.0}, max_request_s=600.0)
    owned = OwnedPool(
        config=config,
        epoch=Epoch(5),
        node=NodeId("n"),
        clock=clock,
        fenced=lambda: True,
        log=disk,
        commit_window_s=0.0,
        release_commit_s=0.0,
        release_memory_s=600.0,
    )
    now = clock.time()
    ending = LiveGrant(GrantKey(3, 1, "gw"), "a", now + 2.0)
    lasting = LiveGrant(GrantKey(3, 2, "gw"), "a", now + 60.0)
    owned.restore(PoolSnapshot(pool="p", epoch=3, wall=now, capacity=10, live=[ending, lasting]))
    await clock.advance(2.5, step=0.5)
    await owned.durable()  # this write's state sweeps the phantom that ended
    assert not owned.lost
    written = disk.snapshot()
    assert written is not None and [g.key for g in written.live] == [lasting.key]
