"""Grant ids cannot be forged: their MAC, key rotation, the charge bound, bounded adoption.

Owner-level (in-memory, fake clock); the same findings through a real server are in
tests/integration/test_grant_ids.py.
"""

from __future__ import annotations

import dataclasses
import os
import pathlib

import pytest

from fairshare import Class
from ha.api import (
    Decision,
    Epoch,
    GrantRef,
    HeldGrant,
    InvalidArgument,
    NodeId,
    PermissionDenied,
    PoolName,
)
from ha.clock import FakeClock
from ha.grantkeys import GrantKeys, KeyFileError, parse_keys
from ha.owned.journal import MemoryLog
from ha.owned.pool import OwnedPool
from ha.settings import PoolConfig

pytestmark = pytest.mark.timeout(30)

KEY_A = "a" * 40
KEY_B = "b" * 40
CONFIG = PoolConfig("p", 10, {"a": 0.5, "b": 0.5}, max_request_s=600.0, max_charge_per_s=2.0)


def owner(
    epoch: int, keys: GrantKeys, *, clock: FakeClock | None = None, disk: MemoryLog | None = None
) -> OwnedPool:
    return OwnedPool(
        config=CONFIG,
        epoch=Epoch(epoch),
        node=NodeId("n"),
        clock=clock or FakeClock(),
        fenced=lambda: True,
        log=disk or MemoryLog(),
        commit_window_s=0.0,
        release_commit_s=0.0,
        release_memory_s=600.0,
        keys=keys,
    )


async def grant(pool: OwnedPool, team: str = "a", holder: str = "gw") -> Decision:
    return await pool.acquire(
        team=team, cls=Class.INTERACTIVE, est_tokens=1, holder=holder, request_id="", try_only=False
    )


def usage(pool: OwnedPool, team: str) -> float:
    return next((s.usage for s in pool.view().teams if s.team == team), 0.0)


def in_flight(pool: OwnedPool, team: str) -> tuple[int, int]:
    stat = next(s for s in pool.view().teams if s.team == team)
    return stat.in_flight, stat.phantoms


def write_keys(path: pathlib.Path, *keys: str) -> None:
    """Replaces the key file as Kubernetes does: a new file renamed over the old one."""
    partial = path.with_name(path.name + ".tmp")
    partial.write_text("".join(k + "\n" for k in keys), encoding="utf-8")
    os.replace(partial, path)


# -- the MAC and its keys ---------------------------------------------------------------------


def test_a_signed_id_round_trips_and_any_changed_field_breaks_its_mac() -> None:
    keys = GrantKeys([KEY_A.encode()])
    ref = GrantRef(PoolName("p"), Epoch(5), 42, "team", "holder")
    signed = GrantRef.decode(keys.sign(ref))
    assert signed.encode().startswith("g2.") and len(signed.mac) == 22
    assert (signed.pool, signed.epoch, signed.seq, signed.team, signed.holder) == (
        "p",
        5,
        42,
        "team",
        "holder",
    )
    assert keys.verify(signed)
    for changed in (
        GrantRef(PoolName("p"), Epoch(4), 42, "team", "holder", signed.mac),
        GrantRef(PoolName("p"), Epoch(5), 43, "team", "holder", signed.mac),
        GrantRef(PoolName("p"), Epoch(5), 42, "other", "holder", signed.mac),
        GrantRef(PoolName("p"), Epoch(5), 42, "team", "other", signed.mac),
        GrantRef(PoolName("q"), Epoch(5), 42, "team", "holder", signed.mac),
    ):
        assert not keys.verify(changed)
    assert not GrantKeys([KEY_B.encode()]).verify(signed)
    assert not keys.verify(ref), "an unsigned id never verifies"


def test_the_standing_is_signed_into_an_id_and_cannot_be_flipped() -> None:
    keys = GrantKeys([KEY_A.encode()])
    for borrowing, mark in ((False, "w"), (True, "b")):
        ref = GrantRef(PoolName("p"), Epoch(5), 42, "team", "holder", "", borrowing)
        text = keys.sign(ref)
        assert text.startswith("g3.") and text.split(".")[6] == mark
        signed = GrantRef.decode(text)
        assert signed.borrowing is borrowing and keys.verify(signed)
        flipped = text.replace(f".{mark}.", ".b." if mark == "w" else ".w.")
        assert not keys.verify(GrantRef.decode(flipped))
        # Dropping the standing makes a g2 id of the same fields: its MAC differs too.
        unmarked = dataclasses.replace(signed, borrowing=None)
        assert not keys.verify(unmarked)
    with pytest.raises(InvalidArgument):
        GrantRef.decode(text.replace(".b.", ".x."))


