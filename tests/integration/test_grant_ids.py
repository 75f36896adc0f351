"""Forged grant ids through a real embedded server: refused, bounded, never a charge.

Each test reproduces a finding of "Forgeable grant ids": an attacker with a valid
connection builds ids from what it can see or guess (the id's fields were plain,
sequence numbers sequential) and calls Release or Adopt with them.
"""

from __future__ import annotations

import pathlib
from collections.abc import AsyncIterator

import grpc
import pytest
from grpc import aio

from fairshare.wire.pb.fairshare.v1 import allocator_pb2 as pb
from fairshare.wire.pb.fairshare.v1 import allocator_pb2_grpc as pb_grpc
from ha.api import Epoch, GrantRef, PermissionDenied, PoolName
from server.app import start_server
from server.config import Config
from server.peers import GrpcPeers

from .certs import make_pki
from .conftest import make_config

pytestmark = pytest.mark.timeout(30)


@pytest.fixture
def node_config(tmp_path: pathlib.Path) -> Config:
    return make_config(tmp_path)


@pytest.fixture
async def address(node_config: Config) -> AsyncIterator[str]:
    running = await start_server(node_config, serve_metrics=False)
    try:
        yield running.address
    finally:
        await running.shutdown(0)


@pytest.fixture
async def stub(address: str) -> AsyncIterator[pb_grpc.AllocatorStub]:
    async with aio.insecure_channel(address) as channel:
        yield pb_grpc.AllocatorStub(channel)


def acquire(team: str, holder: str = "gw-1") -> pb.AcquireRequest:
    return pb.AcquireRequest(pool="gpu-a", team=team, holder=holder)


async def table(stub: pb_grpc.AllocatorStub) -> dict[str, pb.TeamStat]:
    snap = await stub.Snapshot(pb.SnapshotRequest(pool="gpu-a"), timeout=5, wait_for_ready=True)
    return {t.team: t for t in snap.teams}


def forged(epoch: int, seq: int, team: str, holder: str) -> str:
    """An id built from its fields alone, as anyone could before ids were signed."""
    return GrantRef(PoolName("gpu-a"), Epoch(epoch), seq, team, holder).encode()


async def refused(call: object) -> grpc.StatusCode:
    with pytest.raises(aio.AioRpcError) as info:
        await call  # type: ignore[misc]
    return info.value.code()


async def test_a_client_cannot_release_another_clients_grant(
    stub: pb_grpc.AllocatorStub,
) -> None:
    theirs = await stub.Acquire(acquire("inst-a", holder="gw-victim"), timeout=5)
    ref = GrantRef.decode(theirs.grant_id)
    # Its fields are visible (in logs, in the attacker's own ids); the MAC is not.
    guess = forged(ref.epoch, ref.seq, ref.team, ref.holder)
    code = await refused(stub.Release(pb.ReleaseRequest(grant_id=guess, consumed=50.0), timeout=5))
    assert code == grpc.StatusCode.PERMISSION_DENIED
    a = (await table(stub))["inst-a"]
    assert (a.in_flight, a.usage) == (1, 0.0), "nothing released, nothing charged"
    await stub.Release(pb.ReleaseRequest(grant_id=theirs.grant_id, consumed=2.0), timeout=5)
    a = (await table(stub))["inst-a"]
    assert a.in_flight == 0 and a.usage == pytest.approx(2.0)


