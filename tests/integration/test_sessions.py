"""Holder sessions end to end: a real ``fairshare serve`` (embedded mode, short session TTL)
and clients of the client library, raw gRPC callers and a client process of their own.

Issue 31's findings 1 and 2, each as it was found:

- two clients that share a holder name keep their grants apart across a SIGKILL and restart
  of the server: one's complete re-report does not close the other's phantoms;
- a raw caller that takes a victim's holder name (another session, or none) and sends a
  complete re-report carrying a grant it acquired under that name leaves the victim's
  phantoms, so no reserved slot is promised twice;
- a client process SIGKILLed while it holds grants frees their slots within about one
  session TTL (not ``max_request_s``);
- a grant a live client holds for three times ``max_request_s`` stays counted and its
  release is charged;
- the session metadata is checked at the door (malformed: ``INVALID_ARGUMENT``) and at
  the owner (another holder: ``PERMISSION_DENIED``), KeepAlive included; a session id
  presented with another secret is malformed (ids derive from secrets), so it can be
  neither taken over nor opened first where it is not open yet.
"""

from __future__ import annotations

import asyncio
import signal
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path

import grpc
import pytest
from grpc import aio

from fairshare.client import AllocatorClient
from fairshare.sessions import new_session, session_id
from fairshare.wire.metadata import session_entry
from fairshare.wire.pb.fairshare.v1 import allocator_pb2 as pb
from fairshare.wire.pb.fairshare.v1 import allocator_pb2_grpc as pb_grpc
from harness.process import ROOT
from harness.serve import Allocator, wait_serving

pytestmark = pytest.mark.timeout(60)

TTL_S = 1.5
"""The servers' session TTL, unless a test needs its clients to outlive a restart."""
SNAPSHOT_S = 0.1
"""The servers' tick: expiries (and lapses) are found at most this late."""
SHORT_S = 1.0
"""``max_request_s`` of the pool ``short``."""

CONFIG = """\
timing:
  session_ttl_s: {ttl_s}
  forward_deadline_s: 0.5
  snapshot_interval_s: {snapshot_s}
pools:
  - name: gpu-a
    capacity: 4
    shares: {{team-a: 0.5, team-b: 0.5}}
    max_request_s: 600
  - name: short
    capacity: 4
    shares: {{team-a: 0.5, team-b: 0.5}}
    max_request_s: {short_s}
"""


@asynccontextmanager
async def serving(workdir: Path, *, ttl_s: float = TTL_S) -> AsyncIterator[Allocator]:
    """A ``fairshare serve`` process on a free port, state in ``workdir``; killed at the end."""
    config = workdir / "pools.yaml"
    config.write_text(
        CONFIG.format(ttl_s=ttl_s, snapshot_s=SNAPSHOT_S, short_s=SHORT_S), encoding="utf-8"
    )
    server = Allocator(workdir, config, node="sess-0")
    server.start()
    try:
        await wait_serving(server.address, process=server)
        await epoch_of(server.address)
        yield server
    finally:
        server.kill()


async def epoch_of(address: str, pool: str = "gpu-a") -> int:
    snap = await snapshot(address, pool)
    return int(snap.epoch)


async def snapshot(address: str, pool: str = "gpu-a") -> pb.SnapshotResponse:
    async with aio.insecure_channel(address) as channel:
        answer: pb.SnapshotResponse = await pb_grpc.AllocatorStub(channel).Snapshot(
            pb.SnapshotRequest(pool=pool), timeout=5, wait_for_ready=True
        )
    return answer


async def teams(address: str, pool: str = "gpu-a") -> dict[str, tuple[int, int]]:
    """Each team's (in flight, phantoms)."""
    return {t.team: (t.in_flight, t.phantoms) for t in (await snapshot(address, pool)).teams}


async def until(check: Callable[[], Awaitable[bool]], what: str, timeout_s: float = 10.0) -> float:
    """Polls ``check`` until true; returns the seconds it took."""
    start = time.monotonic()
    while not await check():
        assert time.monotonic() - start < timeout_s, f"not within {timeout_s}s: {what}"
        await asyncio.sleep(0.05)
    return time.monotonic() - start


