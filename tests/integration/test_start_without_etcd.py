"""A replica started while its etcd does not answer serves at once, each pool per its
degraded mode, and joins the cluster by itself when etcd appears on the same port.

Real processes: ``fairshare serve`` against a free loopback port with nothing on it, then
a real etcd member started on that port.
"""

from __future__ import annotations

import asyncio
import os
import pathlib
import time
from collections.abc import Iterator

import grpc
import pytest
from grpc import aio
from grpc_health.v1 import health_pb2, health_pb2_grpc

from fairshare.wire.pb.fairshare.v1 import allocator_pb2 as pb
from fairshare.wire.pb.fairshare.v1 import allocator_pb2_grpc as pb_grpc
from harness.etcd import EtcdProcess
from harness.serve import Allocator, wait_serving
from server.app import MEMBER_SERVICE

from .conftest import POOLS_YAML

pytestmark = pytest.mark.timeout(90)

PREFIX = "/late-etcd"
SERVING_WITHIN_S = 15.0
"""How long the process may take to serve (interpreter start and imports, on a loaded
machine); before this change it exited with a traceback instead, within 0.5 s."""
JOIN_WITHIN_S = 20.0
"""How long after etcd answers the replica must own its pools: the join backoff is at
most 5 s, then the campaign."""


@pytest.fixture
def etcd() -> Iterator[EtcdProcess]:
    """A member not started yet: its port is free."""
    member = EtcdProcess(name="late-etcd")
    try:
        yield member
    finally:
        member.close()


def _config(tmp_path: pathlib.Path, etcd: EtcdProcess) -> pathlib.Path:
    keys = tmp_path / "grant-keys"
    keys.write_text("cd" * 32 + "\n", encoding="utf-8")
    config = tmp_path / "pools.yaml"
    config.write_text(
        f"etcd:\n  endpoints: [{etcd.client_url}]\n  prefix: {PREFIX}\n"
        f"grants: {{key_file: {keys}}}\n{POOLS_YAML}",
        encoding="utf-8",
    )
    return config


async def _health(channel: aio.Channel, service: str) -> int:
    stub = health_pb2_grpc.HealthStub(channel)
    reply = await stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=2)
    return int(reply.status)


def _acquire(pool: str, team: str) -> pb.AcquireRequest:
    return pb.AcquireRequest(pool=pool, team=team, est_tokens=10, holder="gw-1")


async def test_a_replica_serves_degraded_without_etcd_and_joins_when_it_appears(
    etcd: EtcdProcess, tmp_path: pathlib.Path
) -> None:
    environ = {k: v for k, v in os.environ.items() if not k.startswith("FAIRSHARE_")}
    replica = Allocator(
        tmp_path, _config(tmp_path, etcd), node="late-0", env=environ, prefix=PREFIX
    )
    replica.start()
    try:
        await wait_serving(replica.address, timeout_s=SERVING_WITHIN_S, process=replica)
        async with aio.insecure_channel(replica.address) as channel:
            stub = pb_grpc.AllocatorStub(channel)
            serving = health_pb2.HealthCheckResponse.SERVING
            not_serving = health_pb2.HealthCheckResponse.NOT_SERVING
            # Not a member yet: it says so, and answers as without an owner.
            assert await _health(channel, MEMBER_SERVICE) == not_serving
            assert await _health(channel, "") == serving
            open_pool = await stub.Acquire(_acquire("gpu-a", "inst-a"), timeout=5)
            assert open_pool.granted and open_pool.degraded, open_pool
            with pytest.raises(aio.AioRpcError) as closed:
                await stub.Acquire(_acquire("gpu-b", "research"), timeout=5)
            assert closed.value.code() == grpc.StatusCode.UNAVAILABLE, closed.value
            assert replica.alive

            etcd.start()
            deadline = time.monotonic() + JOIN_WITHIN_S
            last: object = None
            while True:
                member = await _health(channel, MEMBER_SERVICE)
                reply = await stub.Acquire(_acquire("gpu-a", "inst-b"), timeout=5)
                if member == serving and not reply.degraded:
                    break
                last = (member, reply)
                assert time.monotonic() < deadline, f"not joined: {last}\n{replica.log_tail()}"
                await asyncio.sleep(0.2)
            assert reply.granted and reply.owner == "late-0", reply
        owners = etcd.etcdctl("get", "--prefix", "--keys-only", f"{PREFIX}/owners/")
        assert f"{PREFIX}/owners/gpu-a" in owners and f"{PREFIX}/owners/gpu-b" in owners, owners
        replica.stop()
        assert replica.wait(0) == 0, replica.log_tail()
        log = replica.log_text()
        assert "joining in the background" in log and "joined the cluster at attempt" in log
        assert "Traceback" not in log and "BUG" not in log, log
    finally:
        replica.stop()
    etcd.etcdctl("del", "--prefix", PREFIX)
    assert etcd.etcdctl("get", "--prefix", "--keys-only", PREFIX).strip() == ""
