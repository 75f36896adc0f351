"""``fairshare simulate --allocator``: a scenario's priorities from a running allocator.

A real embedded-mode server (``start_server`` with the default node factory, state in the
test's own directory) runs on the test's event loop on 127.0.0.1:0; the simulator's CLI
runs in a worker thread (its client library drives its own loop), so the server keeps
answering while the simulation blocks on its calls.
"""

from __future__ import annotations

import asyncio
import pathlib
import threading
from collections.abc import AsyncIterator

import pytest
from grpc import aio

from fairshare.sim import command
from fairshare.wire.pb.fairshare.v1 import allocator_pb2 as pb
from fairshare.wire.pb.fairshare.v1 import allocator_pb2_grpc as pb_grpc
from server.app import RunningServer, start_server
from server.config import load_config

pytestmark = pytest.mark.timeout(30)

TOKEN = "sim-admin-token"

CONFIG = """\
listen: 127.0.0.1:0
metrics_listen: ''
node_id: sim-0
state_dir: {state}
admin: {{token_file: {token}}}
pools:
  - name: two-institutions
    capacity: 16
    shares: {{large: 0.8125, small: 0.1875}}
  - name: elastic
    capacity: 16
    shares: {{a: 0.5, b: 0.3, c: 0.2}}
  - name: elsewhere
    capacity: 16
    shares: {{large: 1.0}}
"""


@pytest.fixture
def token_file(tmp_path: pathlib.Path) -> pathlib.Path:
    path = tmp_path / "admin-token"
    path.write_text(TOKEN + "\n", encoding="utf-8")
    return path


@pytest.fixture
async def server(tmp_path: pathlib.Path, token_file: pathlib.Path) -> AsyncIterator[RunningServer]:
    path = tmp_path / "allocator.yaml"
    path.write_text(CONFIG.format(state=tmp_path / "state", token=token_file), encoding="utf-8")
    running = await start_server(load_config(path, environ={}), serve_metrics=False)
    try:
        yield running
    finally:
        await running.shutdown(0)


async def simulate(*argv: str) -> int:
    """``fairshare simulate ARGV`` in a worker thread; its exit status."""
    return await asyncio.to_thread(command.main, list(argv))


async def snapshot(server: RunningServer, pool: str) -> pb.SnapshotResponse:
    async with aio.insecure_channel(server.address) as channel:
        return await pb_grpc.AllocatorStub(channel).Snapshot(
            pb.SnapshotRequest(pool=pool), timeout=5
        )


async def teams(server: RunningServer, pool: str) -> dict[str, pb.TeamStat]:
    return {t.team: t for t in (await snapshot(server, pool)).teams}


async def test_two_institutions_against_a_running_allocator(
    server: RunningServer, tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "sim"
    status = await simulate(
        "--scenario", "two-institutions", "--out", str(out), "--scale", "0.05",
        "--allocator", server.address,
    )  # fmt: skip
    printed = capsys.readouterr()
    assert status == 0, printed.err

    pngs = sorted(p.name for p in out.glob("*.png"))
    assert pngs == [
        "two-institutions-preemptions.png",
        "two-institutions-served.png",
        "two-institutions-waits.png",
    ]
    assert all((out / name).stat().st_size > 0 for name in pngs)
    report = (tmp_path / "sim.md").read_text(encoding="utf-8")
    assert "priorities from a running allocator" in report
    assert "not comparable with the in-process ones" in report
    assert f"--allocator {server.address}" in report

    # Every grant the simulated gateway took was released: none in flight, usage charged.
    stats = await teams(server, "two-institutions")
    assert set(stats) == {"large", "small"}
    assert all(t.in_flight == 0 and t.borrowing == 0 for t in stats.values()), stats
    assert stats["large"].usage > 0 and stats["small"].usage > 0, stats
    # The client library's loop thread was stopped with the run.
    assert not [t for t in threading.enumerate() if t.name.startswith("fairshare-client-")]


async def test_elastic_resizes_the_allocator_pool_with_the_admin_token(
    server: RunningServer,
    tmp_path: pathlib.Path,
    token_file: pathlib.Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    status = await simulate(
        "--scenario", "elastic", "--out", str(tmp_path / "sim"), "--scale", "0.05",
        "--allocator", server.address, "--token-file", str(token_file),
    )  # fmt: skip
    assert status == 0, capsys.readouterr().err
    # The capacity went 16 -> 8 -> 24 during the run and is back to what it was.
    snap = await snapshot(server, "elastic")
    assert snap.capacity == 16
    assert all(t.in_flight == 0 for t in snap.teams)
    assert all(t.usage > 0 for t in snap.teams), snap


async def test_scenarios_a_running_allocator_cannot_serve_are_refused(
    server: RunningServer, tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = str(tmp_path / "sim")

    async def refused(*argv: str) -> str:
        status = await simulate("--out", out, "--scale", "0.05", *argv)
        assert status == command.EXIT_USAGE
        return capsys.readouterr().err

    at = ("--allocator", server.address)
    assert "in-process only" in await refused("--scenario", "failover", *at)
    assert "--token-file" in await refused("--scenario", "elastic", *at)
    # No pool named "three-teams" on this allocator: the message names the pools there.
    err = await refused("--scenario", "three-teams", *at)
    assert "no pool 'three-teams'" in err and "two-institutions" in err
    # A pool whose teams differ: the missing team and the YAML to configure are named.
    err = await refused("--scenario", "two-institutions", "--pool", "elsewhere", *at)
    assert "missing team(s) small" in err and "shares: {large: 0.8125, small: 0.1875}" in err
    assert not (tmp_path / "sim").exists()  # refused before any plot
    for pool in ("two-institutions", "elsewhere"):
        assert all(t.in_flight == 0 for t in (await teams(server, pool)).values())