def test_unsigned_ids_keep_the_form_clients_make() -> None:
    ref = GrantRef(PoolName("p"), Epoch(0), 7, "t", "gw")
    text = ref.encode()
    assert text.startswith("g1.") and len(text.split(".")) == 6
    assert GrantRef.decode(text) == ref


@pytest.mark.parametrize(
    ("text", "message"),
    [
        pytest.param("", "no grant key", id="empty"),
        pytest.param("# only a comment\n\n", "no grant key", id="comments-only"),
        pytest.param("short\n", "at least 32", id="short-key"),
    ],
)
def test_a_key_file_without_a_usable_key_is_refused(text: str, message: str) -> None:
    with pytest.raises(KeyFileError, match=message):
        parse_keys(text, "keys")


def test_rotation_old_keys_verify_until_removed(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "grant-keys"
    write_keys(path, KEY_A)
    keys = GrantKeys.from_file(path, recheck_s=0.0)  # look at the file at every call
    ref = GrantRef(PoolName("p"), Epoch(3), 1, "a", "gw")
    old = GrantRef.decode(keys.sign(ref))
    # Rotate: B becomes current, A stays listed to verify the grants it signed.
    write_keys(path, KEY_B, KEY_A)
    new = GrantRef.decode(keys.sign(ref))
    assert new.mac != old.mac, "the current key signs"
    assert GrantKeys([KEY_B.encode()]).verify(new)
    assert keys.verify(old) and keys.verify(new)
    # A is removed: what it signed no longer verifies.
    write_keys(path, KEY_B)
    assert not keys.verify(old) and keys.verify(new)
    # A replacement without a usable key leaves the keys in force.
    write_keys(path, "too short")
    assert keys.verify(new)


def test_a_generated_key_is_kept_in_the_state_dir(tmp_path: pathlib.Path) -> None:
    first = GrantKeys.generated(tmp_path / "state")
    ref = GrantRef(PoolName("p"), Epoch(3), 1, "a", "gw")
    signed = GrantRef.decode(first.sign(ref))
    assert (tmp_path / "state" / "grant.key").stat().st_mode & 0o777 == 0o600
    assert GrantKeys.generated(tmp_path / "state").verify(signed), "the key survives a restart"


# -- release ----------------------------------------------------------------------------------


async def test_a_guessed_id_of_another_holders_grant_is_refused_and_charges_nothing() -> None:
    pool = owner(5, GrantKeys([KEY_A.encode()]))
    real = GrantRef.decode((await grant(pool)).grant_id)
    guessed = GrantRef(real.pool, real.epoch, real.seq, real.team, real.holder)
    with pytest.raises(PermissionDenied) as info:
        pool.release(guessed, 100.0)
    assert info.value.field == "grant_id"
    bogus = GrantRef(real.pool, real.epoch, real.seq, real.team, real.holder, "A" * 22)
    with pytest.raises(PermissionDenied):
        pool.release(bogus, 100.0)
    assert in_flight(pool, "a") == (1, 0) and usage(pool, "a") == 0.0
    assert pool.counters.ids_refused == 2
    pool.release(real, 1.0)
    assert in_flight(pool, "a") == (0, 0) and usage(pool, "a") == pytest.approx(1.0)


async def test_a_charge_above_what_a_grant_can_consume_is_clamped() -> None:
    pool = owner(5, GrantKeys([KEY_A.encode()]))
    pool.release(GrantRef.decode((await grant(pool)).grant_id), 3e12)
    bound = CONFIG.max_charge_per_s * CONFIG.max_request_s
    assert CONFIG.max_charge() == bound == 1200.0
    assert usage(pool, "a") == pytest.approx(bound)
    assert pool.counters.charges_clamped == 1


async def test_old_epoch_and_degraded_ids_charge_once_and_within_the_bound() -> None:
    keys = GrantKeys([KEY_A.encode()])
    pool = owner(5, keys)
    pool.restore(None)  # no snapshot: every earlier grant is of an unknown window
    forged_old = GrantRef(PoolName("p"), Epoch(3), 9, "b", "x")
    with pytest.raises(PermissionDenied):
        pool.release(forged_old, 1e12)
    # A genuine id of an earlier epoch (signed by the cluster's key) charges once.
    genuine_old = GrantRef.decode(keys.sign(GrantRef(PoolName("p"), Epoch(3), 9, "b", "x")))
    for _ in range(3):
        pool.release(genuine_old, 1e12)
    assert usage(pool, "b") == pytest.approx(CONFIG.max_charge())
    # A client's degraded id (epoch 0, no MAC) proves nothing until its holder
    # re-reported it: then it too is bounded, and charged once.
    degraded = GrantRef(PoolName("p"), Epoch(0), 77, "a", "gw")
    pool.release(degraded, 1e12)
    assert usage(pool, "a") == 0.0 and pool.counters.unproven_releases == 1
    pool.adopt(holder="gw", grants=[HeldGrant(degraded.encode(), "a", 100, True)], complete=False)
    for _ in range(3):
        pool.release(degraded, 1e12)
    assert usage(pool, "a") == pytest.approx(CONFIG.max_charge())
    # Clamped only where charged: the first release of each id.
    assert pool.counters.charges_clamped == 2
    assert pool.counters.unproven_releases == 1


async def test_made_up_unsigned_ids_charge_nothing_however_many() -> None:
    """One ReleaseMany of 256 made-up epoch-0 ids charged team b 1,228,800; after 10,240
    filler releases pushed them out of the settled table, the same ids charged again."""
    pool = owner(5, GrantKeys([KEY_A.encode()]))
    pool.restore(None)
    made_up = [GrantRef(PoolName("p"), Epoch(0), seq, "b", "x") for seq in range(1, 257)]
    filler = [GrantRef(PoolName("p"), Epoch(0), seq, "c", "x") for seq in range(1000, 11_240)]
    for ref in (*made_up, *filler, *made_up):
        pool.release(ref, 1e12)
    assert usage(pool, "b") == 0.0 and usage(pool, "c") == 0.0
    assert pool.counters.unproven_releases == 2 * 256 + 10_240
    # Re-reported by a holder, as many as its in-flight bound are counted, so charged.
    pool.adopt(
        holder="x",
        grants=[HeldGrant(ref.encode(), "b", 100, True) for ref in made_up],
        complete=False,
    )
    for ref in made_up:
        pool.release(ref, 1e12)
    bound = CONFIG.in_flight_bounds(CONFIG.capacity)[1]
    assert usage(pool, "b") == pytest.approx(min(bound, 256) * CONFIG.max_charge())


def test_a_name_longer_than_the_request_limit_is_refused_in_any_grant_id() -> None:
    """A 1,500-byte team name got in through a made-up unsigned id's release."""
    long_team = GrantRef(PoolName("p"), Epoch(0), 1, "t" * 1500, "x").encode()
    with pytest.raises(InvalidArgument):
        GrantRef.decode(long_team)


async def test_a_new_owner_verifies_ids_of_the_old_one_only_under_the_same_keys() -> None:
    clock = FakeClock()
    disk = MemoryLog()
    shared = GrantKeys([KEY_A.encode()])
    old = owner(3, shared, clock=clock, disk=disk)
    ids = [GrantRef.decode((await grant(old)).grant_id) for _ in range(2)]
    await old.durable()
    snapshot = disk.snapshot()
    new = owner(5, GrantKeys([KEY_A.encode()]), clock=clock)
    new.restore(snapshot)
    new.release(ids[0], 2.0)
    assert usage(new, "a") == pytest.approx(2.0) and in_flight(new, "a") == (0, 1)
    stranger = owner(5, GrantKeys([KEY_B.encode()]), clock=clock)
    stranger.restore(snapshot)
    with pytest.raises(PermissionDenied):
        stranger.release(ids[1], 2.0)


# -- adopt ------------------------------------------------------------------------------------


async def test_forged_adopts_cannot_fill_a_teams_reservation() -> None:
    keys = GrantKeys([KEY_A.encode()])
    pool = owner(5, keys)
    pool.restore(None)
    forged = [
        HeldGrant(GrantRef(PoolName("p"), Epoch(3), seq, "a", "evil").encode(), "a", 100, False)
        for seq in range(1, 6)
    ]
    with pytest.raises(PermissionDenied) as info:
        pool.adopt(holder="evil", grants=forged, complete=False)
    assert info.value.field == "grants[0].grant_id"
    # A client's unsigned degraded grant counts only for the holder that calls.
    theirs = GrantRef(PoolName("p"), Epoch(0), 1, "a", "victim").encode()
    with pytest.raises(PermissionDenied):
        pool.adopt(holder="evil", grants=[HeldGrant(theirs, "a", 100, True)], complete=False)
    assert not any(s.in_flight for s in pool.view().teams)
    assert not (await grant(pool, "a")).borrowing


async def test_unsigned_degraded_grants_are_counted_within_the_holders_in_flight_bound() -> None:
    pool = owner(5, GrantKeys([KEY_A.encode()]))
    pool.restore(None)
    bound = CONFIG.in_flight_bounds(CONFIG.capacity)[1]
    many = [
        HeldGrant(GrantRef(PoolName("p"), Epoch(0), seq, "a", "gw").encode(), "a", 100, True)
        for seq in range(1, bound + 11)
    ]
    result = pool.adopt(holder="gw", grants=many, complete=False)
    assert result.adopted == bound
    again = pool.adopt(holder="gw", grants=many, complete=False)
    assert again.adopted == 0


async def test_a_complete_adopt_speaks_only_for_a_holder_it_proves_to_be() -> None:
    clock = FakeClock()
    disk = MemoryLog()
    keys = GrantKeys([KEY_A.encode()])
    old = owner(3, keys, clock=clock, disk=disk)
    victim = [await grant(old, holder="victim") for _ in range(3)]
    await old.durable()
    new = owner(5, keys, clock=clock)
    new.restore(disk.snapshot())
    assert in_flight(new, "a") == (0, 3)
    # Another caller names the victim's holder with an empty, or unsigned, inventory.
    fake = HeldGrant(GrantRef(PoolName("p"), Epoch(0), 5, "a", "victim").encode(), "a", 1, True)
    for grants in ([], [fake]):
        result = new.adopt(holder="victim", grants=grants, complete=True)
        assert result.phantoms_dropped == 0
    assert in_flight(new, "a")[1] == 3, "the victim's phantoms stand"
    # The victim's own complete re-report carries a signed grant of it: it speaks for it.
    mine = HeldGrant(victim[0].grant_id, "a", victim[0].priority, victim[0].borrowing, 1)
    result = new.adopt(holder="victim", grants=[mine], complete=True)
    assert (result.adopted, result.phantoms_dropped) == (1, 3)


async def test_a_signed_grant_of_the_owners_own_epoch_proves_holdership_once_counted() -> None:
    # A gateway whose grants of the old epoch all ended (or were never answered) holds
    # only its own degraded ones; its proof is a grant the new owner signed for it.
    clock = FakeClock()
    disk = MemoryLog()
    keys = GrantKeys([KEY_A.encode()])
    old = owner(3, keys, clock=clock, disk=disk)
    for _ in range(3):
        await grant(old, holder="gw")  # decided and persisted; the answers never arrived
    await old.durable()
    new = owner(5, keys, clock=clock)
    new.restore(disk.snapshot())
    assert in_flight(new, "a") == (0, 3)
    degraded = HeldGrant(GrantRef(PoolName("p"), Epoch(0), 7, "a", "gw").encode(), "a", 1, True)
    result = new.adopt(holder="gw", grants=[degraded], complete=True)
    assert result.phantoms_dropped == 0, "an unsigned inventory proves nothing"
    fresh = await grant(new, holder="gw")
    assert in_flight(new, "a") == (2, 3)  # the degraded grant and the fresh one
    # A grant the new owner signed for another holder proves nothing for this one.
    other = await grant(new, holder="other")
    theirs = HeldGrant(other.grant_id, "a", other.priority, other.borrowing, 1)
    assert new.adopt(holder="gw", grants=[theirs], complete=True).phantoms_dropped == 0
    assert in_flight(new, "a") == (3, 3)
    mine = HeldGrant(fresh.grant_id, "a", fresh.priority, fresh.borrowing, 1)
    result = new.adopt(holder="gw", grants=[degraded, mine], complete=True)
    # The proof closes the phantoms; neither grant is counted a second time.
    assert (result.adopted, result.phantoms_dropped) == (0, 3)
    assert in_flight(new, "a") == (3, 0)


def test_the_key_file_is_looked_at_no_more_than_once_per_recheck(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "grant-keys"
    write_keys(path, KEY_A)
    keys = GrantKeys.from_file(path, recheck_s=3600.0)
    ref = GrantRef(PoolName("p"), Epoch(3), 1, "a", "gw")
    before = GrantRef.decode(keys.sign(ref))
    write_keys(path, KEY_B)
    assert keys.verify(before), "not re-read within recheck_s"