async def test_epoch_zero_and_old_epoch_ids_cannot_charge_without_limit(
    stub: pb_grpc.AllocatorStub,
) -> None:
    ours = await stub.Acquire(acquire("inst-b"), timeout=5)
    # An old epoch: unsigned, it is not a genuine id at all.
    old = forged(ours.epoch - 1, 1, "inst-a", "gw-x")
    code = await refused(stub.Release(pb.ReleaseRequest(grant_id=old, consumed=1e12), timeout=5))
    assert code == grpc.StatusCode.PERMISSION_DENIED
    # Epoch 0 (a client's degraded grant, which carries no MAC): one ReleaseMany of 256
    # made-up ids charged 1,228,800 before; none was counted by an owner, so nothing.
    made_up = [forged(0, seq, "inst-a", "gw-x") for seq in range(1, 257)]
    releases = [pb.ReleaseRequest(grant_id=i, consumed=1e12) for i in made_up]
    await stub.ReleaseMany(pb.ReleaseManyRequest(holder="gw-x", releases=releases), timeout=5)
    assert (await table(stub))["inst-a"].usage == 0.0
    # Re-reported by their holder first, they count (within its in-flight bound),
    # and each release is charged once, within the bound.
    held = [pb.HeldGrant(grant_id=i, team="inst-a", priority=100) for i in made_up[:3]]
    await stub.Adopt(
        pb.AdoptRequest(pool="gpu-a", epoch=ours.epoch, holder="gw-x", grants=held), timeout=5
    )
    for grant_id in made_up[:3]:
        for _ in range(2):
            await stub.Release(pb.ReleaseRequest(grant_id=grant_id, consumed=1e12), timeout=5)
    bound = 8.0 * 600.0  # max_charge_per_s x max_request_s, the defaults
    usage = (await table(stub))["inst-a"].usage
    assert usage == pytest.approx(3 * bound, rel=1e-3), "three calls charged 3e12 before"


async def test_forged_adopts_cannot_fill_a_teams_reservation(
    stub: pb_grpc.AllocatorStub,
) -> None:
    epoch = (await stub.Acquire(acquire("inst-a"), timeout=5)).epoch
    for seq in (1, 2):  # inst-b's 2 reserved slots
        grant = pb.HeldGrant(
            grant_id=forged(epoch - 1, seq, "inst-b", "gw-evil"), team="inst-b", priority=100
        )
        call = stub.Adopt(
            pb.AdoptRequest(pool="gpu-a", epoch=epoch, holder="gw-evil", grants=[grant]),
            timeout=5,
        )
        assert await refused(call) == grpc.StatusCode.PERMISSION_DENIED
    assert (await table(stub)).get("inst-b") is None or (await table(stub))["inst-b"].in_flight == 0
    nxt = await stub.Acquire(acquire("inst-b", holder="gw-2"), timeout=5)
    assert not nxt.borrowing, "inst-b's reservation is still its own"


async def test_a_complete_adopt_for_another_holder_leaves_its_phantoms(
    node_config: Config,
) -> None:
    first = await start_server(node_config, serve_metrics=False)
    try:
        async with aio.insecure_channel(first.address) as ch:
            stub = pb_grpc.AllocatorStub(ch)
            victim = [await stub.Acquire(acquire("inst-b", "gw-victim"), timeout=5) for _ in "ab"]
    finally:
        await first.shutdown(0)
    second = await start_server(node_config, serve_metrics=False)
    try:
        async with aio.insecure_channel(second.address) as ch:
            stub = pb_grpc.AllocatorStub(ch)
            snap = await stub.Snapshot(pb.SnapshotRequest(pool="gpu-a"), timeout=5)
            assert {t.team: t for t in snap.teams}["inst-b"].phantoms == 2
            r = await stub.Adopt(
                pb.AdoptRequest(pool="gpu-a", epoch=snap.epoch, holder="gw-victim", complete=True),
                timeout=5,
            )
            assert r.phantoms_dropped == 0
            b = (await table(stub))["inst-b"]
            assert b.phantoms == 2, "the victim's reservation is not promised twice"
            assert (await stub.Acquire(acquire("inst-b", "gw-2"), timeout=5)).borrowing
            # The victim itself re-reports (ids signed before the restart still verify).
            mine = pb.HeldGrant(
                grant_id=victim[0].grant_id,
                team="inst-b",
                priority=victim[0].priority,
                borrowing=victim[0].borrowing,
            )
            r = await stub.Adopt(
                pb.AdoptRequest(
                    pool="gpu-a", epoch=snap.epoch, holder="gw-victim", complete=True, grants=[mine]
                ),
                timeout=5,
            )
            assert (r.adopted, r.phantoms_dropped) == (1, 2)
    finally:
        await second.shutdown(0)