async def restart(server: Allocator) -> int:
    """SIGKILL, then start again on the same address and state; returns the new epoch."""
    before = await epoch_of(server.address)
    server.kill()
    server.start()
    await wait_serving(server.address, process=server)
    epoch = await epoch_of(server.address)
    assert epoch > before
    return epoch


def client_of(server: Allocator, holder: str) -> AllocatorClient:
    """A client that re-reports only when told to (``refresh_pools``): it reads ListPools
    by itself once an hour, and KeepAlive answers name no epoch."""
    return AllocatorClient([server.address], holder=holder, deadline_s=1.0, epoch_check_s=3600)


async def probe_borrows(stub: pb_grpc.AllocatorStub, team: str) -> bool:
    """Whether a new request of ``team`` borrows (its reservation is all counted); released."""
    r = await stub.Acquire(pb.AcquireRequest(pool="gpu-a", team=team, holder="probe"), timeout=5)
    await stub.Release(pb.ReleaseRequest(grant_id=r.grant_id), timeout=5)
    return bool(r.borrowing)


def session_metadata(text: str) -> tuple[tuple[str, str], ...]:
    return (session_entry(text),)


# -- finding 1 ------------------------------------------------------------------------------


async def test_two_clients_of_one_holder_name_keep_their_grants_apart_across_a_restart(
    tmp_path: Path,
) -> None:
    # A TTL the clients' keepalives outlive a restart with (they reconnect within ~1 s).
    async with (
        serving(tmp_path, ttl_s=4.0) as server,
        aio.insecure_channel(server.address) as channel,
    ):
        stub = pb_grpc.AllocatorStub(channel)
        one, other = client_of(server, "gw"), client_of(server, "gw")
        try:
            assert one.session_id != other.session_id
            mine = [await one.acquire("gpu-a", "team-a") for _ in range(2)]
            theirs = [await other.acquire("gpu-a", "team-b") for _ in range(2)]
            assert not any(g.borrowing for g in mine + theirs)  # each team's 2 reserved

            await restart(server)
            assert await teams(server.address) == {"team-a": (0, 2), "team-b": (0, 2)}
            await one.refresh_pools()  # sees the new epoch: its complete re-report
            await until(
                lambda: _is(teams(server.address), {"team-a": (2, 0), "team-b": (0, 2)}),
                "the first client's grants counted again, the other's phantoms kept",
            )
            # The other's 2 reserved slots are still taken: a new team-b request borrows.
            assert await probe_borrows(stub, "team-b")

            await other.refresh_pools()
            await until(
                lambda: _is(teams(server.address), {"team-a": (2, 0), "team-b": (2, 0)}),
                "both clients' grants counted, no phantom left",
            )
            for grant in mine + theirs:
                await grant.release(1.0)
            await until(
                lambda: _is(teams(server.address), {"team-a": (0, 0), "team-b": (0, 0)}),
                "every grant released",
            )
        finally:
            await one.close()
            await other.close()


async def _is(table: Awaitable[dict[str, tuple[int, int]]], expected: object) -> bool:
    return await table == expected


@pytest.mark.parametrize("intruder", ["another session", "no session"])
async def test_an_impersonated_complete_re_report_leaves_the_victims_phantoms(
    tmp_path: Path, intruder: str
) -> None:
    async with (
        serving(tmp_path, ttl_s=4.0) as server,
        aio.insecure_channel(server.address) as channel,
    ):
        stub = pb_grpc.AllocatorStub(channel)
        victim = client_of(server, "victim")
        try:
            held = [await victim.acquire("gpu-a", "team-b") for _ in range(2)]
            epoch = await restart(server)
            assert await teams(server.address) == {"team-a": (0, 0), "team-b": (0, 2)}

            # The intruder acquires under the victim's name, then re-reports that grant as
            # the victim's whole inventory.
            metadata = session_metadata(new_session()) if intruder == "another session" else ()
            own = await stub.Acquire(
                pb.AcquireRequest(pool="gpu-a", team="team-a", holder="victim"),
                timeout=5,
                metadata=metadata,
            )
            report = pb.AdoptRequest(
                pool="gpu-a",
                epoch=epoch,
                holder="victim",
                complete=True,
                grants=[pb.HeldGrant(grant_id=own.grant_id, team="team-a")],
            )
            adopted = await stub.Adopt(report, timeout=5, metadata=metadata)
            assert adopted.phantoms_dropped == 0
            assert await teams(server.address) == {"team-a": (1, 0), "team-b": (0, 2)}
            assert await probe_borrows(stub, "team-b")  # not promised a second time
            await stub.Release(pb.ReleaseRequest(grant_id=own.grant_id), timeout=5)

            # The victim's own re-report closes its phantoms with its grants.
            await victim.refresh_pools()
            await until(
                lambda: _is(teams(server.address), {"team-a": (0, 0), "team-b": (2, 0)}),
                "the victim's grants counted again",
            )
            for grant in held:
                await grant.release(1.0)
        finally:
            await victim.close()


