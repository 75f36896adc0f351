"""Fixtures of the gRPC integration tests: a real grpc.aio server on 127.0.0.1:0."""

from __future__ import annotations

import pathlib
import subprocess
from collections.abc import AsyncIterator, Iterator, Mapping

import pytest
from grpc import aio

from fairshare.wire.pb.fairshare.v1 import allocator_pb2_grpc as pb_grpc
from server.app import RunningServer, start_server
from server.config import Config, load_config

from .fakes import FakeAllocator

POOLS_YAML = """
pools:
  - name: gpu-a
    capacity: 10
    shares: {inst-a: 0.8125, inst-b: 0.1875}
  - name: gpu-b
    capacity: 4
    shares: {research: 0.5, product: 0.5}
    degraded_mode: fail_closed
"""


def make_config(
    tmp_path: pathlib.Path,
    extra: str = "",
    *,
    environ: Mapping[str, str] | None = None,
) -> Config:
    """A config on loopback port 0 with metrics off, plus ``extra`` YAML."""
    path = tmp_path / "pools.yaml"
    path.write_text(
        f"listen: 127.0.0.1:0\nmetrics_listen: ''\nnode_id: test-0\n"
        f"state_dir: {tmp_path / 'state'}\n{extra}\n{POOLS_YAML}",
        encoding="utf-8",
    )
    return load_config(path, environ=environ or {})


@pytest.fixture
def config(tmp_path: pathlib.Path) -> Config:
    return make_config(tmp_path)


@pytest.fixture
def fake(config: Config) -> FakeAllocator:
    return FakeAllocator(config.pools, node_id=config.node_id)


@pytest.fixture
async def running(config: Config, fake: FakeAllocator) -> AsyncIterator[RunningServer]:
    server = await start_server(config, node=fake, serve_metrics=False)
    try:
        yield server
    finally:
        await server.shutdown(0)


@pytest.fixture
async def channel(running: RunningServer) -> AsyncIterator[aio.Channel]:
    async with aio.insecure_channel(running.address) as ch:
        yield ch


@pytest.fixture
def stub(channel: aio.Channel) -> pb_grpc.AllocatorStub:
    return pb_grpc.AllocatorStub(channel)


@pytest.fixture
def admin(channel: aio.Channel) -> pb_grpc.AdminStub:
    return pb_grpc.AdminStub(channel)


@pytest.fixture
def small_disk(tmp_path: pathlib.Path) -> Iterator[pathlib.Path]:
    """A 1 MiB tmpfs mounted for the test (skipped where mounting is not permitted)."""
    mount = tmp_path / "disk"
    mount.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mount)],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip() or done.returncode}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)
