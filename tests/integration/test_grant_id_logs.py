"""Grant ids are bearer capabilities: a real embedded server and the client library name
them in logs and error messages by their digest (``fairshare.digest``), never in full."""

from __future__ import annotations

import logging
import pathlib
from collections.abc import AsyncIterator

import grpc
import pytest
from grpc import aio

from fairshare.client import AllocatorClient
from fairshare.digest import grant_id_digest
from fairshare.ids import GrantRef
from fairshare.wire.pb.fairshare.v1 import allocator_pb2 as pb
from fairshare.wire.pb.fairshare.v1 import allocator_pb2_grpc as pb_grpc
from server.app import RunningServer, start_server

from .conftest import make_config

pytestmark = pytest.mark.timeout(30)

MALFORMED = "g3.zz.1.Z3B1LWE.aW5zdC1h.Z3ctMQ.w.this-secret-would-leak"
"""Nearly an id: a typo (or a probe) whose text must not come back or reach a log."""


@pytest.fixture
async def running(tmp_path: pathlib.Path) -> AsyncIterator[RunningServer]:
    server = await start_server(make_config(tmp_path), serve_metrics=False)
    try:
        yield server
    finally:
        await server.shutdown(0)


@pytest.fixture
async def stub(running: RunningServer) -> AsyncIterator[pb_grpc.AllocatorStub]:
    async with aio.insecure_channel(running.address) as channel:
        yield pb_grpc.AllocatorStub(channel)


def with_other_mac(grant_id: str) -> str:
    """A signed id of the same fields with a MAC of the right length that does not
    verify: what a release with a stale or tampered id sends."""
    ref = GrantRef.decode(grant_id)
    return grant_id[: -len(ref.mac)] + ("A" if ref.mac[0] != "A" else "B") + ref.mac[1:]


@pytest.mark.parametrize("spoil", ["mac", "form"])
async def test_a_refused_release_logs_the_ids_digest_not_the_id(
    running: RunningServer, caplog: pytest.LogCaptureFixture, spoil: str
) -> None:
    async with AllocatorClient([running.address], holder="gw-1") as client:
        grant = await client.acquire("gpu-a", "inst-a")
        grant.grant_id = with_other_mac(grant.grant_id) if spoil == "mac" else MALFORMED
        with caplog.at_level(logging.DEBUG):
            await grant.release(1.0)
        assert client.pending_releases == 0, "a refused release is not retried"
    refused = [r for r in caplog.records if "refused" in r.getMessage()]
    assert refused, "the refusal is logged"
    assert grant.grant_id not in caplog.text
    assert "secret" not in caplog.text and grant.grant_id.rsplit(".", 1)[1] not in caplog.text
    assert grant_id_digest(grant.grant_id) in refused[0].getMessage()


async def test_the_servers_refusals_name_a_malformed_id_by_its_digest(
    stub: pb_grpc.AllocatorStub,
) -> None:
    digest = grant_id_digest(MALFORMED)
    with pytest.raises(aio.AioRpcError) as one:
        await stub.Release(pb.ReleaseRequest(grant_id=MALFORMED, consumed=1.0), timeout=5)
    assert one.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    many = await stub.ReleaseMany(
        pb.ReleaseManyRequest(holder="gw-1", releases=[pb.ReleaseRequest(grant_id=MALFORMED)]),
        timeout=5,
    )
    epoch = (await stub.Acquire(pb.AcquireRequest(pool="gpu-a", team="inst-a"), timeout=5)).epoch
    held = pb.HeldGrant(grant_id=MALFORMED, team="inst-a", priority=1)
    with pytest.raises(aio.AioRpcError) as adopt:
        await stub.Adopt(
            pb.AdoptRequest(pool="gpu-a", epoch=epoch, holder="gw-1", grants=[held]), timeout=5
        )
    messages = [one.value.details() or "", many.outcomes[0].error.message, adopt.value.details()]
    for message in messages:
        assert "secret" not in message and digest in message, message