# -- finding 2 ------------------------------------------------------------------------------

CHILD = """\
import asyncio, sys
from fairshare.client import AllocatorClient

async def main(address: str) -> None:
    client = AllocatorClient([address], holder="gw-child", deadline_s=2.0)
    for _ in range(3):
        grant = await client.acquire("gpu-a", "team-a")
        assert not grant.degraded, grant
    print("holding", flush=True)
    await asyncio.sleep(3600)  # three requests that never end: the process is killed

asyncio.run(main(sys.argv[1]))
"""


async def test_a_killed_client_process_frees_its_slots_within_one_session_ttl(
    tmp_path: Path,
) -> None:
    async with serving(tmp_path) as server:
        child = await asyncio.create_subprocess_exec(
            sys.executable,
            "-c",
            CHILD,
            server.address,
            cwd=ROOT,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
        )
        try:
            assert child.stdout is not None
            line = await asyncio.wait_for(child.stdout.readline(), 30)
            assert line.strip() == b"holding", line
            assert (await teams(server.address))["team-a"] == (3, 0)
            # Alive, its keepalives keep the grants counted, well past the TTL.
            await asyncio.sleep(3 * TTL_S)
            assert (await teams(server.address))["team-a"] == (3, 0)

            child.send_signal(signal.SIGKILL)
            await child.wait()
            took = await until(
                lambda: _is(teams(server.address), {"team-a": (0, 0), "team-b": (0, 0)}),
                "the killed client's grants freed",
            )
            # Its last renewal was at most a third of the TTL before the kill.
            assert took <= TTL_S + SNAPSHOT_S + 1.0, took
            # Nothing is charged for them (their releases never came).
            usage = {t.team: t.usage for t in (await snapshot(server.address)).teams}
            assert usage["team-a"] == 0.0
        finally:
            if child.returncode is None:
                child.kill()
                await child.wait()


async def test_a_live_clients_grant_outlives_max_request_s_and_its_release_is_charged(
    tmp_path: Path,
) -> None:
    async with (
        serving(tmp_path) as server,
        AllocatorClient([server.address], holder="gw", deadline_s=1.0) as client,
    ):
        grant = await client.acquire("short", "team-a")
        started = time.monotonic()
        while time.monotonic() - started < 3 * SHORT_S + 0.5:
            assert (await teams(server.address, "short"))["team-a"] == (1, 0)
            await asyncio.sleep(0.1)
        await grant.release(5.0)
        await until(lambda: _no_pending(client), "the release acknowledged")
        stat = next(t for t in (await snapshot(server.address, "short")).teams)
        assert (stat.team, stat.in_flight) == ("team-a", 0)
        assert stat.usage == pytest.approx(5.0, rel=1e-3)


async def _no_pending(client: AllocatorClient) -> bool:
    return client.pending_releases == 0


# -- the metadata at the door and at the owner ----------------------------------------------


