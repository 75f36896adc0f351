"""A full disk under the embedded server: the pools that cannot persist report NOT_SERVING
and count refused writes, nothing spins, and the server recovers once space returns.

First with an injected writer that fails with ENOSPC (in process), then with a real
``fairshare serve`` on a small tmpfs this test mounts (skipped where mounting is not
permitted).
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import os
import pathlib
import re
import signal
import time
import urllib.request
from collections.abc import Iterator

import pytest
from grpc import aio
from grpc_health.v1 import health_pb2, health_pb2_grpc
from prometheus_client import generate_latest

from fairshare.wire.channels import open_channel
from fairshare.wire.pb.fairshare.v1 import allocator_pb2 as pb
from fairshare.wire.pb.fairshare.v1 import allocator_pb2_grpc as pb_grpc
from ha.store import file as filestore
from harness.net import free_port
from harness.process import ServerProcess
from harness.serve import serve_args
from server.app import pool_health_service, start_server

from .conftest import POOLS_YAML, make_config

pytestmark = pytest.mark.timeout(60)
SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


class Disk:
    """The store's writer with a switch: when full, it fails with ENOSPC."""

    def __init__(self) -> None:
        self.full = False
        self._real = filestore._write_all

    def write_all(self, fd: int, data: bytes) -> None:
        if self.full:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        self._real(fd, data)


@pytest.fixture
def disk(monkeypatch: pytest.MonkeyPatch) -> Iterator[Disk]:
    disk = Disk()
    monkeypatch.setattr(filestore, "_write_all", disk.write_all)
    yield disk


async def _health(address: str, service: str) -> int:
    async with open_channel(address) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        reply = await stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=2)
        return int(reply.status)


async def _until(what: str, check: object, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    last: object = None
    while time.monotonic() < deadline:
        last = await check()  # type: ignore[operator]
        if last is True:
            return
        await asyncio.sleep(0.1)
    raise AssertionError(f"{what} did not happen within {timeout_s}s (last: {last!r})")


def _gauge(text: str, family: str, pool: str) -> float:
    match = re.search(rf'^{family}{{pool="{pool}"}} (\S+)$', text, flags=re.MULTILINE)
    assert match is not None, f"{family} for {pool} missing"
    return float(match[1])


async def test_a_full_disk_is_not_serving_for_its_pools_and_recovers_without_restart(
    tmp_path: pathlib.Path, disk: Disk, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    running = await start_server(make_config(tmp_path), serve_metrics=False)
    service = pool_health_service("gpu-a")
    try:
        async with open_channel(running.address) as channel:
            stub = pb_grpc.AllocatorStub(channel)
            request = pb.AcquireRequest(pool="gpu-a", team="inst-a", holder="gw", est_tokens=1)
            assert (await stub.Acquire(request, timeout=5)).granted
            assert await _health(running.address, service) == SERVING

            disk.full = True
            # Needs a durable write: refused, the pool is lost (then degraded: fail_open).
            with contextlib.suppress(aio.AioRpcError):
                await stub.Acquire(request, timeout=5)

            async def refused() -> object:
                return await _health(running.address, service) == NOT_SERVING

            await _until("NOT_SERVING for gpu-a", refused)
            text = generate_latest(running.metrics.registry).decode()
            assert _gauge(text, "fairshare_store_full", "gpu-a") == 1.0
            assert _gauge(text, "fairshare_store_refused_writes_total", "gpu-a") >= 1.0
            await asyncio.sleep(2.0)  # the node keeps trying; it must not spin
            assert caplog.text.count("let go of stale owner key") <= 3
            assert caplog.text.count("the store is full and refuses writes") == 1

            disk.full = False  # space is back

            async def recovered() -> object:
                if await _health(running.address, service) != SERVING:
                    return "health"
                reply = await stub.Acquire(request, timeout=5)
                return reply.granted and reply.epoch > 0  # decided by an owner, not degraded

            await _until("recovery of gpu-a", recovered)
            text = generate_latest(running.metrics.registry).decode()
            assert _gauge(text, "fairshare_store_full", "gpu-a") == 0.0

            async def all_clear() -> object:
                await stub.Acquire(request, timeout=5)  # a write, to notice the recovery
                return "the store accepts writes again" in caplog.text and not any(
                    view.store_full for view in running.node.status()
                )

            await _until("every pool to accept writes, and the log to say so", all_clear)
    finally:
        await running.shutdown(0)


# -- a real process on a real full disk ---------------------------------------------------


def fill(path: pathlib.Path) -> None:
    """Writes ``path`` until the disk is full."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        while True:
            os.write(fd, b"\0" * 4096)
    except OSError as e:
        assert e.errno == errno.ENOSPC
    finally:
        os.close(fd)


def _scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as reply:
        return str(reply.read().decode())


async def test_serve_on_a_disk_that_fills_up_and_is_freed(
    tmp_path: pathlib.Path, small_disk: pathlib.Path
) -> None:
    config = tmp_path / "pools.yaml"
    config.write_text(f"node_id: full-0\n{POOLS_YAML}", encoding="utf-8")
    port, metrics_port = free_port(), free_port()
    address = f"127.0.0.1:{port}"
    args = serve_args(
        config,
        listen=address,
        metrics_listen=f"127.0.0.1:{metrics_port}",
        state_dir=small_disk / "state",
    )
    proc = ServerProcess(args, address=address, log=tmp_path / "serve.log")
    proc.start()
    filler = small_disk / "filler"
    try:

        async def serving() -> object:
            try:
                return await _health(address, "") == SERVING
            except aio.AioRpcError as e:
                return e.code()

        await _until("the server to serve", serving, 20)
        async with open_channel(address) as channel:
            stub = pb_grpc.AllocatorStub(channel)
            request = pb.AcquireRequest(pool="gpu-a", team="inst-a", holder="gw", est_tokens=1)
            assert (await stub.Acquire(request, timeout=5)).granted

            fill(filler)
            # An idle pool writes nothing, and a small append may still fit the last block
            # of the log: decide and release until a write needs a block the disk lacks
            # (refused, or granted degraded once the pool is lost).
            for _ in range(200):
                try:
                    reply = await stub.Acquire(request, timeout=5)
                    release = pb.ReleaseRequest(grant_id=reply.grant_id, consumed=1.0)
                    await stub.Release(release, timeout=5)
                except aio.AioRpcError:
                    break
                if reply.degraded:
                    break

            async def full() -> object:
                state = await _health(address, pool_health_service("gpu-a"))
                gauge = _gauge(_scrape(metrics_port), "fairshare_store_full", "gpu-a")
                return state == NOT_SERVING and gauge == 1.0

            await _until("NOT_SERVING and fairshare_store_full for gpu-a", full)

            filler.unlink()  # space is back; the process is the same one

            async def recovered() -> object:
                if await _health(address, pool_health_service("gpu-a")) != SERVING:
                    return "health"
                reply = await stub.Acquire(request, timeout=5)
                if not (reply.granted and reply.epoch > 0):
                    return "acquire"
                # Pool gauges are computed at most once a second: a scrape may lag by that.
                return _gauge(_scrape(metrics_port), "fairshare_store_full", "gpu-a") == 0.0

            await _until("recovery of gpu-a (health, a grant, the gauge back at 0)", recovered)
        proc.signal(signal.SIGTERM)
        assert proc.wait(20) == 0
    finally:
        proc.kill()
    text = (tmp_path / "serve.log").read_text(encoding="utf-8", errors="replace")
    assert text.count("the store is full and refuses writes") == 1, text[-3000:]
    assert "Traceback" not in text, text[-3000:]
