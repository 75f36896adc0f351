"""A team over its reservation, under churn, as the real embedded node shows it over the
wire: the Snapshot answer's within-share count and ``fairshare status``'s within column.

The server is ``start_server`` with the default node (embedded, no etcd): servicer, node,
owner and the wire conversion, as a one-machine user runs them.
"""

from __future__ import annotations

import asyncio
import io
import json
import pathlib
from collections.abc import AsyncIterator

import pytest
from grpc import aio

from fairshare.cli import main as cli
from fairshare.wire.pb.fairshare.v1 import allocator_pb2 as pb
from fairshare.wire.pb.fairshare.v1 import allocator_pb2_grpc as pb_grpc
from server.app import RunningServer, start_server

from .conftest import make_config

pytestmark = pytest.mark.timeout(30)


@pytest.fixture
async def server(tmp_path: pathlib.Path) -> AsyncIterator[RunningServer]:
    running = await start_server(make_config(tmp_path), serve_metrics=False)
    try:
        yield running
    finally:
        await running.shutdown(0)


async def test_a_team_over_its_reservation_is_shown_holding_it(server: RunningServer) -> None:
    async with aio.insecure_channel(server.address) as channel:
        stub = pb_grpc.AllocatorStub(channel)

        async def acquire() -> pb.AcquireResponse:
            request = pb.AcquireRequest(pool="gpu-a", team="inst-b", holder="gw")
            return await stub.Acquire(request, timeout=5)

        # inst-b (2 reserved of C = 10) keeps 5 in flight; its requests end oldest first
        # and are replaced, ten times over.
        held = [await acquire() for _ in range(5)]
        for _ in range(10):
            done = held.pop(0)
            await stub.Release(pb.ReleaseRequest(grant_id=done.grant_id), timeout=5)
            held.append(await acquire())
        assert sum(not r.borrowing for r in held) == 2
        snap = await stub.Snapshot(pb.SnapshotRequest(pool="gpu-a"), timeout=5)
    teams = {t.team: t for t in snap.teams}
    b = teams["inst-b"]
    assert (b.reserved, b.within, b.in_flight, b.borrowing) == (2, 2, 5, 3)
    assert teams["inst-a"].HasField("within") and teams["inst-a"].within == 0

    def status(*extra: str) -> str:
        out = io.StringIO()
        assert (
            cli.main(["status", "--target", server.address, "--pool", "gpu-a", *extra], out=out)
            == 0
        )
        return out.getvalue()

    rows = {
        line.split()[0]: line.split() for line in (await asyncio.to_thread(status)).splitlines()
    }
    assert rows["inst-b"][2:6] == ["2", "2/2", "5", "3"]
    (pool,) = json.loads(await asyncio.to_thread(status, "--json"))
    assert {t["team"]: t["within"] for t in pool["teams"]} == {"inst-a": 0, "inst-b": 2}