async def test_session_metadata_is_checked_at_the_door_and_at_the_owner(tmp_path: Path) -> None:
    async with (
        serving(tmp_path) as server,
        aio.insecure_channel(server.address) as channel,
    ):
        stub = pb_grpc.AllocatorStub(channel)
        keepalive = pb.KeepAliveRequest(pools=["gpu-a"])
        text = new_session()
        acquire = pb.AcquireRequest(pool="gpu-a", team="team-a", holder="gw")
        granted = await stub.Acquire(acquire, timeout=5, metadata=session_metadata(text))
        assert granted.granted

        renewed = await stub.KeepAlive(keepalive, timeout=5, metadata=session_metadata(text))
        assert (list(renewed.renewed), list(renewed.unknown), renewed.ttl_s) == (
            ["gpu-a"],
            [],
            TTL_S,
        )
        stranger = await stub.KeepAlive(
            keepalive, timeout=5, metadata=session_metadata(new_session())
        )
        assert (list(stranger.renewed), list(stranger.unknown)) == ([], ["gpu-a"])

        # The open session's id with another secret cannot even be presented: an id is
        # derived from its secret. (So nobody takes a session over, nor opens its id first
        # at a pool where it is not open yet, to lock its client out there.)
        forged = f"{session_id(text)}.{new_session().partition('.')[2]}"
        for what, call in [
            ("KeepAlive", stub.KeepAlive(keepalive, timeout=5, metadata=session_metadata(forged))),
            ("Acquire", stub.Acquire(acquire, timeout=5, metadata=session_metadata(forged))),
            (
                "Acquire at another pool",
                stub.Acquire(
                    pb.AcquireRequest(pool="short", team="team-a", holder="gw"),
                    timeout=5,
                    metadata=session_metadata(forged),
                ),
            ),
        ]:
            await _refused(call, grpc.StatusCode.INVALID_ARGUMENT, "fairshare-session", what)
        # The session itself, presented for another holder.
        calls: list[tuple[str, Awaitable[object]]] = [
            (
                "Acquire as another holder",
                stub.Acquire(
                    pb.AcquireRequest(pool="gpu-a", team="team-a", holder="gw-2"),
                    timeout=5,
                    metadata=session_metadata(text),
                ),
            ),
        ]
        for what, call in calls:
            await _refused(call, grpc.StatusCode.PERMISSION_DENIED, "fairshare-session", what)

        # Malformed, or missing where it is required: refused at the door.
        bad = session_metadata("not-a-session")
        for what, call in [
            ("KeepAlive", stub.KeepAlive(keepalive, timeout=5, metadata=bad)),
            ("KeepAlive without", stub.KeepAlive(keepalive, timeout=5)),
            ("Acquire", stub.Acquire(acquire, timeout=5, metadata=bad)),
            (
                "AcquireMany",
                stub.AcquireMany(
                    pb.AcquireManyRequest(holder="gw", requests=[acquire]), timeout=5, metadata=bad
                ),
            ),
            (
                "Adopt",
                stub.Adopt(pb.AdoptRequest(pool="gpu-a", holder="gw"), timeout=5, metadata=bad),
            ),
        ]:
            await _refused(call, grpc.StatusCode.INVALID_ARGUMENT, "fairshare-session", what)
        # A release is a bearer call: the metadata is ignored there.
        await stub.Release(pb.ReleaseRequest(grant_id=granted.grant_id), timeout=5, metadata=bad)

        # The pool list is bounded and checked like every other call's.
        await _refused(
            stub.KeepAlive(
                pb.KeepAliveRequest(pools=["gpu-a", "nope"]),
                timeout=5,
                metadata=session_metadata(text),
            ),
            grpc.StatusCode.NOT_FOUND,
            None,
            "an unknown pool",
        )
        await _refused(
            stub.KeepAlive(
                pb.KeepAliveRequest(pools=["gpu-a"] * 257),
                timeout=5,
                metadata=session_metadata(text),
            ),
            grpc.StatusCode.RESOURCE_EXHAUSTED,
            None,
            "too many pools",
        )


async def _refused(
    call: Awaitable[object], code: grpc.StatusCode, field: str | None, what: str
) -> None:
    with pytest.raises(aio.AioRpcError) as refused:
        await call
    assert refused.value.code() is code, (what, refused.value)
    if field is not None:
        trailers = dict(refused.value.trailing_metadata() or ())
        assert trailers.get("fairshare-field") == field, (what, trailers)
