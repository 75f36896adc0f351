"""SIGTERM always ends a ``fairshare serve`` under overload: twenty times, each within the
shutdown bound and with status 0."""

from __future__ import annotations

import asyncio
import contextlib
import os
import pathlib
import signal
import statistics
import subprocess
import sys
import time
import uuid

import pytest
from etcd_process import free_port
from grpc import aio
from grpc_health.v1 import health_pb2, health_pb2_grpc

from ha.settings import Timing
from server.app import GRACE_S
from wire.pb.fairshare.v1 import allocator_pb2 as pb
from wire.pb.fairshare.v1 import allocator_pb2_grpc as pb_grpc

from .conftest import POOLS_YAML

ROUNDS = 20
ETCD_ROUNDS = 5
WORKERS = 48
BOUND_S = Timing().close_bound_s + GRACE_S + 1.0
"""What ``server.app`` promises: the node closes within its bound, then the grace."""

pytestmark = pytest.mark.timeout(ROUNDS * (BOUND_S + 20))

ROOT = pathlib.Path(__file__).parents[2]


async def _wait_serving(address: str, proc: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 20
    async with aio.insecure_channel(address) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        while True:
            assert proc.poll() is None, "the server exited during start-up"
            with contextlib.suppress(aio.AioRpcError):
                reply = await stub.Check(health_pb2.HealthCheckRequest(), timeout=0.5)
                if reply.status == health_pb2.HealthCheckResponse.SERVING:
                    return
            assert time.monotonic() < deadline, "the server did not start within 20s"
            await asyncio.sleep(0.05)


async def _flood(stub: pb_grpc.AllocatorStub, worker: int) -> None:
    """Acquire and release as fast as the server answers, until cancelled."""
    n = 0
    while True:
        n += 1
        team = ("inst-a", "inst-b")[n % 2]
        request = pb.AcquireRequest(
            pool="gpu-a", team=team, holder=f"gw-{worker}", request_id=f"{worker}-{n}"
        )
        try:
            reply = await stub.Acquire(request, timeout=2)
            if reply.granted:
                await stub.Release(pb.ReleaseRequest(grant_id=reply.grant_id), timeout=2)
        except aio.AioRpcError:
            await asyncio.sleep(0.01)


async def test_sigterm_under_overload_always_exits_in_time_with_status_0(
    tmp_path: pathlib.Path,
) -> None:
    # The same state every round: each round is also a restart.
    took = await _rounds(tmp_path, ROUNDS, ["--state-dir", str(tmp_path / "state")])
    print(f"embedded: shutdown took max {max(took):.2f}s, median {statistics.median(took):.2f}s")


@pytest.mark.etcd
async def test_sigterm_under_overload_in_etcd_mode_exits_in_time_with_status_0(
    tmp_path: pathlib.Path, etcd_endpoints: list[str]
) -> None:
    prefix = f"/sigterm-{uuid.uuid4().hex[:8]}"
    key_file = tmp_path / "grant-keys"
    key_file.write_text(uuid.uuid4().hex + uuid.uuid4().hex + "\n", encoding="utf-8")
    try:
        took = await _rounds(
            tmp_path,
            ETCD_ROUNDS,
            ["--etcd", ",".join(etcd_endpoints), "--prefix", prefix],
            f"grants: {{key_file: {key_file}}}\n",
        )
        print(f"etcd: shutdown took max {max(took):.2f}s, median {statistics.median(took):.2f}s")
    finally:
        _etcdctl(etcd_endpoints, "del", "--prefix", prefix + "/")
    assert _etcdctl(etcd_endpoints, "get", "--prefix", "--keys-only", prefix + "/") == ""


async def _rounds(
    tmp_path: pathlib.Path, rounds: int, flags: list[str], extra_yaml: str = ""
) -> list[float]:
    """Starts a server ``rounds`` times, floods it and SIGTERMs it; returns the stop times."""
    config = tmp_path / "pools.yaml"
    config.write_text(f"node_id: term-0\n{extra_yaml}{POOLS_YAML}", encoding="utf-8")
    took: list[float] = []
    for round_ in range(rounds):
        address = f"127.0.0.1:{free_port()}"
        log = tmp_path / f"serve-{round_}.log"
        proc = _spawn(
            [
                sys.executable,
                "-m",
                "cli",
                "serve",
                "--config",
                str(config),
                "--listen",
                address,
                "--advertise",
                address,
                "--metrics-listen",
                "",
                *flags,
            ],
            log,
        )
        try:
            await _wait_serving(address, proc)
            async with aio.insecure_channel(address) as channel:
                stub = pb_grpc.AllocatorStub(channel)
                flood = [asyncio.create_task(_flood(stub, w)) for w in range(WORKERS)]
                await asyncio.sleep(0.3)
                started = time.monotonic()
                proc.send_signal(signal.SIGTERM)
                try:
                    status = await asyncio.to_thread(proc.wait, BOUND_S)
                except subprocess.TimeoutExpired:
                    status = None
                took.append(time.monotonic() - started)
                for task in flood:
                    task.cancel()
                await asyncio.gather(*flood, return_exceptions=True)
            text = log.read_text(errors="replace")
            assert status == 0, f"round {round_}: status {status} after {took[-1]:.1f}s\n{text}"
            # The shutdown path itself raised nothing and left no task behind.
            assert "closing the node failed" not in text, text
            assert "BUG" not in text, text
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=10)
    return took


def _etcdctl(endpoints: list[str], *args: str) -> str:
    done = subprocess.run(
        ["etcdctl", "--endpoints", ",".join(endpoints), *args],
        capture_output=True,
        text=True,
        timeout=10,
        env={**os.environ, "ETCDCTL_API": "3"},
        check=True,
    )
    return done.stdout.strip()


def _spawn(args: list[str], log: pathlib.Path) -> subprocess.Popen[bytes]:
    """Starts ``args`` from the repository root, output to ``log`` (a plain function: the
    start does not block the loop for long, and the process is waited for on a thread)."""
    with log.open("wb") as out:
        return subprocess.Popen(
            args, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=ROOT
        )