async def test_a_forwarding_replica_gets_the_refusal_back_not_an_outage(
    address: str, stub: pb_grpc.AllocatorStub
) -> None:
    # A replica forwards a release to the owner; a refused id must come back as such, or
    # the forwarder would take it for an unreachable owner and retry until it degrades.
    epoch = (await stub.Acquire(acquire("inst-a"), timeout=5)).epoch
    peers = GrpcPeers()
    try:
        with pytest.raises(PermissionDenied) as info:
            await peers.release(address, forged(epoch, 1, "inst-a", "gw-1"), 1.0, timeout=2)
        assert info.value.field == "grant_id"
    finally:
        await peers.close()


async def test_under_mtls_a_holder_is_bound_to_its_client_certificate(
    tmp_path: pathlib.Path,
) -> None:
    ca, srv, clients = make_pki(tmp_path, ("gw-1", "gw-2", "replica"))
    config = make_config(
        tmp_path,
        f"tls: {{cert_file: {srv.cert}, key_file: {srv.key}, client_ca_file: {ca.cert}, "
        "peer_identities: [replica]}",
    )
    server = await start_server(config, serve_metrics=False)
    target = f"localhost:{server.port}"

    def channel(name: str) -> aio.Channel:
        pair = clients[name]
        return aio.secure_channel(
            target,
            grpc.ssl_channel_credentials(
                root_certificates=ca.cert.read_bytes(),
                private_key=pair.key.read_bytes(),
                certificate_chain=pair.cert.read_bytes(),
            ),
        )

    forwarded = (("fairshare-forwarded", "1"),)
    try:
        async with channel("gw-1") as one, channel("gw-2") as two, channel("replica") as peer:
            gw1, gw2 = pb_grpc.AllocatorStub(one), pb_grpc.AllocatorStub(two)
            theirs = await gw1.Acquire(acquire("inst-a", holder="gw-1"), timeout=5)
            other = await gw1.Acquire(acquire("inst-a", holder="gw-1/worker-3"), timeout=5)
            assert theirs.granted and other.granted
            # gw-2 knows gw-1's genuine id: it still may not release it, forwarded or not.
            for metadata in ((), forwarded):
                call = gw2.Release(
                    pb.ReleaseRequest(grant_id=theirs.grant_id, consumed=9.0),
                    metadata=metadata,
                    timeout=5,
                )
                assert await refused(call) == grpc.StatusCode.PERMISSION_DENIED
            # Nor act as gw-1 in an Acquire or a (complete) Adopt.
            call = gw2.Acquire(acquire("inst-a", holder="gw-1"), timeout=5)
            assert await refused(call) == grpc.StatusCode.PERMISSION_DENIED
            adopt = pb.AdoptRequest(pool="gpu-a", holder="gw-1", complete=True)
            assert await refused(gw2.Adopt(adopt, timeout=5)) == grpc.StatusCode.PERMISSION_DENIED
            a = (await table(gw1))["inst-a"]
            assert (a.in_flight, a.usage) == (2, 0.0)
            # A replica forwards for anyone; the holder itself releases its own.
            await pb_grpc.AllocatorStub(peer).Release(
                pb.ReleaseRequest(grant_id=theirs.grant_id, consumed=1.0),
                metadata=forwarded,
                timeout=5,
            )
            await gw1.Release(pb.ReleaseRequest(grant_id=other.grant_id, consumed=1.0), timeout=5)
            a = (await table(gw1))["inst-a"]
            assert a.in_flight == 0 and a.usage == pytest.approx(2.0)
    finally:
        await server.shutdown(0)
